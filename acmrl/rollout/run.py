"""``acmrl rollout``'s display: the per-arm summary table of a rollout file. The rollout itself
is :func:`acmrl.rollout.worker.run_rollout`, which eval and the teacher use too."""

from __future__ import annotations

from typing import Any


def print_summary(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rollout summary (per arm)")
    heads = [
        "arm",
        "episodes",
        "success",
        "score",
        "answered",
        "overflow",
        "mean ctx",
        "peak ctx",
        "tool calls",
        "compactions",
        "wall s",
    ]
    for h in heads:
        table.add_column(h, justify="left" if h == "arm" else "right")
    for r in rows:
        table.add_row(
            r["arm"],
            str(r["episodes"]),
            f"{r['success']:.2f}",
            f"{r['score']:.2f}",
            f"{r['answered']:.2f}",
            f"{r['overflow']:.2f}",
            f"{r['mean_context']:.0f}",
            str(r["peak_context"]),
            f"{r['tool_calls']:.1f}",
            f"{r['compactions']:.1f}",
            f"{r['wall_s']:.1f}",
        )
    console = Console()
    if console.width < 120:  # a pipe or a narrow terminal: do not squeeze the numbers
        console = Console(width=120)
    console.print(table)
