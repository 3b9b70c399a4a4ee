"""Learning curves: every training stage's held-out numbers in one table, and GRPO per step.

A pipeline is judged by whether the policy gets better at the task. ``write_curves`` takes the
eval folders of successive stages (base, SFT, each teacher round, GRPO: whatever ran) and
writes, next to each other:

- ``curves.md``: one row per (stage, arm): Pass@1 with its Wilson interval, valid-call rate,
  malformed calls, overflow, compactions, mean compaction point (context before / budget), the
  share of needed facts its summaries kept, and Compaction Cost per episode;
- ``curves.png``: held-out Pass@1, valid-call rate and overflow per stage, one line per arm;
- ``grpo.png`` (when a GRPO run's ``metrics.jsonl`` is given): mean reward, success, Compaction
  Cost (in budgets), mean compaction point and the share of needed facts the summaries kept,
  per step.

GRPO over seeds (``scripts/grpo_seeds.py``) evaluates each run's checkpoints; :func:`seed_curve`
reduces them to one curve per configuration (per step: Pass@1 and Compaction Cost per success,
mean and range over the seeds), and :func:`write_seed_curves` sets configurations side by side
(``seed_curves.md`` and ``seed_curves.png``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acmrl.eval.plots import _plt

COLUMNS = [
    ("pass@1", "Pass@1", ".3f"),
    ("valid_call_rate", "valid-call rate", ".2f"),
    ("malformed_per_episode", "malformed/ep", ".2f"),
    ("overflow", "overflow", ".2f"),
    ("compactions", "compactions/ep", ".2f"),
    ("compaction_point", "compaction point", ".2f"),
    ("fact_retention", "facts kept", ".2f"),
    ("compaction_cost", "Compaction Cost/ep", ".0f"),
]


def stage_rows(stages: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """One row per stage and arm, from each eval folder's ``report.json`` and episodes."""
    from acmrl.eval.run import reported_ids
    from acmrl.rollout.worker import read_trajectories

    rows = []
    for stage, folder in stages:
        report = json.loads((Path(folder) / "report.json").read_text())
        points: dict[str, list[float]] = {}
        episodes = Path(folder) / "episodes.jsonl"
        ids = reported_ids(folder)
        for t in read_trajectories(episodes) if episodes.exists() else []:
            if ids is None or t.episode_id in ids:  # the episodes the report covers
                points.setdefault(t.arm, []).extend(t.compaction_points())
        for arm, s in report["arms"].items():
            p = points.get(arm, [])
            rows.append(
                {"stage": stage, "arm": arm}
                | s
                | {"compaction_point": sum(p) / len(p) if p else float("nan")}
            )
    return rows


