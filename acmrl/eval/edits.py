"""What an arm's context edits do, edit by edit: from trajectory records, like the report.

An *edit* is a context event that changes the State: a ``manage_context`` summary (acm, the
model's call or ``agent.force_compaction``), a harness summary (``summary``), an ``evolve``
program (applied or refused), results moved to the archive (``memory``). ``query_memory`` adds
to the context and is not an edit. Per edit (a line of ``edits.csv``):

- **generated**: the tokens generated for it: the call's own (an evolve program's text, a
  ``manage_context`` call) plus the helper's completion (the summary);
- **cache_cost**: the Cache Cost of the next input (its tokens past the prefix it shares with
  the input before plus that input's completion; the edits of one completion share one, the
  first carries it);
- **kept_prefix**: that shared prefix over the tokens before, the share of the prefix cache the
  edit kept: 1.0 for an edit that only appends, near 0 for one that rewrites the start (its
  figures count applied edits only: a refused one changed nothing but its receipt);
- **facts_in / facts_kept**: the task's key terms the edit had to keep (in the steps a summary
  replaced and not elsewhere; in the State an evolve program edited, not in the question) and
  those it kept (an evolve program: those its returned items still hold);
- **refusal**: why a refused edit was refused, in a few words (:func:`refusal_kind`);
- **program**: an evolve edit's code as the policy wrote it (examples of what it learned).

Per arm and kind (:func:`edit_figures`): the counts, the **valid rate** (the policy's edits
applied over its calls of the tool, malformed calls that named it included: for ``evolve``, the
valid-program rate; none for the harness's edits), the **effective rate** (of those calls, the
applied edits that made the input smaller and kept every key term they had to keep: a program
that returns the State unchanged is valid, not effective), medians and means of the above.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from acmrl.rollout.records import Trajectory

# the events that edit the State, and the tool each is called through (None: the harness's)
EDIT_KINDS = {
    "manage_context": "manage_context",
    "evolve": "evolve",
    "summary": None,
    "memory": None,
    "mask": None,
}

REFUSALS = ("syntax", "runtime error", "limit", "invalid State", "arguments", "sandbox")

_NAMED = re.compile(r'"name"\s*:\s*"(\w+)"')


def refusal_kind(detail: str) -> str:
    """A refused edit's error (its receipt's ``error``) in a few words: the program did not
    parse (``syntax``), threw (``runtime error``), ran past a limit, returned no State or an
    invalid one, came with bad arguments, or the sandbox failed.

    >>> refusal_kind("the code threw: SyntaxError: unexpected token in expression: '}'")
    'syntax'
    >>> refusal_kind("the code threw: SyntaxError: unexpected token: 'not'")  # a JSON.parse
    'runtime error'
    >>> refusal_kind("the code threw: TypeError: cannot read property 'type' of undefined")
    'runtime error'
    >>> refusal_kind("evolve must return the State array, got undefined")
    'invalid State'
    >>> refusal_kind("the returned State is invalid: item 3: unknown role 'tool'")
    'invalid State'
    >>> refusal_kind("time limit of 500 ms exceeded"), refusal_kind("the limit is 4,096")
    ('limit', 'limit')
    """
    d = detail.lower()
    if "syntaxerror" in d and "unexpected token:" not in d:  # JSON.parse says "token: 'x'"
        return "syntax"
    if ("limit" in d and "exceeded" in d) or "byte limit" in d or "the limit is" in d:
        return "limit"
    if any(
        m in d
        for m in (
            "state is invalid",
            "returned state holds",
            "must return the state",
            "must stay the last item",
            "did not produce a state",
        )
    ):
        return "invalid State"
    if "not valid json" in d or "takes exactly one argument" in d:
        return "arguments"
    if "sandbox process" in d:
        return "sandbox"
    return "runtime error"


def edit_rows(t: Trajectory) -> list[dict[str, Any]]:
    """The episode's edits, one dict each (the columns of ``edits.csv``)."""
    rows = []
    for s in t.steps:
        # an evolve event's program: the step's evolve calls, in order (one event each)
        programs = iter(
            str(a.get("arguments", {}).get("code", "")) for a in s.actions if a["name"] == "evolve"
        )
        for e in s.events:
            if e.kind not in EDIT_KINDS:
                continue
            rows.append(
                {
                    "episode_id": t.episode_id,
                    "task_id": t.task_id,
                    "arm": t.arm,
                    "turn": s.turn,
                    "origin": s.origin,
                    "kind": e.kind,
                    "applied": float(e.applied),
                    "refusal": "" if e.applied else refusal_kind(e.detail),
                    "generated": e.call_tokens + e.helper_generated,
                    "cache_cost": e.cache_cost,
                    "tokens_before": e.tokens_before,
                    "tokens_after": e.tokens_after,
                    "kept_prefix": e.reusable_prefix / e.tokens_before if e.tokens_before else None,
                    "facts_in": e.facts_in,
                    "facts_kept": e.facts_kept,
                    "detail": e.detail,
                    "program": next(programs, "") if e.kind == "evolve" else "",
                }
            )
    return rows


