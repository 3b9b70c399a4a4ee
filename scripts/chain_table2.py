"""The fair Table 2 on kb_search chain or code_nav trace: students per seed, on test tasks.

    .venv/bin/python scripts/chain_table2.py OUT [--bench chain|trace] [--seeds 0 1 2]
        [--steps 300] [--train-arms ARM ...] [--timing spread|read|late] [--parts test dev]
        [--eval-arms ARM ...] [--round-tasks 0] [--round-steps 10] [--test-tasks 8]
        [--agent KEY=VALUE ...] [--max-new-tokens 96] [--dry-run]

The reported Table 2 trains one student per arm, each in its own OUT, with the defaults
(300 SFT steps, ``--timing read``, 8 test tasks of each test world), e.g.
``chain_table2.py runs/test-acm --train-arms acm`` and the same for summary and memory,
then sets the students side by side with ``acmrl eval seeds acm=... summary=...``
(docs/train.md). The demonstrations: each trained arm's best-policy demonstrations
(``teacher.policy=best``, under ``force_answer`` as the evals) on 16 training tasks of each of
worlds 1-10; every arm named in ``--train-arms`` trains the one model of OUT (the default,
all four, trains one model on all four arms' demonstrations). react's best policy fails every
chain task (the third document never fits; ``acmrl audit``), and a failed demonstration
teaches nothing, so react has no student of its own: a model's react runs are the skills the
other arms' demonstrations taught, in react's prompt. Then, per seed: SFT of the default model
(LoRA on the top 15 layers, lr 1e-3, 4,096-token batches), and an eval of the result in
``--eval-arms`` under ``force_answer`` on ``--test-tasks`` eval tasks of each test world (3000
and 3001), which nothing is chosen on. ``--parts dev`` evaluates each seed on the dev worlds
(1000 and 1001) instead, the only ones to choose settings on. Finally ``acmrl eval seeds`` over
the test runs writes OUT/table2.md: this model's runs, its arms side by side (mean and range,
the paired differences of its arms); the Table 2 across students is the command above.

Settings to choose on the dev worlds (pinned in OUT/protocol.json with the steps and tasks, so a
rerun with others is refused): ``--train-arms``, the arms whose demonstrations are trained
(default all four); ``--timing``, when the teacher compacts: ``spread`` as the demo (each task's
point drawn from 0.5-0.9 of the budget right after a read, a share of 0.35 only when the next
result would not fit), ``read`` (right after every document read that the answer does not
follow: one rule, the same in every task) or ``late`` (only when the next result would not
fit, in every task: the audit's ceiling timing; the evolve arm, which has no archive, keeps the
lodge memberships a recall question needs only if it cuts after the document that says which
lodge matters, and at ``read`` its best policy fails all 40 recall questions of the 160 training
tasks); ``--round-tasks N``, a teacher round after SFT, as
the demo's: each seed's SFT student runs N training tasks of each of worlds 11-20 in every
trained arm, the oracle edits its runs and resumes them, and ``--round-steps`` steps at a fifth
of SFT's learning rate train the SFT policy on the demonstrations and the round together; the
evals then read that policy.

``--bench trace`` runs the same protocol on code_nav's ``trace`` preset (torch's source,
budget 2,200): the demonstrations on every task of its train split, the evals on its ``test``
split (``--parts dev``: its ``dev`` split; the two halve the eval split by question group),
``--test-tasks`` of each; no teacher round (``--round-tasks`` needs other training worlds).

``--agent KEY=VALUE ...`` sets agent options (``acmrl.config.AgentConfig``) in the
demonstrations, the teacher round and every eval alike, e.g. the evolve arm's
``evolve_prompt=none evolve_keep_code=false``: a student is run as it was taught. They are
pinned in protocol.json with the other settings. ``--max-new-tokens`` is the most tokens a
student's turn may generate in the teacher round and the evals (96, the tiny demo's, by
default): an evolve program of the teacher's is 364-402 tokens on chain, so an evolve student
needs more room (a scripted teacher's turns are never cut).

Every stage resumes: a rerun skips the finished annotation, continues SFT from its checkpoint
(``--auto-resume``) and each eval from its episodes. SIGTERM or SIGUSR1 (kill, Slurm's warning
before a time limit) reaches the stage running (SFT saves a checkpoint on it) and the protocol
stops; OUT/.lock refuses a second protocol on the same folder while one runs. The stage configs are written to
OUT/configs/ first, so a stage can be rerun by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from acmrl.config import AgentConfig, ConfigError, DemoConfig, load_config, parse_override
from acmrl.demo import _yaml, stage_configs

TRAIN_WORLDS = list(range(1, 11))
ROUND_WORLDS = list(range(11, 21))  # training worlds too: the teacher round's tasks
DEV_WORLDS = [1000, 1001]
# 2000 and 2001 were the test worlds until 2026-12-05; a protocol trial and the audit had read
# them before (docs/train.md), so the reported worlds are fresh ones
TEST_WORLDS = [3000, 3001]
EVAL_ARMS = ["react", "summary", "memory", "acm"]
BUDGETS = {"chain": 2048, "trace": 2200}  # the presets' own (docs/envs.md)


def chain_env(env, seeds: list[int], split: str, per_world: int):
    """The chain worlds ``seeds`` as one mixture, ``per_world`` tasks of ``split`` from each (a
    limit would take them all from the first world)."""
    inner = {"preset": "chain", f"n_{split}": per_world}
    opts = {"env": "kb_search", "seeds": seeds, "options": inner}
    return dataclasses.replace(env, options=opts, split=split, limit=None)


def trace_env(env, split: str, limit: int | None):
    """code_nav's trace preset, ``limit`` tasks of ``split`` (train, dev or test)."""
    return dataclasses.replace(
        env, name="code_nav", options={"preset": "trace"}, split=split, limit=limit
    )


