"""scripts/gpu_check.py, the prepared GPU check, runs its CPU form end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu(tmp_path, default_model_dir):
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            f"--tokenizer={default_model_dir}",
            "--size=tiny",
            "--device=cpu",
            f"--out={tmp_path}",
            "--sft-steps=2",
            "--seq=128",
            "--batch=2",
            "--new-tokens=8",
            "--group=2",
            "--tasks=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert figures["sft_tokens_per_step"] == 256 and figures["sft_tokens_per_s"] > 0
    assert figures["grpo_steps"] == 1 and figures["grpo_episodes"] == 4
    # the engine samples with the trainer's own weights: their logprobs agree closely
    assert math.isfinite(figures["grpo_logprob_mismatch"])
    assert figures["grpo_logprob_mismatch"] < 1e-2
    assert "grpo_logprob_mismatch" in res.stdout


@pytest.mark.slow
def test_gpu_check_can_skip_sft_and_set_the_engine_batch(tmp_path, default_model_dir):
    script = str(ROOT / "scripts" / "gpu_check.py")
    args = ["--size=tiny", "--device=cpu", "--sft-steps=0", "--new-tokens=4", "--group=2"]
    args += ["--tasks=2", "--max-batch=3", f"--out={tmp_path}"]
    res = subprocess.run(
        [sys.executable, script, f"--tokenizer={default_model_dir}", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "sft_tokens_per_s" not in figures
    assert figures["grpo_max_batch"] == 3 and figures["grpo_episodes"] == 4