def edit_calls(t: Trajectory) -> dict[str, dict[str, int]]:
    """Per edit tool of the episode's arm, the calls of it the policy made: those that ran
    (applied, refused, or with nothing to edit) and those that did not (``malformed``: a call
    naming the tool, ``"name": "evolve"``, that was not valid JSON or broke the tool's
    schema). A tool the arm lacks is not counted: calling it is another mistake."""
    from acmrl.arms import get_arm

    try:
        own = get_arm(t.arm).tool_names
    except (KeyError, ValueError):
        own = set()
    tools = {tool for tool in EDIT_KINDS.values() if tool in own}
    out: dict[str, dict[str, int]] = {}
    for s in t.steps:
        if s.call is None or s.call.role != "policy":
            continue
        ran = Counter(a["name"] for a in s.actions if a["name"] in tools)
        named = Counter(n for n in _NAMED.findall(s.text) if n in tools) if s.errors else Counter()
        for tool in ran.keys() | named.keys():
            c = out.setdefault(tool, {"ran": 0, "malformed": 0})
            c["ran"] += ran[tool]
            c["malformed"] += max(0, named[tool] - ran[tool])
    return out


def applied_kept(edits: list[dict[str, Any]], kind: str | None = None) -> list[float]:
    """The kept prefix of each applied edit in ``edits`` (of ``kind``, or of every kind): a
    refused edit left the context as it was, its receipt appended, so its kept prefix says
    nothing of where the policy edits."""
    return [
        e["kept_prefix"]
        for e in edits
        if e["applied"] and e["kept_prefix"] is not None and kind in (None, e["kind"])
    ]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def edit_figures(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind of edit, over the episodes ``rows`` (report rows with their ``edits`` and
    ``edit_calls``): how many, how many applied, refused and why, the valid rate, and the
    per-edit figures' medians and means. The valid rate is the policy's applied edits over its
    calls of the tool, malformed ones included; None for the harness's edits (the ``summary``
    monitor, the ``memory`` arm's moves), which no call makes. Empty when the episodes made no
    edit and attempted none.

    >>> rows = [{"edits": [{"kind": "evolve", "applied": 1.0, "refusal": "", "generated": 300,
    ...                     "cache_cost": 40, "kept_prefix": 0.9, "facts_in": 4, "facts_kept": 4,
    ...                     "origin": "policy"},
    ...                    {"kind": "evolve", "applied": 0.0, "refusal": "syntax",
    ...                     "generated": 280, "cache_cost": 30, "kept_prefix": 1.0,
    ...                     "facts_in": 0, "facts_kept": 0, "origin": "policy"}],
    ...          "edit_calls": {"evolve": {"ran": 2, "malformed": 2}}}]
    >>> f = edit_figures(rows)["evolve"]
    >>> f["edits"], f["valid_rate"], f["refusals"], f["generated_median"]
    (2, 0.25, {'syntax': 1}, 290.0)
    >>> rows[0]["edits"][0] |= {"tokens_before": 1900, "tokens_after": 900}
    >>> edit_figures(rows)["evolve"]["effective_rate"]  # the applied one cut and kept all 4
    0.25
    >>> rows[0]["edits"][0]["facts_kept"] = 3
    >>> edit_figures(rows)["evolve"]["effective_rate"]  # it dropped a needed term
    0.0
    """
    episodes = len(rows)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    calls: dict[str, Counter[str]] = {}
    for r in rows:
        for e in r.get("edits") or []:
            by_kind.setdefault(e["kind"], []).append(e)
        for tool, c in (r.get("edit_calls") or {}).items():
            calls.setdefault(tool, Counter()).update(c)
    for tool in calls:
        by_kind.setdefault(tool, [])
    out = {}
    for kind in sorted(by_kind, key=list(EDIT_KINDS).index):
        es = by_kind[kind]
        applied = [e for e in es if e["applied"]]
        made = calls.get(kind, Counter())
        attempted = made["ran"] + made["malformed"]
        mine = [e for e in applied if e.get("origin", "policy") == "policy"]
        by_policy = len(mine)
        effective = sum(  # it made the input smaller and kept every term it had to
            (e.get("tokens_after") or 0) < (e.get("tokens_before") or 0)
            and e["facts_kept"] >= e["facts_in"]
            for e in mine
        )
        prefix = applied_kept(es)
        out[kind] = {
            "edits": len(es),
            "per_episode": len(es) / episodes if episodes else 0.0,
            "applied": len(applied),
            "calls": attempted,
            "malformed": made["malformed"],
            "valid_rate": by_policy / attempted if EDIT_KINDS[kind] and attempted else None,
            "effective_rate": effective / attempted if EDIT_KINDS[kind] and attempted else None,
            "refusals": dict(Counter(e["refusal"] for e in es if not e["applied"])),
            "generated_median": _median([e["generated"] for e in es]),
            "generated_mean": _mean([e["generated"] for e in es]),
            "cache_cost_median": _median([e["cache_cost"] for e in es]),
            "cache_cost_mean": _mean([e["cache_cost"] for e in es]),
            "kept_prefix_median": _median(prefix),
            "kept_prefix_mean": _mean(prefix),
            "facts_in": sum(e["facts_in"] for e in applied),
            "facts_kept": sum(e["facts_kept"] for e in applied),
        }
    return out
