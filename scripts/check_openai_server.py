"""Check the openai engine against a running OpenAI-compatible server (``vllm serve``, ``acmrl serve``).

    .venv/bin/python scripts/check_openai_server.py --base-url http://127.0.0.1:8000 \\
        --model SERVED_NAME --tokenizer PATH_OR_NAME

Checks: completion token ids returned (not re-tokenised), logprobs per token, greedy determinism,
the server's cached-token count on a session's second turn, stop strings. Prints one line per
check and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True, nargs="+")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True)
    args = p.parse_args()
    from acmrl.engines.base import Request
    from acmrl.engines.openai import OpenAIEngine
    from acmrl.models import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    eng = OpenAIEngine(args.base_url, args.model, tok, max_retries=2)
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

    a = eng.generate([Request("s1", ids, max_tokens=24)])[0]
    b = eng.generate([Request("s2", ids, max_tokens=24)])[0]
    check("greedy is deterministic", a.completion_ids == b.completion_ids, repr(a.text[:60]))
    check(
        "token ids and logprobs",
        len(a.completion_ids) == len(a.logprobs) > 0 and all(x <= 0 for x in a.logprobs),
        f"{len(a.completion_ids)} ids, logprobs {a.logprobs[:3]}",
    )
    check(
        "ids decode to the text",
        tok.decode(a.completion_ids, skip_special_tokens=True).strip() == a.text.strip(),
        repr(a.text[:40]),
    )
    nxt = ids + a.completion_ids + tok.encode("\nNow three animals.", add_special_tokens=False)
    c = eng.generate([Request("s1", nxt, max_tokens=8)])[0]
    check(
        "server prefix cache",
        c.cached_prefix_tokens > 0,
        f"{c.cached_prefix_tokens} of {len(nxt)} prompt tokens cached",
    )
    stop = tok.decode(a.completion_ids[3:5])
    d = eng.generate([Request("s3", ids, max_tokens=24, stop=[stop])])[0]
    check(
        "stop string",
        d.finish_reason == "stop" and stop in d.text,
        f"stop={stop!r} text={d.text!r}",
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
