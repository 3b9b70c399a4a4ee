"""GRPO over several seeds on kb_search chain: each run's checkpoint chosen on dev worlds, every
run compared with its start on test worlds, one table.

    .venv/bin/python scripts/grpo_seeds.py OUT --start POLICY [--seeds 0 1 2] [--steps 20]
        [--save-every 5] [--arm acm] [--dev-tasks 8] [--test-tasks 8] [--group 4] [--tasks 2]
        [--set KEY=VALUE ...] [--agent KEY=VALUE ...] [--max-new-tokens 96] [--test-curves]
        [--token-budget N] [--dry-run]

``--start`` is the policy every run starts from (an SFT or teacher-round ``final/`` folder, e.g.
``scripts/chain_table2.py``'s). Per seed:

1. GRPO on the training split of chain worlds 21-30 (worlds no demonstration or teacher round
   of ``chain_table2.py`` used), arm ``--arm``, ``--group`` episodes per task and ``--tasks``
   tasks per step, ``--steps`` steps, a checkpoint every ``--save-every``; ``--set`` sets any
   other GRPO option (``decisions.share=0.5``, ``segment_weight=inverse``, ``optim.lr=1e-4``...),
   the same for every seed.
2. Each checkpoint, and the start, evaluated greedily in ``--arm`` on ``--dev-tasks`` eval tasks
   of each dev world (1000, 1001). The checkpoint chosen is the one with the highest dev Pass@1,
   then the lowest Compaction Cost per success, then the earliest: the start itself when no
   step beats it.
   With ``--token-budget N`` only the checkpoints whose run had generated at most N rollout
   tokens by then are eligible, so that runs of different group shapes (whole episodes,
   decision groups) are compared at the same spend.
3. The chosen checkpoint and the start evaluated on ``--test-tasks`` eval tasks of each test
   world (3000, 3001), which nothing is chosen on.

The learning curves: OUT/curves.json holds every evaluated checkpoint's Pass@1 and Compaction
Cost per success by part, seed and step, and OUT/seed_curves.md (and .png) the mean and range
over the seeds per step (``acmrl.eval.curves.seed_curve``). On the dev worlds they come with the
choice; ``--test-curves`` evaluates every checkpoint on the test worlds too, for the curves only
(the choice stays on dev). ``scripts/grpo_curves.py`` sets the curves of several such runs (e.g.
whole-episode against decision groups) side by side.

OUT/grpo_seeds.md lists every run against the start (``acmrl.eval.versus.versus_seeds``): Pass@1
with its paired interval and McNemar p, Compaction Cost per success and its change, the mean
compaction point, the kept prefix per edit with its paired interval; then their mean and range
over the seeds. OUT/edits-s<seed>.md shows how each run's context edits changed on the test
worlds (``acmrl eval edits``: valid rate, refusals, the distribution of tokens generated, Cache
Cost and kept prefix per edit, and the first edits of both on the same tasks). Evals use ``force_answer`` and the
chain budget, as the Table 2 protocol; ``--agent`` and ``--max-new-tokens`` set the agent and
the turn length in the runs and every eval alike. Every stage resumes (GRPO with
``--auto-resume``, each eval from its episodes; SIGTERM stops the running stage at a
checkpoint and the run, and OUT/.lock refuses a second run on the folder); the settings, the seeds among them, are pinned
in OUT/protocol.json, and ``--set`` refuses the options the protocol sets itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chain_table2 import (
    BUDGETS,
    DEV_WORLDS,
    TEST_WORLDS,
    acmrl,
    agent_options,
    chain_env,
    check_settings,
    hold,
    parse_agent,
    write_stages,
)

from acmrl.config import ConfigError, DemoConfig, GRPOConfig, load_config
from acmrl.demo import _yaml, stage_configs

GRPO_WORLDS = list(range(21, 31))


def configs(
    out: Path,
    start: str,
    seeds: list[int],
    steps: int,
    save_every: int,
    arm: str,
    dev_tasks: int,
    test_tasks: int,
    group: int,
    tasks: int,
    sets: list[str],
    agent: dict[str, object],
    max_new_tokens: int,
) -> dict[str, object]:
    """Every stage's config: ``grpo-s<seed>``, and the evals ``eval-<part>-start`` and
    ``eval-dev-s<seed>-step<N>`` (the test eval of a chosen checkpoint is made from its dev
    config once it is chosen: :func:`test_eval`)."""
    base = stage_configs(DemoConfig(size="tiny", output=str(out)))
    ev = base["eval-sft"]
    budget = BUDGETS["chain"]
    agent_cfg = dataclasses.replace(
        ev.agent,
        max_context_tokens=budget,
        max_turns=30,
        on_overflow="force_answer",
        **agent_options(agent),
    )
    sampling = dataclasses.replace(ev.sampling, max_new_tokens=max_new_tokens)
    stages: dict[str, object] = {}

    def evaluation(name: str, model: str, part: str) -> object:
        worlds, n = (DEV_WORLDS, dev_tasks) if part == "dev" else (TEST_WORLDS, test_tasks)
        return dataclasses.replace(
            ev,
            model=dataclasses.replace(ev.model, name=model),
            agent=agent_cfg,
            sampling=sampling,
            env=chain_env(ev.env, worlds, "eval", n),
            arms=[arm],
            output=str(out / name),
        )

    stages["eval-dev-start"] = evaluation("eval-dev-start", start, "dev")
    stages["eval-test-start"] = evaluation("eval-test-start", start, "test")
    demo_grpo = base["grpo"]
    for seed in seeds:
        grpo = GRPOConfig(
            model=dataclasses.replace(demo_grpo.model, name=start),
            agent=agent_cfg,
            env=chain_env(demo_grpo.env, GRPO_WORLDS, "train", 16),
            arms=[arm],
            group_size=group,
            tasks_per_step=tasks,
            seed=seed,
            output=str(out / f"grpo-s{seed}"),
            save_every=save_every,
            save_total_limit=None,
            lora=demo_grpo.lora,
            optim=dataclasses.replace(demo_grpo.optim, max_steps=steps),
            reward=demo_grpo.reward,
            scale_advantages=demo_grpo.scale_advantages,
            skip_failed_groups=demo_grpo.skip_failed_groups,
        )
        grpo.sampling = dataclasses.replace(demo_grpo.sampling, max_new_tokens=max_new_tokens)
        stages[f"grpo-s{seed}"] = with_options(grpo, sets)
        for step in range(save_every, steps + 1, save_every):
            ckpt = out / f"grpo-s{seed}" / "checkpoints" / f"step-{step:06d}" / "model"
            name = f"eval-dev-s{seed}-step{step}"
            stages[name] = evaluation(name, str(ckpt), "dev")
    return stages


# what the protocol sets per run, or through its own flags: a --set of these would change
# every run's seed, folder, length, tasks or start behind the table's back
FIXED = ("seed", "output", "model", "env", "agent", "arms", "save_every", "optim.max_steps")


def with_options(grpo: GRPOConfig, sets: list[str]) -> GRPOConfig:
    """``grpo`` with the ``--set`` options applied, each checked as the CLI checks it; the
    options the protocol sets itself are refused."""
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if any(key == f or key.startswith(f + ".") for f in FIXED):
            raise SystemExit(
                f"--set {key}: set by the protocol (per seed, or by --start, --steps, "
                "--save-every, --arm, --agent, --max-new-tokens)"
            )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grpo.yaml"
        path.write_text(_yaml(grpo))
        try:
            return load_config(GRPOConfig, path, sets)
        except ConfigError as exc:
            raise SystemExit(f"--set: {exc}") from None


def test_eval(stages: dict[str, object], seed: int, step: int, out: Path) -> object:
    """The test eval of seed ``seed``'s checkpoint ``step``: its dev eval on the test worlds."""
    dev = stages[f"eval-dev-s{seed}-step{step}"]
    start = stages["eval-test-start"]
    name = f"eval-test-s{seed}-step{step}"  # a resumed eval never mixes two checkpoints
    return dataclasses.replace(dev, env=start.env, output=str(out / name))  # type: ignore[arg-type]


