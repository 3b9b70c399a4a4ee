"""``acmrl eval compare A B``: two result folders (before and after training) side by side, per
arm they share: the report's figures, the context edits' per kind, and the Pass@1 difference with
a paired bootstrap interval and the exact McNemar test over the episodes both ran.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from acmrl.eval.report import mcnemar, paired_bootstrap
from acmrl.eval.run import _atomic_write


def _load(folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    report_path = folder / "report.json"
    if not report_path.is_file():
        raise ValueError(f"{folder} has no report.json: give a folder acmrl eval wrote")
    report = json.loads(report_path.read_text())
    rows = []
    if (folder / "episodes.csv").is_file():
        with (folder / "episodes.csv").open() as f:
            rows = [{**r, "score": float(r["score"])} for r in csv.DictReader(f)]
    return report, rows


# the per-edit figures compare puts side by side (acmrl.eval.edits)
EDIT_COMPARED = [
    ("per_episode", "edits/ep", ".2f"),
    ("valid_rate", "valid rate", ".2f"),
    ("effective_rate", "effective rate", ".2f"),
    ("generated_median", "generated/edit, median", ".0f"),
    ("cache_cost_median", "Cache Cost/edit, median", ".0f"),
    ("kept_prefix_mean", "kept prefix, mean", ".2f"),
]


def _by_task(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per task, the success (score 1) of each of its episodes in ``rows``."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(float(r["score"] >= 1.0))
    return out


def compare(a: str | Path, b: str | Path, output: str | Path | None = None) -> str:
    """Markdown that puts result folders ``a`` (before) and ``b`` (after) side by side, per arm
    they share; Pass@1 differences get a paired bootstrap interval over shared tasks."""
    ra, rows_a = _load(Path(a))
    rb, rows_b = _load(Path(b))
    keys = [
        ("pass@1", "Pass@1", ".3f"),
        ("valid_call_rate", "valid-call rate", ".2f"),
        ("tool_calls", "tool calls", ".2f"),
        ("peak_context_tokens", "peak tokens", ".0f"),
        ("compactions", "compactions/ep", ".2f"),
        ("compaction_cost", "Compaction Cost", ".0f"),
        ("overflow", "overflow", ".2f"),
    ]
    lines = [
        f"# acmrl eval compare: `{ra['meta']['model']}` (A) vs `{rb['meta']['model']}` (B)",
        "",
        f"A: `{a}`; B: `{b}`.",
        "",
        "| arm | metric | A | B | B - A | relative |",
        "|---|---|---|---|---|---|",
    ]
    for arm in [x for x in ra["arms"] if x in rb["arms"]]:
        sa, sb = ra["arms"][arm], rb["arms"][arm]
        for key, label, fmt in keys:
            va, vb = sa[key], sb[key]
            rel = "n/a" if abs(va) < 1e-12 else f"{(vb - va) / va:+.0%}"
            lines.append(
                f"| {arm} | {label} | {va:{fmt}} | {vb:{fmt}} | {vb - va:+{fmt}} | {rel} |"
            )
        # the context edits of both, per kind (reports written before the section have none)
        ea, eb = sa.get("edits") or {}, sb.get("edits") or {}
        for kind in [k for k in ea if k in eb]:
            for key, label, fmt in EDIT_COMPARED:
                va, vb = ea[kind].get(key), eb[kind].get(key)
                if va is None or vb is None:
                    continue
                rel = "n/a" if abs(va) < 1e-12 else f"{(vb - va) / va:+.0%}"
                lines.append(
                    f"| {arm} | {kind}: {label} | {va:{fmt}} | {vb:{fmt}} | {vb - va:+{fmt}} "
                    f"| {rel} |"
                )
        arm_a = [r for r in rows_a if r["arm"] == arm]
        arm_b = [r for r in rows_b if r["arm"] == arm]
        p = paired_bootstrap(_by_task(arm_a), _by_task(arm_b))
        if p.tasks:
            pick = [
                {f"{r['task_id']}#{r['sample']}": [float(r["score"] >= 1.0)] for r in rows}
                for rows in (arm_a, arm_b)
            ]
            exact = mcnemar(*pick)
            lines.append(
                f"| {arm} | Pass@1 B - A, paired 95% CI over {p.tasks} tasks | | | "
                f"[{p.low:+.3f}, {p.high:+.3f}] | exact McNemar p {exact.p:.3g} "
                f"({exact.only_b} episodes B only, {exact.only_a} A only) |"
            )
    text = "\n".join(lines) + "\n"
    if output is not None:
        _atomic_write(Path(output), text)
    return text
