"""Full-weight sync into served vLLM engines after every GRPO step.

GRPO with ``engine.kind=openai`` and LoRA hands the trained adapter to the servers through
vLLM's runtime adapter API (:meth:`acmrl.engines.openai.OpenAIEngine.load_adapter`). Full
fine-tuning has no adapter to hand over: every weight changes. This module streams them with
TRL's :class:`trl.generation.vllm_client.VLLMClient`, the client TRL's own GRPO uses against
``vllm serve``: the trainer joins each server's workers in an NCCL group (vLLM's weight-transfer
engine), announces the tensors (name, dtype, shape) over HTTP and broadcasts them; the server
loads them by their Hugging Face names and its prefix cache is reset. No protocol of acmrl's own.

What a server needs::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "nccl"}'

and the trainer needs a CUDA device and ``pip install 'acmrl[weight-sync]'`` (trl >= 1.16 and
vllm; NCCL is CUDA only: on a CPU-only machine the adapter path is the one that runs). Only the main process streams: under
DDP every process holds the same weights, and under FSDP / ZeRO-3 the full weights are gathered
first (``accelerate``'s ``get_state_dict``, a collective every process joins).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SERVER_HINT = (
    "start each server with VLLM_SERVER_DEV_MODE=1 vllm serve MODEL "
    '--weight-transfer-config \'{"backend": "nccl"}\''
)


CLIENT_CLS: Callable[..., Any] | None = None  # a stand-in for TRL's client (tests)


class WeightSyncError(RuntimeError):
    """Full-weight sync cannot start or failed; the message names what is missing."""


def _trl_client() -> Callable[..., Any]:
    try:
        from trl.generation.vllm_client import VLLMClient
    except ImportError as exc:
        raise WeightSyncError(
            "full-weight sync (GRPO, engine.kind=openai, lora.enabled=false) uses TRL's "
            f"VLLMClient: pip install 'acmrl[weight-sync]' (trl>=1.16, vllm) ({exc})"
        ) from None
    from trl.import_utils import is_vllm_available

    if not is_vllm_available():  # the trainer's side of the transfer is vLLM's NCCL code
        raise WeightSyncError(
            "full-weight sync needs vllm installed beside the trainer too (TRL's client joins "
            "the servers' NCCL group with vLLM's weight-transfer code): pip install "
            "'acmrl[weight-sync]'"
        )
    return VLLMClient


def named_weights(state_dict: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The tensors to stream, by the names a Hugging Face checkpoint gives them (what vLLM's
    ``load_weights`` reads): wrapper prefixes removed, a tied output embedding sent once (vLLM
    ties it itself), each tensor contiguous.

    >>> w = torch.zeros(2, 2)
    >>> [n for n, _ in named_weights({"module.model.embed.weight": w, "lm_head.weight": w})]
    ['model.embed.weight']
    """
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    for name, t in state_dict.items():
        name = name.removeprefix("module.").removeprefix("_orig_mod.")
        if t.data_ptr() in seen:  # a tied weight (lm_head = embed_tokens)
            continue
        seen.add(t.data_ptr())
        out.append((name, t.detach().contiguous()))
    return out


class FullWeightSync:
    """One TRL client per server, each joined to its server's weight-transfer group at start.

    ``client_cls`` is TRL's ``VLLMClient`` unless given, here or as :data:`CLIENT_CLS` (the
    tests record the calls: NCCL needs CUDA and a real vLLM server, which this project's CI
    machine has neither of).
    """

    def __init__(
        self,
        base_urls: list[str],
        device: torch.device,
        group_port: int,
        timeout_s: float = 240.0,
        client_cls: Callable[..., Any] | None = None,
    ) -> None:
        client_cls = client_cls or CLIENT_CLS
        if client_cls is None:
            if device.type != "cuda":
                raise WeightSyncError(
                    f"full-weight sync streams the weights over NCCL, which needs a CUDA device; "
                    f"this trainer runs on {device}. On a CPU-only machine train a LoRA adapter "
                    "(lora.enabled=true: the adapter is synced over HTTP) or use engine.kind=hf"
                )
            client_cls = _trl_client()
        self.clients: list[Any] = []
        for i, url in enumerate(base_urls):
            try:
                client = client_cls(
                    base_url=url, group_port=group_port + i, connection_timeout=timeout_s
                )
                client.init_communicator(device=device)
            except WeightSyncError:
                raise
            except Exception as exc:  # the server's reply names the cause
                raise WeightSyncError(
                    f"{url}: cannot open the weight-transfer group ({exc}); {SERVER_HINT}"
                ) from exc
            self.clients.append(client)
        self.pushes = 0

    def push(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Stream ``state_dict`` into every server and reset its prefix cache (cached keys and
        values were computed by the old weights). Returns the number of tensors sent."""
        weights = named_weights(state_dict)
        metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights]
        for client in self.clients:
            with client.weight_update():
                client.update_named_params(metadata, iter(weights))
            client.reset_prefix_cache()
        self.pushes += 1
        return len(weights)

    def close(self) -> None:
        for client in self.clients:
            client.close_communicator()