def run_test_eval(
    stages: dict[str, object], seed: int, step: int, out: Path, cfg_dir: Path
) -> Path:
    """Evaluate seed ``seed``'s checkpoint ``step`` on the test worlds (resuming); its folder."""
    path = cfg_dir / f"eval-test-s{seed}-step{step}.yaml"
    path.write_text(_yaml(test_eval(stages, seed, step, out)))
    acmrl("eval", "--config", str(path))
    return out / f"eval-test-s{seed}-step{step}"


def rollout_tokens(run: Path, steps: dict[int, object]) -> dict[int, float | None]:
    """The tokens a GRPO run had generated in its rollouts by each of ``steps`` (its
    ``metrics.jsonl``; 0 at the start, None where the log lacks the figure)."""
    from acmrl.eval.curves import read_metrics

    total = {m["step"]: m.get("rollout/gen_tokens_total") for m in read_metrics(run)}
    return {step: 0.0 if step == 0 else total.get(step) for step in steps}


def prefill_tokens(run: Path, steps: dict[int, object]) -> dict[int, float | None]:
    """The prompt tokens a GRPO run's rollouts had prefilled by each of ``steps``: the sum of
    its steps' ``rollout/prefill_tokens`` (the engine's own count; None where a step lacks it)."""
    from acmrl.eval.curves import read_metrics

    per_step = {m["step"]: m.get("rollout/prefill_tokens") for m in read_metrics(run)}
    out: dict[int, float | None] = {}
    for step in steps:
        done = [per_step.get(n) for n in range(1, step + 1)]
        out[step] = None if None in done else float(sum(done))  # type: ignore[arg-type]
    return out


