"""scripts/chain_table2.py, the fair Table 2 protocol: its stage configs (written by --dry-run)
load, train on worlds that no dev or test world shares, and take tasks from every world."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        assert (sft.save_every, sft.save_total_limit) == (25, None)  # dev can choose steps
        for part in ("dev", "test"):
            ev = load_config(EvalConfig, cfgs / f"eval-{part}-s{seed}.yaml", [])
            assert ev.agent.on_overflow == "force_answer" and ev.env.split == "eval"
            assert not train & set(ev.env.options["seeds"]), part
            # fresh test worlds: 2000 and 2001 were read by a protocol trial and the audit
            want = {"test": [3000, 3001], "dev": [1000, 1001]}[part]
            assert ev.env.options["seeds"] == want, part
            assert ev.model.name.endswith(f"sft-s{seed}/final")
    mix = load("mixture", **annotate.env.options)
    assert len({t.id.split("/")[2] for t in mix.tasks("train")}) == len(train) == 10
    assert not (tmp_path / "protocol.json").exists()  # a dry run pins nothing


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
    # the default is the reported protocol's: read timing, 300 steps, 8 test tasks per world
    other = tmp_path / "other"
    assert _dry(other).returncode == 0
    read = load_config(AnnotateConfig, other / "configs" / "annotate.yaml", []).teacher
    assert (read.pressure, read.pressure_spread, read.late_share) == (0.05, [], 0.0)
    assert load_config(SFTConfig, other / "configs" / "sft-s0.yaml", []).optim.max_steps == 300
    test = load_config(EvalConfig, other / "configs" / "eval-test-s0.yaml", [])
    assert test.env.options["options"]["n_eval"] == 8
    # spread: the tiny demo's timing, each task's point drawn from 0.5-0.9 of the budget
    assert _dry(tmp_path / "spread", "--timing", "spread").returncode == 0
    spread = load_config(AnnotateConfig, tmp_path / "spread" / "configs" / "annotate.yaml", [])
    assert spread.teacher.pressure_spread == [0.5, 0.9] and spread.teacher.late_share > 0
    # late: every task compacts only when the next result would not fit (the audit's timing)
    assert _dry(tmp_path / "late", "--timing", "late").returncode == 0
    late = load_config(AnnotateConfig, tmp_path / "late" / "configs" / "annotate.yaml", [])
    t = late.teacher
    assert (t.pressure, t.pressure_spread, t.late_share) == (1.0, [], 1.0)


def test_a_teacher_round_runs_on_other_training_worlds_and_the_evals_read_its_policy(tmp_path):
    res = _dry(
        tmp_path,
        "--train-arms",
        "acm",
        "--timing",
        "read",
        "--round-tasks",
        "3",
        "--round-steps",
        "4",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    round_ = load_config(AnnotateConfig, cfgs / "round-s0.yaml", [])
    assert not round_.demonstrations and round_.arms == ["acm"]
    assert round_.model.name.endswith("sft-s0/final")
    # the oracle injects by pressure alone: 0.75, not the read timing's 0.05 (see the script)
    assert round_.teacher.pressure == 0.75 and annotate.teacher.pressure == 0.05
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


def test_a_started_protocol_refuses_other_settings_and_reads_older_files(tmp_path, script):
    check = script("chain_table2").check_settings
    now = {"steps": 7, "test_tasks": 25, "train_arms": ["acm"], "timing": "read"}
    check(tmp_path, now)
    check(tmp_path, now)  # the same settings continue
    # another --test-tasks would rename the test worlds' questions under the same ids
    with pytest.raises(SystemExit, match="test_tasks: 25 -> 10"):
        check(tmp_path, {**now, "test_tasks": 10})
    with pytest.raises(SystemExit, match="timing: read -> spread"):
        check(tmp_path, {**now, "timing": "spread"})
    # a file from before a setting existed ran with that setting's former default
    old = tmp_path / "old"
    old.mkdir()
    (old / "protocol.json").write_text(json.dumps({"steps": 100, "test_tasks": 8}))
    defaults = {"train_arms": ["react", "summary", "memory", "acm"], "timing": "spread"}
    check(old, {"steps": 100, "test_tasks": 8, **defaults, "round_tasks": 0, "round_steps": 10})
    with pytest.raises(SystemExit, match="round_tasks: 0 -> 3"):
        check(old, {"steps": 100, "test_tasks": 8, **defaults, "round_tasks": 3})
    # its evals ran on the former test worlds: continuing it on the fresh ones is refused
    with pytest.raises(SystemExit, match=r"test_worlds: \[2000, 2001\] -> \[3000, 3001\]"):
        check(old, {"steps": 100, "test_tasks": 8, **defaults, "test_worlds": [3000, 3001]})
    dry = tmp_path / "dry"
    dry.mkdir()
    check(dry, now, write=False)
    assert not (dry / "protocol.json").exists()


def test_chain_failures_reads_eval_folders(tmp_path, tokenizer):
    """scripts/chain_failures.py over an eval of the best scripted policies: react goes over the
    budget on every task, acm solves every one, and each of acm's first summaries names the
    entity the first document leads to."""
    from acmrl.eval.run import run_eval
    from acmrl.teacher.demonstrate import oracle_engine

    env = load("kb_search", preset="chain", seed=0)
    cfg = EvalConfig(output=str(tmp_path / "r"), arms=["react", "acm"], plots=False)
    cfg.env.options, cfg.env.limit, cfg.agent.max_turns = {"preset": "chain", "seed": 0}, 4, 30
    run_eval(cfg, engine=oracle_engine(env, tokenizer, 2048, policy="best"))
    shapes = {t.metadata["question"] for t in env.tasks("eval")[:4]}

    def table(arm: str) -> list[str]:
        cmd = [sys.executable, str(ROOT / "scripts" / "chain_failures.py"), str(tmp_path / "r")]
        res = subprocess.run(
            [*cmd, "--arm", arm], capture_output=True, text=True, timeout=300, cwd=ROOT
        )
        assert res.returncode == 0, res.stderr[-2000:]
        return [
            line for line in res.stdout.splitlines() if line.startswith("| ") and " via " in line
        ]

    acm, react = table("acm"), table("react")
    assert {line.split(" via ")[0][2:] for line in acm} == shapes
    for line in acm:
        cells = [c.strip() for c in line.strip("|").split("|")]
        n = cells[1]
        assert cells[2] == "1.00" and cells[3:8] == ["0"] * 5 and cells[8] == f"{n}/{n}", line
    for line in react:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == "0.00" and cells[3] == cells[1], line  # all over the budget


def test_the_trace_bench_trains_on_its_train_split_and_reports_on_test(tmp_path):
    res = _dry(tmp_path, "--bench", "trace", "--train-arms", "acm", "--test-tasks", "20")
    assert res.returncode == 0, res.stderr[-2000:]
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    assert (annotate.env.name, annotate.env.options) == ("code_nav", {"preset": "trace"})
    assert (annotate.env.split, annotate.env.limit) == ("train", None)
    assert annotate.agent.max_context_tokens == 2200
    for part in ("dev", "test"):
        ev = load_config(EvalConfig, cfgs / f"eval-{part}-s0.yaml", [])
        assert (ev.env.name, ev.env.split, ev.env.limit) == ("code_nav", part, 20)
        assert ev.agent.max_context_tokens == 2200 and ev.agent.on_overflow == "force_answer"
    refused = _dry(tmp_path / "round", "--bench", "trace", "--round-tasks", "2")
    assert refused.returncode != 0 and "no teacher round" in refused.stderr


def test_agent_options_reach_the_demonstrations_and_every_eval(tmp_path, script):
    """--agent sets the evolve arm's prompt and code rule in every stage, is pinned, and a
    name or value AgentConfig does not take is refused before anything runs."""
    args = ["--seeds", "0", "--train-arms", "evolve", "--eval-arms", "react", "evolve"]
    agent = ["--agent", "evolve_prompt=none", "evolve_keep_code=false", "--max-new-tokens", "512"]
    res = _dry(tmp_path, *args, *agent)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _dry(tmp_path / "d", *args).returncode == 0
    cfgs = tmp_path / "configs"
    annotate = load_config(AnnotateConfig, cfgs / "annotate.yaml", [])
    assert annotate.arms == ["evolve"]
    evals = [load_config(EvalConfig, cfgs / f"eval-{p}-s0.yaml", []) for p in ("dev", "test")]
    for cfg in (annotate, *evals):
        assert (cfg.agent.evolve_prompt, cfg.agent.evolve_keep_code) == ("none", False)
        assert cfg.agent.on_overflow == "force_answer"
    # a student's program fits in its turn
    assert [e.sampling.max_new_tokens for e in evals] == [512, 512]
    default = load_config(EvalConfig, cfgs.parent / "d" / "configs" / "eval-dev-s0.yaml", [])
    assert default.sampling.max_new_tokens == 96
    check, run = script("chain_table2").check_settings, tmp_path / "run"
    run.mkdir()
    check(run, {"steps": 7, "agent": {"evolve_prompt": "none", "evolve_keep_code": False}})
    with pytest.raises(SystemExit, match=r"agent: .* -> \{\}"):
        check(run, {"steps": 7, "agent": {}})
    (run / "protocol.json").write_text(json.dumps({"steps": 7}))  # from before --agent
    check(run, {"steps": 7, "agent": {}})
    for bad, says in (
        ("evolve_prompt=tiny", "evolve_prompt"),
        ("evolve_promt=none", "evolve_promt is not an agent option"),
        ("max_context_tokens=9000", "set by the protocol"),
        ("agent.evolve_prompt=none", "without a section"),
    ):
        res = _dry(tmp_path / bad, *args, "--agent", bad)
        assert res.returncode != 0 and says in res.stderr, (bad, res.stderr[-500:])
    # refused before the run is pinned: a real start with a typo leaves nothing to refuse later
    cmd = [sys.executable, str(ROOT / "scripts" / "chain_table2.py"), str(tmp_path / "typo")]
    res = subprocess.run(
        [*cmd, *args, "--agent", "evolve_prompt=tiny"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode != 0 and not (tmp_path / "typo" / "protocol.json").exists()


def test_a_second_protocol_on_one_folder_is_refused(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys, time; from pathlib import Path\n"
            f"spec = importlib.util.spec_from_file_location('c', {str(ROOT / 'scripts' / 'chain_table2.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"m.hold(Path({str(out)!r})); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        res = _dry(out)
        assert res.returncode != 0
        assert f"in use by another run (process {holder.pid})" in res.stderr
    finally:
        holder.kill()
        holder.wait()
    assert _dry(out).returncode == 0  # the lock went with its process


def test_sigterm_reaches_the_running_stage_and_stops_the_protocol(tmp_path):
    """kill or Slurm's SIGTERM to the protocol must reach the training stage (which saves a
    checkpoint on it) and stop the protocol instead of starting the next stage."""
    child = (
        "import signal, sys, time\n"
        f"def stop(n, f): open({str(tmp_path / 'got')!r}, 'w').write(str(n)); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(tmp_path / 'ready')!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('c', {str(ROOT / 'scripts' / 'chain_table2.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"m.stage([sys.executable, '-c', {child!r}])\n"
            f"open({str(tmp_path / 'next')!r}, 'w').close()\n",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):
        if (tmp_path / "ready").exists():
            break
        time.sleep(0.05)
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert (tmp_path / "got").read_text() == str(int(signal.SIGTERM))
    assert parent.returncode == 7
    assert not (tmp_path / "next").exists()
    assert "stopped by SIGTERM" in err and "rerun the same command to resume" in err


def test_a_stage_outlives_its_protocol_with_the_lock_and_a_signal_death_exits_128_plus(tmp_path):
    """A stage without a handler dies of SIGTERM: the protocol exits 143 (128 + 15). A stage
    whose protocol is killed (SIGKILL, nothing forwarded) keeps the folder's lock, so no second
    protocol starts beside it."""
    out = tmp_path / "run"
    script = str(ROOT / "scripts" / "chain_table2.py")
    load = (
        "import importlib.util, sys\nfrom pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('c', {script!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
    )
    ready = str(tmp_path / "ready")
    child = f"import os, time; open({ready!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    run = f"m.hold(Path({str(out)!r}))\nm.stage([sys.executable, '-c', {child!r}])\n"

    def start():
        (tmp_path / "ready").unlink(missing_ok=True)
        p = subprocess.Popen([sys.executable, "-c", load + run], stderr=subprocess.PIPE, text=True)
        for _ in range(600):
            if (tmp_path / "ready").exists() and (tmp_path / "ready").read_text():
                return p
            time.sleep(0.05)
        p.kill()
        raise AssertionError(f"the stage did not start: {p.communicate()[1][-2000:]}")

    parent = start()
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 143 and "(exit code 143)" in err
    parent = start()
    parent.kill()
    parent.wait()
    res = _dry(out)
    assert res.returncode != 0 and "in use by another run" in res.stderr  # the stage holds it
    os.kill(int((tmp_path / "ready").read_text()), signal.SIGKILL)
    for _ in range(200):
        if _dry(out).returncode == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the lock outlived the stage")
