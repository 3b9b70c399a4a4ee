"""The numbers of an eval report, from trajectories: per-arm metrics, intervals, differences.

Everything here is a pure function of trajectory records, so a report can be rebuilt from a
results folder and two folders can be compared without running a model.

Definitions (per arm; an *episode* is one task x sample):

- **Pass@1**: the share of episodes with score >= 1, with a Wilson interval; **pass@k** (k > 1
  samples per task): the unbiased estimator 1 - C(n-c, k) / C(n, k) per task, averaged.
- **Tool calls**: well-formed calls per episode (``answer`` and context tools included);
  **valid-call rate**: the share of policy turns that made at least one well-formed call.
- **Context tokens**: the complete rendered model input of each policy call (system prompt and
  tools included); *mean* averages every call of every episode, *peak* is each episode's largest
  input, averaged over episodes (and its maximum).
- **Compaction Cost** (docs/design.md): per episode, the sum over its compactions, refused edits and
  memory queries of call tokens x output weight + helper tokens + Cache Cost (measured on the
  next input actually sent; docs/rollout.md); also in units of the budget. **Failed edits**:
  context edits that were refused (charged all the same), per episode.
- **Cache reuse**: prompt tokens of policy calls that the engine served from its cache
  (*measured*), and the most any prefix cache could have served (*bound*: the common prefix of each
  call's input with the previous call's input and output), both over all policy prompt tokens.
- **Differences vs react**: absolute and relative, side by side; for Pass@1 a paired bootstrap
  interval over tasks (the arms run the same tasks).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from acmrl.arms import REGISTRY
from acmrl.config import ARMS
from acmrl.context.prefix import reusable_prefix
from acmrl.eval.edits import edit_calls, edit_figures, edit_rows
from acmrl.eval.failures import SUCCESS, Needs, failure_counts, failure_of
from acmrl.rewards import compress_loops
from acmrl.rollout.records import Trajectory, fact_retention


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion.

    >>> [round(x, 3) for x in wilson(8, 10)]
    [0.49, 0.943]
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with ``n`` samples, ``c`` of them correct.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4), pass_at_k(4, 2, 4)
    (0.25, 0.5, 0.0, 1.0)
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _archive_tool(arm: str) -> str | None:
    return REGISTRY[arm].archive_tool if arm in REGISTRY else None


def _policy_steps(t: Trajectory) -> list[Any]:
    return [s for s in t.steps if s.call is not None and s.call.role == "policy"]


def cache_figures(t: Trajectory) -> tuple[int, int, int]:
    """(policy prompt tokens, tokens served from the cache, the most a prefix cache could serve)."""
    prompt = measured = bound = 0
    prev: list[int] | None = None
    for s in _policy_steps(t):
        c = s.call
        prompt += len(c.prompt_ids)
        measured += c.cached_prefix_tokens
        if prev is not None:
            bound += reusable_prefix(prev, c.prompt_ids)
        prev = c.prompt_ids + c.completion_ids
    return prompt, measured, bound


def episode_row(t: Trajectory, budget: int, needs: Needs | None = None) -> dict[str, Any]:
    """Per-episode figures of the report (one line of episodes.csv). ``needs``: what the task
    needs (:func:`acmrl.eval.failures.task_needs`): whether it needs a detail that matters only
    once a later document has said so, and what tells why a failed episode failed; None: not
    known (the archive figure is then left out and a failure is told apart less finely)."""
    m = t.metrics
    steps = _policy_steps(t)
    helpers = [c for s in t.steps for c in s.helper_calls]
    events = [e for s in t.steps for e in s.events]
    prompt, measured, bound = cache_figures(t)
    return {
        "episode_id": t.episode_id,
        "task_id": t.task_id,
        "arm": t.arm,
        "sample": t.sample,
        "status": t.status,
        "score": float(t.score),
        "success": float(t.score >= 1.0),
        "turns": len(steps),
        "valid_turns": sum(bool(s.actions) for s in steps),
        "malformed_calls": int(m.get("malformed_calls", 0)),
        "tool_calls": int(m.get("tool_calls", 0)),
        "mean_context_tokens": float(m.get("mean_context_tokens", 0.0)),
        "peak_context_tokens": int(m.get("peak_context_tokens", 0)),
        "budget": budget,
        "compactions": int(m.get("compactions", 0)),
        "compress_loops": compress_loops(
            {
                "actions": s.actions,
                "events": [{"kind": e.kind, "applied": e.applied} for e in s.events],
            }
            for s in t.steps
        ),
        "failed_edits": sum(not e.applied and e.kind != "query_memory" for e in events),
        "compaction_cost": float(m.get("compaction_cost", 0.0)),
        # what happened to the environment outside the policy (an MCP server restarted)
        "env_incidents": int(m.get("env_incidents", 0)),
        "compaction_at": t.compaction_points(budget),
        "cost_call_tokens": sum(e.call_tokens for e in events),
        "cost_helper_tokens": sum(e.helper_tokens for e in events),
        "cost_cache_tokens": sum(e.cache_cost for e in events),
        "summary_facts_in": sum(e.facts_in for e in events),
        "summary_facts_kept": sum(e.facts_kept for e in events),
        "policy_prompt_tokens": prompt,
        "cached_tokens": measured,
        "reusable_tokens": bound,
        "summariser_calls": sum(c.role == "summariser" for c in helpers),
        "summariser_tokens": sum(
            len(c.prompt_ids) + len(c.completion_ids) for c in helpers if c.role == "summariser"
        ),
        "querier_calls": sum(c.role == "querier" for c in helpers),
        # the policy's calls of its arm's archive tool (query_memory, read_memory)
        "archive_reads": sum(a["name"] == archive for s in steps for a in s.actions)
        if (archive := _archive_tool(t.arm))
        else 0,
        "querier_tokens": sum(
            len(c.prompt_ids) + len(c.completion_ids) for c in helpers if c.role == "querier"
        ),
        # the budget was hit: the episode failed there, or (on_overflow=force_answer) was asked
        # for its answer there
        "overflow": float(t.status == "overflow" or bool(m.get("forced_answer"))),
        "forced_answer": float(bool(m.get("forced_answer"))),
        "forced_compactions": float(m.get("forced_compactions", 0)),
        "wall_s": float(m.get("wall_s", 0.0)),
        "archive_detail": None if needs is None else float(needs.archive_detail),
        "failure": failure_of(t, needs) or SUCCESS,
        # whether the task's needs were known (else a failure is overflow, no_answer or wrong)
        "needs_known": float(needs is not None),
        # the context edits one by one (edits.csv, not episodes.csv) and the policy's calls of
        # the edit tools (acmrl.eval.edits)
        "edits": edit_rows(t),
        "edit_calls": edit_calls(t),
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


@dataclass
class Paired:
    """A difference between an arm and the baseline over the same tasks."""

    diff: float
    low: float
    high: float
    tasks: int


def paired_bootstrap(
    a: dict[str, list[float]],
    b: dict[str, list[float]],
    *,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Paired:
    """Mean(b) - mean(a) over the tasks both have (each task's samples averaged first), with a
    percentile bootstrap interval from resampling tasks.

    >>> p = paired_bootstrap({"t1": [0.0], "t2": [0.0]}, {"t1": [1.0], "t2": [1.0]})
    >>> p.diff, p.low, p.high
    (1.0, 1.0, 1.0)
    """
    tasks = sorted(set(a) & set(b))
    if not tasks:
        return Paired(0.0, 0.0, 0.0, 0)
    d = [sum(b[t]) / len(b[t]) - sum(a[t]) / len(a[t]) for t in tasks]
    rng = random.Random(seed)
    stats = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(resamples))
    lo = stats[int((1 - level) / 2 * resamples)]
    hi = stats[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return Paired(sum(d) / len(d), lo, hi, len(tasks))


@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test of paired successes: ``only_a`` pairs where a succeeded and b failed,
    ``only_b`` the reverse, ``p`` the two-sided exact (binomial) p-value."""

    only_a: int
    only_b: int
    p: float


def mcnemar(a: dict[str, list[float]], b: dict[str, list[float]]) -> McNemar:
    """The exact McNemar test over the keys both have (a score of 1 is a success), one pair per
    key: key the episodes by task and sample (:func:`per_episode`). With several samples per
    task the pairs are not independent; the bootstrap interval, which resamples tasks, is the
    figure to read then. With ``n`` discordant pairs and ``m`` the smaller side,
    ``p = min(1, 2 * sum_{i<=m} C(n, i) / 2**n)``.

    >>> mcnemar({"t1#0": [0.0], "t2#0": [0.0], "t3#0": [1.0]}, {"t1#0": [1.0], "t2#0": [1.0], "t3#0": [1.0]})
    McNemar(only_a=0, only_b=2, p=0.5)
    >>> t = {f"t{i}": [1.0] for i in range(10)}
    >>> mcnemar({k: [0.0] for k in t}, t).p  # 10 of 10 discordant pairs one way: 2 / 1024
    0.001953125
    """
    keys = sorted(set(a) & set(b))
    if any(len(a[k]) != 1 or len(b[k]) != 1 for k in keys):
        raise ValueError("mcnemar pairs one episode per key: key them by task and sample")
    pairs = [(a[k][0], b[k][0]) for k in keys]
    only_a = sum(x >= 1.0 > y for x, y in pairs)
    only_b = sum(y >= 1.0 > x for x, y in pairs)
    n, m = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(m + 1)) / 2**n) if n else 1.0
    return McNemar(only_a, only_b, p)


