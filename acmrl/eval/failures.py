"""Why an episode failed: one cause per failed episode, from what the task needs and what the
episode did.

What a task needs comes from its environment: the documents or files its expert plan reads
(the ``doc_id`` / ``path`` arguments of its calls to the environment's ``read_tools``), the
texts the answer is read from (:meth:`~acmrl.envs.base.Environment.answer_evidence`) and, for
the report's archive figures, whether one of them is a detail that only a later document
selects (evidence with a ``query``). The causes, the first that holds:

- ``overflow``: the input went over the budget and the answer was forced there, or the episode
  ended there (``agent.on_overflow``);
- ``no_answer``: the episode ended without an answer (turn limit, an error, an empty reply); a
  reply in prose is an answer, however far from the question's shape;
- ``unread``: a document the expert plan reads was never read: the policy answered before the
  chain was done, or followed it to another document;
- ``lost``: every document was read, but a text the answer is read from was not in the policy's
  input when it answered: a compaction or a summary dropped it (or moved it to memory) and it
  was not brought back;
- ``wrong``: every such text was in that input, and another answer was given.

A text is in the input when each of its numbers and codes is there verbatim and its words
nearly so (a summary that misspells a name keeps the fact: :func:`in_view`). The input when the
policy answered is the context the episode ended with, less the answering turn (its reply, its
calls and their results). A partly right answer (a score between 0 and 1) is a failure, as in
Pass@1.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache
from typing import Any

from acmrl.rollout.records import Trajectory

FAILURES = ("overflow", "no_answer", "unread", "lost", "wrong")
SUCCESS = "none"  # the failure column of a successful episode
_READ_KEYS = ("doc_id", "path")
_NO_REPLY = "(no reply)"  # what the agent submits for an empty plain reply


@dataclass(frozen=True)
class Needs:
    """What one task needs: the documents its expert plan reads (through ``read_tools``), the
    texts its answer is read from, and whether one of them is a detail a later document
    selects."""

    reads: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    archive_detail: bool = False
    read_tools: tuple[str, ...] = ("open",)


def _norm_id(x: Any) -> str:
    return str(x).strip().removeprefix("./")


def task_needs(env: Any, tasks: Iterable[Any]) -> dict[str, Needs]:
    """:class:`Needs` of each of ``tasks`` (by task id) in ``env``. A task without an expert
    plan needs no document; a task whose needs cannot be derived is left out, with a warning
    (its episodes' causes are then told apart as without an environment)."""
    out, broken = {}, []
    tools = tuple(getattr(env, "read_tools", ()) or ())
    for task in tasks:
        try:
            try:
                plan = env.oracle_plan(task)
            except NotImplementedError:
                plan = []
            reads = [
                _norm_id(args[k])
                for name, args in plan
                if name in tools
                for k in _READ_KEYS
                if k in args
            ]
            evidence = env.answer_evidence(task)
        except Exception as exc:  # one task's needs never cost the others theirs
            broken.append(f"{task.id} ({exc!r})")
            continue
        out[task.id] = Needs(
            reads=tuple(dict.fromkeys(reads)),
            evidence=tuple(e.text for e in evidence if e.text),
            archive_detail=any(e.query for e in evidence),
            read_tools=tools,
        )
    if broken:
        warnings.warn(
            f"what {len(broken)} task(s) need is unknown, their failures are told apart less "
            f"finely: {', '.join(broken[:3])}",
            stacklevel=2,
        )
    return out


def read_ids(t: Trajectory, tools: Iterable[str]) -> set[str]:
    """The documents and files the episode's calls to ``tools`` named (``doc_id`` / ``path``)."""
    tools = set(tools)
    return {
        _norm_id(a["arguments"][k])
        for s in t.steps
        for a in s.actions
        if a.get("name") in tools and isinstance(a.get("arguments"), dict)
        for k in _READ_KEYS
        if k in a["arguments"]
    }


def answer_input(state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The context items the policy saw when it answered: ``state`` (the context an episode
    ended with) less its last turn, the reply and its calls with their results.

    >>> state = [{"role": "user", "content": "q"}, {"type": "function_call_output", "output": "d"},
    ...          {"role": "assistant", "content": "so: 42"}, {"type": "function_call"},
    ...          {"type": "function_call_output", "output": "Answer submitted."}]
    >>> answer_input(state) == state[:2]
    True
    """
    i = len(state)
    while i and state[i - 1].get("type") == "function_call_output":
        i -= 1
    while i and state[i - 1].get("type") == "function_call":
        i -= 1
    if i and state[i - 1].get("role") == "assistant":
        i -= 1
    return state[:i]


def _texts(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _texts(v)]
    if isinstance(x, list):
        return [t for v in x for t in _texts(v)]
    return []


_NUMBERS = re.compile(r"[A-Z]{1,4}-\d+|\d+")
_SPACES = re.compile(r"\s+")


def in_view(text: str, context: str, likeness: float = 0.9) -> bool:
    """Whether ``text`` is in ``context``: verbatim (spaces and case aside), or in one of its
    lines or sentences that has each of ``text``'s numbers and codes verbatim and reads like
    it otherwise (a :class:`difflib.SequenceMatcher` ratio of at least ``likeness``).

    >>> in_view("Zeagea Waicais was born in 1945.", "- Zeagea Waikais was born in 1945.")
    True
    >>> in_view("Zeagea Waicais was born in 1945.", "- Zeagea Waicais was born in 1954.")
    False
    """
    want = _SPACES.sub(" ", text).strip().casefold()
    have, parts = _prepared(context)
    if want in have:
        return True
    numbers = [n.casefold() for n in _NUMBERS.findall(text.upper())]
    return any(
        all(n in part for n in numbers)
        and SequenceMatcher(None, want, part, autojunk=False).ratio() >= likeness
        for part in parts
    )


@lru_cache(maxsize=8)
def _prepared(context: str) -> tuple[str, tuple[str, ...]]:
    """``context`` with spaces and case normalised, whole and as its lines and sentences: done
    once for the several texts of one episode that :func:`in_view` looks for."""
    parts = (_SPACES.sub(" ", p).strip().casefold() for p in re.split(r"\n|(?<=[.!?])\s", context))
    return _SPACES.sub(" ", context).casefold(), tuple(p for p in parts if p)


def failure_of(t: Trajectory, needs: Needs | None) -> str | None:
    """The cause of ``t``'s failure (one of :data:`FAILURES`), None when it succeeded. Without
    ``needs`` (the environment was not known) only ``overflow`` and ``no_answer`` are told
    apart from ``wrong``.

    >>> from acmrl.rollout.records import Step
    >>> t = Trajectory("e", "t", "env", "acm", 0, 0, "m", "?", "42", answer="41",
    ...                status="answered", steps=[Step(0, None, actions=[
    ...                    {"name": "open", "arguments": {"doc_id": "d1"}}])],
    ...                final_state=[{"content": [{"text": "[d1] ... the code is 42"}]}])
    >>> failure_of(t, Needs(reads=("d1", "d2"), evidence=("the code is 42",)))
    'unread'
    >>> failure_of(t, Needs(reads=("d1",), evidence=("the code is 42",)))
    'wrong'
    >>> failure_of(t, Needs(reads=("d1",), evidence=("the code is 43",)))
    'lost'
    """
    if t.score >= 1.0:
        return None
    if t.status == "overflow" or t.metrics.get("forced_answer"):
        return "overflow"
    if (t.answer or "").strip() in ("", _NO_REPLY):
        return "no_answer"
    if needs is None:
        return "wrong"
    if set(needs.reads) - read_ids(t, needs.read_tools):
        return "unread"
    context = "\n".join(_texts(answer_input(t.final_state)))
    if not all(in_view(e, context) for e in needs.evidence):
        return "lost"
    return "wrong"


def failure_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many of ``rows`` (episodes.csv lines) failed for each cause (zeros when none did);
    an empty dict when the rows carry no cause (reports written before causes were
    recorded)."""
    if not any("failure" in r for r in rows):
        return {}
    return {f: sum(r.get("failure") == f for r in rows) for f in FAILURES}
