"""What a policy does at the timing decision: P(answer now) after its last read.

In ``kb_search`` under a tight budget every compaction but the last is forced; the one choice
left is after the event's document is read: compact once more ("My context is at ...", the
early timing) or answer at once ("I have read everything ...", the late timing, one compaction
and ~500 tokens of Compaction Cost fewer). Greedy evaluation shows only which side wins; this
prints, for each model, the probability of the first token of each rationale at those states.

The states are taken from an ``acmrl eval`` folder: in every episode, the model input right
after the last ``open`` whose next action is ``manage_context`` or ``answer``.

    python benchmarks/timing_decision.py EVAL_FOLDER MODEL [MODEL ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from acmrl.config import ModelConfig
from acmrl.models import load_model

EARLY, LATE = "My context is at", "I have read everything"


def decision_prompts(folder: Path) -> list[list[int]]:
    prompts = []
    for line in (folder / "episodes.jsonl").read_text().splitlines():
        t = json.loads(line)
        steps = t["steps"]
        names = [[a.get("name") for a in s.get("actions", [])] for s in steps]
        last = max((i for i, n in enumerate(names) if "open" in n), default=None)
        if last is None or last + 1 >= len(steps):
            continue
        if names[last + 1][:1] in (["manage_context"], ["answer"]):
            prompts.append(steps[last + 1]["call"]["prompt_ids"])
    return prompts


@torch.no_grad()
def late_share(model_name: str, prompts: list[list[int]]) -> tuple[float, float, int]:
    model, tok = load_model(ModelConfig(name=model_name, dtype="float32"))
    early = tok(EARLY, add_special_tokens=False)["input_ids"][0]
    late = tok(LATE, add_special_tokens=False)["input_ids"][0]
    p_late, p_early, wins = [], [], 0
    for ids in prompts:
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        p = torch.softmax(logits, -1)
        p_late.append(float(p[late]))
        p_early.append(float(p[early]))
        wins += int(p[late] > p[early])
    n = max(1, len(prompts))
    return sum(p_late) / n, sum(p_early) / n, wins


def main() -> None:
    folder, models = Path(sys.argv[1]), sys.argv[2:]
    prompts = decision_prompts(folder)
    print(f"{len(prompts)} decision states from {folder}")
    print("| model | P(answer now) | P(compact) | states where answering wins |")
    print("|---|---|---|---|")
    for m in models:
        pl, pe, wins = late_share(m, prompts)
        print(f"| {m} | {pl:.3f} | {pe:.3f} | {wins}/{len(prompts)} |")


if __name__ == "__main__":
    main()
