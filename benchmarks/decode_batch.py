"""Batched decoding in the transformers engine: finished rows leave the batch, or ride along.

    .venv/bin/python benchmarks/decode_batch.py [--rows 16] [--dtype bfloat16] [--repeats 2]

A batch of ``--rows`` kb_search tiny inputs (the rendered State of expert episodes, system
prompt and tools included, ~750-1,250 tokens), each asked for a different number of new tokens
(20 to 96, spread like an agent's turns: a compaction call closes in ~25 tokens, a summary in
~50, a malformed turn runs to the 96-token cap). Two modes of :class:`acmrl.engines.hf.HFEngine`:

    (a) ``drop_finished=False``: every row is decoded until the longest one finishes (the
        engine before this benchmark); (b) ``drop_finished=True``: a row leaves the batch as
        soon as it finishes.

Printed per mode: wall seconds of the decode (prefill excluded: the same in both), tokens
generated, row-steps computed; then the ratio, and whether the completions agree (identical in
float32; in bfloat16 a different batch size may change the last bits of a matmul).
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


def inputs(tokenizer, rows: int) -> list[list[int]]:
    env = load("mixture", env="kb_search", seeds=[0, 100], options={"preset": "tiny"})
    out = []
    for task in env.tasks("eval"):
        renderer = Renderer(tokenizer, SYSTEM_PROMPT, env.session(task).tools)
        state, _ = oracle_state(env, task)
        out.append(renderer.ids(state[: len(state) - 2]))  # before the last call: the longest
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


def run(model, tok, prompts, lengths, drop: bool) -> tuple[float, list[list[int]]]:
    engine = HFEngine(model, tok, max_batch=len(prompts), drop_finished=drop)
    _, decode, out = timed(engine, prompts, lengths)
    return decode, [c.completion_ids for c in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    model, tok = load_model(ModelConfig(dtype=args.dtype))
    prompts = inputs(tok, args.rows)
    n = len(prompts)
    lengths = [20 + (76 * i) // max(1, n - 1) for i in range(n)]
    results = {}
    for drop in (False, True):
        times = []
        for _ in range(args.repeats):
            wall, outs = run(model, tok, prompts, lengths, drop)
            times.append(wall)
        results[drop] = (min(times), outs)
    steps_all = n * max(lengths)
    steps_drop = sum(lengths)
    print(f"{n} rows, new tokens {min(lengths)}..{max(lengths)}, {args.dtype}")
    print(f"| mode | decode seconds (best of {args.repeats}) | row-steps |")
    print("|---|---|---|")
    print(f"| finished rows ride along | {results[False][0]:.2f} | {steps_all} |")
    print(f"| finished rows leave | {results[True][0]:.2f} | {steps_drop} |")
    print(f"speed-up {results[False][0] / results[True][0]:.2f}x")
    same = sum(a == b for a, b in zip(results[False][1], results[True][1], strict=True))
    print(f"completions identical in {same} of {n} rows")


if __name__ == "__main__":
    main()
