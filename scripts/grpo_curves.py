"""GRPO learning curves of several ``scripts/grpo_seeds.py`` runs side by side (e.g.
whole-episode groups against decision groups, from the same start, over the same seeds).

    .venv/bin/python scripts/grpo_curves.py RUN [RUN ...] --to DIR [--labels NAME ...]
        [--part test|dev]

Each RUN is a ``grpo_seeds.py`` output folder; its ``curves.json`` holds every evaluated
checkpoint's Pass@1 and Compaction Cost per success. ``--part test`` (the default) needs runs
made with ``--test-curves``; ``--part dev`` reads the evals the checkpoints were chosen on.
Writes DIR/seed_curves.md (per configuration and step: Pass@1 mean and range over the seeds,
Compaction Cost per success pooled over their successes, with its range) and
DIR/seed_curves.png (both per step, a line per configuration, a band over the seeds' range).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from acmrl.eval.curves import seed_curve, write_seed_curves


def read_curve(run: Path, part: str) -> list[dict]:
    """The curve of one ``grpo_seeds.py`` run on ``part`` (a clear exit when it has none)."""
    path = run / "curves.json"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: is {run} a finished grpo_seeds.py run?")
    by_part = json.loads(path.read_text())
    if part not in by_part:
        hint = " (run grpo_seeds.py with --test-curves: it resumes)" if part == "test" else ""
        raise SystemExit(f"{run} has no {part} curves{hint}; it has {sorted(by_part)}")
    return seed_curve(by_part[part])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="grpo_seeds.py output folders")
    ap.add_argument("--to", type=Path, required=True, help="folder for seed_curves.md/.png")
    ap.add_argument("--labels", nargs="+", help="a name per run (default: the folder names)")
    ap.add_argument("--part", choices=("test", "dev"), default="test")
    args = ap.parse_args()
    labels = args.labels or [r.name for r in args.runs]
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        raise SystemExit("--labels: one distinct name per run")
    curves = {
        label: read_curve(run, args.part) for label, run in zip(labels, args.runs, strict=True)
    }
    title = f"GRPO per step on the {args.part} worlds: " + " against ".join(labels)
    print(write_seed_curves(curves, args.to, title))


if __name__ == "__main__":
    main()
