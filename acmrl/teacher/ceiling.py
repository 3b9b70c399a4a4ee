"""The best scripted policy of each arm, and the trivial strategies a task set allows.

``acmrl audit`` runs both through the real agent loop (the arm's tools, budget and overflow
rule; the environment's tools) before anything is trained, so a comparison of trained arms can
be read against what each arm admits at best and what needs no reading at all.

:class:`CeilingPolicy` is the oracle's expert (:class:`~acmrl.teacher.demonstrate.Demonstrator`)
with three changes that make it the best an arm can do without knowing the answer:

- it answers as soon as its context shows the answer's evidence
  (:meth:`~acmrl.envs.base.Environment.answer_evidence`), whatever is left of the plan: every
  shortcut the observations allow (a title in a search listing, for one), and never an answer its
  context does not support (asked for an answer at the overflow, without the evidence, it says it
  does not know);
- it compacts only when the next result would not fit (the cheapest timing), and its summaries
  keep the fact sentences the plan needs so far plus each evidence sentence whose relevance it
  has seen elsewhere (a membership in a lodge no document has yet named is not known to matter);
- a missing piece of evidence is recovered the arm's way: ``acm`` asks its archive
  (``query_memory``, answered by a keyword extract of the archived steps), ``memory`` reads its
  memory (for a detail it knew to matter when its reflections wrote it), every arm may read the
  document again.

The trivial strategies (:class:`Trivial`, named in :data:`acmrl.config.TRIVIAL_STRATEGIES`) play
the ``react`` arm and read nothing but search listings, if that (code_nav's read the call).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from acmrl.config import TRIVIAL_STRATEGIES
from acmrl.envs.base import ANSWER_TOOL, Environment, Evidence, Task
from acmrl.teacher.demonstrate import Demonstrator
from acmrl.teacher.oracle import _next_needed, _opened

FORCED = "Give your final answer now"  # the harness's request at an overflow (force_answer)
UNKNOWN = "unknown"
_LISTED = re.compile(r"^\[([^\]\s]+)\] ([^:\n]+):", re.MULTILINE)  # a search result line
_WORD = re.compile(r"[A-Z][\w'-]+|\d{3,}")


def answer_text(task: Task) -> str:
    """The text a policy submits: the answer, the first alternative, or every item of a set."""
    if isinstance(task.answer, str):
        return task.answer
    return ", ".join(task.answer) if task.metadata.get("answer_set") else task.answer[0]


def extract(prompt: str) -> str:
    """The querier's reply: the archived sentences that share the most names and numbers with the
    question (at least two), a keyword match that knows nothing of the task.

    >>> p = ("Archived steps S1:\\nresult: Ann holds number 41 in the Oak Guild. Ann holds number "
    ...      "77 in the Elm Guild.\\n\\nQuestion: Ann's number in the Elm Guild\\n\\nAnswer with")
    >>> extract(p)
    'Ann holds number 77 in the Elm Guild.'
    """
    head, _, rest = prompt.partition("\n\nQuestion: ")
    query = rest.split("\n\nAnswer with", 1)[0]
    words = set(_WORD.findall(query))
    parts = re.split(r"(?<=\.)\s+|\n", head)
    sentences = [s.strip().removeprefix("result: ") for s in parts if s.strip()]
    scored = [(sum(w in set(_WORD.findall(s)) for w in words), i) for i, s in enumerate(sentences)]
    best = max((n for n, _ in scored), default=0)
    if best < 2:
        return "The archived steps do not say."
    return " ".join(sentences[i] for n, i in scored if n == best)


class CeilingPolicy(Demonstrator):
    """The best scripted policy of one arm on one task (see the module docstring)."""

    def __init__(
        self,
        env: Environment,
        task: Task,
        arm: str,
        budget: int,
        tokenizer: Any,
        *,
        pressure: float = 1.0,
        late: bool = True,
        noted: bool = False,
        keep_code: bool = True,
    ) -> None:
        """``pressure`` and ``late`` as the expert's; the defaults (compact only when the next
        result would not fit) are the cheapest timing, the audit's; demonstrations may draw
        others (``teacher.pressure_spread``, ``teacher.late_share``). ``noted``: each turn's
        thought first repeats every evidence line its context has shown so far (react's only
        way to keep a fact past the overflow rule's dropping of its oldest steps: the latest
        thought holds them all; the audit's ``noted`` strategy)."""
        super().__init__(
            env, task, arm, budget, tokenizer, pressure=pressure, late=late, keep_code=keep_code
        )
        self.evidence = env.answer_evidence(task)
        self.queried: set[str] = set()
        self.reread = 0  # plan steps read again for evidence without a document
        self.noted: set[str] | None = set() if noted else None

    def __call__(self, session_id: str, prompt: str) -> str:
        turn = self._play(session_id, prompt)
        if self.noted is None or session_id.endswith(("/querier", "/summariser")):
            return turn
        context = f"{self.task.prompt}\n{self.seen}\n{prompt}"
        new = [
            e.text
            for e in self.evidence
            if e.text in prompt
            and e.text not in self.noted
            and (e.selector is None or e.selector in context.replace(e.text, ""))
        ]
        self.noted.update(new)
        kept = [e.text for e in self.evidence if e.text in self.noted]  # every line so far
        return "".join(f"I note: {text}\n" for text in kept) + turn

    def _play(self, session_id: str, prompt: str) -> str:
        if session_id.endswith("/querier"):
            return extract(prompt)
        if session_id.endswith("/summariser"):
            return self._notes(prompt)
        missing = [e for e in self.evidence if e.text not in prompt]
        if not missing:
            self.seen += "\n" + prompt
            args = {"text": answer_text(self.task)}
            return self._turn(self._because(prompt), ANSWER_TOOL, args)
        if FORCED in prompt:
            return self._turn(
                "My context no longer holds what the answer needs.", ANSWER_TOOL, {"text": UNKNOWN}
            )
        # a document it opened counts as read even when a summary replaced it before this turn
        # saw it (the notes list it): the plan goes on instead of opening it again
        for name, args in self.done:
            doc = json.loads(args).get("doc_id") if name == "open" else None
            if doc and not _opened(doc, self.seen):
                self.seen += f"\n[{doc}] (read)\n\n"
        name, _ = _next_needed(self.env, self.task, self.seen + "\n" + prompt, self.done, prompt)
        if name != ANSWER_TOOL:
            return super().__call__(session_id, prompt)
        # the plan is read through and the evidence is not in view: bring it back, and never
        # answer what the context does not show (the expert would: it knows the answer)
        self.seen += "\n" + prompt
        turn = self._recover(prompt, missing[0]) or self._read_again()
        if turn is not None:
            return turn
        return self._turn(
            "My context does not show the answer, and reading again did not bring it back.",
            ANSWER_TOOL,
            {"text": UNKNOWN},
        )

    def _read_again(self) -> str | None:
        """The plan's last environment call once more, for evidence without a document of its
        own (an observation a summary dropped); once per time the plan ends, None after."""
        if self.reread >= 2:
            return None
        self.reread += 1
        plan = self.env.oracle_plan(self.task)
        step = next((s for s in reversed(plan) if s[0] != ANSWER_TOOL), None)
        if step is None:
            return None
        self.done.append((step[0], json.dumps(step[1], sort_keys=True)))
        return self._turn("What the answer needs has left my context; I read it again.", *step)

    def _because(self, prompt: str) -> str:
        """The answer turn's rationale: the sentence in view that states the answer, where the
        environment names one ("In 1954 the register of X recorded the ledger code HH-9279, so I
        can give my answer now."), else the expert's."""
        stated = [e.text for e in self.evidence if e.doc_id is not None]
        if stated:
            return f"{stated[-1].rstrip('.')}, so I can give my answer now."
        return (
            self._answer_rationale(prompt)
            or "The answer is in my context, so I can give my answer now."
        )

    def _recover(self, prompt: str, ev: Evidence) -> str | None:
        """A call that brings back ``ev`` once the plan is read through: the arm's own way
        (:meth:`acmrl.arms.Arm.recover`: acm asks its archive, memory reads its memory), else its
        document again; None when none applies."""
        own = self.arm_def.recover(self, prompt, ev)
        if own is not None:
            return self._turn(*own)
        if ev.doc_id is None:
            return None
        self.read_memory = False
        plan = self.env.oracle_plan(self.task)
        call: tuple[str, dict[str, Any]] = ("open", {"doc_id": ev.doc_id})
        if ev.doc_id not in prompt:  # find it first, by the plan's search for it
            at = next((i for i, s in enumerate(plan) if s == call), None)
            if at is None or at == 0 or plan[at - 1][0] != "search":
                return None
            call = plan[at - 1]
        self.done.append((call[0], json.dumps(call[1], sort_keys=True)))
        return self._turn(f"I need to read {ev.doc_id} again.", *call)

    def _notes(self, prompt: str) -> str:
        """The expert's notes, plus each evidence sentence of these steps whose selector the
        agent has seen outside that sentence (so a summary never keeps a detail for a reason it
        could not yet know)."""
        notes = super()._notes(prompt)
        steps = prompt.split("Steps to summarise:", 1)[-1]
        context = f"{self.task.prompt}\n{self.seen}\n{prompt}"
        extra = []
        for ev in self.evidence:
            if ev.text not in steps or ev.text in notes:
                continue
            if ev.selector is not None and ev.selector not in context.replace(ev.text, ""):
                continue
            extra.append(f"- {ev.text}")
        return "\n".join([*extra, notes]) if extra else notes


# -- trivial strategies (react arm) ----------------------------------------------------------------


def _answer(text: str, why: str) -> str:
    return Demonstrator._turn(why, ANSWER_TOOL, {"text": text or UNKNOWN})


def search_tool(env: Environment) -> tuple[str, str] | None:
    """The environment's search tool and its query argument: a tool named ``search`` or
    ``<prefix>_search`` (as verifiers names a toolset's), taking ``query`` or else its one
    required argument; None when there is none."""
    for tool in env.tools():
        f = tool["function"]
        if f["name"] != "search" and not f["name"].endswith("_search"):
            continue
        params = f.get("parameters") or {}
        required = params.get("required") or []
        if "query" in (params.get("properties") or {}):
            return f["name"], "query"
        if len(required) == 1:
            return f["name"], required[0]
    return None


class Trivial:
    """One trivial strategy on one task: ``first_result`` searches the question and answers
    with the first result's title; ``listed_title`` makes the plan's searches and answers with a
    title a listing shows when one is an accepted answer (an upper bound of answering from
    titles), else the last listing's first; ``frequent`` answers the training split's most
    frequent answer; ``random`` a training answer drawn per task (``answers``: (task id,
    answer) of the training split; the task's own is left out). On code_nav's chain,
    ``first_argument`` and ``random_argument`` read the first definition's call and answer its
    first argument, or one drawn per task, without following it (on the trace preset's
    first_use questions, with the call's own line: no other line is known before ``h``)."""

    def __init__(
        self, name: str, env: Environment, task: Task, answers: list[tuple[str, str]]
    ) -> None:
        self.name, self.env, self.task = name, env, task
        # the training answers of other tasks (an audit of the train split never sees its own)
        self.answers = [a for task_id, a in answers if task_id != task.id]
        # the reading strategies follow a prefix of it (none without a plan: the others only)
        self.plan = env.oracle_plan(task) if env.has_plan(task) is None else []
        self.searches = [a for n, a in self.plan if n == "search"]
        self.turn = 0

    def __call__(self, session_id: str, prompt: str) -> str:
        self.turn += 1
        titles = [m.group(2).strip() for m in _LISTED.finditer(prompt)]
        last = [m.group(2).strip() for m in _LISTED.finditer(prompt.rsplit("Results for", 1)[-1])]
        if self.name == "frequent":
            top = Counter(self.answers).most_common(1)
            return _answer(top[0][0] if top else UNKNOWN, "The most frequent answer.")
        if self.name == "random":
            rng = random.Random(zlib.crc32(self.task.id.encode()))
            return _answer(rng.choice(self.answers) if self.answers else UNKNOWN, "A guess.")
        if self.name == "def_line":
            # code_nav trace: read the call and h, find k (its def line) but do not read it,
            # and answer k's first argument at the most common offset below its def
            plan = self.plan
            finds = [i for i, (n, _) in enumerate(plan) if n == "find_def"]
            reads = plan[: finds[-1] + 1] if finds else []
            if self.turn <= len(reads):
                return Demonstrator._turn("I find the definitions.", *reads[self.turn - 1])
            guess = getattr(self.env, "line_guess", lambda t, c: None)(self.task, prompt)
            return _answer(guess or UNKNOWN, "Its first read is usually just below its def.")
        if self.name in ("first_argument", "random_argument"):
            # code_nav chain and trace: read the first definition's call (the plan up to the
            # find_def after the first read), then answer one of the call's arguments without
            # following it; first_use also asks for a line, and the call's is the one known
            plan = self.plan
            first = next((i for i, (n, _) in enumerate(plan) if n == "read_file"), len(plan))
            after = [i for i, (n, _) in enumerate(plan) if n == "find_def" and i > first]
            reads = plan[: after[0]] if after else []
            if self.turn <= len(reads):
                name, args = reads[self.turn - 1]
                return Demonstrator._turn("I read the call.", name, args)
            shown = [a for a in self.task.metadata.get("arguments", []) if a in prompt]
            if not shown:
                return _answer(UNKNOWN, "The call is not in view.")
            if self.name == "first_argument":
                arg, why = shown[0], "The call's first argument."
            else:
                rng = random.Random(zlib.crc32(self.task.id.encode()))
                arg, why = rng.choice(shown), "One of the call's arguments."
            if self.task.metadata.get("template") == "first_use":
                arg = f"{arg}, line {plan[first][1]['start']}"
            return _answer(arg, why)
        if self.name == "first_result":
            search = search_tool(self.env) if self.turn == 1 else None
            if search is not None:
                tool, arg = search
                return Demonstrator._turn("I search the question.", tool, {arg: self.task.prompt})
            return _answer(titles[0] if titles else UNKNOWN, "The first result's title.")
        if self.name == "listed_title":
            hit = next((t for t in titles if self.env.score(self.task, t) >= 1.0), None)
            if hit is not None:
                return _answer(hit, "A title the listing shows.")
            if self.turn <= len(self.searches):
                return Demonstrator._turn("I search.", "search", self.searches[self.turn - 1])
            return _answer(last[0] if last else UNKNOWN, "The last listing's first title.")
        raise ValueError(
            f"unknown trivial strategy {self.name!r}; known: {', '.join(TRIVIAL_STRATEGIES)}"
        )


def audit_reply(
    env: Environment,
    tokenizer: Any,
    budget: int,
    answers: list[tuple[str, str]],
    keep_code: bool = True,
) -> Callable[[str, str], str]:
    """The reply function of a :class:`~acmrl.engines.scripted.ScriptedEngine` that plays every
    audit episode: an episode id ``<task>#<arm>#ceiling`` is the arm's :class:`CeilingPolicy`,
    ``<task>#react#<trivial>`` a :class:`Trivial` strategy (policy, summariser and querier calls
    alike)."""
    tasks = {t.id: t for split in env.splits for t in env.tasks(split)}
    players: dict[str, Callable[[str, str], str]] = {}

    def reply(session_id: str, prompt: str) -> str:
        eid = session_id.removesuffix("/summariser").removesuffix("/querier")
        if eid not in players:
            task_id, arm, strategy = eid.rsplit("#", 2)
            task = tasks[task_id]
            players[eid] = (
                CeilingPolicy(
                    env,
                    task,
                    arm,
                    budget,
                    tokenizer,
                    noted=strategy == "noted",
                    keep_code=keep_code,
                )
                if strategy in ("ceiling", "noted")
                else Trivial(strategy, env, task, answers)
            )
        return players[eid](session_id, prompt)

    return reply