def sign_flip(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    """The exact two-sided sign-flip (permutation) p-value of ``b - a`` with the task as the
    unit: each key's successes of ``b`` less those of ``a`` (summed over its episodes: the
    runs and samples of one task), and under the null hypothesis each task's difference is as
    likely to be of either sign. Where every key holds one episode per side this is the exact
    McNemar test; over several training seeds it counts each task once, where a McNemar over
    all the seeds' pairs counts a task once per seed as if the pairs were independent. Exact
    for any number of tasks (the sums are integers: their distribution is counted, not
    sampled).

    >>> a = {"t1": [0.0, 0.0], "t2": [0.0, 1.0], "t3": [1.0, 1.0]}
    >>> b = {"t1": [1.0, 1.0], "t2": [1.0, 1.0], "t3": [1.0, 1.0]}
    >>> sign_flip(a, b)  # differences 2 and 1: of the 4 sign patterns, 2 reach |3|
    0.5
    """
    keys = sorted(set(a) & set(b))
    if any(len(a[k]) != len(b[k]) for k in keys):
        raise ValueError("sign_flip pairs the same number of episodes per task on both sides")

    def wins(xs: list[float]) -> int:
        return sum(x >= 1.0 for x in xs)

    signed = [wins(b[k]) - wins(a[k]) for k in keys]
    diffs = [abs(d) for d in signed if d]
    if not diffs:
        return 1.0
    observed = abs(sum(signed))
    counts: dict[int, int] = {0: 1}  # sum of the signed differences -> sign patterns
    for d in diffs:
        nxt: dict[int, int] = {}
        for total, c in counts.items():
            for t in (total + d, total - d):
                nxt[t] = nxt.get(t, 0) + c
        counts = nxt
    return min(1.0, sum(c for t, c in counts.items() if abs(t) >= observed) / 2 ** len(diffs))


def per_episode(rows: list[dict[str, Any]], key: str = "success") -> dict[str, list[float]]:
    """``key`` of each episode row under ``<task_id>#<sample>`` (the pairs of :func:`mcnemar`)."""
    return {f"{r['task_id']}#{r.get('sample', 0)}": [r[key]] for r in rows}


def per_task(rows: list[dict[str, Any]], key: str = "success") -> dict[str, list[float]]:
    """``key`` of each episode row, grouped by ``task_id`` (the pairs of :func:`paired_bootstrap`)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(r[key])
    return out


def arm_summary(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    n = len(rows)
    succ = sum(r["success"] for r in rows)
    lo, hi = wilson(succ, n)
    turns = sum(r["turns"] for r in rows)
    prompt = sum(r["policy_prompt_tokens"] for r in rows)
    by_task = per_task(rows)
    wins = [r for r in rows if r["success"]]
    points = [p for r in rows for p in r.get("compaction_at", [])]
    out: dict[str, Any] = {
        "episodes": n,
        "tasks": len(by_task),
        "pass@1": succ / n if n else 0.0,
        "pass@1_low": lo,
        "pass@1_high": hi,
        "score": _mean(rows, "score"),
        "tool_calls": _mean(rows, "tool_calls"),
        "valid_call_rate": sum(r["valid_turns"] for r in rows) / turns if turns else 0.0,
        "malformed_per_episode": _mean(rows, "malformed_calls"),
        "turns": _mean(rows, "turns"),
        "mean_context_tokens": _mean(rows, "mean_context_tokens"),
        "peak_context_tokens": _mean(rows, "peak_context_tokens"),
        "max_peak_context_tokens": max((r["peak_context_tokens"] for r in rows), default=0),
        "budget": max((r["budget"] for r in rows), default=0),
        "compactions": _mean(rows, "compactions"),
        "compress_loops": sum(r.get("compress_loops", 0) for r in rows) / n if n else 0.0,
        "failed_edits": sum(r.get("failed_edits", 0) for r in rows) / n if n else 0.0,
        "compaction_cost": _mean(rows, "compaction_cost"),
        "env_incidents": sum(bool(r.get("env_incidents")) for r in rows),
        "compaction_cost_budget": sum(r["compaction_cost"] / r["budget"] for r in rows) / n
        if n
        else 0.0,
        # what a success costs, and where the arm compacts (context before / budget): the
        # timing GRPO is meant to shape (the same figures as its rollout/* metrics)
        "compaction_cost_per_success": sum(r["compaction_cost"] for r in wins) / len(wins)
        if wins
        else 0.0,
        "compaction_point": sum(points) / len(points) if points else 0.0,
        # of the task's key terms that a summary replaced, the share it kept (None: no summary
        # had to keep one); the counts over all the arm's summaries
        "summary_facts_in": sum(r.get("summary_facts_in", 0) for r in rows),
        "summary_facts_kept": sum(r.get("summary_facts_kept", 0) for r in rows),
        "fact_retention": fact_retention(rows),
        "cache_reuse": sum(r["cached_tokens"] for r in rows) / prompt if prompt else 0.0,
        "cache_reuse_bound": sum(r["reusable_tokens"] for r in rows) / prompt if prompt else 0.0,
        "summariser_calls": _mean(rows, "summariser_calls"),
        "summariser_tokens": _mean(rows, "summariser_tokens"),
        "querier_calls": _mean(rows, "querier_calls"),
        "querier_tokens": _mean(rows, "querier_tokens"),
        "overflow": _mean(rows, "overflow"),
        "wall_s": _mean(rows, "wall_s"),
    }
    out |= archive_detail_figures(rows)
    if edits := edit_figures(rows):
        out["edits"] = edits
    if failures := failure_counts(rows):
        out["failures"] = failures
        out["failures_needs_unknown"] = sum(
            r.get("failure") not in (SUCCESS, None) and not r.get("needs_known", 1.0) for r in rows
        )
    if k > 1:
        samples = [(len(v), int(sum(v))) for v in by_task.values()]
        out[f"pass@{k}"] = sum(pass_at_k(n_, c, k) for n_, c in samples) / len(samples)
    return out


def archive_detail_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """On the tasks that need an archived detail (``archive_detail``): how many, the share of
    their episodes that asked the archive (called the arm's archive tool: ``query_memory`` in
    acm, ``read_memory`` in memory; rows written before that count was kept: a querier call),
    and Pass@1 of the episodes that did and of those that did not. Empty when no task is known
    to need one.

    >>> rows = [{"archive_detail": 1.0, "archive_reads": 1, "success": 1.0},
    ...         {"archive_detail": 1.0, "archive_reads": 0, "success": 0.0},
    ...         {"archive_detail": 0.0, "archive_reads": 0, "success": 1.0}]
    >>> archive_detail_figures(rows)["archive_queried"], archive_detail_figures(rows)["archive_pass_queried"]
    (0.5, 1.0)
    """
    need = [r for r in rows if r.get("archive_detail")]
    if not need:
        return {}

    def reads(r: dict[str, Any]) -> float:
        return float(r.get("archive_reads", r.get("querier_calls")) or 0)

    asked = [r for r in need if reads(r) > 0]
    other = [r for r in need if reads(r) == 0]

    def rate(rs: list[dict[str, Any]]) -> float | None:
        return sum(float(r["success"]) for r in rs) / len(rs) if rs else None

    return {
        "archive_episodes": len(need),
        "archive_queried": len(asked) / len(need),
        "archive_pass_queried": rate(asked),
        "archive_pass_unqueried": rate(other),
        "archive_pass": rate(need),
    }


def _rel(new: float, base: float) -> float | None:
    return None if abs(base) < 1e-12 else (new - base) / base


def build_report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Per-arm summaries, differences against ``react`` and the reading notes."""
    k = int(meta.get("samples", 1))
    arms = sorted({r["arm"] for r in rows}, key=lambda a: ARMS.index(a) if a in ARMS else 99)
    per_arm = {a: [r for r in rows if r["arm"] == a] for a in arms}
    summary = {a: arm_summary(per_arm[a], k) for a in arms}
    diffs: dict[str, Any] = {}
    if "react" in summary:
        base = summary["react"]
        for a in arms:
            if a == "react":
                continue
            s = summary[a]
            paired = paired_bootstrap(per_task(per_arm["react"]), per_task(per_arm[a]))
            exact = mcnemar(per_episode(per_arm["react"]), per_episode(per_arm[a]))
            diffs[a] = {
                "pass@1_abs": s["pass@1"] - base["pass@1"],
                "pass@1_rel": _rel(s["pass@1"], base["pass@1"]),
                "pass@1_paired_low": paired.low,
                "pass@1_paired_high": paired.high,
                "paired_tasks": paired.tasks,
                "pass@1_mcnemar_p": exact.p,
                "only_react": exact.only_a,
                "only_arm": exact.only_b,
                "tool_calls_abs": s["tool_calls"] - base["tool_calls"],
                "tool_calls_rel": _rel(s["tool_calls"], base["tool_calls"]),
                "peak_abs": s["peak_context_tokens"] - base["peak_context_tokens"],
                "peak_rel": _rel(s["peak_context_tokens"], base["peak_context_tokens"]),
            }
    report = {"meta": meta, "arms": summary, "vs_react": diffs}
    report["notes"] = reading_notes(report)
    return report


def reading_notes(report: dict[str, Any]) -> list[str]:
    """Plain sentences that keep a reader from the misreadings that the ACM write-up's audit of
    its paper's Table 2 found (docs/design.md)."""
    notes = []
    arms, diffs = report["arms"], report["vs_react"]
    base = arms.get("react")
    for a, d in diffs.items():
        lo, hi = d["pass@1_paired_low"], d["pass@1_paired_high"]
        sig = "excludes" if lo > 0 or hi < 0 else "includes"
        exact = (
            f"; exact McNemar p = {d['pass@1_mcnemar_p']:.3g} ({d['only_arm']} episodes solved "
            f"by {a} alone, {d['only_react']} by react alone)"
            if "pass@1_mcnemar_p" in d
            else ""
        )
        notes.append(
            f"{a} vs react: Pass@1 {d['pass@1_abs']:+.3f} absolute; the paired 95% interval over "
            f"{d['paired_tasks']} tasks is [{lo:+.3f}, {hi:+.3f}] and {sig} 0{exact}."
        )
        if base is not None and base["pass@1"] < 0.3 and d["pass@1_rel"] is not None:
            notes.append(
                f"{a}: the relative gain ({d['pass@1_rel']:+.0%}) is on a react Pass@1 of "
                f"{base['pass@1']:.3f}; read the absolute difference."
            )
        if base is not None and d["peak_abs"] > 0:
            notes.append(
                f"{a} raises the mean peak context by {d['peak_abs']:+.0f} tokens over react: "
                "context tools do not lower peak tokens here."
            )
        s = arms[a]
        if base is not None and s["overflow"] < base["overflow"] and d["peak_abs"] < 0:
            notes.append(
                f"{a} overflows less than react ({s['overflow']:.2f} vs {base['overflow']:.2f}); "
                "overflowed episodes stop at the budget, so peak tokens compare runs of "
                "different lengths."
            )
    for a, s in arms.items():
        if s.get("env_incidents"):
            notes.append(
                f"{a}: {s['env_incidents']} episode(s) went through a tool-server restart "
                "(`env_incidents` in episodes.csv); their outcome may be the tools', not the "
                "policy's."
            )
        if s["overflow"] > 0:
            notes.append(
                f"{a} overflowed in {s['overflow']:.0%} of episodes. An overflowing input is never "
                "sent, so its peak counts only the inputs before it: peak tokens understate "
                "what the arm would have needed."
            )
    kept = [a for a, s in arms.items() if s.get("fact_retention") is not None]
    if kept:
        notes.append(
            "Facts kept by summaries and evolve programs: of the task's key terms (`key_terms` "
            "of the environment; kb_search: the chain's names, the birth year, the event and the "
            "documents to read) that were in the steps a summary replaced and nowhere else in the "
            "context, or in the State an applied program edited, how many the edit kept: "
            + ", ".join(f"{a} {arms[a]['fact_retention']:.2f}" for a in kept)
            + ". A needed fact a summary drops can only come back by reading it again."
        )
    small = [a for a, s in arms.items() if s["episodes"] < 30]
    if small:
        widths = ", ".join(
            f"{a} [{arms[a]['pass@1_low']:.2f}, {arms[a]['pass@1_high']:.2f}]" for a in small
        )
        notes.append(f"Fewer than 30 episodes per arm: the Pass@1 intervals are wide ({widths}).")
    return notes


def rows_from(
    trajectories: Iterable[Trajectory], budget_of: Any, needs: dict[str, Needs] | None = None
) -> list[dict[str, Any]]:
    """The episodes' rows; ``needs``: what each task needs, by task id
    (:func:`acmrl.eval.failures.task_needs`; None: not known, e.g. the environment could not be
    loaded)."""
    return [
        episode_row(t, budget_of(t), None if needs is None else needs.get(t.task_id))
        for t in trajectories
    ]
