"""What a success's Compaction Cost is made of, per eval folder and arm, side by side.

    .venv/bin/python benchmarks/compaction_cost_parts.py runs/demo/eval-round runs/demo/eval-trained
    .venv/bin/python benchmarks/compaction_cost_parts.py --output-weight 1.0 FOLDER [FOLDER ...]

Reads each folder's ``episodes.jsonl`` (what ``acmrl eval`` writes, an oracle-driven eval
included) and splits the Compaction Cost of its successful episodes into the parts docs/design.md
"Costs" adds up, per compaction (query_memory lookups are counted in the totals, not as
compactions):

- *policy*: tokens the policy writes for the call itself (``manage_context`` with its
  rationale, an evolve program), times the output weight;
- *summary*: tokens the summariser generates, times the output weight;
- *read*: the summariser's and querier's prompt tokens not served from a cache (the history it
  reads);
- *cache*: Cache Cost, the tokens of the next input past the prefix it shares with the last one.

The last columns say which share the policy's own writing (policy + summary: what GRPO can make
shorter) takes, and how many compactions a success needs. When the budget forces a compaction
after every tool result, the rest is fixed by the plan: that bounds how far GRPO can cut the
cost without compacting less often. ``check`` is the parts' sum over the recorded cost (1.00 when
``--output-weight`` is the run's ``agent.output_weight``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from acmrl.rewards import compaction_points


def parts(folder: Path, output_weight: float) -> list[dict[str, float | str]]:
    episodes = [
        json.loads(line)
        for line in (folder / "episodes.jsonl").read_text().splitlines()
        if line.strip()
    ]
    out = []
    for arm in sorted({e["arm"] for e in episodes}):
        mine = [e for e in episodes if e["arm"] == arm]
        wins = [e for e in mine if float(e.get("score", 0.0)) >= 1.0]
        events = [x for e in wins for s in e["steps"] for x in s["events"]]
        helpers = [c for e in wins for s in e["steps"] for c in s.get("helper_calls", [])]
        compactions = [x for x in events if x["kind"] != "query_memory" and x.get("applied", True)]
        if not compactions:
            continue
        n, k = len(wins), len(compactions)
        policy = output_weight * sum(x["call_tokens"] for x in events)
        summary = output_weight * sum(len(c["completion_ids"]) for c in helpers)
        read = sum(len(c["prompt_ids"]) - c["cached_prefix_tokens"] for c in helpers)
        cache = sum(x["cache_cost"] for x in events)
        cost = sum(x["compaction_cost"] for x in events)
        points = [
            p
            for e in wins
            for p in compaction_points(
                (x for s in e["steps"] for x in s["events"]), e["metrics"]["budget"]
            )
        ]
        out.append(
            {
                "folder": str(folder),
                "arm": arm,
                "wins": f"{n}/{len(mine)}",
                "compactions": k / n,
                "cost": cost / n,
                "policy": policy / k,
                "summary": summary / k,
                "read": read / k,
                "cache": cache / k,
                "point": sum(points) / len(points),
                "writes": (policy + summary) / cost if cost else 0.0,
                "check": (policy + summary + read + cache) / cost if cost else 0.0,
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="acmrl eval output folders")
    p.add_argument("--output-weight", type=float, default=1.0, help="the run's agent.output_weight")
    args = p.parse_args()
    print(
        "| eval | arm | successes | compactions / success | Compaction Cost / success "
        "| per compaction: policy call | summary | summariser read | Cache Cost "
        "| compaction point | policy-written share | check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for folder in args.folders:
        for r in parts(folder, args.output_weight):
            print(
                f"| {r['folder']} | {r['arm']} | {r['wins']} | {r['compactions']:.2f} "
                f"| {r['cost']:.0f} | {r['policy']:.0f} | {r['summary']:.0f} | {r['read']:.0f} "
                f"| {r['cache']:.0f} | {r['point']:.3f} | {r['writes']:.2f} | {r['check']:.2f} |"
            )


if __name__ == "__main__":
    main()
