"""The smallest context budget at which each arm's oracle demonstration succeeds, per task.

    .venv/bin/python benchmarks/arm_budgets.py [--tasks 64] [--step 50] [--max 2400]

The teacher's expert plan plays every arm (``acmrl.teacher.demonstrate``, the same policy as
``acmrl eval engine.kind=oracle``), at budgets from 900 tokens up in steps of ``--step``. For
each task and arm it records the first budget at which the demonstration succeeds; the table
prints, per environment and arm, the start tokens (system prompt, tools and task, as the model
sees them), the median and largest of those first budgets, and against ``react`` on the same
task: how many tasks the arm solves at a budget where react does not (react overflows there),
and the per-task gap (arm's first budget minus react's). It answers where each arm's context
handling pays for the tokens its prompt adds: on code_nav the reads are a few lines, on kb_search
the documents are longer. Tokens are SmolLM2's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import acmrl
from acmrl.config import AgentConfig, SamplingConfig
from acmrl.envs import load
from acmrl.models import ensure_default_model, load_tokenizer
from acmrl.teacher.demonstrate import demonstrate

ARMS = ["react", "acm", "evolve"]
NEVER = 10**6


def first_budgets(env, tasks, tok, budgets: list[int]) -> tuple[dict, dict]:
    """(task, arm) -> the first budget that succeeds; arm -> its mean start tokens."""
    first: dict[tuple[str, str], int] = {}
    start: dict[tuple[str, str], int] = {}
    sampling = SamplingConfig(max_new_tokens=96, stop=["</tool_call>"])
    for budget in budgets:
        agent = AgentConfig(max_context_tokens=budget, max_turns=12, context_signal=True)
        demos = demonstrate(env, tasks, ARMS, tok, agent=agent, sampling=sampling, pressure=0.75)
        for d in demos:
            if d.score >= 1:
                first.setdefault((d.task_id, d.arm), budget)
            if d.steps and d.steps[0].call is not None:
                start.setdefault((d.task_id, d.arm), len(d.steps[0].call.prompt_ids))
        if all((t.id, a) in first for t in tasks for a in ARMS):
            break
    mean = {a: statistics.mean(n for (_, b), n in start.items() if b == a) for a in ARMS}
    return first, mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=64, help="held-out tasks per environment")
    ap.add_argument("--step", type=int, default=50)
    ap.add_argument("--max", type=int, default=2400, help="largest budget tried")
    ap.add_argument("--envs", nargs="+", default=["kb", "stdlib", "acmrl"])
    args = ap.parse_args()
    tok = load_tokenizer(ensure_default_model())
    budgets = list(range(900, args.max + 1, args.step))
    make = {
        "kb": ("kb_search tiny", lambda: load("kb_search", preset="tiny", seed=0)),
        "stdlib": ("code_nav stdlib", lambda: load("code_nav", n_eval=args.tasks)),
        "acmrl": (
            "code_nav acmrl/",
            lambda: load("code_nav", root=str(Path(acmrl.__file__).parent), n_eval=args.tasks),
        ),
    }
    envs = {make[k][0]: make[k][1]() for k in args.envs}
    head = (
        f"{'environment':16} {'arm':7} {'tasks':>5} {'start tok':>9} {'median':>7} {'max':>6} "
        f"{'fits where react overflows':>27} {'gap min/median/max':>20} {'s':>5}"
    )
    print(f"first budget (tokens) at which the oracle's demonstration succeeds, {budgets[0]}..")
    print(head)
    for name, env in envs.items():
        t0 = time.perf_counter()
        tasks = env.tasks("eval")[: args.tasks]
        first, start = first_budgets(env, tasks, tok, budgets)
        secs = time.perf_counter() - t0
        for arm in ARMS:
            got = [first.get((t.id, arm), NEVER) for t in tasks]
            react = [first.get((t.id, "react"), NEVER) for t in tasks]
            gaps = sorted(g - r for g, r in zip(got, react, strict=True) if max(g, r) < NEVER)
            wins = sum(g < r for g, r in zip(got, react, strict=True))
            solved = sorted(g for g in got if g < NEVER)
            med = f"{statistics.median(solved):7.0f}" if solved else f"{'-':>7}"
            top = f"{solved[-1]:6d}" if len(solved) == len(got) else f"{'>' + str(budgets[-1]):>6}"
            gap = f"{gaps[0]:+d}/{statistics.median(gaps):+.0f}/{gaps[-1]:+d}" if gaps else "-"
            print(
                f"{name:16} {arm:7} {len(tasks):5d} {start[arm]:9.0f} {med} {top} "
                f"{wins:>27d} {gap:>20} {secs:5.0f}"
            )


if __name__ == "__main__":
    main()
