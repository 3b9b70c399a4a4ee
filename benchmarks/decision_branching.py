"""What GRPO's decision groups cost to roll out: branches prefilled with and without the cache.

    .venv/bin/python benchmarks/decision_branching.py [--model PATH] [--tasks 2] [--group 4] \
        [--arm acm] [--preset chain] [--max-turns 8] [--new-tokens 96]

One sampled episode per task (the *source*, temperature 1.0), then, as a GRPO step with
``decisions.share=1`` builds them (acmrl/train/decisions.py), G - 1 branches per source from a
decision state drawn the same way: they replay the source up to that turn and sample from there
on. The branches run three times, each on a fresh ``hf`` engine over the same model and with the
same sampling seeds:

    (a) no prefix cache (``reuse_cache=False``): every call reads its whole prompt;
    (b) each session reuses its own cache across its turns (``share_prefix=False``);
    (c) the default: as (b), and a session's first call borrows the longest prefix another
        session has read, so the branches of one group read their common start once.

and, for scale, (d) G - 1 whole episodes per task from the start, on the default engine (what a
whole-episode group of the same size adds to its first episode).

Printed per mode: prompt tokens of the live calls and tokens prefilled (computed) per group,
generated tokens, wall time; then the ratios. The sampled continuations may differ slightly
between modes (a cached prefix is not bit-identical to a fresh one), so prompt tokens can differ
a little too.
"""

from __future__ import annotations

import argparse
import time
import zlib

from acmrl.config import AgentConfig, ModelConfig, SamplingConfig
from acmrl.engines.hf import HFEngine
from acmrl.envs import load
from acmrl.models import load_model
from acmrl.rollout.agent import Episode
from acmrl.rollout.worker import run_episodes
from acmrl.train.decisions import (
    branch_id,
    branch_scripts,
    decision_states,
    live_calls,
    mark_branch,
    pick_decision,
    policy_turns,
    run_with_replays,
)


def episode(env, task, eid: str, tok, args) -> Episode:
    return Episode(
        eid,
        env,
        task,
        args.arm,
        tok,
        agent=AgentConfig(max_turns=args.max_turns, on_overflow="force_answer"),
        sampling=SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0),
        seed=zlib.crc32(eid.encode()),
    )


def live_prompt_tokens(trajs, starts) -> int:
    """Prompt tokens of the calls made from each trajectory's start turn on (helpers included)."""
    return sum(
        len(c.prompt_ids)
        for t, start in zip(trajs, starts, strict=True)
        for c in live_calls(t, start)
    )


def generated(trajs, starts) -> int:
    """Tokens generated from each trajectory's start turn on (a branch's replayed turns were
    played back, not generated)."""
    return sum(
        len(c.completion_ids)
        for t, start in zip(trajs, starts, strict=True)
        for c in live_calls(t, start)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--group", type=int, default=4, help="G: the source and G - 1 branches")
    ap.add_argument("--arm", default="acm")
    ap.add_argument("--preset", default="chain")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--context-share", type=float, default=0.7)
    args = ap.parse_args()

    model_cfg = ModelConfig() if args.model is None else ModelConfig(name=args.model)
    model, tok = load_model(model_cfg)
    env = load("kb_search", preset=args.preset, seed=0)
    tasks = env.tasks("train")[: args.tasks]
    sources = [
        episode(env, t, f"s1/{k}/{t.id}#{args.arm}#0", tok, args) for k, t in enumerate(tasks)
    ]
    t0 = time.perf_counter()
    run_episodes(sources, HFEngine(model, tok), concurrency=len(sources))
    print(f"sources: {len(sources)} episodes in {time.perf_counter() - t0:.0f} s")
    picks = []
    for src in sources:
        states = decision_states(src.traj, src.budget, args.context_share)
        d = pick_decision(states, 0, src.id)
        turns = len(policy_turns(src.traj))
        print(f"  {src.id}: {src.traj.status}, {turns} turns, states {[s.turn for s in states]}")
        if d is not None:
            picks.append((src, d))
    if not picks:
        raise SystemExit(
            "no source has a decision state; raise --max-turns or lower --context-share"
        )

    def branches() -> tuple[list[Episode], dict]:
        eps, scripts = [], {}
        for src, d in picks:
            for r in range(1, args.group):
                eid = branch_id(src.id, r)
                eps.append(episode(env, src.task, eid, tok, args))
                scripts |= branch_scripts(src.traj, d, eid, tok)
        return eps, scripts

    rows = []
    modes = [
        ("(a) no prefix cache", {"reuse_cache": False}),
        ("(b) own-session cache", {"share_prefix": False}),
        ("(c) default: shared prefixes", {}),
    ]
    for name, kw in modes:
        engine = HFEngine(model, tok, **kw)
        eps, scripts = branches()
        t0 = time.perf_counter()
        run_with_replays(eps, scripts, engine, tok, concurrency=len(eps))
        wall = time.perf_counter() - t0
        ok = sum(
            mark_branch(e.traj, src.traj, d)
            for e, (src, d) in zip(eps, _each(picks, args), strict=True)
        )
        starts = [d.turn for src, d in _each(picks, args)]
        prompt = live_prompt_tokens([e.traj for e in eps], starts)
        made = generated([e.traj for e in eps], starts)
        rows.append((name, prompt, engine.prefilled_tokens, made, wall))
        print(f"{name}: {ok}/{len(eps)} branches replayed exactly")
    engine = HFEngine(model, tok)
    whole = [
        episode(env, src.task, src.id.rsplit("#", 1)[0] + f"#{r}", tok, args)
        for src, _ in picks
        for r in range(1, args.group)
    ]
    t0 = time.perf_counter()
    run_episodes(whole, engine, concurrency=len(whole))
    wall = time.perf_counter() - t0
    prompt = live_prompt_tokens([e.traj for e in whole], [0] * len(whole))
    rows.append(
        (
            "(d) whole episodes instead",
            prompt,
            engine.prefilled_tokens,
            generated([e.traj for e in whole], [0] * len(whole)),
            wall,
        )
    )

    g = len(picks)
    print(f"\n{g} decision groups of {args.group} ({args.arm}, kb_search {args.preset})")
    print(
        f"{'mode':32} {'prompt/group':>13} {'prefilled/group':>16} {'generated':>10} {'wall s':>8}"
    )
    for name, prompt, pre, gen, wall in rows:
        print(f"{name:32} {prompt / g:13.0f} {pre / g:16.0f} {gen:10d} {wall:8.1f}")
    a, c, d = rows[0], rows[2], rows[3]
    print(f"\nprefilled, default / no cache: {c[2] / max(1, a[2]):.3f}")
    print(f"prefilled, default branches / whole episodes: {c[2] / max(1, d[2]):.3f}")
    print(f"wall, default / no cache: {c[4] / max(1e-9, a[4]):.3f}")


def _each(picks, args):
    """(source, decision) once per branch, in the order :func:`main` builds them."""
    return [(src, d) for src, d in picks for _ in range(1, args.group)]


if __name__ == "__main__":
    main()
