"""Two training processes on this CPU (gloo), launched the way a cluster job launches them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.test_sft import dataset  # noqa: F401 - the annotated dataset fixture

LAUNCH = [
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
]


@pytest.mark.slow
def test_sft_under_a_two_process_launch(tmp_path, dataset, tiny_model_dir):  # noqa: F811
    out = tmp_path / "ddp"
    cmd = [
        *LAUNCH,
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


@pytest.mark.slow
def test_grpo_under_a_two_process_launch(tmp_path, tiny_model_dir):
    """Each process rolls out its own task's group; gradients are averaged across the two."""
    out = tmp_path / "grpo"
    cmd = [
        *LAUNCH,
        "grpo",
        f"model.name={tiny_model_dir}",
        "env.name=tests.grpo_env:TargetEnv",
        "env.options={target: the, tasks: 2}",
        "arms=[react]",
        "agent.max_turns=1",
        "sampling.max_new_tokens=2",
        "group_size=2",
        "tasks_per_step=2",
        "skip_flat_groups=false",
        "optim.max_steps=2",
        "save_every=2",
        "lora.r=4",
        "log_with=[]",
        f"output={out}",
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = sorted(re.findall(r"process (\d) of (\d): steps 2", res.stdout))
    assert ranks == [("0", "2"), ("1", "2")]
    assert (out / "final" / "adapter_config.json").exists()
    for rank in (0, 1):  # one task's group of 2 per process and step
        assert len((out / f"rollouts-rank{rank}.jsonl").read_text().splitlines()) == 4
