"""The Slurm recipes of scripts/slurm/ on a real single-node cluster (Debian's slurm-wlm).

Skipped where Slurm is not installed or the daemons cannot start (they need root); the skip
reason says which. Submits the annotate job array and its merge, a 2-task CPU SFT job (one
process per Slurm task, gloo), and preempts a second SFT job with SIGUSR1 through scancel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_sft import dataset  # noqa: F401 - the annotated dataset fixture

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "scripts" / "slurm"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "srun") if not shutil.which(b)]
    if missing:
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)} missing)")
    if os.getuid() != 0:
        pytest.skip("the Slurm daemons need root")
    where = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(
        ["bash", str(SLURM / "local_cluster.sh"), "start", str(where)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    env = os.environ | {
        "SLURM_CONF": str(where / "slurm.conf"),
        "ACMRL_PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    yield env
    subprocess.run(["bash", str(SLURM / "local_cluster.sh"), "stop", str(where)], timeout=60)


def sbatch(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sbatch", *args], capture_output=True, text=True, timeout=900, env=env, cwd=cwd
    )


def test_annotate_array_then_merge(cluster, tmp_path, tiny_model_dir):
    out = tmp_path / "ann"
    overrides = [
        f"model.name={tiny_model_dir}",
        "env.options={preset: tiny, seed: 0}",
        "env.split=train",
        "env.limit=6",
        "arms=[acm]",
        "demonstrations=true",
        "student_tasks=0",
        f"output={out}",
    ]
    config = tmp_path / "annotate.yaml"
    config.write_text("agent: {max_turns: 12, max_context_tokens: 1400}\n")
    res = subprocess.run(
        ["bash", str(SLURM / "annotate.sh"), "3", str(config), *overrides],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster | {"SBATCH_ARGS": f"--chdir={tmp_path}"},
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    ids = dict(line.split() for line in res.stdout.splitlines())
    print(f"annotate array job {ids['array']}, merge job {ids['merge']}")
    deadline = time.monotonic() + 600
    while subprocess.run(
        ["squeue", "-h", "-j", f"{ids['array']},{ids['merge']}"],
        capture_output=True,
        text=True,
        env=cluster,
    ).stdout.strip():
        assert time.monotonic() < deadline, "the annotate jobs did not finish"
        time.sleep(1)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.out")}
    merge_log = next(v for k, v in logs.items() if k.startswith("acmrl-annotate-merge"))
    assert "dataset:" in merge_log, logs
    shards = sorted(p.name for p in out.glob("records-*.jsonl"))
    assert shards == [f"records-{i}-of-3.jsonl" for i in range(3)]
    assert not (out / "dataset-shard").exists()
    from datasets import load_from_disk

    ds = load_from_disk(str(out / "dataset"))
    print(f"merged dataset: {len(ds['trajectories'])} trajectories, {len(ds['samples'])} samples")
    assert len(ds["trajectories"]) == 6  # one demonstration for each of the 6 tasks
    assert sorted(set(ds["trajectories"]["task_id"])) == sorted(
        json.loads(line)["task_id"]
        for s in shards
        for line in (out / s).read_text().splitlines()
        if line.strip()
    )


def sft_overrides(data: Path, model: Path, out: Path, steps: int) -> list[str]:
    return [
        f"dataset={data}",
        f"model.name={model}",
        f"output={out}",
        "lora.r=4",
        f"optim.max_steps={steps}",
        "optim.batch_tokens=1024",
        "save_every=2",
        "log_with=[]",
    ]


def test_two_task_cpu_sft_job(cluster, tmp_path, dataset, tiny_model_dir):  # noqa: F811
    out = tmp_path / "sft"
    config = tmp_path / "sft.yaml"
    config.write_text("optim: {lr: 5.0e-3}\n")
    res = sbatch(
        cluster | {"LAUNCH": "srun"},
        "--wait",
        "--parsable",
        "--nodes=1",
        "--ntasks=2",
        "--ntasks-per-node=2",
        "--gpus-per-node=0",
        f"--output={tmp_path}/sft-%j.out",
        str(SLURM / "train.sbatch"),
        "sft",
        str(config),
        *sft_overrides(dataset, tiny_model_dir, out, 4),
        cwd=ROOT,
    )
    job = res.stdout.strip().split(";")[0]
    log = next(tmp_path.glob("sft-*.out")).read_text()
    print(f"SFT job {job}: exit {res.returncode}")
    assert res.returncode == 0, log[-3000:] + res.stderr
    ranks = sorted(re.findall(r"process (\d) of (\d): steps 4", log))
    assert ranks == [("0", "2"), ("1", "2")], log[-3000:]
    assert (out / "checkpoints" / "step-000004" / "trainer_state.json").is_file()
    assert (out / "final" / "adapter_config.json").is_file()
    print(f"SFT checkpoint: {sorted(p.name for p in (out / 'checkpoints').iterdir())}")


def test_usr1_from_slurm_saves_and_the_requeued_job_resumes(
    cluster,
    tmp_path,
    dataset,  # noqa: F811
    tiny_model_dir,
):
    """USR1 to the batch script (what --signal=B:USR1@600 sends before the time limit): it
    passes the signal to both processes, they stop at the same step with a checkpoint, the
    script requeues the job, and the job's second run continues from the checkpoint to the end
    (--auto-resume), with every step's metrics once."""
    from acmrl.train.checkpoint import latest_checkpoint

    out = tmp_path / "sft"
    config = tmp_path / "sft.yaml"
    config.write_text("optim: {lr: 5.0e-3}\n")
    args = [
        "--parsable",
        "--nodes=1",
        "--ntasks=2",
        "--ntasks-per-node=2",
        "--gpus-per-node=0",
        f"--output={tmp_path}/sft-%j.out",
        str(SLURM / "train.sbatch"),
        "sft",
        str(config),
        *sft_overrides(dataset, tiny_model_dir, out, 60),
        "save_every=1000",  # the only checkpoint before the end is the one USR1 makes
    ]
    env = cluster | {"LAUNCH": "srun"}
    job = sbatch(env, *args, cwd=ROOT).stdout.strip().split(";")[0]
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.05)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, env=env)
    first_stop = None
    deadline = time.monotonic() + 600
    while subprocess.run(
        ["squeue", "-h", "-j", job], capture_output=True, text=True, env=env
    ).stdout.strip():
        ckpt = latest_checkpoint(out)
        if first_stop is None and ckpt is not None:
            first_stop = json.loads((ckpt / "trainer_state.json").read_text())["step"]
        assert time.monotonic() < deadline, "the requeued job did not finish"
        time.sleep(0.2)
    log = (tmp_path / f"sft-{job}.out").read_text()
    print(f"SFT job {job}: USR1, checkpoint at step {first_stop}, requeued, finished")
    assert "requeueing job" in log and "(restart 1)" in log, log[-3000:]
    assert first_stop is not None and 3 <= first_stop < 60, log[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert (out / "final" / "adapter_config.json").is_file()
