"""The teacher's ``evolve`` edits for any environment, from seed 001's patterns.

Seed 001's examples edit the State in a few recurring ways; :func:`keep_facts_code` writes one
program that does three of them, parameterised by the task:

- collapse repeated calls: of several identical calls (same tool, same arguments) only the
  latest result stays; the older ones say where to look;
- drop bulky outputs after keeping their facts: a long result keeps only its lines and sentences
  that mention what the task still needs (:func:`needed_terms`: the question's names and code
  symbols, the documents or files the expert plan reads, the years of the facts it rests on;
  never the answer itself);
- keep the task and the latest plan: user and assistant messages are never touched.

The check (:func:`dropped`) is what makes such an edit safe to teach: the program is run in the
sandbox on the student's State, and the edit is refused if the result lost a string that the
State held and the expert plan still needs (a document id to open, a file to read, the answer).
"""

from __future__ import annotations

import json
import re
from typing import Any

from acmrl.envs.base import Task

_NAMES = re.compile(r"\b[A-Z][\w'-]+(?: [A-Z][\w'-]+)+")  # multi-word proper names
_CODE = re.compile(r"`([^`\n]+)`")  # code symbols and modules in backticks
_YEAR = re.compile(r"\b\d{4}\b")

KEEP_FACTS_JS = r"""
const need = __TERMS__, key = {}, last = {};
state.forEach((i, n) => {
  if (i.type === "function_call") key[i.call_id] = i.name + i.arguments;
  if (i.type === "function_call_output") last[key[i.call_id]] = n;
});
return state.map((i, n) => i.type !== "function_call_output" || typeof i.output !== "string" ? i
  : last[key[i.call_id]] !== n ? {...i, output: "(repeated later: see that result)"}
  : i.output.length < 400 ? i
  : {...i, output: i.output.split(/\n+|(?<=\.)\s+/).filter(p => need.some(t => p.includes(t)))
      .join("\n") || i.output.slice(0, 160)});
""".strip()


def _answers(task: Task) -> list[str]:
    ans = task.answer if isinstance(task.answer, list) else [task.answer]
    return [str(a) for a in ans if str(a).strip()]


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
    answers = [a.casefold() for a in _answers(task)]
    return sorted(t for t in terms if len(t) > 2 and not any(a in t.casefold() for a in answers))


def keep_facts_code(task: Task, plan: list[tuple[str, dict[str, Any]]]) -> str:
    return KEEP_FACTS_JS.replace("__TERMS__", json.dumps(needed_terms(task, plan)))


def still_needed(task: Task, plan: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Strings an edit must not drop when the State holds them: every id or path the plan opens
    or reads, and the answer."""
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
