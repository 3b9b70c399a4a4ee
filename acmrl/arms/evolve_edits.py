"""The teacher's ``evolve`` edits for any environment, from the Self-Evolving Agents
write-up's patterns (docs/design.md).

Seed 001's examples edit the State in a few recurring ways; :func:`keep_facts_code` writes one
program that does them, parameterised by the task and written for the State it edits (only the
clauses that State calls for, so that the edit costs few generated tokens):

- drop bulky outputs after keeping their facts: a result of :data:`SHORT` characters or more
  keeps only its lines and sentences that mention what the task still needs
  (:func:`needed_terms`: the question's names and code symbols, the documents or files the
  expert plan reads, the years of the facts it rests on; never the answer itself), of those
  terms only the ones that select in that State (:func:`selective_terms`);
- collapse repeated calls: of several identical calls (same tool, same arguments) only the
  latest result stays; the older ones say where to look;
- drop spent steps: every earlier evolve call with its receipt (its edit is in the State), every
  call that is not a read once a read came after it (the listing of the document then opened),
  every assistant message but the latest; the task and other user messages stay.

The check (:func:`dropped`) is what makes such an edit safe to teach: the program is run in the
sandbox on the student's State, and the edit is refused if the result lost a string that the
State held and the expert plan still needs (a document id to open, a file to read, the answer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from acmrl.envs.base import Task

_NAMES = re.compile(r"\b[A-Z][\w'-]+(?: [A-Z][\w'-]+)+")  # multi-word proper names
_CODE = re.compile(r"`([^`\n]+)`")  # code symbols and modules in backticks
_YEAR = re.compile(r"\b\d{4}\b")

SHORT = 200  # results shorter than this (characters) are kept whole
_SENTENCES = re.compile(r"\n+|(?<=\.)\s+")  # the program splits results the same way

# The program, clause by clause: the teacher writes only the clauses the State calls for, so
# that the edit costs few generated tokens (single quotes: no JSON escapes).
_REPEATS = """const key = {}, last = {};
state.forEach((i, n) => {
  if (i.type === 'function_call') key[i.call_id] = i.name + i.arguments;
  if (i.type === 'function_call_output') last[key[i.call_id]] = n;
});
"""
_REPEATED = "last[key[i.call_id]] !== n ? {...i, output: '(repeated later: see that result)'}\n  : "
# spent steps leave, with their calls: every earlier evolve call with its receipt, and every call
# that is not a read once a read came after it (the search that listed the document then
# opened, the definition found and then read); of the assistant's messages only the latest (its
# current plan) stays. The reads' own results stay, to be cut.
_SPENT = """const gone = new Set(), say = state.map(i => i.role === 'assistant').lastIndexOf(true);
for (let n = state.length - 2, later = false; n >= 0; n--) {
  const i = state[n];
  if (i.type !== 'function_call') continue;
  if (__READS__.includes(i.name)) later = true;
  else if (later || i.name === 'evolve') gone.add(i.call_id);
}
state = state.filter((i, n) => !gone.has(i.call_id) && (i.role !== 'assistant' || n === say));
"""
_GUARD = "i.type !== 'function_call_output' || typeof i.output !== 'string' ? i\n  : "
_CUT = """i.output.length < __SHORT__ ? i
  : {...i, output: i.output.split(/\\n+|(?<=\\.)\\s+/).filter(p => need.some(t => p.includes(t))).join('\\n')
      || i.output.slice(0, 120)}"""


# a tool result in the rendered input
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


def kept_lines(env: Any, task: Task, results: Sequence[str]) -> list[str]:
    """The lines of ``results`` that the environment says a teacher keeps verbatim for ``task``
    (:meth:`~acmrl.envs.base.Environment.notes_of`, which a summary's notes keep too: on code,
    whole spans, such as a call with all its arguments), as their code reads."""
    out: list[str] = []
    for result in results:
        for line in env.notes_of(task, result) or []:  # "path:line: code"
            code = line.split(": ", 1)[-1]
            # a bracket or a one-letter line would select every line that holds it
            if len(code) > 2 and any(c.isalnum() for c in code) and code not in out:
                out.append(code)
    return out


def _answers(task: Task) -> list[str]:
    ans = task.answer if isinstance(task.answer, list) else [task.answer]
    return [str(a) for a in ans if str(a).strip()]


def gives_away(text: str, task: Task, part: bool = False) -> bool:
    """Whether ``text`` holds an answer of ``task`` (``part``: or is a part of one)."""
    t = text.casefold()
    return any(a in t or (part and t in a) for a in (a.casefold() for a in _answers(task)))


def needed_terms(task: Task, plan: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """What a kept line must mention: names and code symbols of the question, the ids and paths
    the plan reads, the entities and fact years of the metadata. No term is or contains an
    answer (the program is the teacher's turn, which the student learns to write)."""
    meta = task.metadata
    terms = set(_NAMES.findall(task.prompt)) | set(_CODE.findall(task.prompt))
    terms |= {str(e) for e in meta.get("entities", [])}
    terms |= {str(d) for d in meta.get("gold_docs", []) + meta.get("gold_files", [])}
    for fact in meta.get("facts", []):
        terms |= set(_YEAR.findall(str(fact)))
    for name, args in plan:
        if name in ("open", "read_file"):
            terms |= {str(v) for k, v in args.items() if k in ("doc_id", "path")}
    return sorted(t for t in terms if len(t) > 2 and not gives_away(t, task, part=True))


def selective_terms(terms: list[str], context: str, keep: set[str] = frozenset()) -> list[str]:
    """The terms that select evidence in ``context`` (the text the State shows): those it holds,
    less any named in most of the sentences that name a term (a page's own subject, in every
    sentence of its page, selects nothing), unless it is in ``keep`` or no other term is left.

    >>> selective_terms(["Ann Lee", "1940", "Oslo"], "Ann Lee was born in 1940. Ann Lee sings.")
    ['1940']
    """
    sentences = [p for p in _SENTENCES.split(context) if any(t in p for t in terms)]
    present = [t for t in terms if any(t in p for p in sentences)]
    sharp = [
        t for t in present if t in keep or 2 * sum(t in p for p in sentences) <= len(sentences)
    ]
    return sharp or present or terms


def _js_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def keep_facts_code(
    task: Task,
    plan: list[tuple[str, dict[str, Any]]],
    context: str | None = None,
    *,
    repeats: bool = True,
    keep: Sequence[str] = (),
) -> str:
    """The keep-facts program for ``task``. Given ``context`` (what the State shows), its terms
    are the :func:`selective_terms` there; ``repeats`` adds the collapse of repeated calls;
    ``keep`` (:func:`kept_lines`) adds each line no term selects, such as a line of code.
    Spent steps go first (:data:`_SPENT`): earlier evolve calls with their receipts, calls a
    later read followed, all but the latest assistant message."""
    terms = needed_terms(task, plan)
    lines = [
        line for line in keep if not any(t in line for t in terms) and not gives_away(line, task)
    ]
    terms += lines
    if context is not None:
        terms = selective_terms(terms, context, keep={*still_needed(task, plan), *lines})
    head = f"const need = [{', '.join(_js_string(t) for t in terms)}];\n"
    # first: the clauses below index the State that is left
    reads = sorted({name for name, _ in plan if name in ("open", "read_file")})
    head += _SPENT.replace("__READS__", f"[{', '.join(_js_string(r) for r in reads)}]")
    body = _CUT.replace("__SHORT__", str(SHORT))
    if repeats:
        head += _REPEATS
        body = _REPEATED + body
    body = _GUARD + body
    return f"{head}return state.map((i, n) => {body});"


def still_needed(task: Task, plan: list[tuple[str, dict[str, Any]]] | None) -> list[str]:
    """Strings an edit must not drop when the State holds them: every id or path the plan opens
    or reads, and the answer; without a plan (None), the answer and the evidence sentences the
    task gives (``task.metadata["evidence"]``, e.g. an MCP task file's)."""
    if plan is None:
        evidence = [str(e) for e in task.metadata.get("evidence") or [] if str(e).strip()]
        return sorted({*_answers(task), *evidence})
    out = [str(v) for name, args in plan if name in ("open", "read_file") for k, v in args.items()]
    return sorted({*(v for v in out if not v.isdigit()), *_answers(task)})


def _text(state: list[dict[str, Any]]) -> str:
    return json.dumps(state, ensure_ascii=False)


def dropped(
    before: list[dict[str, Any]], after: list[dict[str, Any]], needed: list[str]
) -> list[str]:
    """The needed strings the State held before an edit and no longer holds after it."""
    was, now = _text(before), _text(after)
    return [s for s in needed if json.dumps(s)[1:-1] in was and json.dumps(s)[1:-1] not in now]
