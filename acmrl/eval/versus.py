"""A trained policy against the policy it started from, on the same held-out tasks.

``versus_start(start, trained, reward)`` reads two ``acmrl eval`` folders and writes what a
GRPO run is meant to change, per arm they share: Pass@1 and the mean reward (the run's own
reward weights, applied to the held-out episodes), each with a paired bootstrap interval over
the tasks both evaluated; the Compaction Cost per successful episode with its relative change;
the mean compaction point (context before / budget) of both; the kept prefix per applied
context edit (the share of the prefix cache it kept, :mod:`acmrl.eval.edits`; the arm's kinds
of edit pooled) of both, with their difference paired over the tasks both edited (each task's
episodes averaged first) and its bootstrap interval; and, where the episodes recorded it, the
share of needed facts their summaries kept. A last line says whether the
run met the bar that a claim of learned compaction must meet: reward up, Compaction Cost per
success down by at least ``cost_drop``, at equal or better Pass@1 (read as: no significant
drop, i.e. the paired interval of trained - start reaches 0 or above).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acmrl.eval.edits import EDIT_KINDS
from acmrl.eval.report import mcnemar, paired_bootstrap, per_episode, per_task
from acmrl.rewards import RewardWeights, compaction_points, trajectory_reward
from acmrl.rollout.records import fact_retention


def _episodes(folder: Path) -> list[dict[str, Any]]:
    """The folder's episodes its report covers (``reported_ids``: not those of an earlier plan
    that stay in ``episodes.jsonl``); ``episodes.jsonl.gz`` where the file was kept so."""
    from acmrl.eval.run import reported_ids

    path = folder / "episodes.jsonl"
    if path.is_file():
        text = path.read_text()
    elif (folder / "episodes.jsonl.gz").is_file():  # as scripts/keep_results.py keeps it
        text = gzip.decompress((folder / "episodes.jsonl.gz").read_bytes()).decode()
    else:
        raise ValueError(f"{folder} has no episodes.jsonl: give a folder acmrl eval wrote")
    ids = reported_ids(folder)
    out = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [t for t in out if ids is None or t["episode_id"] in ids]


def episode_figures(
    traj: dict[str, Any], weights: RewardWeights, output_weight: float = 1.0
) -> dict[str, Any]:
    """Success, reward, Compaction Cost, compaction points and the summaries' needed facts
    (in / kept) of one trajectory dict."""
    m = traj.get("metrics", {})
    budget = int(m.get("budget") or 0)
    reward, _ = trajectory_reward(traj, budget, weights, output_weight=output_weight)
    events = [e for s in traj.get("steps", []) for e in s.get("events", [])]
    return {
        # each applied context edit's kept prefix (acmrl.eval.edits), every kind of the arm's
        "kept": [
            e["reusable_prefix"] / e["tokens_before"]
            for e in events
            if e.get("kind") in EDIT_KINDS
            and e.get("applied", True)
            and e.get("tokens_before")
            and "reusable_prefix" in e
        ],
        "task_id": traj["task_id"],
        "sample": traj.get("sample", 0),
        "success": float(float(traj.get("score", 0.0)) >= 1.0),
        "reward": reward,
        "cost": float(m.get("compaction_cost", 0.0)),
        "points": compaction_points(events, budget),
        "summary_facts_in": sum(e.get("facts_in", 0) for e in events),
        "summary_facts_kept": sum(e.get("facts_kept", 0) for e in events),
    }


def arm_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = max(1, len(rows))
    wins = [r for r in rows if r["success"]]
    points = [p for r in rows for p in r["points"]]
    kept = [k for r in rows for k in r["kept"]]
    return {
        "episodes": len(rows),
        "pass@1": sum(r["success"] for r in rows) / n,
        "reward": sum(r["reward"] for r in rows) / n,
        "cost_per_success": sum(r["cost"] for r in wins) / len(wins) if wins else float("nan"),
        "compaction_point": sum(points) / len(points) if points else float("nan"),
        "fact_retention": fact_retention(rows),  # None: no summary had a fact to keep
        "kept_prefix": sum(kept) / len(kept) if kept else None,  # per edit; None: no edit
    }


def kept_by_task(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per task, each episode's mean kept prefix over its context edits (episodes without an
    edit left out): the pairs of the kept prefix's bootstrap."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r["kept"]:
            out.setdefault(r["task_id"], []).append(sum(r["kept"]) / len(r["kept"]))
    return out


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _kept(v: dict[str, Any]) -> str:
    """A versus_seeds cell: the kept prefix of both sides and their paired difference."""
    pk = v["kept"]
    cell = f"{_num(v['start']['kept_prefix'])} -> {_num(v['trained']['kept_prefix'])}"
    if pk.tasks:
        cell += f"; paired {pk.diff:+.3f} [{pk.low:+.3f}, {pk.high:+.3f}] over {pk.tasks} tasks"
    return cell


def versus_figures(
    start: str | Path,
    trained: str | Path,
    weights: RewardWeights,
    *,
    output_weight: float = 1.0,
) -> dict[str, dict[str, Any]]:
    """Per arm both evaluated: the figures of ``start`` and ``trained`` (:func:`arm_figures`),
    the paired bootstrap of Pass@1 (``pass``) and of the reward (``reward``) over the tasks
    both evaluated, the exact McNemar test of the paired episodes (``exact``) and the relative
    change of the Compaction Cost per success (``cost_change``; nan without a success)."""
    a_all = _episodes(Path(start))
    b_all = _episodes(Path(trained))
    arms = [x for x in dict.fromkeys(t["arm"] for t in a_all) if any(t["arm"] == x for t in b_all)]
    out = {}
    for arm in arms:
        a = [episode_figures(t, weights, output_weight) for t in a_all if t["arm"] == arm]
        b = [episode_figures(t, weights, output_weight) for t in b_all if t["arm"] == arm]
        fa, fb = arm_figures(a), arm_figures(b)
        ca, cb = fa["cost_per_success"], fb["cost_per_success"]
        out[arm] = {
            "start": fa,
            "trained": fb,
            "pass": paired_bootstrap(per_task(a, "success"), per_task(b, "success")),
            "reward": paired_bootstrap(per_task(a, "reward"), per_task(b, "reward")),
            "exact": mcnemar(per_episode(a), per_episode(b)),
            "kept": paired_bootstrap(kept_by_task(a), kept_by_task(b)),
            "cost_change": (cb - ca) / ca if ca == ca and cb == cb and ca > 0 else float("nan"),
        }
    return out


def versus_start(
    start: str | Path,
    trained: str | Path,
    weights: RewardWeights,
    output: str | Path | None = None,
    *,
    output_weight: float = 1.0,
    cost_drop: float = 0.20,
) -> str:
    """Markdown: ``trained`` vs ``start`` per shared arm (module docstring)."""
    lines = [
        f"# The trained policy vs the policy it started from (`{start}` -> `{trained}`)",
        "",
        "Held-out episodes of both; reward by the run's weights "
        f"(success {weights.success}, Compaction Cost {weights.compaction_cost}, malformed "
        f"{weights.malformed}, compress loops {weights.compress_loops}); paired 95% bootstrap "
        "intervals over the tasks both evaluated.",
        "",
        "| arm | metric | start | trained | trained - start | relative / paired 95% CI |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for arm, v in versus_figures(start, trained, weights, output_weight=output_weight).items():
        fa, fb, p_pass, p_rew, exact = v["start"], v["trained"], v["pass"], v["reward"], v["exact"]
        ca, cb, rel = fa["cost_per_success"], fb["cost_per_success"], v["cost_change"]
        lines += [
            f"| {arm} | Pass@1 | {fa['pass@1']:.3f} | {fb['pass@1']:.3f} | "
            f"{fb['pass@1'] - fa['pass@1']:+.3f} | [{p_pass.low:+.3f}, {p_pass.high:+.3f}] "
            f"over {p_pass.tasks} tasks; exact McNemar p {exact.p:.3g} |",
            f"| {arm} | mean reward | {fa['reward']:.3f} | {fb['reward']:.3f} | "
            f"{fb['reward'] - fa['reward']:+.3f} | [{p_rew.low:+.3f}, {p_rew.high:+.3f}] |",
            f"| {arm} | Compaction Cost per success | {ca:.0f} | {cb:.0f} | {cb - ca:+.0f} | "
            f"{rel:+.0%} |",
            f"| {arm} | mean compaction point | {fa['compaction_point']:.3f} | "
            f"{fb['compaction_point']:.3f} | "
            f"{fb['compaction_point'] - fa['compaction_point']:+.3f} | |",
        ]
        pk = v["kept"]
        if fa["kept_prefix"] is not None or fb["kept_prefix"] is not None:
            ka, kb = fa["kept_prefix"], fb["kept_prefix"]
            diff = kb - ka if ka is not None and kb is not None else None
            paired = (
                f"paired over the {pk.tasks} tasks both edited: {pk.diff:+.3f} "
                f"[{pk.low:+.3f}, {pk.high:+.3f}]"
                if pk.tasks
                else "no task both edited"
            )
            lines.append(
                f"| {arm} | kept prefix per applied edit, mean | {_num(ka)} | {_num(kb)} | "
                f"{_num(diff, '+.3f')} | {paired} |"
            )
        ka, kb = fa["fact_retention"], fb["fact_retention"]
        if ka is not None or kb is not None:  # recorded by either side
            diff = kb - ka if ka is not None and kb is not None else None
            lines.append(
                f"| {arm} | needed facts kept by edits | {_num(ka)} | {_num(kb)} | "
                f"{_num(diff, '+.3f')} | |"
            )
        reward_up = fb["reward"] > fa["reward"]
        cheaper = rel == rel and rel <= -cost_drop
        not_worse = p_pass.high >= 0
        met = reward_up and cheaper and not_worse
        verdicts.append(
            f"- {arm}: mean reward {'up' if reward_up else 'not up'} "
            f"({fa['reward']:.3f} -> {fb['reward']:.3f}); Compaction Cost per success "
            f"{rel:+.0%} (bar: -{cost_drop:.0%} or lower); Pass@1 "
            f"{'not lower' if not_worse else 'lower'} (paired interval "
            f"[{p_pass.low:+.3f}, {p_pass.high:+.3f}]): the bar is "
            f"{'met' if met else 'not met'}."
        )
    text = "\n".join([*lines, "", *verdicts]) + "\n"
    if output is not None:
        from acmrl.eval.run import _atomic_write

        _atomic_write(Path(output), text)
    return text


def versus_seeds(
    start: str | Path,
    runs: list[tuple[str, str | Path]],
    weights: RewardWeights,
    arm: str,
    output: str | Path | None = None,
    *,
    output_weight: float = 1.0,
    notes: Sequence[str] = (),
) -> str:
    """Markdown: every run of several GRPO seeds (``runs``: a label and its eval folder) against
    the one start they share, in ``arm``, one row each (never a best of them), then the mean and
    the range over the seeds. ``notes`` are printed under the table (how each run's checkpoint
    was chosen)."""
    rows, lines = (
        [],
        [
            f"# GRPO runs against their start (`{start}`), arm {arm}",
            "",
            "Every run is listed; paired 95% bootstrap intervals over the tasks both evaluated, exact "
            "McNemar p of the paired episodes.",
            "",
            "| run | Pass@1 start | Pass@1 run | run - start [95% CI] | McNemar p | "
            "CC/success start | CC/success run | change | compaction point start -> run | "
            "kept prefix start -> run; paired run - start [95% CI] |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ],
    )
    for label, folder in runs:
        figures = versus_figures(start, folder, weights, output_weight=output_weight)
        if arm not in figures:
            raise ValueError(f"{folder} and {start} share no {arm} episodes")
        v = figures[arm]
        fa, fb, p = v["start"], v["trained"], v["pass"]
        rows.append(v)
        lines.append(
            f"| {label} | {fa['pass@1']:.3f} | {fb['pass@1']:.3f} | "
            f"{fb['pass@1'] - fa['pass@1']:+.3f} [{p.low:+.3f}, {p.high:+.3f}] | "
            f"{v['exact'].p:.3g} | {fa['cost_per_success']:.0f} | {fb['cost_per_success']:.0f} | "
            f"{v['cost_change']:+.0%} | {fa['compaction_point']:.3f} -> "
            f"{fb['compaction_point']:.3f} | {_kept(v)} |"
        )

    def spread(values: list[float], fmt: str) -> str:
        real = [x for x in values if x == x]
        if not real:
            return "-"
        mean = sum(real) / len(real)
        return f"{mean:{fmt}} ({min(real):{fmt}} to {max(real):{fmt}})"

    def col(key: str, side: str = "trained") -> list[float]:
        return [r[side][key] for r in rows]

    diffs = [r["trained"]["pass@1"] - r["start"]["pass@1"] for r in rows]
    lines += [
        "",
        f"Over {len(rows)} runs, mean (range): Pass@1 {spread(col('pass@1'), '.3f')} against "
        f"{rows[0]['start']['pass@1']:.3f} at the start; run - start "
        f"{spread(diffs, '+.3f')}; Compaction Cost per success "
        f"{spread(col('cost_per_success'), '.0f')} against "
        f"{rows[0]['start']['cost_per_success']:.0f}, change "
        f"{spread([r['cost_change'] for r in rows], '+.1%')}; mean compaction point "
        f"{spread(col('compaction_point'), '.3f')} against "
        f"{rows[0]['start']['compaction_point']:.3f}; kept prefix per edit "
        f"{spread([x for x in col('kept_prefix') if x is not None], '.3f')} against "
        f"{_num(rows[0]['start']['kept_prefix'])}.",
        *(["", *[f"- {n}" for n in notes]] if notes else []),
    ]
    text = "\n".join(lines) + "\n"
    if output is not None:
        from acmrl.eval.run import _atomic_write

        _atomic_write(Path(output), text)
    return text
