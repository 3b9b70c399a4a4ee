"""SFT steps with glibc's default malloc and with freed memory kept in the process.

    .venv/bin/python benchmarks/keep_freed_memory.py --config runs/demo/configs/sft.yaml \
        [--steps 10] [--rounds 2]

Runs ``acmrl train sft --config CONFIG optim.max_steps=STEPS`` as a child process with
``model.keep_freed_memory`` false (glibc's defaults: allocations over 32 MB are mapped afresh
and unmapped when freed, the heap's free top is trimmed) and true (every allocation from the
heap, freed memory kept: :func:`acmrl.models.configure_malloc`), alternating, ``--rounds``
times each, into throw-away output folders. The config's dataset must exist (for the demo's:
``acmrl demo --size tiny stop_after=annotate``).

Printed per run: wall seconds (model loading included, the same in both), minor page faults,
system CPU seconds and peak RSS of the child (``os.wait4``); then the mean of each variant and
the ratio default/kept, and the last logged loss of each (they must agree: only the allocator's
policy differs). Run alone: CPU contention from other jobs distorts the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sft_command(config: str, steps: int, out: str, *overrides: str) -> list[str]:
    """``acmrl train sft`` for ``steps`` steps into ``out``, no checkpoint or logger (the
    benchmarks of SFT share it)."""
    return [
        str(Path(sys.executable).parent / "acmrl"),  # not -m: the working folder's code
        "train",
        "sft",
        "--config",
        config,
        f"optim.max_steps={steps}",
        f"save_every={steps + 1}",
        "log_with=[]",
        f"output={out}",
        *overrides,
    ]


def run(config: str, steps: int, keep: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile("w+") as log:
        cmd = sft_command(config, steps, out, f"model.keep_freed_memory={str(keep).lower()}")
        t0 = time.perf_counter()
        # stderr to a file, not a pipe: a child that fills a pipe nobody reads would block
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{log.read()[-2000:]}")
        lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
        loss = json.loads(lines[-1]).get("loss", float("nan"))
    return {
        "wall": wall,
        "faults": usage.ru_minflt,
        "sys": usage.ru_stime,
        "rss_gb": usage.ru_maxrss / 1e6,
        "loss": loss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="an SFT config whose dataset exists")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    print(f"{'variant':<10} {'wall s':>8} {'minor faults':>13} {'sys s':>7} {'peak GB':>8} loss")
    for _ in range(args.rounds):
        for keep in (False, True):
            r = run(args.config, args.steps, keep)
            results[keep].append(r)
            name = "kept" if keep else "default"
            print(
                f"{name:<10} {r['wall']:>8.1f} {r['faults']:>13,} {r['sys']:>7.1f} "
                f"{r['rss_gb']:>8.2f} {r['loss']:.6f}",
                flush=True,
            )
    mean = {k: sum(r["wall"] for r in v) / len(v) for k, v in results.items()}
    print(
        f"mean wall: default {mean[False]:.1f} s, kept {mean[True]:.1f} s, "
        f"default/kept {mean[False] / mean[True]:.2f}x"
    )


if __name__ == "__main__":
    main()
