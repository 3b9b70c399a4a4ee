"""How a policy's context edits changed between two evals of the same tasks: a GRPO run against
its start, a teacher round against SFT.

``edit_change(start, trained)`` reads two ``acmrl eval`` folders and, per arm both evaluated
and kind of edit (:mod:`acmrl.eval.edits`: an ``evolve`` program, a ``manage_context`` summary,
the ``summary`` arm's monitor, the ``memory`` arm's moves), sets side by side:

- the edit figures of each side (:func:`acmrl.eval.edits.edit_figures`: edits per episode,
  valid and effective rate, refusals and why, needed facts kept);
- the **kept prefix** (the share of the prefix cache an applied edit kept: 1.0 for an edit
  that only appends, near 0 for one that rewrites the start) as a paired difference over the
  tasks on which both applied such an edit (each task's edits averaged first), with a
  bootstrap interval;
- the distribution of the per-edit measures (tokens generated and Cache Cost of every edit,
  refused ones too; kept prefix of the applied ones): their 10th, 25th, 50th, 75th and 90th
  percentiles;
- a kind that one side never made or attempted is shown too (a policy may learn to stop
  editing so), that side's figures empty;
- examples: on the first tasks both edited (then those one side edited), the first edit of
  each side (an evolve program's code, a summary's text), so that what the policy learned to
  write can be read.

``acmrl eval edits START TRAINED [-o FILE]`` writes it as markdown (:func:`edit_change_md`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from acmrl.eval.edits import EDIT_KINDS, applied_kept, edit_calls, edit_figures, edit_rows
from acmrl.eval.report import Paired, paired_bootstrap
from acmrl.eval.versus import _episodes, kept_by_task
from acmrl.rollout.records import Trajectory

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
MEASURES = (
    ("generated", "tokens generated", ".0f"),
    ("cache_cost", "Cache Cost", ".0f"),
    ("kept_prefix", "kept prefix", ".2f"),
)


def _rows(folder: Path) -> list[dict[str, Any]]:
    """One row per reported episode: its arm, task, edits and edit calls."""
    out = []
    for d in _episodes(folder):
        t = Trajectory.from_dict(d)
        out.append(
            {"arm": t.arm, "task_id": t.task_id, "edits": edit_rows(t), "edit_calls": edit_calls(t)}
        )
    return out


def quantiles(xs: list[float], qs: tuple[float, ...] = QUANTILES) -> list[float] | None:
    """Nearest-rank percentiles of ``xs`` (None when empty).

    >>> quantiles([5, 1, 4, 2, 3], (0.1, 0.5, 0.9))
    [1, 3, 5]
    >>> quantiles(list(range(1, 11)))
    [1, 3, 5, 8, 9]
    """
    if not xs:
        return None
    s = sorted(xs)
    return [s[min(len(s), max(1, math.ceil(q * len(s) - 1e-9))) - 1] for q in qs]


def _kept_by_task(rows: list[dict[str, Any]], kind: str) -> dict[str, list[float]]:
    """Per task, the mean kept prefix of its episodes' applied edits of ``kind`` (episodes
    without one left out)."""
    return kept_by_task(
        [{"task_id": r["task_id"], "kept": applied_kept(r["edits"], kind)} for r in rows]
    )


def _measure(rows: list[dict[str, Any]], kind: str, key: str) -> list[float]:
    """``key`` of every edit of ``kind`` in ``rows`` (the kept prefix of applied ones only)."""
    if key == "kept_prefix":
        return [k for r in rows for k in applied_kept(r["edits"], kind)]
    return [e[key] for r in rows for e in r["edits"] if e["kind"] == kind and e[key] is not None]


def _example(rows: list[dict[str, Any]], kind: str, task: str) -> dict[str, Any] | None:
    for r in rows:
        if r["task_id"] == task:
            for e in r["edits"]:
                if e["kind"] == kind:
                    return e
    return None


def edit_change(
    start: str | Path, trained: str | Path, *, examples: int = 2
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per arm both evaluated and kind of edit either side made or attempted: ``start`` and
    ``trained`` (their :func:`edit_figures`; None for a side that made and attempted none of
    the kind), ``kept_prefix`` (the paired difference, :class:`Paired`), ``dist``
    (per measure, the percentiles of each side) and ``examples`` (pairs of edits on the same
    task). Raises ValueError when the folders share no arm."""
    a_all, b_all = _rows(Path(start)), _rows(Path(trained))
    arms = [x for x in dict.fromkeys(r["arm"] for r in a_all) if any(r["arm"] == x for r in b_all)]
    if not arms:
        raise ValueError(f"{start} and {trained} evaluated no arm in common")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in arms:
        a = [r for r in a_all if r["arm"] == arm]
        b = [r for r in b_all if r["arm"] == arm]
        fa, fb = edit_figures(a), edit_figures(b)
        # a kind either side made or attempted: a policy that learned to stop (or start)
        # editing so is shown, the other side's figures empty
        for kind in sorted(fa.keys() | fb.keys(), key=list(EDIT_KINDS).index):
            ka, kb = _kept_by_task(a, kind), _kept_by_task(b, kind)
            dist = {}
            for key, _, _ in MEASURES:
                dist[key] = tuple(quantiles(_measure(side, kind, key)) for side in (a, b))
            # the first tasks both edited, then those one side edited
            tasks = list(dict.fromkeys(r["task_id"] for r in a + b))
            pairs = [(t, _example(a, kind, t), _example(b, kind, t)) for t in tasks]
            pairs = [p for p in pairs if p[1] and p[2]] + [
                p for p in pairs if bool(p[1]) != bool(p[2])
            ]
            out.setdefault(arm, {})[kind] = {
                "start": fa.get(kind),  # None: that side made and attempted none
                "trained": fb.get(kind),
                "kept_prefix": paired_bootstrap(ka, kb),
                "dist": dist,
                "examples": pairs[:examples],
            }
    return out


