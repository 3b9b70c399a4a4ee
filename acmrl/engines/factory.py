"""Engines from a config: the student's engine of a rollout, eval, annotate or GRPO config.

``make_engine(cfg)`` reads ``cfg.engine`` (its kind and options), ``cfg.model``, ``cfg.seed``
and ``cfg.concurrency``; ``vllm_engine`` serves an adapter folder as a LoRA on its base model;
``trainer_engine`` is the engine GRPO samples its rollouts from. What an engine does beside a
trainer (sleep, wake up, take a new policy) is its own (:class:`acmrl.engines.base.Engine`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from acmrl.config import ConfigError, EngineConfig, ModelConfig
from acmrl.engines.base import Engine


class EngineSettings(Protocol):
    """What the factories read of a config (rollout, annotate, GRPO)."""

    engine: EngineConfig
    model: ModelConfig
    seed: int
    concurrency: int


def make_engine(cfg: EngineSettings) -> Engine:
    """The student engine of a rollout or annotate config; it carries the tokenizer that renders
    States (``engine.tokenizer``)."""
    e = cfg.engine
    if e.kind == "oracle":
        raise ConfigError(
            "engine.kind=oracle is the expert plan as a policy, for acmrl eval only; "
            "rollout, annotate and GRPO need a model (hf, openai or vllm)"
        )
    if e.kind == "openai":
        import os

        from acmrl.engines.openai import OpenAIEngine
        from acmrl.models import load_tokenizer

        engine = OpenAIEngine(
            e.base_urls,
            e.served_model or cfg.model.name,
            load_tokenizer(cfg.model.name),
            api_key=os.environ.get(e.api_key_env),
            timeout_s=e.timeout_s,
            max_retries=e.max_retries,
            concurrency=cfg.concurrency,
        )
        return engine
    if e.kind == "vllm":
        return vllm_engine(cfg)
    from acmrl.engines.hf import HFEngine

    return HFEngine.from_config(
        cfg.model,
        reuse_cache=e.reuse_cache,
        share_prefix=e.share_prefix,
        max_batch=e.max_batch,
        seed=cfg.seed,
    )


ALONE_MEMORY = 0.85  # vLLM alone on the GPU (rollout, eval, annotate)
COLOCATED_MEMORY = 0.3  # beside a trainer: the weights, gradients and optimizer need the rest


def vllm_engine(cfg: EngineSettings, enable_lora: bool = False, colocated: bool = False) -> Engine:
    """vLLM over ``cfg.model``; an adapter folder is served as a LoRA on its base model.
    ``colocated``: it shares the GPU with a trainer (GRPO): a smaller memory share by default
    (TRL's colocate default, 0.3) and sleep mode on CUDA, so the update gets the memory back."""
    from acmrl.engines.vllm import VLLMEngine
    from acmrl.models import adapter_base, resolve_model

    e, where = cfg.engine, Path(resolve_model(cfg.model.name))
    adapter = None
    base = adapter_base(where)  # the one rule, moved run folders included
    if base is not None:
        adapter, where = str(where), Path(resolve_model(base))
    return VLLMEngine(
        str(where),
        dtype=cfg.model.dtype,
        max_model_len=e.max_model_len,
        gpu_memory_utilization=e.gpu_memory_utilization
        or (COLOCATED_MEMORY if colocated else ALONE_MEMORY),
        sleep_mode=colocated and e.vllm_sleep,
        lora_path=adapter,
        enable_lora=enable_lora,
        max_lora_rank=e.max_lora_rank,
        seed=cfg.seed,
    )


def trainer_engine(
    cfg: EngineSettings,
    policy: Callable[[], Any],
    tokenizer: Any,
    served_base: Callable[[], str],
) -> Engine:
    """The engine a GRPO config samples its rollouts from. ``hf``: the model ``policy()``
    returns (the trainer's live parameters, or its merged copy), in this process; ``vllm``: the
    model ``served_base()`` names, on the trainer's GPU (colocated: a smaller memory share and
    sleep mode), the trained adapter loaded by the trainer; ``openai``: the configured servers,
    which the trainer syncs."""
    kind = cfg.engine.kind
    if kind == "vllm":
        base = dataclasses.replace(cfg.model, name=served_base())
        return vllm_engine(dataclasses.replace(cfg, model=base), enable_lora=True, colocated=True)
    if kind in ("openai", "oracle"):
        return make_engine(cfg)  # the oracle is refused there
    from acmrl.engines.hf import HFEngine

    e = cfg.engine
    return HFEngine(
        policy(),
        tokenizer,
        reuse_cache=e.reuse_cache,
        share_prefix=e.share_prefix,
        max_batch=e.max_batch,
        max_sessions=max(64, cfg.concurrency),
        seed=cfg.seed,
    )