def curves_markdown(rows: list[dict[str, Any]]) -> str:
    head = ["stage", "arm", "episodes", *(label for _, label, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["stage"], r["arm"], str(r["episodes"])]
        for key, _, fmt in COLUMNS:
            value = r.get(key)
            # NaN / None: no compaction, or no summary that had a fact to keep
            cell = "-" if value is None or value != value else format(value, fmt)
            if key == "pass@1":
                cell += f" [{r['pass@1_low']:.2f}, {r['pass@1_high']:.2f}]"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_stages(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (key, label) in zip(
        axes,
        [
            ("pass@1", "held-out Pass@1"),
            ("valid_call_rate", "valid-call rate"),
            ("overflow", "overflow"),
        ],
        strict=True,
    ):
        for arm in arms:
            by = {r["stage"]: r for r in rows if r["arm"] == arm}
            xs = [i for i, s in enumerate(stages) if s in by]
            ys = [by[stages[i]][key] for i in xs]
            ax.plot(xs, ys, marker="o", label=arm)
            if key == "pass@1":
                lo = [by[stages[i]]["pass@1_low"] for i in xs]
                hi = [by[stages[i]]["pass@1_high"] for i in xs]
                ax.fill_between(xs, lo, hi, alpha=0.15)
        ax.set_xticks(range(len(stages)), stages, rotation=20)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_grpo(metrics: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    steps = [m["step"] for m in metrics]
    panels = [
        ("reward/mean", "mean reward"),
        ("rollout/success", "success"),
        ("reward/compaction_cost", "Compaction Cost (budgets)"),
        ("rollout/compaction_point", "mean compaction point"),
        ("rollout/fact_retention", "needed facts kept by edits"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 3.5))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(steps, [m.get(key, float("nan")) for m in metrics], marker=".")
        ax.set_xlabel("GRPO step")
        ax.set_title(label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_metrics(grpo_dir: Path) -> list[dict[str, Any]]:
    path = Path(grpo_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_curves(
    stages: list[tuple[str, Path]], out: Path, grpo_dir: Path | None = None, plots: bool = True
) -> dict[str, Any]:
    """Write ``curves.md`` (and the plots) under ``out``; returns the rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = stage_rows(stages)
    text = "# Learning curves (held-out tasks)\n\n" + curves_markdown(rows) + "\n"
    metrics = read_metrics(grpo_dir) if grpo_dir else []
    if metrics:
        first, last = metrics[0], metrics[-1]
        text += (
            f"\nGRPO, {len(metrics)} steps: mean reward {first['reward/mean']:.3f} -> "
            f"{last['reward/mean']:.3f}, success {first['rollout/success']:.2f} -> "
            f"{last['rollout/success']:.2f} (training rollouts).\n"
        )
    if plots:
        plot_stages(rows, out / "curves.png")
        text += "\n![held-out numbers per stage](curves.png)\n"
        if metrics:
            plot_grpo(metrics, out / "grpo.png")
            text += "\n![GRPO per step](grpo.png)\n"
    (out / "curves.md").write_text(text)
    result = {"rows": rows, "grpo": metrics}
    (out / "curves.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def seed_curve(
    scores: dict[Any, dict[Any, Any]], tokens: dict[Any, dict[Any, Any]] | None = None
) -> list[dict[str, Any]]:
    """One configuration's curve from ``{seed: {step: (Pass@1, Compaction Cost per success)}}``
    (the cost ``None`` or infinite where an eval had no success; keys may be strings, as read
    back from JSON). Per step, over the seeds evaluated there: Pass@1's mean, min and max, and
    Compaction Cost per success pooled over the seeds' successes (each seed's figure weighted
    by its Pass@1; its evals have the same number of tasks) with its min and max. ``tokens``
    (``{seed: {step: n}}``, the tokens a run had generated in its rollouts by then) adds their
    mean over the seeds, ``rollout_tokens`` (``None`` where a seed lacks the figure).

    >>> rows = seed_curve({0: {0: (0.5, 1000.0), 5: (0.25, 600.0)}, 1: {0: (0.0, None)}})
    >>> [(r["step"], r["seeds"], r["pass@1"], r["cost_per_success"]) for r in rows]
    [(0, 2, 0.25, 1000.0), (5, 1, 0.25, 600.0)]
    >>> seed_curve({0: {5: (0.5, 1000.0)}, "1": {5: (0.25, 400.0)}})[0]["cost_per_success"]
    800.0

    (Twice the successes at 1,000 as at 400: 800, where a mean over the seeds would say 700.)
    """
    by_step: dict[int, list[tuple[float, float | None]]] = {}
    for per_seed in scores.values():
        for step, (p, c) in per_seed.items():
            cost = None if c is None or c == float("inf") or p <= 0 else float(c)
            by_step.setdefault(int(step), []).append((float(p), cost))
    spent: dict[int, list[float | None]] = {}
    by_seed = {str(k): v for k, v in (tokens or {}).items()}  # int keys, or str from JSON
    for seed, per_seed in scores.items():
        mine = {int(k): v for k, v in (by_seed.get(str(seed)) or {}).items()}
        for step in per_seed:
            spent.setdefault(int(step), []).append(mine.get(int(step)))
    rows = []
    for step in sorted(by_step):
        ps = [p for p, _ in by_step[step]]
        used = [n for n in spent[step] if n is not None]
        complete = len(used) == len(spent[step])  # every seed's figure known
        won = [(p, c) for p, c in by_step[step] if c is not None]
        pooled = sum(p * c for p, c in won) / sum(p for p, _ in won) if won else None
        rows.append(
            {
                "step": step,
                "seeds": len(ps),
                "pass@1": sum(ps) / len(ps),
                "pass@1_min": min(ps),
                "pass@1_max": max(ps),
                "cost_per_success": pooled,
                "cost_min": min((c for _, c in won), default=None),
                "cost_max": max((c for _, c in won), default=None),
                "rollout_tokens": sum(used) / len(used) if complete and used else None,
            }
        )
    return rows


def seed_curves_markdown(curves: dict[str, list[dict[str, Any]]]) -> str:
    """Configurations side by side, one row per (configuration, step)."""

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "| configuration | step | rollout tokens (mean) | seeds | Pass@1 mean (range) | "
        "Compaction Cost per success (range) |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in curves.items():
        for r in rows:
            pass_cell = f"{r['pass@1']:.3f} ({r['pass@1_min']:.3f}-{r['pass@1_max']:.3f})"
            cost = num(r["cost_per_success"], ",.0f")
            if r["cost_per_success"] is not None:
                cost += f" ({r['cost_min']:,.0f}-{r['cost_max']:,.0f})"
            spent = num(r.get("rollout_tokens"), ",.0f")
            lines.append(
                f"| {label} | {r['step']} | {spent} | {r['seeds']} | {pass_cell} | {cost} |"
            )
    return "\n".join(lines)


def plot_seed_curves(
    curves: dict[str, list[dict[str, Any]]], path: Path, title: str, x: str = "step"
) -> None:
    """Pass@1 and Compaction Cost per success per GRPO step (``x="tokens"``: against the mean
    rollout tokens generated by then): a line per configuration (the mean over seeds) and a
    band over their range; no point where no seed succeeded."""
    plt = _plt()
    nan = float("nan")
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    panels = [("pass@1", "pass@1_min", "pass@1_max", "Pass@1")]
    panels.append(("cost_per_success", "cost_min", "cost_max", "Compaction Cost per success"))
    for ax, (key, lo, hi, label) in zip(axes, panels, strict=True):
        for name, rows_all in curves.items():
            rows = [r for r in rows_all if x == "step" or r.get("rollout_tokens") is not None]
            xs = [r["step"] if x == "step" else r["rollout_tokens"] for r in rows]

            def ys(k: str, rows: list[dict[str, Any]] = rows) -> list[float]:
                return [nan if r[k] is None else r[k] for r in rows]

            ax.plot(xs, ys(key), marker="o", label=name)
            ax.fill_between(xs, ys(lo), ys(hi), alpha=0.15)
        ax.set_xlabel("GRPO step" if x == "step" else "rollout tokens generated")
        ax.set_title(label)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_seed_curves(
    curves: dict[str, list[dict[str, Any]]],
    out: Path,
    title: str,
    plots: bool = True,
    x: str = "step",
) -> str:
    """``seed_curves.md`` (and ``seed_curves.png``, against ``x``: ``step`` or ``tokens``)
    under ``out``; returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\n" + seed_curves_markdown(curves) + "\n"
    if plots:
        plot_seed_curves(curves, out / "seed_curves.png", title, x)
        text += "\n![Pass@1 and Compaction Cost per success per step](seed_curves.png)\n"
    (out / "seed_curves.md").write_text(text)
    return text
