"""The LLM judge of ``env.judge`` on any engine.

The ``judge`` metric (the default of corpus_qa's ``browsecomp-plus`` preset, as BrowseComp-Plus
and the ACM reference grade) asks a model whether an answer gives the reference's answer
(:data:`acmrl.envs.scoring.JUDGE_PROMPT`, one greedy reply, parsed by
:func:`acmrl.envs.scoring.parse_verdict`). The model runs with transformers in this process, or
on OpenAI-compatible servers (``env.judge.base_urls``). Every command builds its environment
with the judge through :func:`acmrl.rollout.environment.build_environment`.
"""

from __future__ import annotations

import itertools
from typing import Any

from acmrl.config import JudgeConfig, ModelConfig
from acmrl.engines.base import Engine, Request
from acmrl.envs.scoring import Judge, llm_judge


def judge_engine(cfg: JudgeConfig) -> tuple[Engine, Any]:
    """The judge's engine and tokenizer."""
    from acmrl.models import load_tokenizer

    assert cfg.model is not None
    if cfg.base_urls:
        from acmrl.engines.openai import OpenAIEngine

        tok = load_tokenizer(cfg.model)
        return OpenAIEngine(cfg.base_urls, cfg.served_model or cfg.model, tok), tok
    from acmrl.engines.hf import HFEngine

    engine = HFEngine.from_config(ModelConfig(name=cfg.model), reuse_cache=False)
    return engine, engine.tokenizer


def make_judge(cfg: JudgeConfig) -> Judge | None:
    """A judge from ``cfg``, or None when no judge model is set."""
    if cfg.model is None:
        return None
    engine, tok = judge_engine(cfg)
    ids = itertools.count()

    def complete(prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        prompt_ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        session = f"judge-{next(ids)}"
        (out,) = engine.generate([Request(session, list(prompt_ids), max_tokens=cfg.max_tokens)])
        engine.release(session)
        return out.text

    return llm_judge(complete)
