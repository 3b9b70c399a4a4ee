"""Peak resident memory of SFT steps under environment variants, side by side.

    .venv/bin/python benchmarks/sft_memory.py --config runs/demo/configs/sft.yaml \
        [--steps 40] [--rounds 1] [--variant NAME=KEY=VALUE ...] [--no-default]

Each variant runs ``acmrl train sft --config CONFIG optim.max_steps=STEPS`` as a child process
into a throw-away folder, with the variant's settings (``default`` has none): a KEY with a dot
is a config override (``model.keep_freed_memory=false``), any other an environment variable;
repeat ``--variant`` with one NAME for several. With ``--rounds`` above 1 the variants
alternate, round after round. Printed per run: wall seconds, peak RSS of the child (``os.wait4``), its RSS when
each quarter of the steps is logged (from ``/proc``: a peak that climbs with the step count is
memory kept across steps, not one large batch), and the last logged loss (variants that only
change a cache or an allocator must agree). All in kB / 1e6, the unit of
:func:`acmrl.models.resident_gb`. Run alone: CPU contention distorts the wall times, not the
memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from keep_freed_memory import sft_command  # this folder's (run as a script)

from acmrl.models import resident_gb


def run(config: str, steps: int, settings: dict[str, str]) -> dict[str, object]:
    env = {k: v for k, v in settings.items() if "." not in k}
    overrides = [f"{k}={v}" for k, v in settings.items() if "." in k]
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile("w+") as log:
        cmd = sft_command(config, steps, out, *overrides)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=os.environ | env)
        metrics, marks, seen = Path(out) / "metrics.jsonl", [], 0
        while True:  # the RSS within 0.5 s of each quarter of the steps being logged
            done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            if done >= (seen + 1) * steps / 4:
                seen += 1
                marks.append(resident_gb(proc.pid)[0] or float("nan"))  # 0: exited
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{log.read()[-2000:]}")
        loss = json.loads(metrics.read_text().splitlines()[-1]).get("loss", float("nan"))
    return {"wall": wall, "rss_gb": usage.ru_maxrss / 1e6, "marks": marks, "loss": loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="an SFT config whose dataset exists")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the variants this often")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=KEY=VALUE: variant NAME sets config key KEY (a dotted name) or environment "
        "variable KEY to VALUE",
    )
    ap.add_argument("--no-default", action="store_true", help="only the --variant runs")
    args = ap.parse_args()
    variants: dict[str, dict[str, str]] = {} if args.no_default else {"default": {}}
    for v in args.variant:
        name, key, value = v.split("=", 2)
        variants.setdefault(name, {})[key] = value
    print(f"round {'variant':<12} {'wall s':>8} {'peak GB':>8}  RSS at 1/4..4/4 of the steps  loss")
    for round_ in range(1, args.rounds + 1):
        for name, settings in variants.items():
            r = run(args.config, args.steps, settings)
            marks = " ".join(f"{m:.2f}" for m in r["marks"])
            print(
                f"{round_:<5} {name:<12} {r['wall']:>8.1f} {r['rss_gb']:>8.2f}  {marks:<30} "
                f"{r['loss']:.6f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
