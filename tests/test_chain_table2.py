"""scripts/chain_table2.py, the fair Table 2 protocol: its stage configs (written by --dry-run)
load, train on worlds that no dev or test world shares, and take tasks from every world."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from acmrl.config import AnnotateConfig, EvalConfig, SFTConfig, load_config
from acmrl.envs import load

ROOT = Path(__file__).resolve().parents[1]


def _dry(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / "chain_table2.py"), str(out), "--dry-run"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_protocol_trains_and_tests_on_separate_worlds(tmp_path):
    res = _dry(tmp_path, "--seeds", "0", "1", "--steps", "7")
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    assert annotate.teacher.policy == "best" and annotate.agent.on_overflow == "force_answer"
    assert annotate.arms == ["react", "summary", "memory", "acm"]
    train = set(annotate.env.options["seeds"])
    for seed in (0, 1):
        sft = load_config(SFTConfig, cfgs / f"sft-s{seed}.yaml", [])
        assert (sft.seed, sft.optim.max_steps) == (seed, 7)
        for part in ("dev", "test"):
            ev = load_config(EvalConfig, cfgs / f"eval-{part}-s{seed}.yaml", [])
            assert ev.agent.on_overflow == "force_answer" and ev.env.split == "eval"
            assert not train & set(ev.env.options["seeds"]), part
            assert ev.model.name.endswith(f"sft-s{seed}/final")
    mix = load("mixture", **annotate.env.options)
    assert len({t.id.split("/")[2] for t in mix.tasks("train")}) == len(train) == 10
    # another --test-tasks would rename the test worlds' questions under the same ids: refused
    again = _dry(tmp_path, "--seeds", "0", "--steps", "7", "--test-tasks", "10")
    assert again.returncode != 0 and "test_tasks: 25 -> 10" in again.stderr


def test_the_read_timing_and_train_arms_reach_the_annotation(tmp_path):
    res = _dry(tmp_path, "--train-arms", "acm", "--timing", "read", "--eval-arms", "acm", "react")
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    assert annotate.arms == ["acm"]
    t = annotate.teacher
    assert (t.pressure, t.pressure_spread, t.late_share) == (0.05, [], 0.0)
    ev = load_config(EvalConfig, cfgs / "eval-dev-s0.yaml", [])
    assert ev.arms == ["acm", "react"]
    # the default timing is the demo's spread
    other = tmp_path / "other"
    assert _dry(other).returncode == 0
    spread = load_config(AnnotateConfig, other / "configs" / "annotate.yaml", []).teacher
    assert spread.pressure_spread == [0.5, 0.9] and spread.late_share > 0
    # a rerun with another timing is refused, as the dataset was built with the first
    again = _dry(tmp_path, "--train-arms", "acm", "--timing", "spread")
    assert again.returncode != 0 and "timing: read -> spread" in again.stderr


def test_a_teacher_round_runs_on_other_training_worlds_and_the_evals_read_its_policy(tmp_path):
    res = _dry(tmp_path, "--train-arms", "acm", "--round-tasks", "3", "--round-steps", "4")
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    round_ = load_config(AnnotateConfig, cfgs / "round-s0.yaml", [])
    assert not round_.demonstrations and round_.arms == ["acm"]
    assert round_.model.name.endswith("sft-s0/final")
    assert round_.agent.on_overflow == "force_answer" and round_.agent.max_context_tokens == 2048
    assert round_.env.options["options"] == {"preset": "chain", "n_train": 3}
    worlds = set(round_.env.options["seeds"])
    ev = load_config(EvalConfig, cfgs / "eval-test-s0.yaml", [])
    dev = load_config(EvalConfig, cfgs / "eval-dev-s0.yaml", [])
    assert not worlds & (set(ev.env.options["seeds"]) | set(dev.env.options["seeds"]))
    assert not worlds & set(annotate.env.options["seeds"])
    sft_round = load_config(SFTConfig, cfgs / "sft-round-s0.yaml", [])
    assert sft_round.optim.max_steps == 4 and sft_round.model.name.endswith("sft-s0/final")
    assert [Path(d).name for d in sft_round.dataset] == ["annotate", "round-s0"]
    sft = load_config(SFTConfig, cfgs / "sft-s0.yaml", [])
    assert sft_round.optim.lr < sft.optim.lr
    assert ev.model.name.endswith("sft-round-s0/final")
