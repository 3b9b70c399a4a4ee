"""Latency of one evolve on a ~100 KB State: p50/p99 and where the time goes.

    .venv/bin/python benchmarks/evolve_latency.py [--runs 200] [--kb 100]

One evolve = validate the input, serialise it, run the model's code in a fresh QuickJS context,
parse and validate the result, and optionally render with the SmolLM2 tokenizer to measure the
reusable prefix and Cache Cost: either both States, or only the new one when the agent loop
already holds the old input's ids. The three modes are printed side by side. The code is the web-search filter of
the Self-Evolving Agents write-up's chapter 3 applied to the last of many search results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from acmrl.context.evolve import apply_evolve, evolve_call
from acmrl.context.state import function_call, function_call_output, user

CODE = """
const calls = state.filter(i => i.type === "function_call" && i.name === "web_search");
const last = calls[calls.length - 1];
const out = state.find(i => i.type === "function_call_output" && i.call_id === last.call_id);
const data = JSON.parse(out.output);
data.results = data.results.filter(r => /^https:\\/\\/northbridge-observatory\\.org/.test(r.url));
out.output = [{type: "input_text", text: JSON.stringify(data)},
              {type: "input_text", text: "Memory edit: kept the observatory's own records."}];
return state;
"""


def make_state(kb: int) -> list:
    state = [user("When did the Northbridge Observatory restoration start, and who funded it?")]
    i = 0
    while len(json.dumps(state)) < kb * 1024:
        results = [
            {
                "title": f"Result {i}.{j}",
                "url": (
                    "https://northbridge-observatory.org/p"
                    if j % 4 == 0
                    else "https://example.com/p"
                )
                + str(j),
                "excerpt": "The dome and the 1891 refractor were restored in stages. " * 3,
            }
            for j in range(8)
        ]
        state.append(
            function_call(f"c{i}", "web_search", {"query": f"Northbridge restoration {i}"})
        )
        state.append(function_call_output(f"c{i}", json.dumps({"results": results})))
        i += 1
    return [*state, evolve_call("ev", CODE)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench(
    state: list, runs: int, renderer, before_ids
) -> tuple[list[float], dict[str, list[float]], dict]:
    totals, parts = [], {}
    for _ in range(runs + 5):
        t = time.perf_counter()
        result = apply_evolve(state, renderer=renderer, call_tokens=120, before_ids=before_ids)
        totals.append(time.perf_counter() - t)
        assert result.applied, result.error
        for k, v in result.timings.items():
            parts.setdefault(k, []).append(v)
    return totals[5:], {k: v[5:] for k, v in parts.items()}, result.receipt  # drop warm-up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--kb", type=int, default=100)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from acmrl.context.render import Renderer
    from acmrl.models import ensure_default_model

    renderer = Renderer(
        AutoTokenizer.from_pretrained(ensure_default_model()), system_prompt="You are an agent."
    )
    state = make_state(args.kb)
    known = renderer.ids(state, add_generation_prompt=False)
    modes = {
        "no measure": (None, None),
        "measure, old ids known": (renderer, known),
        "measure, render both": (renderer, None),
    }
    results = {name: bench(state, args.runs, r, ids) for name, (r, ids) in modes.items()}

    size = len(json.dumps(state).encode())
    print(f"State: {size / 1024:.1f} KB, {len(state)} items; {args.runs} runs per mode")
    receipt = results["measure, render both"][2]
    print("receipt:", json.dumps(receipt))
    names = list(results)
    print(f"{'ms (p50 unless noted)':<24}" + "".join(f"{n:>26}" for n in names))
    base = statistics.median(results["no measure"][0])
    rows = [
        ("one evolve p50", lambda t, p: statistics.median(t)),
        ("one evolve p99", lambda t, p: pct(t, 0.99)),
    ]
    rows += [(k, lambda t, p, k=k: statistics.median(p[k]) if k in p else 0.0) for k in STAGES]
    for label, fn in rows:
        print(f"{label:<24}" + "".join(f"{fn(t, p) * 1e3:>26.2f}" for t, p, _ in results.values()))
    print(
        f"{'p50 / no-measure p50':<24}"
        + "".join(f"{statistics.median(t) / base:>25.1f}x" for t, _, _ in results.values())
    )
    t, p, _ = results["no measure"]
    p50 = statistics.median(t)
    split = ", ".join(f"{k} {statistics.median(p[k]) / p50:.0%}" for k in STAGES if k in p)
    print(
        f"no-measure split of p50: {split}, other (input validation, copies, receipt) "
        f"{(p50 - sum(statistics.median(p[k]) for k in STAGES if k in p)) / p50:.0%}"
    )


STAGES = ("json_in", "quickjs", "json_out", "validate", "measure")


if __name__ == "__main__":
    main()
