"""The environment a config names, built the same way for every command.

Eval, rollout, annotate, audit, export's card and GRPO all build their tasks through
:func:`build_environment`, so they score alike: with the environment's metric, or with the LLM
judge of ``env.judge`` (:mod:`acmrl.rollout.judge`) when one is configured.
"""

from __future__ import annotations

from acmrl.config import EnvConfig
from acmrl.envs import load
from acmrl.envs.base import Environment
from acmrl.rollout import judge


def build_environment(cfg: EnvConfig) -> Environment:
    """``cfg``'s environment, scoring with its judge when one is configured."""
    scorer = judge.make_judge(cfg.judge)
    return load(cfg.name, **cfg.options, **({"judge": scorer} if scorer else {}))
