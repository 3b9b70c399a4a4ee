"""What a policy does at the timing decision: P(answer now) after its last read.

In ``kb_search`` under a tight budget every compaction but the last is forced; the one choice
left is after the event's document is read: compact once more ("My context is at ...", the
early timing) or answer at once ("I have read everything ...", the late timing, one compaction
and ~500 tokens of Compaction Cost fewer). Greedy evaluation shows only which side wins; this
prints, for each model, the probability of the first token of each rationale at those states.

The states are taken from an ``acmrl eval`` folder: in every episode, the model input right
after the last ``open`` whose next action is ``manage_context`` or ``answer``.

Answering is right only there: after an earlier ``open`` (the person's document, which the
budget makes the policy compact after before it searches on) an answer fails. So the table also
gives, at those *reading* states (the input after the first of an episode's several ``open``
calls), the probability of the whole answer-now rationale: a policy that learned the timing
raises it after the last read and keeps it near 0 while reading goes on. (The first token alone
does not tell there: "I need to find out more ..." starts a search with the same token.)

    python benchmarks/timing_decision.py EVAL_FOLDER MODEL [MODEL ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from acmrl.config import ModelConfig
from acmrl.models import load_model

EARLY, LATE = "My context is at", "I have read everything"


def decision_prompts(folder: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts after each episode's last read (the decision) and after its first read
    when more reads follow (where answering fails)."""
    prompts, reading = [], []
    for line in (folder / "episodes.jsonl").read_text().splitlines():
        t = json.loads(line)
        steps = t["steps"]
        names = [[a.get("name") for a in s.get("actions", [])] for s in steps]
        opens = [i for i, n in enumerate(names) if "open" in n]
        if not opens or opens[-1] + 1 >= len(steps):
            continue  # no read, or the episode ended at its last read
        last = opens[-1]
        if names[last + 1][:1] in (["manage_context"], ["answer"]):
            prompts.append(steps[last + 1]["call"]["prompt_ids"])
        if len(opens) > 1 and steps[opens[0] + 1].get("call"):  # the first of several reads
            reading.append(steps[opens[0] + 1]["call"]["prompt_ids"])
    return prompts, reading


@torch.no_grad()
def late_share(model: Any, tok: Any, prompts: list[list[int]]) -> tuple[float, float, int]:
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


@torch.no_grad()
def phrase_prob(model: torch.nn.Module, prompt: list[int], phrase: list[int]) -> float:
    """P(the model writes ``phrase`` next), teacher-forced in one forward pass."""
    logits = model(input_ids=torch.tensor([prompt + phrase])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return float(logp.gather(-1, torch.tensor(phrase)[:, None]).sum().exp())


def answer_while_reading(model: Any, tok: Any, prompts: list[list[int]]) -> tuple[float, int]:
    """Mean P(the answer-now rationale) at reading states, and how many give it > 0.5."""
    phrase = tok(LATE, add_special_tokens=False)["input_ids"]
    probs = [phrase_prob(model, ids, phrase) for ids in prompts]
    return sum(probs) / max(1, len(probs)), sum(p > 0.5 for p in probs)


def main() -> None:
    folder, models = Path(sys.argv[1]), sys.argv[2:]
    prompts, reading = decision_prompts(folder)
    print(f"{len(prompts)} decision states and {len(reading)} reading states from {folder}")
    print(
        "| model | P(answer now) | P(compact) | states where answering wins "
        "| P(answer-now rationale) while reading | reading states above 0.5 |"
    )
    print("|---|---|---|---|---|---|")
    for m in models:
        model, tok = load_model(ModelConfig(name=m, dtype="float32"))  # once for both tables
        pl, pe, wins = late_share(model, tok, prompts)
        pr, above = answer_while_reading(model, tok, reading)
        print(
            f"| {m} | {pl:.3f} | {pe:.3f} | {wins}/{len(prompts)} "
            f"| {pr:.4f} | {above}/{len(reading)} |"
        )


if __name__ == "__main__":
    main()
