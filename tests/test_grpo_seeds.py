"""scripts/grpo_seeds.py: GRPO over seeds, each run's checkpoint chosen on dev worlds and
compared with its start on test worlds, every run in one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from acmrl.config import EvalConfig, GRPOConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def _run(out: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / "grpo_seeds.py"), str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's acmrl, as the stages use
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_runs_train_on_their_own_worlds_and_take_the_options(tmp_path, tiny_model_dir):
    args = ["--start", str(tiny_model_dir), "--seeds", "0", "1", "--steps", "6"]
    args += ["--save-every", "3", "--set", "decisions.share=0.5", "segment_weight=inverse"]
    res = _run(tmp_path, *args, "--dry-run")
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    worlds = {}
    for seed in (0, 1):
        grpo = load_config(GRPOConfig, cfgs / f"grpo-s{seed}.yaml", [])
        assert grpo.seed == seed and grpo.optim.max_steps == 6 and grpo.save_every == 3
        assert grpo.decisions.share == 0.5 and grpo.segment_weight == "inverse"
        assert grpo.agent.on_overflow == "force_answer" and grpo.agent.max_context_tokens == 2048
        worlds["train"] = set(grpo.env.options["seeds"])
        for step in (3, 6):
            ev = load_config(EvalConfig, cfgs / f"eval-dev-s{seed}-step{step}.yaml", [])
            assert ev.model.name.endswith(f"grpo-s{seed}/checkpoints/step-{step:06d}/model")
            worlds["dev"] = set(ev.env.options["seeds"])
    worlds["test"] = set(
        load_config(EvalConfig, cfgs / "eval-test-start.yaml").env.options["seeds"]
    )
    assert not worlds["train"] & (worlds["dev"] | worlds["test"])
    assert not worlds["dev"] & worlds["test"]
    # a rerun with other settings is refused once started (dry runs pin nothing)
    assert not (tmp_path / "protocol.json").exists()
    bad = _run(tmp_path, *args[:-2], "--set", "decisions.shar=1", "--dry-run")
    assert bad.returncode != 0 and "decisions.shar" in bad.stderr
    odd = _run(tmp_path, "--start", str(tiny_model_dir), "--steps", "5", "--save-every", "3")
    assert odd.returncode != 0 and "multiple of --save-every" in odd.stderr
    for key in ("seed=3", "optim.max_steps=50", "env.split=eval", "agent.max_turns=5"):
        fixed = _run(tmp_path, *args[:-2], "--set", key, "--dry-run")
        assert fixed.returncode != 0 and "set by the protocol" in fixed.stderr, key


def test_the_choice_is_dev_pass_then_cost_then_the_earliest(script):
    choose = script("grpo_seeds").choose
    assert choose({0: (0.25, 900.0), 5: (0.5, 1200.0), 10: (0.5, 1000.0)}) == 10
    assert choose({0: (0.5, 900.0), 5: (0.5, 950.0), 10: (0.25, 10.0)}) == 0
    assert choose({0: (0.0, float("inf")), 5: (0.0, float("inf"))}) == 0


def test_a_token_budget_leaves_the_checkpoints_that_cost_more_out_of_the_choice(script):
    """--token-budget: runs of different group shapes are compared at the same spend, so a
    checkpoint whose run had generated more rollout tokens (or an unknown number) is not
    eligible; the start always is."""
    seeds = script("grpo_seeds")
    scores = {0: (0.25, 900.0), 5: (0.5, 1200.0), 10: (0.75, 1000.0), 15: (1.0, 10.0)}
    spent = {0: 0.0, 5: 4000.0, 10: 8000.0, 15: None}
    assert seeds.choose(scores) == 15
    assert seeds.choose(seeds.within(scores, spent, 8000)) == 10
    assert seeds.choose(seeds.within(scores, spent, 5000)) == 5
    assert seeds.within(scores, spent, 100) == {0: (0.25, 900.0)}


@pytest.mark.slow
def test_every_seed_is_trained_chosen_on_dev_and_listed(tmp_path, tiny_model_dir):
    """The whole script on the tiny model: two seeds of 1 GRPO step with decision groups, a
    dev eval per checkpoint and of the start, the test evals, and one table listing both runs."""
    args = ["--start", str(tiny_model_dir), "--seeds", "0", "1", "--steps", "1"]
    args += ["--save-every", "1", "--dev-tasks", "1", "--test-tasks", "1", "--group", "2"]
    args += ["--tasks", "1", "--max-new-tokens", "8", "--set", "decisions.share=1.0"]
    args += ["skip_flat_groups=false", "lora.r=4", "lora.top_layers=null", "log_with=[]"]
    res = _run(tmp_path, *args, "--test-curves", timeout=1800)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert set(curves) == {"dev", "test", "rollout_tokens", "prefill_tokens"}
    assert set(curves["test"]) == {"0", "1"}
    assert curves["prefill_tokens"]["0"]["0"] == 0 and curves["prefill_tokens"]["0"]["1"] > 0
    assert all(set(by_step) == {"0", "1"} for by_step in curves["test"].values())
    assert (tmp_path / "eval-test-s0-step1" / "report.json").exists()  # every checkpoint tested
    spent = curves["rollout_tokens"]["0"]
    assert spent["0"] == 0 and spent["1"] > 0  # what seed 0 had generated by its step 1
    mean = (spent["1"] + curves["rollout_tokens"]["1"]["1"]) / 2
    assert f"| test worlds | 1 | {mean:,.0f} | 2 |" in (tmp_path / "seed_curves.md").read_text()
    for seed in (0, 1):
        choice = json.loads((tmp_path / f"choice-s{seed}.json").read_text())
        assert set(choice["dev"]) == {"0", "1"}
        assert choice["step"] in (0, 1)
    table = (tmp_path / "grpo_seeds.md").read_text()
    assert "| seed 0, step" in table and "| seed 1, step" in table
    assert "Over 2 runs, mean (range)" in table
    assert "seed 1: step" in table  # how each was chosen
    assert json.loads((tmp_path / "protocol.json").read_text())["seeds"] == [0, 1]
    assert json.loads((tmp_path / "protocol.json").read_text())["steps"] == 1
    # a rerun with other seeds (a table without some runs) or settings is refused
    for other in (["--seeds", "1"], ["--steps", "2"]):
        again = _run(tmp_path, *args, *other)
        assert again.returncode != 0 and "started with other settings" in again.stderr, other
    # and leaves the run's configs as they were
    grpo = load_config(GRPOConfig, tmp_path / "configs" / "grpo-s0.yaml", [])
    assert grpo.optim.max_steps == 1


def _curves_run(folder: Path, test: dict[str, dict[str, list]], sets: list[str]) -> Path:
    folder.mkdir(parents=True)
    # each seed had generated 200 rollout tokens per step by each checkpoint
    spent = {seed: {step: 200.0 * int(step) for step in s} for seed, s in test.items()}
    saved = {"dev": test, "test": test, "rollout_tokens": spent}
    (folder / "curves.json").write_text(json.dumps(saved))
    protocol = {"seeds": [int(s) for s in test], "steps": 5, "group": 4, "sets": sets}
    (folder / "protocol.json").write_text(json.dumps(protocol))
    return folder


def test_curves_of_two_configurations_side_by_side(tmp_path):
    """scripts/grpo_curves.py: per configuration and step, Pass@1's mean and range over the
    seeds and the Compaction Cost per success pooled over their successes; a run without test
    curves is refused with the flag that makes them."""
    whole = _curves_run(
        tmp_path / "whole",
        {"0": {"0": [0.25, 1000.0], "5": [0.5, 900.0]}, "1": {"0": [0.0, None]}},
        [],
    )
    decision = _curves_run(
        tmp_path / "decision",
        {"0": {"0": [0.25, 1000.0], "5": [0.75, 600.0]}, "1": {"0": [0.0, None]}},
        ["decisions.share=1.0"],
    )
    cmd = [sys.executable, str(ROOT / "scripts" / "grpo_curves.py"), str(whole), str(decision)]
    cmd += ["--to", str(tmp_path / "cmp"), "--labels", "whole", "decision", "--x", "tokens"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    md = (tmp_path / "cmp" / "seed_curves.md").read_text()
    assert "| whole | 0 | 0 | 2 | 0.125 (0.000-0.250) | 1,000 (1,000-1,000) |" in md
    assert "| decision | 5 | 1,000 | 1 | 0.750 (0.750-0.750) | 600 (600-600) |" in md
    assert (tmp_path / "cmp" / "seed_curves.png").stat().st_size > 0
    # runs that differ in more than their GRPO options (here one seed fewer) are refused
    fewer = _curves_run(tmp_path / "fewer", {"0": {"0": [0.25, 1000.0]}}, [])
    mixed = subprocess.run(
        [*cmd[:2], str(whole), str(fewer), "--to", str(tmp_path / "y")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert mixed.returncode != 0 and "differ in more than their GRPO options (seeds" in mixed.stderr
    (tmp_path / "dev-only").mkdir()
    (tmp_path / "dev-only" / "curves.json").write_text(json.dumps({"dev": {}}))
    bad = subprocess.run(
        [*cmd[:2], str(tmp_path / "dev-only"), "--to", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode != 0 and "--test-curves" in bad.stderr