def configs(
    out: Path,
    seeds: list[int],
    steps: int,
    test_tasks: int,
    train_arms: list[str] = EVAL_ARMS,
    timing: str = "spread",
    eval_arms: list[str] = EVAL_ARMS,
    round_tasks: int = 0,
    round_steps: int = 10,
    test_worlds: list[int] = TEST_WORLDS,
    bench: str = "chain",
    agent: dict[str, object] | None = None,
    max_new_tokens: int = 96,
) -> dict[str, object]:
    if bench == "trace" and round_tasks:
        raise SystemExit("--bench trace has no teacher round: its tasks are one code base's")
    base = stage_configs(DemoConfig(size="tiny", output=str(out)))
    annotate, sft, ev = base["annotate"], base["sft"], base["eval-sft"]
    sampling = dataclasses.replace(ev.sampling, max_new_tokens=max_new_tokens)
    budget = BUDGETS[bench]
    options = agent_options(agent or {})
    agent = dataclasses.replace(ev.agent, max_context_tokens=budget, max_turns=30, **options)
    if bench == "trace":
        annotate.env = trace_env(annotate.env, "train", None)  # every training question
    else:
        annotate.env = chain_env(annotate.env, TRAIN_WORLDS, "train", 16)  # 160 tasks
    annotate.agent = dataclasses.replace(
        annotate.agent,
        max_context_tokens=budget,
        max_turns=30,
        on_overflow="force_answer",
        **options,
    )
    annotate.arms = list(train_arms)
    annotate.teacher.policy = "best"
    if timing == "read":  # compact right after every read that the answer does not follow
        annotate.teacher = dataclasses.replace(
            annotate.teacher, pressure=0.05, pressure_spread=[], late_share=0.0
        )
    elif timing == "late":  # compact only when the next result would not fit
        annotate.teacher = dataclasses.replace(
            annotate.teacher, pressure=1.0, pressure_spread=[], late_share=1.0
        )
    annotate.output = str(out / "annotate")
    out_cfgs: dict[str, object] = {"annotate": annotate}
    for seed in seeds:
        run = dataclasses.replace(sft, seed=seed, output=str(out / f"sft-s{seed}"))
        run.dataset = str(out / "annotate")
        run.optim = dataclasses.replace(sft.optim, max_steps=steps)
        # every 25th step's adapter is kept (32 MB each): the dev worlds can choose a step count
        # from a seed's own checkpoints without training it again
        run.save_every, run.save_total_limit = 25, None
        out_cfgs[f"sft-s{seed}"] = run
        policy = out / f"sft-s{seed}" / "final"
        if round_tasks:
            # the demo's round: the SFT student on other training tasks, the oracle's edits
            # and resumes, then a fresh LoRA on the SFT policy over both datasets
            round_ = base["round"]
            out_cfgs[f"round-s{seed}"] = dataclasses.replace(
                round_,
                model=dataclasses.replace(round_.model, name=str(policy)),
                env=chain_env(round_.env, ROUND_WORLDS, "train", round_tasks),
                agent=annotate.agent,
                sampling=dataclasses.replace(round_.sampling, max_new_tokens=max_new_tokens),
                arms=list(train_arms),
                # the oracle's injection waits for no read: at the read timing's 0.05 it would
                # compact before the second ``open`` of every episode; at 0.75 x 2,048 it comes
                # right after each read on chain (the input after the first document is
                # 1,578-1,754 tokens, after a compaction and a search about 1,100)
                teacher=dataclasses.replace(annotate.teacher, pressure=0.75, pressure_spread=[]),
                seed=seed,
                output=str(out / f"round-s{seed}"),
            )
            sft_round = base["sft-round"]
            out_cfgs[f"sft-round-s{seed}"] = dataclasses.replace(
                sft_round,
                model=dataclasses.replace(sft_round.model, name=str(policy)),
                dataset=[str(out / "annotate"), str(out / f"round-s{seed}")],
                seed=seed,
                output=str(out / f"sft-round-s{seed}"),
                optim=dataclasses.replace(sft_round.optim, max_steps=round_steps),
            )
            policy = out / f"sft-round-s{seed}" / "final"
        model = dataclasses.replace(ev.model, name=str(policy))
        for part, worlds in (("test", test_worlds), ("dev", DEV_WORLDS)):
            if bench == "trace":
                env = trace_env(ev.env, part, test_tasks)
            else:
                env = chain_env(ev.env, worlds, "eval", test_tasks)
            out_cfgs[f"eval-{part}-s{seed}"] = dataclasses.replace(
                ev,
                model=model,
                agent=agent,
                sampling=sampling,
                env=env,
                arms=list(eval_arms),
                output=str(out / f"eval-{part}-s{seed}"),
            )
    return out_cfgs


