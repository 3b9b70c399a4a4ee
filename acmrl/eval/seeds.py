"""``acmrl eval seeds A B C ...``: one table over the runs of several training seeds.

Each argument is a folder ``acmrl eval`` wrote for one trained model (one training seed) on the
same tasks. The table lists every run (never the best of them), then per arm the mean and the
range over runs of Pass@1, peak tokens and Compaction Cost per episode, and per pair of arms the
paired difference in each run and over all runs: the bootstrap interval over tasks, the exact
McNemar p-value and the exact sign-flip p-value with the task as the unit, from the runs'
``episodes.csv``.

Where each arm has its own trained model (one student per arm, the same demonstrations, steps
and rounds), name the runs per column instead: ``acmrl eval seeds acm=A0,A1,A2
summary=S0,S1,S2 react:acm-model=A0,A1,A2 react:summary-model=S0,S1,S2``. A column is
``ARM`` or ``ARM:NAME`` (the arm read from those runs, and a name to tell two columns of one
arm apart), then its runs in seed order; the columns pair run by run (the i-th run of each is
seed i), so every column lists as many runs.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acmrl.config import ARMS
from acmrl.eval.report import mcnemar, paired_bootstrap, sign_flip

PAIRS = (
    ("react", "acm"),
    ("summary", "acm"),
    ("react", "summary"),
    ("react", "memory"),
    ("memory", "acm"),
)


@dataclass
class _Run:
    folder: Path
    report: dict[str, Any]
    by_arm: dict[str, dict[str, list[float]]]  # arm -> "<task>#<sample>" -> [success]


@dataclass
class Column:
    """One arm of the table, read from one run per seed."""

    label: str
    arm: str
    runs: list[_Run]


def _load(folder: Path) -> _Run:
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
    return _Run(folder, report, by_arm)


SAME = ("env", "env_options", "split", "samples", "temperature", "on_overflow", "repeat_rule")


def _check_alike(runs: list[_Run]) -> None:
    """The runs must differ in the model alone: the same settings and budgets."""
    first = runs[0]
    for run in runs[1:]:
        changed = [k for k in SAME if first.report["meta"].get(k) != run.report["meta"].get(k)]
        common = set(first.report["arms"]) & set(run.report["arms"])
        if any(
            first.report["arms"][a]["budget"] != run.report["arms"][a]["budget"] for a in common
        ):
            changed.append("budget")
        if changed:
            raise ValueError(
                f"{run.folder} was evaluated under other settings than {first.folder} "
                f"({', '.join(changed)})"
            )


def _check_tasks(columns: list[Column]) -> None:
    """Every run of every column ran its arm on the same tasks."""
    ref = columns[0].runs[0]
    want = set(ref.by_arm.get(columns[0].arm, {}))
    for col in columns:
        for run in col.runs:
            if set(run.by_arm.get(col.arm, {})) != want:
                raise ValueError(
                    f"the runs were evaluated on different tasks: {col.arm} in {run.folder} "
                    f"and {columns[0].arm} in {ref.folder}"
                )


def _is_column(arg: str) -> bool:
    """``ARM=...`` or ``ARM:NAME=...`` (a run folder may hold a ``=`` in its path too)."""
    label, sep, _ = arg.partition("=")
    return bool(sep) and re.fullmatch(r"\w+(:[\w.-]+)?", label) is not None


def parse_columns(args: list[str]) -> list[Column]:
    """``ARM[:NAME]=RUN,RUN,...`` per argument (see the module's docstring)."""
    loaded: dict[Path, _Run] = {}
    columns: list[Column] = []
    for arg in args:
        label, sep, folders = arg.partition("=")
        arm = label.split(":", 1)[0]
        if not sep or arm not in ARMS or not folders.strip(","):
            raise ValueError(
                f"column {arg!r}: write ARM=RUN,RUN,... or ARM:NAME=RUN,... with ARM one of "
                f"{', '.join(ARMS)}"
            )
        if any(c.label == label for c in columns):
            raise ValueError(f"column {label!r} is given twice: name them ARM:NAME")
        runs = []
        for f in filter(None, folders.split(",")):
            path = Path(f)
            if path not in loaded:
                loaded[path] = _load(path)
            if arm not in loaded[path].report["arms"]:
                raise ValueError(f"column {label!r}: {path} has no {arm} episodes")
            runs.append(loaded[path])
        columns.append(Column(label, arm, runs))
    counts = {c.label: len(c.runs) for c in columns}
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"the columns pair run by run (seed by seed), so each needs as many: {counts}"
        )
    return columns


