"""Copy the small outputs of a protocol run (``scripts/chain_table2.py``, ``scripts/grpo_seeds.py``)
into ``results/``, where they are kept with the code that made them.

    .venv/bin/python scripts/keep_results.py runs/trace-acm results/trace-acm

A run folder holds checkpoints and trajectories of several GB; what its tables are computed from
is small: each eval's ``report.json`` and ``episodes.csv`` (``acmrl eval seeds`` and ``acmrl eval
versus`` read those), ``edits.csv`` and ``report.md``, the run's ``protocol.json``, stage configs,
its tables (``table2.md``, ``grpo_seeds.md``, ``edits-s*.md``, ``curves.json``, ``choice-s*.json``)
and the annotation's counts. Those are copied, each under ``--max-bytes``; anything else (and a
file over the limit) is left and listed. A rerun replaces the copies. ``acmrl eval seeds
results/.../eval-test-s0 ...`` then rebuilds a table from the kept files alone.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

# (pattern relative to the run folder, the name it is kept under; None: the same)
KEPT = [
    ("protocol.json", None),
    ("configs/*.yaml", None),
    ("*.md", None),
    ("curves.json", None),
    ("choice-s*.json", None),
    ("annotate/README.md", "annotate.md"),
    ("round-s*/README.md", None),
    ("eval-*/report.json", None),
    ("eval-*/report.md", None),
    ("eval-*/episodes.csv", None),
    ("eval-*/edits.csv", None),
    ("eval-*/config.yaml", None),
]


def keep(run: Path, dest: Path, max_bytes: int = 2_000_000) -> tuple[list[Path], list[str]]:
    """Copy ``run``'s small outputs (KEPT) to ``dest``; returns the copies and the files left
    out for their size."""
    if not (run / "protocol.json").is_file():
        raise SystemExit(
            f"{run} has no protocol.json: give a folder chain_table2.py or grpo_seeds.py wrote"
        )
    copied, skipped = [], []
    for pattern, name in KEPT:
        for src in sorted(run.glob(pattern)):
            if not src.is_file():
                continue
            if src.stat().st_size > max_bytes:
                skipped.append(f"{src} ({src.stat().st_size:,} bytes)")
                continue
            target = dest / (name if name else src.relative_to(run))
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            shutil.copyfile(src, tmp)
            tmp.replace(target)
            copied.append(target)
    return copied, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a protocol's run folder")
    ap.add_argument("dest", type=Path, help="where to keep its small outputs (results/NAME)")
    ap.add_argument("--max-bytes", type=int, default=2_000_000, help="largest file copied")
    args = ap.parse_args()
    copied, skipped = keep(args.run, args.dest, args.max_bytes)
    print(f"kept {len(copied)} files in {args.dest}")
    for s in skipped:
        print(f"left out for its size: {s}")


if __name__ == "__main__":
    main()
