"""Two training processes on this CPU (gloo), launched the way a cluster job launches them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.test_sft import dataset  # noqa: F401 - the annotated dataset fixture


@pytest.mark.slow
def test_sft_under_a_two_process_launch(tmp_path, dataset, tiny_model_dir):  # noqa: F811
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:0",
        "-m",
        "acmrl.cli",
        "train",
        "sft",
        f"dataset={dataset}",
        f"model.name={tiny_model_dir}",
        "optim.max_steps=3",
        "optim.batch_tokens=1024",
        "save_every=3",
        f"output={out}",
        "lora.r=4",
        "log_with=[]",
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = sorted(re.findall(r"process (\d) of (\d): steps 3", res.stdout))
    assert ranks == [("0", "2"), ("1", "2")]
    assert (out / "checkpoints" / "step-000003" / "trainer_state.json").exists()
    assert (out / "final" / "adapter_config.json").exists()