# the figures of a side that made and attempted no edit of a kind
NONE: dict[str, Any] = {
    "edits": 0,
    "per_episode": 0.0,
    "valid_rate": None,
    "effective_rate": None,
    "refusals": {},
    "facts_in": 0,
    "facts_kept": 0,
    "kept_prefix_mean": None,
}


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _refusals(f: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(f["refusals"].items())) or "none"


def _text(e: dict[str, Any] | None, limit: int = 1500) -> str:
    if e is None:
        return "(none)"
    body = e["program"] or e["detail"] or ""
    cut = body if len(body) <= limit else body[:limit] + f"\n... ({len(body) - limit} more chars)"
    state = "applied" if e["applied"] else f"refused: {e['refusal']}"
    return (
        f"turn {e['turn']}, {state}, {e['generated']} tokens generated, Cache Cost "
        f"{e['cache_cost']}, kept prefix {_num(e['kept_prefix'], '.2f')}, facts "
        f"{e['facts_kept']}/{e['facts_in']}\n\n```\n{cut}\n```"
    )


def edit_change_md(
    start: str | Path, trained: str | Path, output: str | Path | None = None, *, examples: int = 2
) -> str:
    """Markdown of :func:`edit_change`; written to ``output`` too when given."""
    figures = edit_change(start, trained, examples=examples)
    lines = [
        f"# How the context edits changed (`{start}` -> `{trained}`)",
        "",
        "Per arm and kind of edit. Kept prefix: the share of the prefix cache an applied edit "
        "kept; its difference is paired over the tasks on which both applied such an edit (each "
        "task's edits averaged first), with a 95% bootstrap interval. Percentiles are per edit "
        "(the kept prefix's over applied edits).",
    ]
    if not any(figures.values()):
        lines += ["", "Neither side made or attempted a context edit in an arm both evaluated."]
    # (a kind one side never made is shown with "-" and 0 on that side)
    for arm, kinds in figures.items():
        for kind, v in kinds.items():
            fa, fb, p = v["start"] or NONE, v["trained"] or NONE, v["kept_prefix"]
            lines += [
                "",
                f"## {arm}: {kind}",
                "",
                "| measure | start | trained |",
                "|---|---|---|",
                f"| edits (per episode) | {fa['edits']} ({fa['per_episode']:.2f}) | "
                f"{fb['edits']} ({fb['per_episode']:.2f}) |",
                f"| valid rate | {_num(fa['valid_rate'], '.2f')} | {_num(fb['valid_rate'], '.2f')} |",
                f"| effective rate | {_num(fa['effective_rate'], '.2f')} | "
                f"{_num(fb['effective_rate'], '.2f')} |",
                f"| refused (why) | {_refusals(fa)} | {_refusals(fb)} |",
                f"| needed facts kept | {fa['facts_kept']}/{fa['facts_in']} | "
                f"{fb['facts_kept']}/{fb['facts_in']} |",
                f"| kept prefix, mean | {_num(fa['kept_prefix_mean'], '.2f')} | "
                f"{_num(fb['kept_prefix_mean'], '.2f')} |",
                "",
                _paired_line(p),
                "",
                "| per edit | side | p10 | p25 | median | p75 | p90 |",
                "|---|---|---|---|---|---|---|",
            ]
            for key, label, fmt in MEASURES:
                for side, qs in zip(("start", "trained"), v["dist"][key], strict=True):
                    cells = " | ".join(_num(q, fmt) for q in qs) if qs else "- | - | - | - | -"
                    lines.append(f"| {label} | {side} | {cells} |")
            for task, ea, eb in v["examples"]:
                lines += [
                    "",
                    f"### Task `{task}`, the first {kind} edit",
                    "",
                    f"Start: {_text(ea)}",
                    "",
                    f"Trained: {_text(eb)}",
                ]
    text = "\n".join(lines) + "\n"
    if output is not None:
        from acmrl.eval.run import _atomic_write

        _atomic_write(Path(output), text)
    return text


def _paired_line(p: Paired) -> str:
    if not p.tasks:
        return "Kept prefix, trained - start: no task on which both applied such an edit."
    return (
        f"Kept prefix, trained - start: {p.diff:+.3f}, 95% CI [{p.low:+.3f}, {p.high:+.3f}] over "
        f"{p.tasks} tasks both edited (applied edits)."
    )
