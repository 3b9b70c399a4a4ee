"""Pure reward functions: task success, compaction cost, penalties, and their combination.

The trainer optimises *when and how* to compact: reward = success - cost terms. Every term is a
small typed function of plain numbers or trajectory records (JSON dicts as written by the
rollout), so it can be unit-tested by hand and logged separately; the weights live in the config.

>>> terms = reward_terms(score=1.0, events=[{"kind": "manage_context", "compaction_cost": 300.0,
...     "applied": True}], budget=2048, malformed_calls=1, steps=[])
>>> round(terms["compaction_cost"], 4), terms["malformed"], terms["compress_loops"]
(0.1465, 1.0, 0.0)
>>> round(combine(terms, RewardWeights()), 4)  # 1 - 0.1 * 300/2048 - 0.01 * 1 - 0.05 * 0
0.9754

Resource use (the Self-Evolving Agents write-up, docs/design.md: "reward the model for both task
performance and total resource use") is an optional term, off by default: the episode's uncached
input tokens plus its generated tokens at the output weight, in units of the budget.

>>> round(resource_use(uncached_input=1500, generated=200, output_weight=4.0, budget=2048), 4)
1.123
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

COMPACTIONS = ("manage_context", "evolve", "summary", "memory", "mask")


@dataclass(frozen=True)
class RewardWeights:
    """reward = success * w_success - each cost term * its weight (compaction cost, malformed
    calls, compress loops, failed edits, resource use)."""

    success: float = 1.0
    compaction_cost: float = 0.1
    malformed: float = 0.01
    compress_loops: float = 0.05
    failed_edits: float = 0.01
    resource_use: float = 0.0


def task_success(score: float, threshold: float | None = None) -> float:
    """The environment's score in [0, 1]; with ``threshold``, 1.0 at or above it, else 0.0.

    >>> task_success(0.5), task_success(0.5, threshold=1.0), task_success(1.0, threshold=1.0)
    (0.5, 0.0, 1.0)
    """
    if threshold is None:
        return float(score)
    return 1.0 if score >= threshold else 0.0


def compaction_cost(events: Iterable[Mapping[str, Any]], budget: int) -> float:
    """Sum of the episode's Compaction Costs (docs/design.md: call tokens x output weight + Cache
    Cost, helper tokens included), in units of the context budget. ``query_memory`` events count
    too: the querier's tokens are a cost of managing context.

    >>> compaction_cost([{"compaction_cost": 512.0}, {"compaction_cost": 512.0}], budget=2048)
    0.5
    """
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    return sum(float(e["compaction_cost"]) for e in events) / budget


def compaction_points(events: Iterable[Mapping[str, Any]], budget: int) -> list[float]:
    """Where an episode compacted: the context before each applied compaction (not a refused
    one, not a ``query_memory`` lookup) as a share of the budget; none without a budget. The
    timing GRPO is meant to shape; every report reads it here.

    >>> compaction_points([{"kind": "manage_context", "tokens_before": 650},
    ...     {"kind": "query_memory", "tokens_before": 700},
    ...     {"kind": "evolve", "tokens_before": 900, "applied": False}], budget=1000)
    [0.65]
    """
    if not budget:
        return []
    return [
        float(e["tokens_before"]) / budget
        for e in events
        if e.get("kind") in COMPACTIONS and e.get("applied", True)
    ]


def compress_loops(steps: Iterable[Mapping[str, Any]]) -> int:
    """Compactions that follow another compaction with no environment call in between.

    ``steps`` are trajectory steps as dicts (``actions``: the calls, ``events``: context events).

    >>> mc = {"actions": [{"name": "manage_context"}], "events": [{"kind": "manage_context"}]}
    >>> search = {"actions": [{"name": "search"}], "events": []}
    >>> compress_loops([mc, mc, search, mc])
    1
    """
    loops, compacted = 0, False
    for step in steps:
        for event in step.get("events", []):
            if event.get("kind") in COMPACTIONS and event.get("applied", True):
                loops += compacted
                compacted = True
        names = [a.get("name") for a in step.get("actions", [])]
        if any(n not in (*COMPACTIONS, "query_memory") for n in names):
            compacted = False  # progress: the agent did something in the world
    return loops


def failed_edits(events: Iterable[Mapping[str, Any]]) -> int:
    """Context edits that were refused (an ``evolve`` whose code failed or whose result was
    invalid): charged their tokens like any edit, and counted here.

    >>> failed_edits([{"kind": "evolve", "applied": False}, {"kind": "evolve", "applied": True}])
    1
    """
    return sum(e.get("kind") != "query_memory" and not e.get("applied", True) for e in events)


def resource_use(uncached_input: int, generated: int, output_weight: float, budget: int) -> float:
    """(uncached input tokens + generated tokens x output weight) / budget."""
    if budget <= 0:
        raise ValueError(f"budget must be > 0, got {budget}")
    return (uncached_input + generated * output_weight) / budget


def reward_terms(
    *,
    score: float,
    events: Iterable[Mapping[str, Any]],
    budget: int,
    malformed_calls: int,
    steps: Iterable[Mapping[str, Any]],
    success_threshold: float | None = None,
    uncached_input: int = 0,
    generated: int = 0,
    output_weight: float = 1.0,
) -> dict[str, float]:
    """Every term, unweighted, for logging; :func:`combine` weighs them."""
    events = list(events)
    return {
        "success": task_success(score, success_threshold),
        "compaction_cost": compaction_cost(events, budget),
        "malformed": float(malformed_calls),
        "compress_loops": float(compress_loops(steps)),
        "failed_edits": float(failed_edits(events)),
        "resource_use": resource_use(uncached_input, generated, output_weight, budget),
    }


def combine(terms: Mapping[str, float], weights: RewardWeights) -> float:
    """The scalar reward: success minus the weighted costs.

    >>> combine({"success": 1.0, "compaction_cost": 0.5, "malformed": 2.0, "compress_loops": 0.0,
    ...          "failed_edits": 0.0, "resource_use": 3.0},
    ...         RewardWeights(compaction_cost=0.2, malformed=0.05))
    0.8
    """
    w = asdict(weights)
    return w["success"] * terms["success"] - sum(w[k] * terms[k] for k in w if k != "success")


def trajectory_reward(
    traj: Mapping[str, Any],
    budget: int,
    weights: RewardWeights,
    success_threshold: float | None = None,
    output_weight: float = 1.0,
) -> tuple[float, dict[str, float]]:
    """Reward and terms of one trajectory dict (``Trajectory.to_dict()``)."""
    steps = traj.get("steps", [])
    metrics = traj.get("metrics", {})
    terms = reward_terms(
        score=float(traj.get("score", 0.0)),
        events=[e for s in steps for e in s.get("events", [])],
        budget=budget,
        malformed_calls=int(metrics.get("malformed_calls", 0)),
        steps=steps,
        success_threshold=success_threshold,
        uncached_input=int(metrics.get("uncached_input_tokens", 0)),
        generated=int(metrics.get("generated_tokens", 0)),
        output_weight=output_weight,
    )
    return combine(terms, weights), terms
