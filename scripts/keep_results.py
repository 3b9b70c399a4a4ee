"""Copy the small outputs of a protocol run (``scripts/chain_table2.py``, ``scripts/grpo_seeds.py``)
into ``results/``, where they are kept with the code that made them.

    .venv/bin/python scripts/keep_results.py runs/trace-acm results/trace-acm

A run folder holds checkpoints and trajectories of several GB; what its tables are computed from
is small: each eval's ``report.json`` and ``episodes.csv`` (``acmrl eval seeds`` reads those),
its ``episodes.jsonl`` gzipped (``acmrl eval versus`` and ``acmrl eval edits`` read that, as
``episodes.jsonl.gz``), ``edits.csv``, ``report.md`` and ``config.yaml``; the run's
``protocol.json``, stage configs and tables (``table2.md``, ``grpo_seeds.md``, ``edits-s*.md``,
``curves.json``, ``choice-s*.json``); the annotation's counts. Those are copied, each up to
``--max-bytes`` (a file over it is left out and listed); checkpoints, datasets and logs are not.
A rerun overwrites the copies it makes and leaves any others in place. ``acmrl eval seeds
results/NAME/eval-test-s0 ...`` then rebuilds a table from the kept files alone.
"""

from __future__ import annotations

import argparse
import gzip
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
    for src in sorted(run.glob("eval-*/episodes.jsonl")):
        data = gzip.compress(src.read_bytes(), mtime=0)
        if len(data) > max_bytes:
            skipped.append(f"{src} ({len(data):,} bytes gzipped)")
            continue
        target = dest / src.relative_to(run).with_suffix(".jsonl.gz")
        _write(target, data)
        copied.append(target)
    for pattern, name in KEPT:
        for src in sorted(run.glob(pattern)):
            if not src.is_file():
                continue
            if src.stat().st_size > max_bytes:
                skipped.append(f"{src} ({src.stat().st_size:,} bytes)")
                continue
            target = dest / (name if name else src.relative_to(run))
            _write(target, src.read_bytes())
            copied.append(target)
    return copied, skipped


def _write(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (a temporary file beside it, then a rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


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
