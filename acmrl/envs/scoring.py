"""Answer scoring shared by every environment: SQuAD-style normalisation, exact match, token F1,
answers that are sets, and an optional LLM judge.

A task's reference is either one string, a list of accepted alternatives (the best match counts),
or, when ``metadata["answer_set"]`` is true, a list of items that must *all* be given (scored by
set F1 over the items the prediction lists). Scores are in [0, 1]; rewards treat 1.0 as success.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

METRICS = ("em", "f1", "contains")

Judge = Callable[[str, str, str], float]
"""``judge(question, reference, prediction) -> score in [0, 1]``."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_ITEM_SPLIT = re.compile(r"\s*(?:[,;\n]|\band\b)\s*")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (the SQuAD recipe).

    >>> normalize_answer("The  Veltra-Lantern Festival!")
    'veltralantern festival'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised strings are equal.

    >>> exact_match("the Kelm Holdings.", "Kelm Holdings")
    1.0
    """
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall after normalisation.

    >>> round(token_f1("Kelm Holdings of Port Elm", "Kelm Holdings"), 3)
    0.571
    """
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def contains(prediction: str, reference: str) -> float:
    """1.0 when the normalised reference occurs as a whole-word run inside the prediction.

    >>> contains("I believe it was the Kelm Holdings, in 1962.", "Kelm Holdings")
    1.0
    """
    ref = normalize_answer(reference)
    if not ref:
        return 0.0
    return float(f" {ref} " in f" {normalize_answer(prediction)} ")


_METRIC_FNS: dict[str, Callable[[str, str], float]] = {
    "em": exact_match,
    "f1": token_f1,
    "contains": contains,
}


def split_items(prediction: str) -> list[str]:
    """The items of a listed answer: split on commas, semicolons, new lines and 'and'.

    >>> split_items("Alpha, Beta and Gamma")
    ['Alpha', 'Beta', 'Gamma']
    """
    return [item for item in _ITEM_SPLIT.split(prediction.strip()) if item.strip()]


def set_f1(
    prediction: str, items: Sequence[str], aliases: Mapping[str, Sequence[str]] | None = None
) -> float:
    """F1 between the set of items the prediction lists and the reference items (exact match
    each, after normalisation). ``aliases`` maps an item to its other accepted forms; a listed
    item matches at most one reference item and each reference item counts once.

    >>> set_f1("Beta, alpha", ["Alpha", "Beta", "Gamma"])
    0.8
    >>> set_f1("NYC and Boston", ["New York", "Boston"], {"New York": ["NYC"]})
    1.0
    """
    predicted = {normalize_answer(i) for i in split_items(prediction)} - {""}
    aliases = aliases or {}
    gold = [{normalize_answer(f) for f in (item, *aliases.get(item, ()))} - {""} for item in items]
    gold = [forms for forms in gold if forms]
    if not predicted or not gold:
        return float(not predicted and not gold)
    hits, used = 0, set()
    for forms in gold:
        match = next((p for p in sorted(predicted - used) if p in forms), None)
        if match is not None:
            hits += 1
            used.add(match)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(predicted), hits / len(gold)
    return 2 * precision * recall / (precision + recall)


def score_answer(
    prediction: str | None,
    reference: str | Sequence[str],
    *,
    metric: str = "em",
    answer_set: bool = False,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> float:
    """Score one prediction against a reference (a string, alternatives, or a set of items).
    ``aliases`` maps a reference (an alternative or a set item) to its other accepted forms."""
    if metric not in _METRIC_FNS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if prediction is None:
        return 0.0
    refs = [reference] if isinstance(reference, str) else list(reference)
    if answer_set:
        return set_f1(prediction, refs, aliases)
    fn = _METRIC_FNS[metric]
    forms = [form for ref in refs for form in (ref, *(aliases or {}).get(ref, ()))]
    return max((fn(prediction, form) for form in forms), default=0.0)


class JudgeError(RuntimeError):
    """The judge model's reply holds no verdict."""


JUDGE_PROMPT = """You grade answers to questions. Decide whether the response gives the same answer as
the reference; ignore wording, case and extra explanation, but a different or missing answer is wrong.

Question: {question}
Reference answer: {reference}
Response: {prediction}

Reply with JSON only: {{"verdict": "correct"}} or {{"verdict": "incorrect"}}."""

_VERDICT = re.compile(r'"?verdict"?\s*:\s*"?(correct|incorrect)"?|\b(correct|incorrect)\b', re.I)


def parse_verdict(reply: str) -> float:
    """1.0 / 0.0 from a judge reply; JSON first, else the first bare verdict word.

    >>> parse_verdict('{"verdict": "incorrect"}')
    0.0
    """
    with_json = reply.strip()
    try:
        obj = json.loads(with_json)
        if isinstance(obj, dict) and str(obj.get("verdict", "")).lower() in (
            "correct",
            "incorrect",
        ):
            return float(obj["verdict"].lower() == "correct")
    except json.JSONDecodeError:
        pass  # free text: fall through to the pattern
    match = _VERDICT.search(reply)
    if match is None:
        raise JudgeError(f"the judge's reply holds no verdict: {reply[:200]!r}")
    return float((match.group(1) or match.group(2)).lower() == "correct")


def llm_judge(complete: Callable[[str], str], template: str = JUDGE_PROMPT) -> Judge:
    """A judge backed by any text-completion function (an engine wrapped by the caller).

    ``complete(prompt) -> reply``; the reply must contain a verdict (see :func:`parse_verdict`).
    """

    def judge(question: str, reference: str, prediction: str) -> float:
        prompt = template.format(question=question, reference=reference, prediction=prediction)
        return parse_verdict(complete(prompt))

    return judge