def _spread(values: list[float], fmt: str) -> str:
    mean = sum(values) / len(values)
    return f"{mean:{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def seeds_table(folders: list[str | Path], output: str | Path | None = None) -> str:
    """Markdown: every run's figures, then mean [min, max] per arm, then paired differences.
    ``folders`` are run folders (each run holds every arm) or ``ARM[:NAME]=RUN,...`` columns."""
    if len(folders) < 1:
        raise ValueError("acmrl eval seeds needs at least one result folder")
    if any(_is_column(str(f)) for f in folders):
        if not all(_is_column(str(f)) for f in folders):
            raise ValueError("give either run folders or ARM=RUN,... columns, not both")
        columns = parse_columns([str(f) for f in folders])
        _check_alike(list({id(r): r for c in columns for r in c.runs}.values()))
    else:
        runs = [_load(Path(f)) for f in folders]
        _check_alike(runs)
        columns = [
            Column(arm, arm, runs) for arm in ARMS if any(arm in r.report["arms"] for r in runs)
        ]
    _check_tasks(columns)
    return _table(columns, output)


def _runs_with(columns: list[Column], key: str) -> list[tuple[Any, Column]]:
    """(run, column) for every run whose report has ``key`` for the column's arm."""
    return [
        (run, col) for col in columns for run in col.runs if run.report["arms"][col.arm].get(key)
    ]


def _by_task(episodes: dict[str, list[float]]) -> dict[str, list[float]]:
    """``<task>#<sample>`` keys grouped by task."""
    out: dict[str, list[float]] = {}
    for key, v in episodes.items():
        out.setdefault(key.rsplit("#", 1)[0], []).extend(v)
    return out


