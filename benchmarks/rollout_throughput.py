"""Rollout throughput of the transformers engine on kb_search episodes: cache reuse and batching.

    .venv/bin/python benchmarks/rollout_throughput.py [--episodes 8] [--new-tokens 16] [--preset small]

The turns are those of expert (oracle) episodes of ``kb_search``: at turn k the model input is the
rendered State after k tool calls and observations (system prompt and tools included), and the
model generates ``--new-tokens`` tokens greedily (what it says is not used: the next input follows
the expert's plan, so every mode does the same work). Six modes:

    (a) re-prefill every turn (reuse_cache=False), (b) per-session KV-cache reuse
    (share_prefix=False), (c) the same, and a session's first turn borrows the prefix another
    session has read (the system prompt and tools; the default), each with batch 1 (episodes
    one after another) and batch 8 (eight episodes in flight, decoded together).

Printed per mode: episodes/s, prompt tokens processed (prefilled, i.e. not reused) per episode,
wall time; then the ratios. With its own completion in the history instead of the expert's call,
reuse would be slightly higher than here (the cache also holds the completion).
"""

from __future__ import annotations

import argparse
import time

from acmrl.config import ModelConfig
from acmrl.context.render import Renderer
from acmrl.engines.base import Request
from acmrl.engines.hf import HFEngine
from acmrl.envs import load
from acmrl.envs.pressure import SYSTEM_PROMPT, oracle_state
from acmrl.models import load_model


def turn_prompts(env, tokenizer, n: int) -> list[list[list[int]]]:
    """For each of ``n`` eval episodes, the model input of every turn."""
    out = []
    for task in env.tasks("eval")[:n]:
        renderer = Renderer(tokenizer, SYSTEM_PROMPT, env.session(task).tools)
        state, _ = oracle_state(env, task)
        out.append([renderer.ids(state[: 1 + 2 * k]) for k in range((len(state) - 1) // 2)])
    return out


def run_mode(
    model, tok, episodes, *, reuse: bool, share: bool, batch: int, new_tokens: int
) -> dict[str, float]:
    engine = HFEngine(model, tok, reuse_cache=reuse, share_prefix=share, max_batch=batch)
    processed = generated = 0
    t0 = time.perf_counter()
    for start in range(0, len(episodes), batch):
        group = list(enumerate(episodes[start : start + batch], start))
        for turn in range(max(len(turns) for _, turns in group)):
            reqs = [
                Request(f"ep{i}", turns[turn], max_tokens=new_tokens)
                for i, turns in group
                if turn < len(turns)
            ]
            for req, c in zip(reqs, engine.generate(reqs), strict=True):
                processed += len(req.prompt_ids) - c.cached_prefix_tokens
                generated += len(c.completion_ids)
        for i, _ in group:
            engine.release(f"ep{i}")
    wall = time.perf_counter() - t0
    processed -= engine.borrowed_tokens  # read from another session's cache, not prefilled
    return {
        "episodes_per_s": len(episodes) / wall,
        "prefilled_per_episode": processed / len(episodes),
        "generated": generated,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    model, tok = load_model(ModelConfig(threads=args.threads))
    env = load("kb_search", preset=args.preset, seed=0)
    episodes = turn_prompts(env, tok, args.episodes)
    inputs = sum(len(t) for turns in episodes for t in turns) / len(episodes)
    print(
        f"kb_search {args.preset}: {len(episodes)} oracle episodes, "
        f"{sum(len(t) for t in episodes) / len(episodes):.1f} turns and {inputs:.0f} input tokens "
        f"per episode, {args.new_tokens} new tokens per turn, SmolLM2-135M float32"
    )
    results = {}
    modes = {
        "a": (False, False, "re-prefill"),
        "b": (True, False, "reuse"),
        "c": (True, True, "reuse + borrowed"),
    }
    print(f"{'mode':32} {'episodes/s':>11} {'prefilled/episode':>18} {'wall s':>8}")
    for key, (reuse, share, label) in modes.items():
        for batch in (1, 8):
            r = run_mode(
                model,
                tok,
                episodes,
                reuse=reuse,
                share=share,
                batch=batch,
                new_tokens=args.new_tokens,
            )
            results[(key, batch)] = r
            print(
                f"{f'({key}) {label}, batch {batch}':32} {r['episodes_per_s']:11.3f} "
                f"{r['prefilled_per_episode']:18.0f} {r['wall_s']:8.1f}"
            )
    print("ratios")
    for batch in (1, 8):
        for x, y in (("b", "a"), ("c", "b")):
            a, b = results[(y, batch)], results[(x, batch)]
            print(
                f"  batch {batch}: ({x}) / ({y}) episodes/s = "
                f"{b['episodes_per_s'] / a['episodes_per_s']:.2f}x, "
                f"prefilled tokens = {b['prefilled_per_episode'] / a['prefilled_per_episode']:.2f}x"
            )
    for key in modes:
        one, eight = results[(key, 1)], results[(key, 8)]
        print(
            f"  ({key}): batch 8 / batch 1 episodes/s = "
            f"{eight['episodes_per_s'] / one['episodes_per_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
