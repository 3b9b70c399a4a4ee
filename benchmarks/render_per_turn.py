"""Per-turn cost of the model input: render + tokenise the whole State vs acmrl's incremental path.

    .venv/bin/python benchmarks/render_per_turn.py [--sizes 8000,32000,128000] [--turns 100]

For each size a State of about that many tokens (search results, as in benchmarks/evolve_latency.py)
grows by one turn at a time (an assistant tool call and its result, ~710 tokens) for ``--turns``
turns. Each turn the model input is built twice:

- before: the chat template through jinja, then the tokenizer over the whole text (what every
  turn cost until the renderer kept its pieces);
- after: ``Renderer.ids`` (the template's Python twin, then the ids of the pieces between
  special tokens, tokenising only pieces it has not seen).

Both must give the same ids (checked every turn). Printed: per-turn p50 before and after, their
ratio, and the totals over the episode, side by side. The SmolLM2 tokenizer and acmrl's template.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from acmrl.context.state import function_call, function_call_output, user


def result(i: int) -> str:
    rows = [
        {
            "title": f"Result {i}.{j}",
            "url": f"https://example.com/{i}/{j}",
            "excerpt": "The dome and the 1891 refractor were restored in stages. " * 3,
        }
        for j in range(8)
    ]
    return json.dumps({"results": rows})


def grow(state: list, i: int) -> None:
    state.append(function_call(f"c{i}", "web_search", {"query": f"Northbridge restoration {i}"}))
    state.append(function_call_output(f"c{i}", result(i)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8000,32000,128000")
    ap.add_argument("--turns", type=int, default=100)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from acmrl.context.render import Renderer, acmrl_chat_template
    from acmrl.models import ensure_default_model

    tok = AutoTokenizer.from_pretrained(ensure_default_model())
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        renderer = Renderer(tok, system_prompt="You are an agent.")
        state = [user("When did the Northbridge Observatory restoration start?")]
        i = 0
        while len(renderer.ids(state)) < size:
            grow(state, i)
            i += 1
        start = len(renderer.ids(state))
        before, after = [], []
        for _ in range(args.turns):
            grow(state, i)
            i += 1
            t = time.perf_counter()
            text = tok.apply_chat_template(
                renderer.messages(state),
                chat_template=acmrl_chat_template(),
                tokenize=False,
                add_generation_prompt=True,
            )
            whole = tok.encode(text, add_special_tokens=False)
            before.append(time.perf_counter() - t)
            t = time.perf_counter()
            ids = renderer.ids(state)
            after.append(time.perf_counter() - t)
            assert ids == whole, "the incremental ids differ from the whole tokenisation"
        rows.append((start, len(ids), before, after))
    print(f"{args.turns} turns per episode, ~710 tokens added per turn; ms unless noted")
    head = ("start tokens", "end tokens", "before p50", "after p50", "ratio", "before total s")
    print("".join(f"{h:>15}" for h in (*head, "after total s")))
    for start, end, before, after in rows:
        b, a = statistics.median(before), statistics.median(after)
        cells = (start, end, f"{b * 1e3:.2f}", f"{a * 1e3:.2f}", f"{b / a:.1f}x")
        cells += (f"{sum(before):.2f}", f"{sum(after):.2f}")
        print("".join(f"{c:>15}" for c in cells))


if __name__ == "__main__":
    main()
