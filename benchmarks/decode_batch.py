"""Batched decoding in the transformers engine: finished rows leave the batch or ride along;
the batch's cache grows in place or by concatenation.

    .venv/bin/python benchmarks/decode_batch.py [--rows 16] [--dtype bfloat16] [--repeats 2]
        [--preset tiny|chain] [--cap N]

A batch of ``--rows`` kb_search inputs (the rendered State of expert episodes before their last
call, system prompt and tools included: ~750-1,250 tokens on ``tiny``, longer on ``chain``),
each asked for a different number of new tokens (20 to 96, spread like an agent's turns: a
compaction call closes in ~25 tokens, a summary in ~50, a malformed turn runs to the 96-token
cap). Three modes of :class:`acmrl.engines.hf.HFEngine`:

    (a) ``drop_finished=False, grow_in_place=False``: every row is decoded until the longest
        one finishes, its cache grown by concatenation (transformers' ``DynamicCache``: each
        token copies the whole cache);
    (b) ``drop_finished=True, grow_in_place=False``: a row leaves the batch as soon as it
        finishes;
    (c) ``drop_finished=True, grow_in_place=True`` (the engine's default): as (b), each token
        written in place into a buffer made for the batch's new tokens.

Printed per mode: wall seconds of the decode (prefill excluded: the same in all), row-steps
computed; then the ratios, and whether the completions agree (identical in float32; in
bfloat16 a different batch size may change the last bits of a matmul).
"""

from __future__ import annotations

import argparse
import time

import torch

from acmrl.config import ModelConfig
from acmrl.context.render import Renderer
from acmrl.engines.base import Completion, Engine, Request
from acmrl.engines.hf import HFEngine
from acmrl.envs import load
from acmrl.envs.pressure import SYSTEM_PROMPT, oracle_state
from acmrl.models import load_model


def inputs(tokenizer, rows: int, preset: str = "tiny", cap: int = 0) -> list[list[int]]:
    env = load("mixture", env="kb_search", seeds=[0, 100], options={"preset": preset})
    out = []
    for task in env.tasks("eval"):
        renderer = Renderer(tokenizer, SYSTEM_PROMPT, env.session(task).tools)
        state, _ = oracle_state(env, task)
        ids = renderer.ids(state[: len(state) - 2])  # before the last call: the longest
        out.append(ids[:cap] if cap else ids)
        if len(out) == rows:
            break
    return out


def timed(engine: Engine, prompts, lengths) -> tuple[float, float, list[Completion]]:
    """Prefill seconds, decode seconds and the completions of ``engine`` on the batch: the first
    call reads every prompt into its session's cache, the second reuses all but the last prompt
    token, so it is almost pure decode."""
    engine.eos_ids = set()  # never stop early: the lengths alone decide when a row finishes
    reqs = [
        Request(f"r{i}", p, max_tokens=n)
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    t0 = time.perf_counter()
    engine.generate([Request(r.session_id, r.prompt_ids, max_tokens=1) for r in reqs])
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = engine.generate(reqs)
    return prefill, time.perf_counter() - t0, out


def run(model, tok, prompts, lengths, drop: bool, grow: bool) -> tuple[float, list[list[int]]]:
    engine = HFEngine(model, tok, max_batch=len(prompts), drop_finished=drop, grow_in_place=grow)
    _, decode, out = timed(engine, prompts, lengths)
    return decode, [c.completion_ids for c in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--preset", default="tiny", help="kb_search preset of the inputs")
    ap.add_argument(
        "--cap",
        type=int,
        default=0,
        help="cut each input to its first N tokens (0: whole); chain's expert states without "
        "compaction run far past an agent's budget, so e.g. --cap 2000 for the size of its turns",
    )
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    model, tok = load_model(ModelConfig(dtype=args.dtype))
    prompts = inputs(tok, args.rows, args.preset, args.cap)
    n = len(prompts)
    lengths = [20 + (76 * i) // max(1, n - 1) for i in range(n)]
    modes = {
        "finished rows ride along, cache concatenated": (False, False),
        "finished rows leave, cache concatenated": (True, False),
        "finished rows leave, cache grown in place": (True, True),
    }
    results = {}
    for _ in range(args.repeats):  # the modes interleaved, so a slower spell hits them alike
        for name, (drop, grow) in modes.items():
            wall, outs = run(model, tok, prompts, lengths, drop, grow)
            best = results.get(name, (wall, outs))[0]
            results[name] = (min(best, wall), outs)
    steps = {True: sum(lengths), False: n * max(lengths)}
    sizes = [len(p) for p in prompts]
    print(
        f"{n} rows of {min(sizes)}..{max(sizes)} tokens ({args.preset}), "
        f"new tokens {min(lengths)}..{max(lengths)}, {args.dtype}"
    )
    print(f"| mode | decode seconds (best of {args.repeats}) | row-steps | vs (a) |")
    print("|---|---|---|---|")
    first = next(iter(results.values()))
    for key, (name, (wall, _)) in zip("abc", results.items(), strict=True):
        ratio = first[0] / wall
        print(f"| ({key}) {name} | {wall:.2f} | {steps[modes[name][0]]} | {ratio:.2f}x |")
    for name, (_, outs) in list(results.items())[1:]:
        same = sum(a == b for a, b in zip(first[1], outs, strict=True))
        print(f"{name}: completions identical to (a) in {same} of {n} rows")


if __name__ == "__main__":
    main()
