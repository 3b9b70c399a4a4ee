"""Assessments of student trajectories, and the validators every assessment must pass.

A teacher reads a trajectory against the reference answer and returns one :class:`Assessment`:

- ``injection``: at policy step ``step`` a context action would have helped (``manage_context``,
  ``query_memory`` with its query, or ``evolve`` with its code); the student's turn there is
  replaced by the teacher's turn: a first-person rationale and that call;
- ``correction``: the student's turn at ``step`` was unproductive (a repeated or irrelevant
  search, an answer given before any evidence) and is replaced by a productive call;
- ``no_action``: nothing to change.

The rationale is written as the student's own thinking and must be grounded in what the student had
seen before that step (the ACM write-up's "dual constraints", docs/design.md). :func:`validate`
rejects a rationale that leaks the reference answer in any surface form (case, punctuation and
hyphens do not matter, and a run of two or more of a multi-word answer's words counts), cites
material the student had not seen, mentions a teacher, reviewer, guidance or being told, is not the
agent's own first-person thinking sentence by sentence, or is too short or too long; and an action
the arm does not have, whose arguments do not fit its schema, or (``evolve``) whose code fails when
it runs in the sandbox on the State the student had at that step; an answer that the
environment scores below 1; and a ``query_memory`` of a summary that does not exist at the edit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from acmrl.context.render import check_arguments
from acmrl.envs.base import ANSWER_TOOL
from acmrl.envs.scoring import normalize_answer

KINDS = ("injection", "correction", "no_action")
CONTEXT_ACTIONS = ("manage_context", "query_memory", "evolve")

MIN_WORDS, MAX_WORDS = 8, 120
_META = re.compile(
    r"\b(teachers?|coach\w*|feedback|tutors?|instructors?|instructed|grader|grading|supervis\w*|"
    r"annotat\w*|reviewers?|reviewed|guidance|hints?|hinted|evaluators?|judges?|examiners?|"
    r"assessors?|critique|reference answers?|reference solution|ground truth|answer key|"
    r"the correct answer|the right answer|oracle|expert|demonstrat\w*|(was|been|were|am|got) told|"
    r"told (me|us)|(was|been|were) (advised|shown|corrected)|corrected me|pointed out to me)\b",
    re.I,
)
# the agent spoken of in the third person, or spoken to
_THIRD = re.compile(
    r"\b(the|this) (agent|student|model|assistant|policy|learner)\b|\byou(r|rs|'ll|'re|'ve)?\b",
    re.I,
)
_FIRST = re.compile(r"\b(I|I'm|I've|I'll|I'd|my|me|mine|myself)\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[^\W_]+")
# quoted text; an apostrophe inside a word ("I'm", "don't") opens or closes no quote
_QUOTED = re.compile(r"(?<![^\W_])[\"“']([^\"“”']{3,80})[\"”'](?![^\W_])")
_DOC_ID = re.compile(r"\b[A-Za-z]+-\d{2,}\b")


@dataclass
class Assessment:
    kind: str  # injection | correction | no_action
    step: int = -1  # index of the policy step whose turn is replaced (-1 for no_action)
    action: dict[str, Any] | None = None  # {"name": ..., "arguments": {...}}
    rationale: str = ""
    teacher: str = ""
    valid: bool = True
    errors: list[str] = field(default_factory=list)
    attempts: int = 1
    arm: str | None = None  # the arm the resumed episode runs in (None: the source's)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def steps_before(traj: Any, step: int) -> Iterator[Any]:
    """The steps of ``traj`` before its policy step ``step`` (harness steps included)."""
    policy = 0
    for s in traj.steps:
        if s.call is not None and s.call.role == "policy":
            if policy == step:
                return
            policy += 1
        yield s


def seen_text(traj: Any, step: int, tokenizer: Any = None) -> str:
    """Everything the student had read before policy step ``step``: the task and observations,
    and, given the ``tokenizer`` that decodes them, the summaries its compactions put in its
    context (the summariser's replies)."""
    parts = [traj.prompt]
    for s in steps_before(traj, step):
        parts.append(s.text)
        parts.extend(s.observations)
        if tokenizer is not None:
            parts += [
                tokenizer.decode(c.completion_ids, skip_special_tokens=True)
                for c in s.helper_calls
                if c.role == "summariser"
            ]
    return "\n".join(parts)


def summaries_before(traj: Any, step: int) -> set[str]:
    """The ids of the summaries archived before policy step ``step`` (the agent's own
    ``manage_context`` calls and the harness's forced compactions): what ``query_memory`` can
    name there."""
    return {e.summary_id for s in steps_before(traj, step) for e in s.events if e.summary_id}


def validate(
    a: Assessment,
    *,
    seen: str,
    reference: str | list[str],
    tools: list[dict[str, Any]],
    known_names: set[str] | None = None,
    state: list[dict[str, Any]] | None = None,
    needed: list[str] | None = None,
    score: Callable[[str], float] | None = None,
    summaries: set[str] | None = None,
) -> list[str]:
    """The reasons ``a`` is invalid (empty when it is valid). ``state`` is the State the student
    had at the edit: an ``evolve`` action's code is then run on it in the sandbox, and refused
    if its result lost one of the ``needed`` strings the State held (what the expert plan still
    needs: ids to open, the answer; acmrl/arms/evolve_edits.py). ``score(text)`` is the
    environment's score of an answer: an edit that answers must score 1 by it. ``summaries``:
    the summary ids archived before the edit (:func:`summaries_before`), which a
    ``query_memory`` edit must name one of."""
    if a.kind not in KINDS:
        return [f"kind must be one of {', '.join(KINDS)}, got {a.kind!r}"]
    if a.kind == "no_action":
        return []
    errors = []
    words = len(a.rationale.split())
    if not MIN_WORDS <= words <= MAX_WORDS:
        errors.append(f"the rationale has {words} words; it needs {MIN_WORDS} to {MAX_WORDS}")
    meta = _META.search(a.rationale)
    if meta:
        errors.append(
            f"the rationale mentions {meta.group(0)!r}; write it as the agent's own thinking"
        )
    errors += _person(a.rationale)
    seen_norm = f" {normalize_answer(seen)} "
    refs = [reference] if isinstance(reference, str) else reference
    leaked = leaks(a.rationale, refs, seen)
    if leaked:
        errors.append(
            f"the rationale leaks the reference answer ({leaked!r}), which the agent has not seen"
        )
    unseen = _unseen(a.rationale, seen, seen_norm, known_names or set())
    if unseen:
        errors.append(
            f"the rationale cites material the agent has not seen: {', '.join(sorted(unseen))}"
        )
    errors += _check_action(a, tools)
    if score is not None:
        errors += _check_answer(a, score)
    if summaries is not None:
        errors += _check_summary(a, summaries)
    if not errors and state is not None and (a.action or {}).get("name") == "evolve":
        errors += _check_evolve(a.action["arguments"].get("code", ""), state, needed or [])
    return errors


def _tokens(text: str) -> list[str]:
    """Case-folded words with every punctuation mark (hyphens, dots, quotes) as a separator."""
    return _WORD.findall(text.casefold())


def leaks(rationale: str, references: list[str], seen: str) -> str | None:
    """The part of a reference answer the rationale gives away, if any: the whole answer, or for a
    multi-word answer any run of two or more of its words, in any case or punctuation, that the
    agent had not seen in that order. None when nothing leaks.

    >>> leaks("Maybe it is the velvet-lantern one.", ["Velvet Lantern Festival"], "")
    'velvet lantern'
    >>> leaks("I read about the Velvet Lantern Festival.", ["Velvet Lantern Festival"],
    ...       "The Velvet Lantern Festival was held in 1901.") is None
    True
    """
    said = f" {' '.join(_tokens(rationale))} "
    known = f" {' '.join(_tokens(seen))} "
    for ref in references:
        words = _tokens(ref)
        if not words:
            continue
        shortest = 1 if len(words) == 1 else 2
        for n in range(len(words), shortest - 1, -1):
            for i in range(len(words) - n + 1):
                gram = f" {' '.join(words[i : i + n])} "
                if gram in said and gram not in known:
                    return gram.strip()
    return None


def _person(rationale: str) -> list[str]:
    """The rationale is the agent's own thinking: first person; no sentence speaks of the agent in
    the third person or to it; and at least a third of its sentences say "I", "my" or "me" (one
    stray "I" does not make a third-person rationale first person)."""
    if not _FIRST.search(rationale):
        return ["the rationale must be in the first person"]
    sentences = [s for s in _SENTENCE.split(rationale.strip()) if len(s.split()) >= 3]
    third = [s for s in sentences if _THIRD.search(s)]
    if third:
        return [
            f"the rationale must be in the first person; this sentence is not: {third[0][:80]!r}"
        ]
    first = sum(1 for s in sentences if _FIRST.search(s))
    if sentences and 3 * first < len(sentences):
        return [
            f"the rationale must be in the first person; only {first} of its "
            f"{len(sentences)} sentences are"
        ]
    return []


def _check_evolve(code: Any, state: list[dict[str, Any]], needed: list[str]) -> list[str]:
    """Run the teacher's evolve code in the sandbox on the student's State at the edit."""
    from acmrl.arms.evolve_edits import dropped
    from acmrl.context.evolve import apply_evolve, evolve_call

    if not isinstance(code, str):
        return ["the evolve code must be a string"]
    result = apply_evolve([*state, evolve_call("teacher-check", code)])
    if not result.applied:
        return [f"the evolve code fails on the agent's State: {result.error}"]
    # the items the program returned: its own call (which names what it keeps) and receipt out
    lost = dropped(state, result.state[:-2], needed)
    if lost:
        return [f"the evolve code drops what the task still needs: {', '.join(lost)}"]
    return []


def _unseen(rationale: str, seen: str, seen_norm: str, known: set[str]) -> set[str]:
    cited = {m.group(1).strip() for m in _QUOTED.finditer(rationale)}
    cited |= {m.group(0) for m in _DOC_ID.finditer(rationale)}
    low = rationale.lower()
    cited |= {name for name in known if len(name) > 3 and name.lower() in low}
    return {c for c in cited if c not in seen and f" {normalize_answer(c)} " not in seen_norm}


def _arguments(a: Assessment, name: str) -> dict[str, Any] | None:
    """The arguments of ``a``'s action if it calls ``name``, else None."""
    action = a.action if isinstance(a.action, dict) else {}
    args = action.get("arguments")
    return args if action.get("name") == name and isinstance(args, dict) else None


def _check_answer(a: Assessment, score: Callable[[str], float]) -> list[str]:
    """An edit that answers must give an answer the environment scores 1 (its own metric,
    aliases and answer sets included): a wrong answer is never the productive call."""
    args = _arguments(a, ANSWER_TOOL)
    if args is None or score(str(args.get("text", ""))) >= 1.0:
        return []
    return ["the edit answers, but the answer scores below 1: a wrong answer is never productive"]


def _check_summary(a: Assessment, summaries: set[str]) -> list[str]:
    """A ``query_memory`` edit names a summary that exists at the edit."""
    args = _arguments(a, "query_memory")
    sid = str(args.get("summary_id", "")).strip() if args is not None else ""
    if args is None or sid in summaries:
        return []
    have = ", ".join(sorted(summaries)) or "none yet"
    return [f"query_memory names summary {sid!r}, which does not exist there (summaries: {have})"]


def _check_action(a: Assessment, tools: list[dict[str, Any]]) -> list[str]:
    if not isinstance(a.action, dict) or not isinstance(a.action.get("name"), str):
        return ['the action must be {"name": ..., "arguments": {...}}']
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    name, args = a.action["name"], a.action.get("arguments", {})
    if name not in params:
        return [f"the agent has no tool {name!r}; its tools: {', '.join(params)}"]
    if a.kind == "injection" and name not in CONTEXT_ACTIONS:
        return [f"an injection is a context action ({', '.join(CONTEXT_ACTIONS)}), not {name!r}"]
    if not isinstance(args, dict):
        return [f"the arguments of {name} must be an object"]
    problem = check_arguments(name, args, params[name])
    return [problem[1]] if problem else []
