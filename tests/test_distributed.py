"""Two training processes on this CPU (gloo), launched the way a cluster job launches them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow
def test_grpo_uneven_micro_batches_match_one_process(tmp_path, tiny_model_dir):
    """Ranks with different numbers of micro-batches (3 and 1) finish the
    update (they hung in DDP's synchronised backward before), and the gradient equals one
    process's over the same four samples: the loss is the token mean over every rank's targets."""
    import torch

    root = Path(__file__).resolve().parents[1]
    script = [sys.executable, "tests/ddp_uneven.py", tiny_model_dir]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [*script, str(tmp_path / "one")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=root,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    launch = [*LAUNCH[:-3], "tests/ddp_uneven.py", tiny_model_dir, str(tmp_path / "two")]
    two = subprocess.run(launch, capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 of 2: 3 samples" in two.stdout and "rank 1 of 2: 1 samples" in two.stdout
    a = torch.load(tmp_path / "one" / "grad.pt")
    b = torch.load(tmp_path / "two" / "grad.pt")
    assert a["grads"].keys() == b["grads"].keys() and a["grads"]
    for name, g in a["grads"].items():
        assert torch.allclose(g, b["grads"][name], rtol=1e-4, atol=1e-7), name
    assert abs(a["metrics"]["train/loss"] - b["metrics"]["train/loss"]) < 1e-5
    assert a["metrics"]["train/target_tokens"] == b["metrics"]["train/target_tokens"]


def test_tasks_per_step_below_the_process_count_is_refused(tmp_path, tiny_model_dir, monkeypatch):
    from acmrl.config import GRPOConfig
    from acmrl.train import grpo
    from tests.grpo_env import TargetEnv, override

    class TwoProcesses:
        num_processes, process_index = 2, 0

    monkeypatch.setattr(grpo, "make_accelerator", lambda *a: TwoProcesses())
    cfg = override(GRPOConfig(), model__name=tiny_model_dir, output=str(tmp_path), tasks_per_step=1)
    with pytest.raises(ValueError, match="tasks_per_step=1 is smaller than the 2 training"):
        grpo.GRPOTrainer(cfg, env=TargetEnv())


@pytest.mark.slow
def test_sharded_checkpoint_path_under_two_processes(tmp_path, tiny_model_dir):
    """Full weights gathered, one optimizer shard per process, each restored by its own rank."""
    script = Path(__file__).parent / "ddp_sharded_save.py"
    cmd = [*LAUNCH[:-3], str(script), str(tiny_model_dir), str(tmp_path)]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(re.findall(r"process (\d): shard restored", res.stdout)) == ["0", "1"]