def within(scores: dict[int, tuple[float, float]], tokens: dict[int, float | None], budget: int):
    """The steps of ``scores`` whose run had generated at most ``budget`` rollout tokens by
    then (the start always). A step whose count is unknown cannot be shown within it.

    >>> within({0: (0.1, 9.0), 5: (0.2, 8.0), 10: (0.3, 7.0)}, {0: 0.0, 5: 900.0, 10: 1800.0}, 1000)
    {0: (0.1, 9.0), 5: (0.2, 8.0)}
    """
    ok = {s for s, n in tokens.items() if s == 0 or (n is not None and n <= budget)}
    return {s: v for s, v in scores.items() if s in ok}


def write_curves(out: Path, curves: dict[str, dict], arm: str) -> None:
    """OUT/curves.json (every evaluated checkpoint, and the rollout tokens each run had
    generated by then) and OUT/seed_curves.md/.png (per step, the mean and range over the
    seeds), per part that was evaluated."""
    from acmrl.eval.curves import seed_curve, write_seed_curves

    tokens = curves["rollout_tokens"]
    parts = {part: curves[part] for part in ("dev", "test") if curves[part]}
    saved = {part: _finite(by_seed) for part, by_seed in parts.items()}
    for key in ("rollout_tokens", "prefill_tokens"):
        saved[key] = {str(k): {str(s): n for s, n in v.items()} for k, v in curves[key].items()}
    (out / "curves.json").write_text(json.dumps(saved, indent=1))
    lines = {f"{part} worlds": seed_curve(by_seed, tokens) for part, by_seed in parts.items()}
    write_seed_curves(lines, out, f"GRPO from its start in {arm}, per step ({out.name})")


def _finite(by_seed: dict) -> dict:
    """One part's scores with an infinite cost (no success) as null: JSON has no infinity."""
    return {
        str(seed): {str(step): [p, None if c == float("inf") else c] for step, (p, c) in s.items()}
        for seed, s in by_seed.items()
    }


def dev_score(folder: Path, arm: str) -> tuple[float, float]:
    """(Pass@1, Compaction Cost per success) of an eval folder's ``arm`` (inf: no success)."""
    a = json.loads((folder / "report.json").read_text())["arms"][arm]
    return a["pass@1"], a["compaction_cost_per_success"] if a["pass@1"] > 0 else float("inf")


