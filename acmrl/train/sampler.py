"""A merged copy of the policy for the ``hf`` engine to sample from, in another dtype.

GRPO's ``hf`` engine samples from the very parameters being trained by default: float32 master
weights and, under LoRA, the adapter's extra matmuls in every projection. On a CPU the rollouts
then run at float32 speed although the update autocasts in bf16. With ``rollout_dtype`` set (or
``auto`` under bf16) the engine runs on this copy instead: the base model with the adapter
merged, cast to the dtype, and refreshed from the live parameters after every optimiser step,
as a vLLM sampler is synced in verl or TRL. The trainer recomputes the old logprobs
(``old_logprobs=recompute``), so the update's ratio is exact; the engine-vs-trainer difference
is logged as ``train/logprob_mismatch``.

Under LoRA only the adapted projections change, so only they are refreshed
(``W + scale * B @ A``, computed by peft's ``get_delta_weight`` without touching the live
weights); under full fine-tuning every trainable parameter is copied.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

PEFT_PREFIX = "base_model.model."


def _plain_name(name: str) -> str:
    """A parameter's name in the merged model, from its name in the (peft) policy."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX) :]
    return name.replace(".base_layer.", ".")


class SamplerCopy:
    """The policy merged and cast to ``dtype``; :meth:`refresh` copies the live weights in."""

    def __init__(self, policy: Any, dtype: torch.dtype) -> None:
        is_peft = isinstance(policy, PeftModel)
        model = copy.deepcopy(policy)
        if is_peft:
            model = model.merge_and_unload()
        self.model = model.to(dtype).eval().requires_grad_(False)
        params = dict(self.model.named_parameters())
        self._pairs: list[tuple[torch.Tensor, Callable[[], torch.Tensor]]] = []
        adapted: set[str] = set()
        for name, module in policy.named_modules():
            if is_peft and isinstance(module, LoraLayer):
                key = _plain_name(name) + ".weight"
                if key not in params:
                    raise RuntimeError(f"sampler copy: no weight {key!r} for adapted layer {name}")
                self._pairs.append((params[key], lambda m=module: _merged_weight(m)))
                adapted.add(key)
        for name, p in policy.named_parameters():
            if p.requires_grad and "lora_" not in name:
                key = _plain_name(name)
                if key in adapted:
                    continue
                if key not in params:
                    raise RuntimeError(f"sampler copy: no parameter {key!r} for {name}")
                self._pairs.append((params[key], lambda p=p: p))

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live policy's current (merged) weights into the copy."""
        for dst, src in self._pairs:
            dst.copy_(src().to(dst.dtype))


def _merged_weight(module: Any) -> torch.Tensor:
    """A LoRA layer's base weight plus the deltas of its active, unmerged adapters."""
    w = module.base_layer.weight
    if getattr(module, "merged", False):
        return w
    for name in module.active_adapters:
        if name in module.lora_A:
            w = w + module.get_delta_weight(name)
    return w
