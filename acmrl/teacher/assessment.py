"""Assessments of student trajectories, and the validators every assessment must pass.

A teacher reads a trajectory against the reference answer and returns one :class:`Assessment`:

- ``injection``: at policy step ``step`` a context action would have helped (``manage_context``,
  ``query_memory`` with its query, or ``evolve`` with its code); the student's turn there is
  replaced by the teacher's turn: a first-person rationale and that call;
- ``correction``: the student's turn at ``step`` was unproductive (a repeated or irrelevant
  search, an answer given before any evidence) and is replaced by a productive call;
- ``no_action``: nothing to change.

The rationale is written as the student's own thinking and must be grounded in what the student
had seen before that step (seed 000, "dual constraints"). :func:`validate` rejects a rationale that
leaks the reference answer, cites material the student had not seen, mentions a teacher, coach or
feedback, or is too short or too long, and an action the arm does not have or whose arguments do
not fit its schema.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from acmrl.context.render import check_arguments
from acmrl.envs.scoring import normalize_answer

KINDS = ("injection", "correction", "no_action")
CONTEXT_ACTIONS = ("manage_context", "query_memory", "evolve")

MIN_WORDS, MAX_WORDS = 8, 120
_META = re.compile(
    r"\b(teacher|coach|coaching|feedback|tutor|instructor|grader|supervis\w*|annotat\w*|"
    r"reference answer|ground truth|the correct answer|oracle)\b",
    re.I,
)
_QUOTED = re.compile(r"[\"“']([^\"“”']{3,80})[\"”']")
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seen_text(traj: Any, step: int) -> str:
    """Everything the student had read before policy step ``step``: the task and observations."""
    parts = [traj.prompt]
    policy = 0
    for s in traj.steps:
        if s.call is not None and s.call.role == "policy":
            if policy == step:
                break
            policy += 1
        parts.append(s.text)
        parts.extend(s.observations)
    return "\n".join(parts)


def validate(
    a: Assessment,
    *,
    seen: str,
    reference: str | list[str],
    tools: list[dict[str, Any]],
    known_names: set[str] | None = None,
) -> list[str]:
    """The reasons ``a`` is invalid (empty when it is valid)."""
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
    if not re.search(r"\b(I|I'm|I've|I'll|my|me)\b", a.rationale):
        errors.append("the rationale must be in the first person")
    seen_norm = f" {normalize_answer(seen)} "
    refs = [reference] if isinstance(reference, str) else reference
    for ref in refs:
        r = normalize_answer(ref)
        if r and f" {r} " in f" {normalize_answer(a.rationale)} " and f" {r} " not in seen_norm:
            errors.append("the rationale leaks the reference answer, which the agent has not seen")
            break
    unseen = _unseen(a.rationale, seen, seen_norm, known_names or set())
    if unseen:
        errors.append(
            f"the rationale cites material the agent has not seen: {', '.join(sorted(unseen))}"
        )
    errors += _check_action(a, tools)
    return errors


def _unseen(rationale: str, seen: str, seen_norm: str, known: set[str]) -> set[str]:
    cited = {m.group(1).strip() for m in _QUOTED.finditer(rationale)}
    cited |= {m.group(0) for m in _DOC_ID.finditer(rationale)}
    low = rationale.lower()
    cited |= {name for name in known if len(name) > 3 and name.lower() in low}
    return {c for c in cited if c not in seen and f" {normalize_answer(c)} " not in seen_norm}


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