def choose(scores: dict[int, tuple[float, float]]) -> int:
    """The step with the highest dev Pass@1, then the lowest Compaction Cost per success, then
    the earliest (0: the start).

    >>> choose({0: (0.25, 900.0), 5: (0.5, 1200.0), 10: (0.5, 1000.0), 15: (0.5, 1000.0)})
    10
    >>> choose({0: (0.5, 900.0), 5: (0.5, 950.0)})
    0
    """
    return min(scores, key=lambda s: (-scores[s][0], scores[s][1], s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--start", required=True, help="the policy every run starts from")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--arm", default="acm")
    ap.add_argument("--dev-tasks", type=int, default=8)
    ap.add_argument("--test-tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=2, help="tasks per GRPO step")
    ap.add_argument("--set", nargs="*", default=[], help="GRPO options, KEY=VALUE")
    ap.add_argument("--agent", nargs="*", default=[], help="agent options, KEY=VALUE")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--test-curves",
        action="store_true",
        help="evaluate every checkpoint on the test worlds too, for the learning curves only",
    )
    ap.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="choose only among checkpoints whose run had generated at most this many rollout "
        "tokens (to compare runs of different group shapes at the same spend)",
    )
    ap.add_argument("--dry-run", action="store_true", help="write the configs and stop")
    args = ap.parse_args()
    if args.steps % args.save_every:
        raise SystemExit("--steps must be a multiple of --save-every (the last step is a choice)")
    settings = {
        # the seeds too: a rerun with fewer would write a table without some runs
        "seeds": args.seeds,
        "start": str(Path(args.start).resolve()),
        "steps": args.steps,
        "save_every": args.save_every,
        "arm": args.arm,
        "dev_tasks": args.dev_tasks,
        "test_tasks": args.test_tasks,
        "group": args.group,
        "tasks": args.tasks,
        "sets": args.set,
        "agent": parse_agent(args.agent),
        "max_new_tokens": args.max_new_tokens,
    }
    stages = configs(args.out, **settings)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp:  # a bad --set is refused before anything
        write_stages(stages, Path(tmp))
    # a rerun under other settings is refused before it rewrites the run's configs
    hold(args.out)
    check_settings(args.out, settings, write=not args.dry_run)
    cfg_dir = args.out / "configs"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    write_stages(stages, cfg_dir)
    if args.dry_run:
        print(f"configs: {cfg_dir}")
        return
    for part in ("dev", "test"):
        acmrl("eval", "--config", str(cfg_dir / f"eval-{part}-start.yaml"))
    runs, notes = [], []
    curves: dict[str, dict[int, dict[int, Any]]] = {
        "dev": {},
        "test": {},
        "rollout_tokens": {},
        "prefill_tokens": {},
    }
    for seed in args.seeds:
        if not (args.out / f"grpo-s{seed}" / "final").exists():
            acmrl("train", "grpo", "--config", str(cfg_dir / f"grpo-s{seed}.yaml"), "--auto-resume")
        scores = {0: dev_score(args.out / "eval-dev-start", args.arm)}
        for step in range(args.save_every, args.steps + 1, args.save_every):
            acmrl("eval", "--config", str(cfg_dir / f"eval-dev-s{seed}-step{step}.yaml"))
            scores[step] = dev_score(args.out / f"eval-dev-s{seed}-step{step}", args.arm)
        spend = rollout_tokens(args.out / f"grpo-s{seed}", scores)
        unknown = [s for s, n in spend.items() if s and n is None]
        if args.token_budget is not None and unknown:
            print(
                f"seed {seed}: the rollout tokens of steps {unknown} are unknown (a metrics.jsonl "
                "without rollout/gen_tokens_total): they cannot be chosen under --token-budget",
                file=sys.stderr,
            )
        eligible = scores if args.token_budget is None else within(scores, spend, args.token_budget)
        step = choose(eligible)
        choice = {"step": step, "dev": scores, "token_budget": args.token_budget}
        (args.out / f"choice-s{seed}.json").write_text(json.dumps(choice))
        curves["dev"][seed] = scores
        curves["rollout_tokens"][seed] = spend
        curves["prefill_tokens"][seed] = prefill_tokens(args.out / f"grpo-s{seed}", scores)
        if args.test_curves:  # after the choice, which never reads them
            tested = {0: dev_score(args.out / "eval-test-start", args.arm)}
            for n in range(args.save_every, args.steps + 1, args.save_every):
                tested[n] = dev_score(run_test_eval(stages, seed, n, args.out, cfg_dir), args.arm)
            curves["test"][seed] = tested
        if step == 0:
            folder = args.out / "eval-test-start"
        else:
            folder = run_test_eval(stages, seed, step, args.out, cfg_dir)
        runs.append((f"seed {seed}, step {step}", folder))
        dev = ", ".join(f"{s}: {p:.3f}" for s, (p, _) in scores.items())
        spent = curves["rollout_tokens"][seed].get(step)
        tokens = "" if spent is None else f"; {spent:,.0f} rollout tokens generated by then"
        if args.token_budget is not None:
            tokens += f"; chosen among checkpoints within {args.token_budget:,} rollout tokens"
        notes.append(
            f"seed {seed}: step {step} chosen on the dev worlds (dev Pass@1 by step {dev}{tokens})"
        )
    write_curves(args.out, curves, args.arm)
    from acmrl.eval.versus import versus_seeds
    from acmrl.train.grpo_steps import reward_weights

    grpo = stages[f"grpo-s{args.seeds[0]}"]
    text = versus_seeds(
        args.out / "eval-test-start",
        runs,
        reward_weights(grpo),  # type: ignore[arg-type]
        args.arm,
        args.out / "grpo_seeds.md",
        output_weight=grpo.agent.output_weight,  # type: ignore[attr-defined]
        notes=notes,
    )
    print(text)
    # how each run's context edits changed against the start (programs, summaries, examples)
    from acmrl.eval.edit_change import edit_change_md

    for (_, folder), seed in zip(runs, args.seeds, strict=True):
        edit_change_md(args.out / "eval-test-start", folder, args.out / f"edits-s{seed}.md")
    print(f"how the context edits changed: {args.out}/edits-s<seed>.md")


if __name__ == "__main__":
    main()
