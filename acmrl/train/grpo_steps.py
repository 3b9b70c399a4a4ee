"""What one GRPO step samples and measures: its tasks, its groups of episodes, and the
rollout figures logged per step (reward terms, success, compactions, where the policy compacts
and what a success costs). :mod:`acmrl.train.grpo` trains on them."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Container
from typing import Any

import torch

from acmrl.config import GRPOConfig
from acmrl.envs import Environment
from acmrl.envs.base import Task
from acmrl.eval.edits import edit_calls, edit_figures, edit_rows
from acmrl.rewards import RewardWeights
from acmrl.rollout.agent import Episode, make_episode
from acmrl.rollout.records import Trajectory, fact_retention
from acmrl.rollout.worker import episode_id


def step_tasks(tasks: list[Task], step: int, cfg: GRPOConfig) -> list[Task]:
    """The tasks of GRPO step ``step`` (0-based): consecutive slices of per-epoch shuffles."""
    n = len(tasks)
    out = []
    for pos in range(step * cfg.tasks_per_step, (step + 1) * cfg.tasks_per_step):
        epoch, i = divmod(pos, n)
        order = list(range(n))
        random.Random(cfg.seed * 1_000_003 + epoch).shuffle(order)
        out.append(tasks[order[i]])
    return out


def branching_groups(cfg: GRPOConfig, n_tasks: int, step: int) -> set[tuple[int, str]]:
    """The groups (task index in the step, arm) of step ``step`` that branch at a decision
    (:mod:`acmrl.train.decisions`), drawn over the whole step (before its tasks are split
    between processes) with a seed of the run's seed and the step: ``decisions.share`` of them,
    the fraction of a group drawn as a coin, so the share holds on average even where a step has
    one group."""
    groups = [(k, arm) for k in range(n_tasks) for arm in cfg.arms]
    rng = random.Random(cfg.seed * 1_000_003 + 7919 * step)
    whole, part = divmod(cfg.decisions.share * len(groups), 1.0)
    n = min(len(groups), int(whole) + (rng.random() < part))
    return set(rng.sample(groups, n))


def step_episodes(
    cfg: GRPOConfig,
    env: Environment,
    tasks: list[Task],
    step: int,
    tokenizer: Any,
    sources: Container[tuple[int, str]] = (),
) -> list[Episode]:
    """The step's whole episodes: ``group_size`` per task and arm, and one (the source of its
    branches) for the groups in ``sources``."""
    episodes = []
    for k, task in enumerate(tasks):
        for arm in cfg.arms:
            for g in range(1 if (k, arm) in sources else cfg.group_size):
                # k tells apart a task drawn twice in one step (a split smaller than the step)
                eid = f"s{step + 1}/{k}/" + episode_id(task.id, arm, g)
                episodes.append(
                    make_episode(
                        cfg, eid, env, task, arm, g, tokenizer, sample_helpers=cfg.train_helpers
                    )
                )
    return episodes


def segment_coefficients(targets: list[int], aggregation: str, segment_weight: str) -> list[float]:
    """The loss weight of each target token of one episode's segments (its samples, with
    ``targets[i]`` target tokens in segment ``i``): the segment's weight (1, or 1 / the number of
    segments under ``segment_weight=inverse``), divided under ``aggregation=segment`` by the
    segment's targets, so that its tokens sum to that weight. The loss is the weighted mean of
    the step's target tokens under these weights; with token aggregation and weight one (the
    default) every target token counts once, as in DAPO / Dr. GRPO.

    >>> segment_coefficients([10, 30], "token", "one")
    [1.0, 1.0]
    >>> segment_coefficients([10, 30], "segment", "inverse")
    [0.05, 0.016666666666666666]
    """
    w = 1.0 / max(1, len(targets)) if segment_weight == "inverse" else 1.0
    if aggregation == "segment":
        return [w / max(1, n) for n in targets]
    return [w] * len(targets)


def group_key(ep_id: str) -> str:
    """Episodes ``s3/0/task#arm#g`` of one group share ``s3/0/task#arm`` (and so do the branches
    ``s3/0/task#arm#b1`` of a decision group)."""
    return ep_id.rsplit("#", 1)[0]


