"""``acmrl eval report A B C ...``: one Table-2 over several benchmarks.

Each argument is a folder ``acmrl eval`` wrote (one environment each). The table has a row per
(environment, arm) with Pass@1, tool calls, peak tokens and Compaction Cost, each arm's absolute
and relative difference to ``react`` on the same benchmark beside it, and reading notes that say
when an arm's Pass@1 gain holds on some benchmarks only, and where an arm raises peak tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def benchmark_name(meta: dict[str, Any], folder: Path) -> str:
    """``kb_search (preset tiny)`` from a report's meta; the folder name when it says nothing."""
    env = meta.get("env") or folder.name
    opts = dict(meta.get("env_options") or {})
    if env == "mixture" and opts.get("env"):
        env, inner = opts["env"], opts.get("options") or {}
        seeds = opts.get("seeds")
        opts = {**inner, **({"seeds": seeds} if seeds else {})}
    shown = ", ".join(
        f"{k} {v}" for k, v in opts.items() if k in ("preset", "seeds", "seed", "root", "format")
    )
    return f"{env} ({shown})" if shown else str(env)


def _rel(new: float, base: float) -> str:
    return "n/a" if abs(base) < 1e-12 else f"{(new - base) / base:+.0%}"


def multi_report(folders: list[str | Path], output: str | Path | None = None) -> str:
    """Markdown: one Table-2 with a row per (benchmark, arm), and reading notes."""
    if not folders:
        raise ValueError("acmrl eval report needs at least one result folder")
    benches: list[tuple[str, dict[str, Any]]] = []
    for f in map(Path, folders):
        path = f / "report.json"
        if not path.is_file():
            raise ValueError(f"{f} has no report.json: give folders acmrl eval wrote")
        report = json.loads(path.read_text())
        benches.append((benchmark_name(report.get("meta", {}), f), report))
    head = [
        "benchmark",
        "arm",
        "Pass@1 [95% CI]",
        "Δ abs",
        "Δ rel",
        "tool calls",
        "Δ abs",
        "Δ rel",
        "peak tokens",
        "Δ abs",
        "Δ rel",
        "Compaction Cost",
        "overflow",
    ]
    lines = [
        "# acmrl eval report: Table 2 over benchmarks",
        "",
        "Δ: the arm minus react on the same benchmark, absolute and relative.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    gains: dict[str, dict[str, float]] = {}
    peaks: dict[str, dict[str, float]] = {}
    for name, report in benches:
        base = report["arms"].get("react")
        for arm, s in report["arms"].items():
            cells = [
                name,
                arm,
                f"{s['pass@1']:.3f} [{s['pass@1_low']:.2f}, {s['pass@1_high']:.2f}]",
            ]
            for key, fmt in (
                ("pass@1", ".3f"),
                ("tool_calls", ".2f"),
                ("peak_context_tokens", ".0f"),
            ):
                if key != "pass@1":
                    cells.append(f"{s[key]:{fmt}}")
                if base is None or arm == "react":
                    cells += ["", ""]
                else:
                    cells += [f"{s[key] - base[key]:+{fmt}}", _rel(s[key], base[key])]
            cells += [f"{s['compaction_cost']:.0f}", f"{s['overflow']:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
            if base is not None and arm != "react":
                gains.setdefault(arm, {})[name] = s["pass@1"] - base["pass@1"]
                peaks.setdefault(arm, {})[name] = (
                    s["peak_context_tokens"] - base["peak_context_tokens"]
                )
    notes = reading_notes(gains, peaks, [n for n, r in benches if "react" not in r["arms"]])
    text = "\n".join([*lines, "", "## Reading this table", "", *notes]) + "\n"
    if output is not None:
        out = Path(output)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text)
        tmp.replace(out)
    return text


def reading_notes(
    gains: dict[str, dict[str, float]], peaks: dict[str, dict[str, float]], no_react: list[str]
) -> list[str]:
    """Where a gain holds on some benchmarks only, and where an arm raises peak tokens."""
    notes = []
    for arm, by_bench in gains.items():
        up = [b for b, d in by_bench.items() if d > 0]
        down = [b for b, d in by_bench.items() if d <= 0]
        if up and down:
            notes.append(
                f"- {arm}: its Pass@1 gain over react holds on {', '.join(up)} only; "
                f"none on {', '.join(down)}."
            )
        elif up:
            notes.append(f"- {arm}: Pass@1 above react on every benchmark ({', '.join(up)}).")
        else:
            notes.append(f"- {arm}: no Pass@1 gain over react on any benchmark.")
        raised = [f"{b} ({d:+.0f})" for b, d in peaks.get(arm, {}).items() if d > 0]
        if raised:
            notes.append(f"- {arm} raises the mean peak tokens over react on {', '.join(raised)}.")
    notes += [f"- {b}: no react arm, so no differences are shown." for b in no_react]
    return notes or ["- Only react was evaluated: there is nothing to compare."]
