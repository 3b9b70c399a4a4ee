"""Context pressure of the environments, measured on the expert's (oracle) episodes.

    .venv/bin/python benchmarks/env_pressure.py [--presets tiny small medium large] [--episodes 50]

For each ``kb_search`` preset: documents, mean document tokens, mean tokens an oracle episode
observes, oracle steps, the mean rendered size of its full history against the preset's
``max_context_tokens``, the fraction of episodes that overflow, and the largest single step beside
the task prompt (what a compacting agent must fit at once). Then the ``code_nav`` question counts
per template on this interpreter's standard library, with how many answers the imported objects
confirmed. Tokens are SmolLM2's, rendered exactly as the model sees them (system prompt and tool
definitions included).
"""

from __future__ import annotations

import argparse
import time

from acmrl.envs import load
from acmrl.envs.pressure import pressure_report
from acmrl.models import ensure_default_model, load_tokenizer


def kb_table(presets: list[str], episodes: int, seed: int) -> None:
    tok = load_tokenizer(ensure_default_model())
    head = (
        f"{'preset':8} {'docs':>6} {'doc tok':>8} {'observed':>9} {'steps':>6} {'history':>8} "
        f"{'budget':>7} {'overflow':>9} {'step max':>9} {'oracle':>7} {'load s':>7}"
    )
    print("kb_search, oracle episodes on the eval split")
    print(head)
    for preset in presets:
        t0 = time.perf_counter()
        env = load("kb_search", preset=preset, seed=seed)
        load_s = time.perf_counter() - t0
        r = pressure_report(env, tok, limit=episodes)
        print(
            f"{preset:8} {r['documents']:6d} {r['mean_doc_tokens']:8.0f} "
            f"{r['mean_observed_tokens']:9.0f} {r['mean_steps']:6.1f} {r['mean_full_tokens']:8.0f} "
            f"{r['max_context_tokens']:7d} {r['overflow_fraction']:9.2f} "
            f"{r['max_base_plus_peak']:9d} {r['oracle_score']:7.2f} {load_s:7.1f}"
        )


def code_nav_table() -> None:
    t0 = time.perf_counter()
    env = load("code_nav")
    load_s = time.perf_counter() - t0
    print(f"\ncode_nav on {env.root} ({load_s:.1f} s to derive and check)")
    print(
        f"{'template':14} {'candidates':>10} {'confirmed':>10} {'mismatch':>9} {'ast only':>9} {'train':>6} {'eval':>5}"
    )
    for template, counts in env.report.items():
        n = {
            s: sum(t.metadata["template"] == template for t in env.tasks(s))
            for s in ("train", "eval")
        }
        print(
            f"{template:14} {counts['candidates']:10d} {counts['confirmed']:10d} "
            f"{counts['mismatch']:9d} {counts['ast_only']:9d} {n['train']:6d} {n['eval']:5d}"
        )
    right = 0
    tasks = env.tasks("train") + env.tasks("eval")
    for task in tasks:
        session = env.session(task)
        for name, args in env.oracle_plan(task):
            session.call(name, args)
        right += session.score() == 1.0
    print(f"oracle plans answered correctly: {right}/{len(tasks)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small", "medium", "large"])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-code-nav", action="store_true")
    args = parser.parse_args()
    kb_table(args.presets, args.episodes, args.seed)
    if not args.skip_code_nav:
        code_nav_table()


if __name__ == "__main__":
    main()