def episode_facts(traj: Trajectory, reward: float, terms: dict[str, float]) -> dict[str, Any]:
    """What the step's metrics need of one episode: small enough to gather from every process."""
    m = traj.metrics
    return {
        "reward": reward,
        "terms": terms,
        "score": traj.score,
        "status": traj.status,
        "metrics": {
            k: m.get(k, 0)
            for k in (
                "peak_context_tokens",
                "compactions",
                "tool_calls",
                "prompt_tokens",
                "reused_tokens",
                "compaction_cost",
                "summary_facts_in",
                "summary_facts_kept",
            )
        },
        # where the policy compacts (context before / budget)
        "points": traj.compaction_points(),
        # its context edits, one by one, and the edit calls that did not run (acmrl.eval.edits)
        "edits": [{k: e[k] for k in _EDIT_KEYS} for e in edit_rows(traj)],
        "edit_calls": edit_calls(traj),
    }


_EDIT_KEYS = (
    "kind",
    "applied",
    "refusal",
    "generated",
    "cache_cost",
    "kept_prefix",
    "tokens_before",
    "tokens_after",
    "facts_in",
    "facts_kept",
)


def reward_weights(cfg: GRPOConfig) -> RewardWeights:
    """The reward weights of a GRPO config (its ``reward:`` section)."""
    return RewardWeights(
        **{f.name: getattr(cfg.reward, f.name) for f in dataclasses.fields(RewardWeights)}
    )


def rollout_metrics(facts: list[dict[str, Any]]) -> dict[str, float]:
    """Reward, success, context and compaction figures of a step's episodes (all processes')."""
    n = max(1, len(facts))
    terms = [f["terms"] for f in facts]
    rewards = [f["reward"] for f in facts]
    out = {f"reward/{k}": sum(t[k] for t in terms) / n for k in (terms[0] if terms else {})}
    out["reward/mean"] = sum(rewards) / n
    out["reward/std"] = float(torch.tensor(rewards or [0.0]).std(unbiased=False))

    def mean(key: str) -> float:
        return sum(f["metrics"][key] for f in facts) / n

    prompt = sum(f["metrics"]["prompt_tokens"] for f in facts)
    out |= {
        "rollout/success": sum(f["score"] >= 1.0 for f in facts) / n,
        "rollout/score": sum(f["score"] for f in facts) / n,
        "rollout/peak_context_tokens": mean("peak_context_tokens"),
        "rollout/compactions": mean("compactions"),
        "rollout/tool_calls": mean("tool_calls"),
        "rollout/overflow": sum(f["status"] == "overflow" for f in facts) / n,
        "rollout/cache_reuse": sum(f["metrics"]["reused_tokens"] for f in facts) / max(1, prompt),
    }
    # where the policy compacts and what a success costs: the timing GRPO is meant to shape
    points = [p for f in facts for p in f["points"]]
    wins = [f for f in facts if f["score"] >= 1.0]
    out["rollout/compaction_point"] = sum(points) / len(points) if points else float("nan")
    out["rollout/compaction_cost_per_success"] = (
        sum(f["metrics"]["compaction_cost"] for f in wins) / len(wins) if wins else float("nan")
    )
    # how well the summaries and evolve programs of the step kept the task's needed facts
    kept = fact_retention([f["metrics"] for f in facts])
    out["rollout/fact_retention"] = float("nan") if kept is None else kept
    # per kind of context edit: the valid rate (an evolve program's), and per edit the tokens
    # generated, the Cache Cost and the share of the prefix kept: what GRPO shapes in the programs
    nan = float("nan")
    for kind, f in edit_figures(facts).items():
        for key, value in (
            ("valid_rate", f["valid_rate"]),
            ("effective_rate", f["effective_rate"]),
            ("generated", f["generated_mean"]),
            ("cache_cost", f["cache_cost_mean"]),
            ("kept_prefix", f["kept_prefix_mean"]),
        ):
            out[f"rollout/{kind}/{key}"] = nan if value is None else value
    out["rollout/episodes"] = len(facts)
    return out
