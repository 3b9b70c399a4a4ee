"""The report's PNG figures (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def success_vs_peak(report: dict[str, Any], path: Path) -> None:
    """Pass@1 (with its interval) against the mean peak context, one point per arm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for arm, s in report["arms"].items():
        err = [[s["pass@1"] - s["pass@1_low"]], [s["pass@1_high"] - s["pass@1"]]]
        ax.errorbar(s["peak_context_tokens"], s["pass@1"], yerr=err, fmt="o", capsize=4, label=arm)
        ax.annotate(
            arm, (s["peak_context_tokens"], s["pass@1"]), xytext=(5, 5), textcoords="offset points"
        )
    budget = max(s["budget"] for s in report["arms"].values())
    ax.axvline(budget, color="grey", linestyle="--", linewidth=1)
    ax.text(budget, 0.02, " budget", color="grey")
    ax.set_xlabel("mean peak context tokens per episode")
    ax.set_ylabel("Pass@1 (95% Wilson interval)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("success vs peak context")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compaction_points(rows: list[dict[str, Any]], path: Path) -> None:
    """Where compactions happen: the context size before each, as a share of the budget."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    by_arm: dict[str, list[float]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).extend(r["compaction_at"])
    shown = {a: v for a, v in by_arm.items() if v}
    if shown:
        ax.hist(
            list(shown.values()), bins=[i / 20 for i in range(21)], label=list(shown), stacked=False
        )
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no compactions", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("context before the compaction / budget")
    ax.set_ylabel("compactions")
    ax.set_xlim(0, 1.05)
    ax.set_title("when the context is compacted")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cost_breakdown(rows: list[dict[str, Any]], path: Path) -> None:
    """Mean Compaction Cost per episode, split into its parts, per arm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    parts = [
        ("cost_call_tokens", "call tokens"),
        ("cost_helper_tokens", "summariser/querier tokens"),
        ("cost_cache_tokens", "lost cache (Cache Cost)"),
    ]
    bottom = [0.0] * len(arms)
    for key, label in parts:
        vals = []
        for a in arms:
            mine = [r[key] for r in rows if r["arm"] == a]
            vals.append(sum(mine) / len(mine) if mine else 0.0)
        ax.bar(arms, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("tokens per episode")
    ax.set_title("Compaction Cost breakdown")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(report: dict[str, Any], rows: list[dict[str, Any]], out: Path) -> list[str]:
    names = ["success_vs_peak.png", "compaction_points.png", "cost_breakdown.png"]
    success_vs_peak(report, out / names[0])
    compaction_points(rows, out / names[1])
    cost_breakdown(rows, out / names[2])
    return names
