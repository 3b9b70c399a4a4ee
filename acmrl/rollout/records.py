"""What a rollout records: every model call, every step, every context event, per episode.

A :class:`Trajectory` is one JSON line of a rollout file. It holds everything the teacher, the
rewards and the trainer need: the exact token ids of each model call (prompt as the engine saw it,
completion, logprobs, the prefix the engine reused), the parsed actions and observations, the
context events with the cost figures of docs/design.md, the final answer and status, and metrics.
Token origin is explicit: completion ids of ``policy`` calls are the policy's tokens, teacher
edits are marked ``teacher``, everything else in a prompt came from the environment or harness.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from acmrl.context.prefix import reusable_prefix
from acmrl.rewards import compaction_points

STATUSES = ("answered", "overflow", "max_turns", "error")
ROLES = ("policy", "summariser", "querier", "teacher")


@dataclass
class ModelCall:
    role: str  # policy | summariser | querier | teacher
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    cached_prefix_tokens: int
    finish_reason: str
    wall_s: float


@dataclass
class ContextEvent:
    """One compaction or memory operation, with the figures of docs/design.md "Costs"."""

    kind: str  # manage_context | query_memory | summary | evolve | memory | mask
    tokens_before: int
    tokens_after: int
    reusable_prefix: int
    cache_cost: int
    call_tokens: int  # generated tokens of the call itself
    helper_tokens: int  # summariser / querier tokens (prompt + completion)
    compaction_cost: float
    applied: bool = True
    summary_id: str | None = None
    detail: str = ""
    # an edit's needed facts (the task's key terms): those in the steps a summary replaced and
    # not elsewhere in the context, or in the State an evolve program edited, or in the results
    # a mask took out and not in the task, and how many of them it kept (:func:`terms_kept`; a
    # mask keeps those the policy's own words still hold)
    facts_in: int = 0
    facts_kept: int = 0
    helper_generated: int = 0  # of ``helper_tokens``, the ones the helper generated


def _has(term: str, text: str) -> bool:
    words = [re.escape(w) for w in term.split()]
    pattern = r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)"
    return bool(words) and re.search(pattern, text, re.IGNORECASE) is not None


def terms_kept(terms: list[str], steps: str, summary: str, context: str = "") -> tuple[int, int]:
    """How many of ``terms`` a summary had to keep, and how many it kept: those that occur in
    the ``steps`` it replaces but nowhere in the ``context`` that stays (the task, earlier
    summaries), and of those, the ones ``summary`` has. Whole words, any case, any spacing.

    >>> steps = "call open(kb-00030) result: Volis Wiox was born in 1971."
    >>> terms_kept(["Volis Wiox", "1971", "kb-00030", "kb-00097"], steps, "- Born in 1971.",
    ...            context="Where was Volis Wiox born?")
    (2, 1)
    """
    needed = [t for t in terms if _has(t, steps) and not _has(t, context)]
    return len(needed), sum(_has(t, summary) for t in needed)


def fact_retention(rows: list[dict[str, Any]]) -> float | None:
    """Of the needed facts (the task's key terms) in the steps the rows' summaries replaced, the
    share the summaries kept; None when no summary had one to keep.

    >>> fact_retention([{"summary_facts_in": 3, "summary_facts_kept": 2},
    ...                 {"summary_facts_in": 1, "summary_facts_kept": 1}])
    0.75
    >>> fact_retention([{"summary_facts_in": 0, "summary_facts_kept": 0}]) is None
    True
    """
    n_in = sum(r.get("summary_facts_in", 0) for r in rows)
    return sum(r.get("summary_facts_kept", 0) for r in rows) / n_in if n_in else None


@dataclass
class Step:
    turn: int
    call: ModelCall | None  # the policy call of this step (None for harness-only steps)
    text: str = ""  # the completion's text
    actions: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "arguments"}]
    errors: list[str] = field(default_factory=list)  # malformed calls, as the agent saw them
    observations: list[str] = field(default_factory=list)
    events: list[ContextEvent] = field(default_factory=list)
    helper_calls: list[ModelCall] = field(default_factory=list)  # summariser / querier calls
    origin: str = "policy"  # policy | teacher | harness (the summary monitor)


@dataclass
class Trajectory:
    episode_id: str
    task_id: str
    env: str
    arm: str
    sample: int
    seed: int
    model: str
    prompt: str
    reference: str | list[str]
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    status: str = "error"
    score: float = 0.0
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    final_state: list[dict[str, Any]] = field(default_factory=list)
    edit: dict[str, Any] | None = (
        None  # provenance of a teacher edit (step, kind, rationale, teacher)
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        steps = []
        for s in data.get("steps", []):
            s = dict(s)
            s["call"] = ModelCall(**s["call"]) if s.get("call") else None
            s["events"] = [ContextEvent(**e) for e in s.get("events", [])]
            s["helper_calls"] = [ModelCall(**c) for c in s.get("helper_calls", [])]
            steps.append(Step(**s))
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "steps": steps})

    def policy_calls(self) -> list[ModelCall]:
        return [s.call for s in self.steps if s.call is not None and s.call.role == "policy"]

    def compaction_points(self, budget: int | None = None) -> list[float]:
        """:func:`acmrl.rewards.compaction_points` of this episode, over ``budget`` or else
        ``metrics["budget"]``."""
        events = (
            {"kind": e.kind, "tokens_before": e.tokens_before, "applied": e.applied}
            for s in self.steps
            for e in s.events
        )
        return compaction_points(events, budget or self.metrics.get("budget") or 0)

    def compute_metrics(self) -> dict[str, Any]:
        calls = self.policy_calls()
        helpers = [c for s in self.steps for c in s.helper_calls]
        events = [e for s in self.steps for e in s.events]
        self.metrics = {
            "turns": len(self.steps),
            "peak_context_tokens": max((len(c.prompt_ids) for c in calls), default=0),
            "mean_context_tokens": (sum(len(c.prompt_ids) for c in calls) / len(calls))
            if calls
            else 0.0,
            "tool_calls": sum(len(s.actions) for s in self.steps),
            "malformed_calls": sum(len(s.errors) for s in self.steps),
            "compactions": sum(e.applied and e.kind != "query_memory" for e in events),
            "failed_edits": sum(not e.applied and e.kind != "query_memory" for e in events),
            "summariser_calls": sum(c.role == "summariser" for c in helpers),
            "querier_calls": sum(c.role == "querier" for c in helpers),
            "policy_tokens": sum(len(c.completion_ids) for c in calls),
            "prompt_tokens": sum(len(c.prompt_ids) for c in calls + helpers),
            "reused_tokens": sum(c.cached_prefix_tokens for c in calls + helpers),
            "total_tokens": sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls + helpers),
            "uncached_input_tokens": uncached_input_tokens(self.steps),
            "generated_tokens": sum(len(c.completion_ids) for c in calls + helpers),
            "compaction_cost": sum(e.compaction_cost for e in events),
            "cache_cost": sum(e.cache_cost for e in events),
            "summary_facts_in": sum(e.facts_in for e in events),
            "summary_facts_kept": sum(e.facts_kept for e in events),
            "wall_s": self.metrics.get("wall_s", 0.0),  # set by the worker: batches share calls
            "budget": self.metrics.get("budget", 0),  # set by the episode
        }
        return self.metrics


def uncached_input_tokens(steps: list[Step]) -> int:
    """Input tokens an exact-prefix cache could not reuse, summed over every model call of an
    episode: each call's prompt minus the prefix it shares with the previous call of the same
    session (the policy's, the summariser's or the querier's) and that call's completion. The
    model-independent bound (docs/design.md), whatever the engine reported."""
    last: dict[str, list[int]] = {}
    total = 0
    for step in steps:
        for call in ([step.call] if step.call else []) + list(step.helper_calls):
            session = "policy" if call.role in ("policy", "teacher") else call.role
            prev = last.get(session, [])
            total += len(call.prompt_ids) - reusable_prefix(prev, call.prompt_ids)
            last[session] = call.prompt_ids + call.completion_ids
    return total
