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

With ``--cited`` (policies trained on ``teacher.answers: cited`` demonstrations, whose answer
turn opens "kb-00080 says the ... took place in ..."), answering now is measured by the
probability of that opening, "<id of the document just read> says", against the whole
"My context is at", at the decision and at the reading states alike (the first token, "kb",
also opens a call to ``open``).

    python benchmarks/timing_decision.py [--cited] EVAL_FOLDER MODEL [MODEL ...]
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


State = tuple[list[int], str]  # a model input and the id of the document read just before


def decision_prompts(folder: Path) -> tuple[list[State], list[State]]:
    """The prompts after each episode's last read (the decision) and after its first read
    when more reads follow (where answering fails), each with the id of that read."""
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
            prompts.append(_state(steps, last))
        if len(opens) > 1 and steps[opens[0] + 1].get("call"):  # the first of several reads
            reading.append(_state(steps, opens[0]))
    return prompts, reading


def _state(steps: list[dict[str, Any]], i: int) -> State:
    """The input after step ``i`` (an ``open``) and the id it opened."""
    opened = next(a for a in steps[i]["actions"] if a.get("name") == "open")
    return steps[i + 1]["call"]["prompt_ids"], str(opened["arguments"].get("doc_id"))


def late_phrase(cited: bool, doc_id: str) -> str:
    """How an answer-now turn opens: the plain rationale, or the cited one's "<id> says"."""
    return f"{doc_id} says" if cited else LATE


@torch.no_grad()
def late_share(
    model: Any, tok: Any, prompts: list[State], cited: bool = False
) -> tuple[float, float, int]:
    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    p_late, p_early, wins = [], [], 0
    for prompt, doc_id in prompts:
        if cited:  # whole openings: the first token "kb" also opens an `open` call
            phrases = (late_phrase(True, doc_id), EARLY)
            late, early = (phrase_prob(model, prompt, ids(x)) for x in phrases)
        else:
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
            p = torch.softmax(logits, -1)
            late, early = float(p[ids(LATE)[0]]), float(p[ids(EARLY)[0]])
        p_late.append(late)
        p_early.append(early)
        wins += int(late > early)
    n = max(1, len(prompts))
    return sum(p_late) / n, sum(p_early) / n, wins


@torch.no_grad()
def phrase_prob(model: torch.nn.Module, prompt: list[int], phrase: list[int]) -> float:
    """P(the model writes ``phrase`` next), teacher-forced in one forward pass."""
    logits = model(input_ids=torch.tensor([prompt + phrase])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    return float(logp.gather(-1, torch.tensor(phrase)[:, None]).sum().exp())


def answer_while_reading(
    model: Any, tok: Any, prompts: list[State], cited: bool = False
) -> tuple[float, int]:
    """Mean P(the answer-now rationale) at reading states, and how many give it > 0.5."""
    probs = [
        phrase_prob(
            model, ids, tok(late_phrase(cited, doc_id), add_special_tokens=False)["input_ids"]
        )
        for ids, doc_id in prompts
    ]
    return sum(probs) / max(1, len(probs)), sum(p > 0.5 for p in probs)


def main() -> None:
    args = sys.argv[1:]
    cited = "--cited" in args
    args = [a for a in args if a != "--cited"]
    folder, models = Path(args[0]), args[1:]
    prompts, reading = decision_prompts(folder)
    print(f"{len(prompts)} decision states and {len(reading)} reading states from {folder}")
    print(
        "| model | P(answer now) | P(compact) | states where answering wins "
        "| P(answer-now rationale) while reading | reading states above 0.5 |"
    )
    print("|---|---|---|---|---|---|")
    for m in models:
        model, tok = load_model(ModelConfig(name=m, dtype="float32"))  # once for both tables
        pl, pe, wins = late_share(model, tok, prompts, cited)
        pr, above = answer_while_reading(model, tok, reading, cited)
        print(
            f"| {m} | {pl:.3f} | {pe:.3f} | {wins}/{len(prompts)} "
            f"| {pr:.4f} | {above}/{len(reading)} |"
        )


if __name__ == "__main__":
    main()
