"""Where trained students fall short on kb_search chain, per question shape.

    .venv/bin/python scripts/chain_failures.py EVAL_DIR [EVAL_DIR ...] [--arm acm]

Reads the folders ``acmrl eval`` wrote (their ``config.yaml``'s environment names the tasks)
and prints, per question shape (the question kind and the chain's relations, from the task's
metadata): episodes, Pass@1, why the failed ones failed (``acmrl.eval.failures``), how often
the episode's first summary (the summariser call of a ``manage_context`` call or of the
``summary`` arm's harness; a ``memory`` reflection is not one) names the chain's second entity,
the one the first document leads to (spelling aside: ``acmrl.eval.failures.in_view``), and how
often the answer has the shape of the reference (a ledger code ``AB-1234`` or a number): an
answer in another question's shape means the policy answered another question than the one
asked.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

from acmrl.config import EvalConfig, RolloutConfig, load_config
from acmrl.eval.failures import FAILURES, failure_of, in_view, task_needs
from acmrl.eval.run import reported_ids
from acmrl.models import load_tokenizer
from acmrl.rollout.environment import build_environment
from acmrl.rollout.worker import read_trajectories

SUMMARIES = ("manage_context", "summary")  # the events whose helper call writes a summary


def shape(text: str | None) -> str:
    """``code`` (AB-1234), ``number`` (digits) or ``other``."""
    t = (text or "").strip()
    if re.fullmatch(r"[A-Z]{2}-\d{4}", t):
        return "code"
    return "number" if t.isdigit() else "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="folders written by acmrl eval")
    ap.add_argument("--arm", default="acm")
    args = ap.parse_args()
    groups: dict[str, list[tuple[str | None, bool, bool, bool]]] = defaultdict(list)
    tokenizer = None
    for run in args.runs:
        try:  # the eval's config; a folder written before that: the rollout's
            cfg = load_config(EvalConfig, run / "config.yaml")
        except ValueError:
            cfg = load_config(RolloutConfig, run / "config.yaml")
        env = build_environment(cfg.env)
        ids = reported_ids(run)  # the episodes its report covers
        trajs = [
            t
            for t in read_trajectories(run / "episodes.jsonl")
            if t.arm == args.arm and (ids is None or t.episode_id in ids)
        ]
        ids = {t.task_id for t in trajs}
        tasks = {t.id: t for split in env.splits for t in env.tasks(split) if t.id in ids}
        needs = task_needs(env, tasks.values())
        tokenizer = tokenizer or load_tokenizer(cfg.model.name)
        for t in trajs:
            meta = tasks[t.task_id].metadata
            key = f"{meta.get('question')} via {'/'.join(meta.get('relations') or [])}"
            first = next(
                (
                    c
                    for s in t.steps
                    if any(e.kind in SUMMARIES for e in s.events)
                    for c in s.helper_calls
                    if c.role == "summariser"
                ),
                None,
            )
            second = (meta.get("entities") or [None, None])[1]
            kept = first is not None and second is not None
            kept = kept and in_view(second, tokenizer.decode(first.completion_ids))
            same_shape = shape(t.answer) == shape(str(t.reference))
            groups[key].append(
                (failure_of(t, needs[t.task_id]), kept, first is not None, same_shape)
            )
    head = ["shape", "episodes", "Pass@1", *FAILURES, "1st summary names hop 2", "answer's shape"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key, rows in sorted(groups.items()):
        n = len(rows)
        summarised = sum(r[2] for r in rows)
        print(
            f"| {key} | {n} | {sum(r[0] is None for r in rows) / n:.2f} | "
            + " | ".join(str(sum(r[0] == f for r in rows)) for f in FAILURES)
            + f" | {sum(r[1] for r in rows)}/{summarised} | {sum(r[3] for r in rows)}/{n} |"
        )


if __name__ == "__main__":
    main()
