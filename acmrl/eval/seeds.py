"""``acmrl eval seeds A B C ...``: one table over the runs of several training seeds.

Each argument is a folder ``acmrl eval`` wrote for one trained model (one training seed) on the
same tasks. The table lists every run (never the best of them), then per arm the mean and the
range over runs of Pass@1, peak tokens and Compaction Cost per episode, and per pair of arms the
paired difference in each run: the bootstrap interval over tasks and the exact McNemar p-value,
from the runs' ``episodes.csv``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from acmrl.config import ARMS
from acmrl.eval.report import mcnemar, paired_bootstrap

PAIRS = (("react", "acm"), ("summary", "acm"), ("react", "summary"))


def _load(folder: Path) -> tuple[dict[str, Any], dict[str, dict[str, list[float]]]]:
    """A run's report and, per arm, each task's successes."""
    for name in ("report.json", "episodes.csv"):
        if not (folder / name).exists():
            raise ValueError(f"{folder} has no {name}: give folders written by acmrl eval")
    report = json.loads((folder / "report.json").read_text())
    by_arm: dict[str, dict[str, list[float]]] = {}
    with (folder / "episodes.csv").open() as f:
        for row in csv.DictReader(f):
            key = f"{row['task_id']}#{row.get('sample') or 0}"  # one pair per task and sample
            by_arm.setdefault(row["arm"], {})[key] = [float(float(row["score"]) >= 1.0)]
    return report, by_arm


SAME = ("env", "env_options", "split", "samples", "temperature", "on_overflow", "repeat_rule")


def _check_alike(runs: list[tuple[Path, dict[str, Any], dict[str, Any]]]) -> None:
    """The runs must differ in the model alone: the same tasks per arm, the same settings."""
    first, report, by_arm = runs[0]
    for folder, other, other_by_arm in runs[1:]:
        changed = [k for k in SAME if report["meta"].get(k) != other["meta"].get(k)]
        budgets = [{a: s["budget"] for a, s in r["arms"].items()} for r in (report, other)]
        changed += ["budget"] if budgets[0] != budgets[1] else []
        if changed:
            raise ValueError(
                f"{folder} was evaluated under other settings than {first} ({', '.join(changed)})"
            )
        for arm in set(by_arm) | set(other_by_arm):
            if set(by_arm.get(arm, {})) != set(other_by_arm.get(arm, {})):
                raise ValueError(
                    f"the runs were evaluated on different tasks: {arm} in {folder} and {first}"
                )


def _spread(values: list[float], fmt: str) -> str:
    mean = sum(values) / len(values)
    return f"{mean:{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def seeds_table(folders: list[str | Path], output: str | Path | None = None) -> str:
    """Markdown: every run's figures, then mean [min, max] per arm, then paired differences."""
    if len(folders) < 1:
        raise ValueError("acmrl eval seeds needs at least one result folder")
    runs = [(Path(f), *_load(Path(f))) for f in folders]
    _check_alike(runs)
    arms = [a for a in ARMS if any(a in r["arms"] for _, r, _ in runs)]
    lines = [
        f"# {len(runs)} runs, every one listed",
        "",
        "| run | arm | Pass@1 [95% CI] | peak tokens | overflow | Compaction Cost/ep |",
        "|---|---|---|---|---|---|",
    ]
    for folder, report, _ in runs:
        for arm in arms:
            s = report["arms"].get(arm)
            if s is not None:
                lines.append(
                    f"| {folder} | {arm} | {s['pass@1']:.3f} [{s['pass@1_low']:.2f}, "
                    f"{s['pass@1_high']:.2f}] | {s['peak_context_tokens']:.0f} | "
                    f"{s['overflow']:.2f} | {s['compaction_cost']:.0f} |"
                )
    lines += [
        "",
        "Mean [min, max] over the runs:",
        "",
        "| arm | runs | Pass@1 | peak tokens | Compaction Cost/ep |",
        "|---|---|---|---|---|",
    ]
    for arm in arms:
        got = [r["arms"][arm] for _, r, _ in runs if arm in r["arms"]]
        lines.append(
            f"| {arm} | {len(got)} | {_spread([s['pass@1'] for s in got], '.3f')} | "
            f"{_spread([s['peak_context_tokens'] for s in got], '.0f')} | "
            f"{_spread([s['compaction_cost'] for s in got], '.0f')} |"
        )
    peaks = {
        arm: [r["arms"][arm]["peak_context_tokens"] for _, r, _ in runs if arm in r["arms"]]
        for arm in ("react", "acm")
    }
    if all(peaks.values()) and sum(peaks["react"]):
        ratio = (sum(peaks["acm"]) / len(peaks["acm"])) / (
            sum(peaks["react"]) / len(peaks["react"])
        )
        lines += ["", f"Mean peak tokens, acm / react: {ratio:.3f}."]
    archive = [
        (folder, arm, r["arms"][arm])
        for folder, r, _ in runs
        for arm in arms
        if r["arms"].get(arm, {}).get("archive_episodes")
    ]
    if archive:
        lines += [
            "",
            "Tasks that need an archived detail (a later document selects it), per run:",
            "",
            "| run | arm | episodes | asked the archive | Pass@1 when asked | Pass@1 when not |",
            "|---|---|---|---|---|---|",
        ]
        for folder, arm, s in archive:
            asked, other = s["archive_pass_queried"], s["archive_pass_unqueried"]
            lines.append(
                f"| {folder} | {arm} | {s['archive_episodes']} | "
                f"{s['archive_queried']:.2f} | {'-' if asked is None else f'{asked:.2f}'} | "
                f"{'-' if other is None else f'{other:.2f}'} |"
            )
    pairs = [(a, b) for a, b in PAIRS if a in arms and b in arms]
    if pairs:
        lines += [
            "",
            "Paired differences per run (b - a over the tasks both arms ran):",
            "",
            "| a | b | run | Pass@1 b - a | paired 95% CI | b alone / a alone | exact McNemar p |",
            "|---|---|---|---|---|---|---|",
        ]
    for a, b in pairs:
        for folder, _, by_arm in runs:
            if a not in by_arm or b not in by_arm:
                continue
            p = paired_bootstrap(by_arm[a], by_arm[b])
            m = mcnemar(by_arm[a], by_arm[b])
            lines.append(
                f"| {a} | {b} | {folder} | {p.diff:+.3f} | [{p.low:+.3f}, {p.high:+.3f}] | "
                f"{m.only_b} / {m.only_a} | {m.p:.3g} |"
            )
    text = "\n".join(lines) + "\n"
    if output is not None:
        from acmrl.eval.run import _atomic_write

        _atomic_write(Path(output), text)
    return text