def _table(columns: list[Column], output: str | Path | None) -> str:
    n_runs = max(len(c.runs) for c in columns)
    lines = [
        f"# {n_runs} runs per arm, every one listed",
        "",
        "| run | arm | Pass@1 [95% CI] | peak tokens | overflow | Compaction Cost/ep |",
        "|---|---|---|---|---|---|",
    ]
    for col in columns:
        for run in col.runs:
            s = run.report["arms"][col.arm]
            lines.append(
                f"| {run.folder} | {col.label} | {s['pass@1']:.3f} [{s['pass@1_low']:.2f}, "
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
    for col in columns:
        got = [r.report["arms"][col.arm] for r in col.runs]
        lines.append(
            f"| {col.label} | {len(got)} | {_spread([s['pass@1'] for s in got], '.3f')} | "
            f"{_spread([s['peak_context_tokens'] for s in got], '.0f')} | "
            f"{_spread([s['compaction_cost'] for s in got], '.0f')} |"
        )

    def mean_peak(col: Column) -> float:
        return sum(r.report["arms"][col.arm]["peak_context_tokens"] for r in col.runs) / len(
            col.runs
        )

    ratios = [
        f"{b.label} / {a.label}: {mean_peak(b) / mean_peak(a):.3f}"
        for a in columns
        if a.arm == "react" and mean_peak(a)
        for b in columns
        if b.arm == "acm"
    ]
    if ratios:
        lines += ["", f"Mean peak tokens, {'; '.join(ratios)}."]
    archive = _runs_with(columns, "archive_episodes")
    if archive:
        lines += [
            "",
            "Tasks that need an archived detail (a later document selects it), per run:",
            "",
            "| run | arm | episodes | asked the archive | Pass@1 when asked | Pass@1 when not |",
            "|---|---|---|---|---|---|",
        ]
        for run, col in archive:
            s = run.report["arms"][col.arm]
            asked, other = s["archive_pass_queried"], s["archive_pass_unqueried"]
            lines.append(
                f"| {run.folder} | {col.label} | {s['archive_episodes']} | "
                f"{s['archive_queried']:.2f} | {'-' if asked is None else f'{asked:.2f}'} | "
                f"{'-' if other is None else f'{other:.2f}'} |"
            )
    failed = _runs_with(columns, "failures")
    if failed:
        from acmrl.eval.failures import FAILURES

        lines += [
            "",
            "Why episodes failed, per run (one cause per failed episode, the first that holds: "
            "`acmrl.eval.failures`):",
            "",
            "| run | arm | failed | " + " | ".join(FAILURES) + " |",
            "|---|---|---|" + "---|" * len(FAILURES),
        ]
        for run, col in failed:
            s = run.report["arms"][col.arm]
            counts = s["failures"]
            lines.append(
                f"| {run.folder} | {col.label} | {sum(counts.values())}/{s['episodes']} | "
                + " | ".join(str(counts.get(f, 0)) for f in FAILURES)
                + " |"
            )
    pairs = [
        (ca, cb) for a, b in PAIRS for ca in columns if ca.arm == a for cb in columns if cb.arm == b
    ]
    if pairs:
        lines += [
            "",
            "Paired differences (b - a over the tasks both arms ran), per run (the i-th run of "
            "each column: the same training seed) and over all runs (the interval resamples "
            "tasks, each task's successes averaged over the runs and samples, so it shows task "
            "sampling, not seed to seed variation: read that in the per-run rows; the pooled "
            "McNemar pairs each run's episodes with the same seed's and counts them as "
            "independent pairs, so a task counts once per run; the sign-flip test counts each "
            "task once, its successes summed over the runs: in one run of one sample per task "
            "it is the McNemar test):",
            "",
            "| a | b | run | Pass@1 b - a | paired 95% CI | b alone / a alone | exact McNemar p "
            "| exact sign-flip p, tasks |",
            "|---|---|---|---|---|---|---|---|",
        ]
    for ca, cb in pairs:
        pooled_a: dict[str, list[float]] = {}
        pooled_b: dict[str, list[float]] = {}
        by_task_a: dict[str, list[float]] = {}
        by_task_b: dict[str, list[float]] = {}
        for i, (ra, rb) in enumerate(zip(ca.runs, cb.runs, strict=True)):
            a, b = ra.by_arm[ca.arm], rb.by_arm[cb.arm]
            p, m = paired_bootstrap(a, b), mcnemar(a, b)
            common = set(a) & set(b)
            ta = _by_task({k: a[k] for k in common})  # a task's samples together
            tb = _by_task({k: b[k] for k in common})
            where = ra.folder if ra is rb else f"{ra.folder} : {rb.folder}"
            lines.append(
                f"| {ca.label} | {cb.label} | {where} | {p.diff:+.3f} | [{p.low:+.3f}, "
                f"{p.high:+.3f}] | {m.only_b} / {m.only_a} | {m.p:.3g} | "
                f"{sign_flip(ta, tb):.3g} |"
            )
            for key in common:
                pooled_a[f"{i}/{key}"], pooled_b[f"{i}/{key}"] = a[key], b[key]
            for task in ta:  # and its runs
                by_task_a.setdefault(task, []).extend(ta[task])
                by_task_b.setdefault(task, []).extend(tb[task])
        if len(ca.runs) > 1:
            p, m = paired_bootstrap(by_task_a, by_task_b), mcnemar(pooled_a, pooled_b)
            lines.append(
                f"| {ca.label} | {cb.label} | all {len(ca.runs)} runs | {p.diff:+.3f} | "
                f"[{p.low:+.3f}, {p.high:+.3f}] | {m.only_b} / {m.only_a} | {m.p:.3g} | "
                f"{sign_flip(by_task_a, by_task_b):.3g} |"
            )
    text = "\n".join(lines) + "\n"
    if output is not None:
        from acmrl.eval.run import _atomic_write

        _atomic_write(Path(output), text)
    return text