def agent_options(options: dict[str, object]) -> dict[str, object]:
    """``--agent`` options, checked against ``AgentConfig``: a name it lacks, or one the
    protocol sets itself, is refused by name."""
    fields = {f.name for f in dataclasses.fields(AgentConfig)}
    if unknown := sorted(set(options) - fields):
        raise SystemExit(f"--agent: {', '.join(unknown)} is not an agent option (AgentConfig)")
    if fixed := sorted(set(options) & {"max_context_tokens", "max_turns", "on_overflow"}):
        raise SystemExit(f"--agent: {', '.join(fixed)} is set by the protocol (--bench)")
    return options


def parse_agent(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` items as a dict, each value read as YAML (``false``, ``4``, ``none``...:
    ``none`` stays the string, as the options that take it expect)."""
    out: dict[str, object] = {}
    for text in items:
        try:
            path, value = parse_override(text)
        except ConfigError as exc:
            raise SystemExit(f"--agent: {exc}") from None
        if len(path) != 1:
            raise SystemExit(f"--agent {text!r}: give an agent option's name, without a section")
        out[path[0]] = value
    return out


# what a protocol.json written before a setting existed ran with
FORMER_DEFAULTS = {
    "test_worlds": [2000, 2001],
    "train_arms": EVAL_ARMS,
    "timing": "spread",
    "round_tasks": 0,
    "round_steps": 10,
    "bench": "chain",
    "agent": {},
    "max_new_tokens": 96,
}


def check_settings(out: Path, now: dict[str, object], write: bool = True) -> None:
    """A rerun continues only what the same settings started: the task ids of a world built
    with another ``--test-tasks`` name other questions, and a finished SFT of other steps would
    be skipped as done. The eval arms and parts are not pinned: each eval is its own folder."""
    path = out / "protocol.json"
    if path.exists():
        before = json.loads(path.read_text())
        changed = [
            f"{k}: {before.get(k, FORMER_DEFAULTS.get(k))} -> {v}"
            for k, v in now.items()
            if before.get(k, FORMER_DEFAULTS.get(k)) != v
        ]
        if changed:
            raise SystemExit(f"{out} was started with other settings ({'; '.join(changed)})")
    if write:
        path.write_text(json.dumps(now))


def write_stages(stages: dict[str, object], folder: Path) -> None:
    """Write each stage's config to ``folder/<name>.yaml`` and load it back as its command
    would: a bad value stops here, naming the stage, before any stage starts."""
    for name, cfg in stages.items():
        path = folder / f"{name}.yaml"
        path.write_text(_yaml(cfg))
        try:
            load_config(type(cfg), path)
        except ConfigError as exc:
            raise SystemExit(f"{name}: {exc}") from None


# SIGTERM and SIGUSR1 (what kill and Slurm send) stop a training stage at a checkpoint: they are
# passed on to the stage running, and the protocol stops once it has (a rerun resumes)
FORWARDED = (signal.SIGTERM, signal.SIGUSR1)


def acmrl(*args: str) -> None:
    """Run one stage, ``python -m acmrl.cli ARGS`` (see :func:`stage`)."""
    cmd = [sys.executable, "-m", "acmrl.cli", *args]
    print("$", " ".join(cmd), flush=True)
    stage(cmd)


def stage(cmd: list[str]) -> None:
    """Run ``cmd``; a signal in FORWARDED reaches it (a training stage saves a checkpoint on it;
    another stage just ends), and the protocol then stops with its exit code instead of
    starting the next stage. The run folder's lock is passed on, so it is held while the stage
    runs even if this process is killed."""
    received: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child is not None:
            child.send_signal(signum)

    # the handlers go in first: a signal while the stage starts is recorded, then passed on
    before = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        child = subprocess.Popen(cmd, pass_fds=[f.fileno() for f in _LOCKS])
        if received:
            child.send_signal(received[0])
        code = child.wait()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if received:
        # a stage killed by the signal itself has a negative return code
        status = code if code > 0 else 128 + (-code or received[0])
        print(
            f"stopped by {signal.Signals(received[0]).name} during `{' '.join(cmd)}` "
            f"(exit code {status}); rerun the same command to resume",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(status)
    if code:
        raise subprocess.CalledProcessError(code, cmd)


_LOCKS: list[TextIO] = []


def hold(out: Path) -> None:
    """Hold OUT/.lock while this process (and the stage it runs) lives. Two protocols on one
    folder would write the same checkpoints and episodes, so a second is refused, naming the
    first one's process. On a file system without locks it warns and goes on."""
    out.mkdir(parents=True, exist_ok=True)
    f = (out / ".lock").open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "?"
        f.close()
        raise SystemExit(
            f"{out} is in use by another run (process {pid}): wait for it or stop it"
        ) from None
    except OSError as exc:  # e.g. ENOLCK on some network file systems
        f.close()
        print(f"warning: cannot lock {out / '.lock'} ({exc}); a second run is not refused")
        return
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _LOCKS.append(f)  # the lock lasts as long as the open file (and the stages' copies of it)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--bench", choices=list(BUDGETS), default="chain", help="the task set")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300, help="SFT steps per seed")
    ap.add_argument(
        "--test-tasks", type=int, default=8, help="eval tasks per world (trace: of the split)"
    )
    ap.add_argument("--train-arms", nargs="+", default=EVAL_ARMS, help="arms demonstrated")
    ap.add_argument("--timing", choices=["spread", "read", "late"], default="read")
    ap.add_argument("--parts", nargs="+", choices=["test", "dev"], default=["test"])
    ap.add_argument("--eval-arms", nargs="+", default=EVAL_ARMS)
    ap.add_argument("--round-tasks", type=int, default=0, help="teacher round, tasks per world")
    ap.add_argument("--round-steps", type=int, default=10)
    ap.add_argument(
        "--agent", nargs="+", default=[], metavar="KEY=VALUE", help="agent options, every stage"
    )
    ap.add_argument(
        "--max-new-tokens", type=int, default=96, help="most tokens a student's turn generates"
    )
    ap.add_argument("--dry-run", action="store_true", help="write the configs and stop")
    args = ap.parse_args()
    cfg_dir = args.out / "configs"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    hold(args.out)
    # the settings a started run is pinned to, named as configs() takes them
    settings = {
        "test_worlds": TEST_WORLDS,
        "steps": args.steps,
        "test_tasks": args.test_tasks,
        "train_arms": args.train_arms,
        "timing": args.timing,
        "round_tasks": args.round_tasks,
        "round_steps": args.round_steps,
        "bench": args.bench,
        "agent": parse_agent(args.agent),
        "max_new_tokens": args.max_new_tokens,
    }
    stages = configs(args.out, args.seeds, eval_arms=args.eval_arms, **settings)
    # a bad --agent value is refused here, before the run is pinned to it or a stage starts
    with tempfile.TemporaryDirectory() as tmp:
        write_stages(stages, Path(tmp))
    check_settings(args.out, settings, write=not args.dry_run)
    for name, cfg in stages.items():
        (cfg_dir / f"{name}.yaml").write_text(_yaml(cfg))
    if args.dry_run:
        print(f"configs: {cfg_dir}")
        return
    if not (args.out / "annotate" / "dataset").exists():
        acmrl("annotate", "--config", str(cfg_dir / "annotate.yaml"))
    for seed in args.seeds:
        if not (args.out / f"sft-s{seed}" / "final").exists():
            acmrl("train", "sft", "--config", str(cfg_dir / f"sft-s{seed}.yaml"), "--auto-resume")
        if args.round_tasks and not (args.out / f"sft-round-s{seed}" / "final").exists():
            acmrl("annotate", "--config", str(cfg_dir / f"round-s{seed}.yaml"))
            acmrl(
                "train",
                "sft",
                "--config",
                str(cfg_dir / f"sft-round-s{seed}.yaml"),
                "--auto-resume",
            )
        for part in args.parts:
            acmrl("eval", "--config", str(cfg_dir / f"eval-{part}-s{seed}.yaml"))
    for part in args.parts:
        runs = [str(args.out / f"eval-{part}-s{s}") for s in args.seeds]
        name = "table2.md" if part == "test" else "table2-dev.md"
        acmrl("eval", "seeds", *runs, "--output", str(args.out / name))


if __name__ == "__main__":
    main()
