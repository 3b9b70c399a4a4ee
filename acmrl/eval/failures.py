"""Why an episode failed: one cause per failed episode, from what the task needs and what the
episode did.

What a task needs comes from its environment: the documents or files the expert plan reads
(the ``doc_id`` / ``path`` arguments of its calls), the text the answer is read from
(:meth:`~acmrl.envs.base.Environment.answer_evidence`) and whether that text is a detail that
only a later document selects (evidence with a ``query``). The causes, the first that holds:

- ``overflow``: the input went over the budget and the answer was forced there, or the episode
  ended there (``agent.on_overflow``);
- ``no_answer``: the episode ended without an answer (turn limit, an error, an empty answer);
- ``unread``: a document the expert plan reads was never read: the policy answered before the
  chain was done, or followed it to another document;
- ``lost``: every document was read, but the answer's text was not in the context when the
  episode ended: a compaction (or a summary) dropped it and it was not brought back;
- ``wrong``: the answer's text was in the context, and another answer was given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from acmrl.rollout.records import Trajectory

FAILURES = ("overflow", "no_answer", "unread", "lost", "wrong")
_READ_KEYS = ("doc_id", "path")


@dataclass(frozen=True)
class Needs:
    """What one task needs: the documents its expert plan reads, the texts its answer is read
    from, and whether one of them is a detail a later document selects."""

    reads: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    archive_detail: bool = False


def task_needs(env: Any, tasks: Iterable[Any]) -> dict[str, Needs]:
    """:class:`Needs` of each of ``tasks`` (by task id) in ``env``; a task without an expert
    plan needs no document."""
    out = {}
    for task in tasks:
        try:
            plan = env.oracle_plan(task)
        except NotImplementedError:
            plan = []
        reads = [str(args[k]) for _, args in plan for k in _READ_KEYS if k in args]
        evidence = env.answer_evidence(task)
        out[task.id] = Needs(
            reads=tuple(dict.fromkeys(reads)),
            evidence=tuple(e.text for e in evidence if e.text),
            archive_detail=any(e.query for e in evidence),
        )
    return out


def read_ids(t: Trajectory) -> set[str]:
    """The documents and files the episode's calls named (``doc_id`` / ``path``)."""
    return {
        str(a["arguments"][k])
        for s in t.steps
        for a in s.actions
        if isinstance(a.get("arguments"), dict)
        for k in _READ_KEYS
        if k in a["arguments"]
    }


def _context_text(t: Trajectory) -> str:
    """The text of the context the episode ended with (its items' strings, every field)."""
    parts: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            parts.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(t.final_state)
    return "\n".join(parts)


def failure_of(t: Trajectory, needs: Needs | None) -> str | None:
    """The cause of ``t``'s failure (one of :data:`FAILURES`), None when it succeeded. Without
    ``needs`` (the environment was not known) only ``no_answer`` and ``overflow`` are told
    apart from ``wrong``.

    >>> from acmrl.rollout.records import Step
    >>> t = Trajectory("e", "t", "env", "acm", 0, 0, "m", "?", "42", answer="41",
    ...                status="answered", steps=[Step(0, None, actions=[
    ...                    {"name": "open", "arguments": {"doc_id": "d1"}}])],
    ...                final_state=[{"content": [{"text": "[d1] ... the code is 42"}]}])
    >>> failure_of(t, Needs(reads=("d1", "d2"), evidence=("42",)))
    'unread'
    >>> failure_of(t, Needs(reads=("d1",), evidence=("42",)))
    'wrong'
    >>> failure_of(t, Needs(reads=("d1",), evidence=("43",)))
    'lost'
    """
    if t.score >= 1.0:
        return None
    if t.status == "overflow" or t.metrics.get("forced_answer"):
        return "overflow"
    if not (t.answer or "").strip():
        return "no_answer"
    if needs is None:
        return "wrong"
    if set(needs.reads) - read_ids(t):
        return "unread"
    context = _context_text(t)
    if not all(e in context for e in needs.evidence):
        return "lost"
    return "wrong"


def failure_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``rows`` (episodes.csv lines) failed for each cause; an empty dict when the
    rows carry no cause (reports written before causes were recorded)."""
    if not any(r.get("failure") for r in rows):
        return {}
    return {f: sum(r.get("failure") == f for r in rows) for f in FAILURES}
