"""Expert demonstrations: whole episodes in which the oracle teacher writes every policy turn.

An untrained small student makes no valid tool call (the base model's eval, README), so one
correction per run teaches it one call: the student falls back to plain text right after the edit.
A demonstration gives the supervised warm start the rest of the pipeline needs: the agent loop, the
environment and the context tools run for real, and every policy turn is the teacher's: a
first-person rationale and the call, in the exact rendering the student reads. Each turn is chosen
from what the agent has seen so far, as the oracle's corrections are:

- with context tools (``acm``, ``evolve``), when the input reaches ``pressure`` x budget right
  after a document was read, or whenever the next document would not fit, and nothing was
  compacted since the last environment call, the teacher compacts (``manage_context``, or an
  ``evolve`` that keeps the documents' fact sentences). ``pressure`` may be drawn per task
  from a range (``teacher.pressure_spread``), so the demonstrations compact at different points;
  a share of the tasks (``teacher.late_share``) compacts only when the next result would not
  fit, the latest timing: such a demonstration answers without compacting once nothing more is
  to be read, where the others compact first. GRPO then has two timings to choose between;
- otherwise the next call of the expert's plan that is still needed, using only what the context
  shows now: a document is opened by an id the agent can see (in search results or its notes),
  never one it would have to remember; at the end, ``answer``, once the answer is in view.

``manage_context`` needs a summary: the teacher writes it too, from the steps the summariser is
shown and nothing else (the student, who is its own summariser, learns to write it): the fact
sentences of the documents read there, verbatim; the documents found there that are still to be
read; which documents were read; and the plan's next call where those steps and the task
determine it (``- Next: search for "<town> <year>".``). The turn after a compaction continues
that plan and says so, one rule for every such turn instead of a decision the student would
re-derive from the facts. Nothing of the episode comes from a model. Every policy
step is marked ``teacher``: in the training samples all its tokens, and the notes it wrote as
the summariser, are targets, weighted by the demonstration's outcome (a failed one teaches
nothing by default; :mod:`acmrl.train.samples`).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from typing import Any

from acmrl.arms import get_arm
from acmrl.arms.evolve_edits import TOOL_RESPONSE, kept_lines
from acmrl.config import AgentConfig, SamplingConfig
from acmrl.context.render import format_tool_call
from acmrl.engines.scripted import ScriptedEngine
from acmrl.envs.base import Environment, Task
from acmrl.rollout.agent import Episode
from acmrl.rollout.records import Trajectory
from acmrl.rollout.worker import run_episodes
from acmrl.teacher.oracle import (
    NEXT,
    _describe,
    _next_needed,
    call_value,
    cited_answer,
    followed_plan,
    plan_line,
)

_SIGNAL = re.compile(r"\[context: (\d+) of \d+ tokens\]")
_DOC = re.compile(r"^\[([^\]\s]+)\] ([^\n]+)\n\n(.*)", re.DOTALL)  # an opened document
_RESULT = re.compile(r"^\[([^\]\s]+)\] ([^:\n]+):", re.MULTILINE)  # a search result line
_EVENT = re.compile(r"\b(was held|took place)\b")
_NEXT_STEP = re.compile(r"\n(?:assistant: |user: |call \w+\()")  # items_text's next item


def pressure_for(task_id: str, pressure: float, spread: list[float] | None) -> float:
    """The compaction point of a task's demonstration: ``pressure``, or, with ``spread``
    ``[lo, hi]``, a value drawn uniformly from it, seeded by the task (so reruns agree and each
    task compacts at its own point: GRPO then has timings to choose between).

    >>> pressure_for("t1", 0.75, None)
    0.75
    >>> 0.4 <= pressure_for("t1", 0.75, [0.4, 0.9]) <= 0.9
    True
    """
    if not spread:
        return pressure
    lo, hi = spread
    return lo + (hi - lo) * random.Random(zlib.crc32(task_id.encode())).random()


def is_late(task_id: str, share: float) -> bool:
    """Whether a task's demonstration compacts only when the next result would not fit (never
    by pressure alone): drawn with probability ``share``, seeded by the task, independently of
    :func:`pressure_for`'s draw.

    >>> is_late("t1", 0.0), is_late("t1", 1.0)
    (False, True)
    >>> sum(is_late(f"t{i}", 0.3) for i in range(1000))  # about the share
    328
    """
    if share <= 0:
        return False
    return random.Random(zlib.crc32(f"{task_id}#late".encode())).random() < share


class Demonstrator:
    """The oracle's reply function for one demonstration episode (policy and summariser)."""

    def __init__(
        self,
        env: Environment,
        task: Task,
        arm: str,
        budget: int,
        tokenizer: Any,
        pressure: float,
        answers: str = "plain",
        late: bool = False,
        keep_code: bool = True,
    ) -> None:
        self.env, self.task, self.arm, self.budget = env, task, arm, budget
        # agent.evolve_keep_code: whether an evolve program's text stays in later inputs
        self.keep_code = keep_code
        self.arm_def = get_arm(arm)  # what the arm's teacher does (acmrl.arms)
        self.answers = answers  # teacher.answers
        self.tok, self.pressure = tokenizer, pressure
        self.late = late  # compact only when the next result would not fit
        self.seen = task.prompt  # everything read so far (kept across compactions)
        self.done: list[tuple[str, str]] = []
        self.opened: set[str] = set()  # documents read, whether still in context or not
        self.compacted = False  # a compaction since the last environment call
        self.read_memory = False  # memory arm: the memory was read since the last env call

    def __call__(self, session_id: str, prompt: str) -> str:
        if session_id.endswith("/summariser"):
            return self._notes(prompt)
        if session_id.endswith("/querier"):
            return "No archived facts were needed."
        self.seen += "\n" + prompt
        n = self.size(prompt)
        name, args = _next_needed(self.env, self.task, self.seen, self.done, visible=prompt)
        # compact once the pressure is reached right after reading a document (its facts are
        # what a summary keeps), or whenever the next document would not fit (a late task: only
        # then, so it answers without compacting once nothing more is to be read)
        just_read = bool(self.done) and self.done[-1][0] in self.env.read_tools and not self.late
        if (
            self.arm_def.compacts
            and not self.compacted
            and self.done
            and (
                (just_read and n >= self.pressure * self.budget)
                or self._would_overflow(prompt, name, args)
            )
        ):
            self.compacted = True
            # short, so that the student's compaction turn fits its completion cap; what to
            # keep is the summary's job (or the evolve code's)
            call, call_args = self.arm_def.compaction(
                self.task,
                self.env.oracle_plan(self.task),
                prompt,
                repeats=len(set(self.done)) < len(self.done),
                keep=kept_lines(self.env, self.task, TOOL_RESPONSE.findall(prompt)),
            )
            return self.compaction_turn(n, call, call_args)
        detour = self.arm_def.demo_detour(self, prompt, name, args)
        if detour is not None:
            return self._turn(*detour)
        gold = self.task.metadata.get("gold_docs") or []
        if name == "answer" and gold and not self.in_view(args, prompt):
            # the answer must come from what the context shows: read its document again (an
            # environment without documents has no such step: its plan's reads are done)
            name, args = (
                ("open", {"doc_id": gold[-1]}) if gold[-1] in prompt else self._search_last()
            )
        self.done.append((name, json.dumps(args, sort_keys=True)))
        why = self._answer_rationale(prompt) if name == "answer" else None
        if self.compacted and self.arm_def.resumes_from_summary and why is None:
            # one rule for every turn right after a compaction: continue the summary's plan
            why = followed_plan(prompt, name, args)
        self.compacted = self.read_memory = False
        return self._turn(why or _describe(name, args, self.task), name, args)

    def size(self, prompt: str) -> int:
        """The context size the agent sees: the harness's signal when it shows one, else the
        size of the input itself."""
        signals = _SIGNAL.findall(prompt)
        return (
            int(signals[-1]) if signals else len(self.tok.encode(prompt, add_special_tokens=False))
        )

    @staticmethod
    def in_view(args: dict[str, Any], prompt: str) -> bool:
        """Whether the answer is in the context: its text, or each part of a listed answer."""
        text = str(args.get("text", ""))
        return text in prompt or all(p.strip() in prompt for p in text.split(","))

    def _answer_rationale(self, prompt: str) -> str | None:
        """The answer turn's rationale by ``teacher.answers``: ``cited``, the sentence of a
        document in view that states the answer, with its id (:func:`cited_answer`);
        ``reasoned``, the fact the answer rests on and what it looks for, both in view (the key
        fact's year, then the event of that year), never the answer; None for ``plain`` or
        when what it needs is not in view."""
        if self.answers == "cited":
            return cited_answer(self.task, prompt)
        meta = self.task.metadata
        key, entities = meta.get("key_fact"), meta.get("entities", [])
        year = re.search(r"\b\d{4}\b", key or "")
        if not (self.answers == "reasoned" and key and year and entities and key in prompt):
            return None
        return f"{key} So I need the event held in {entities[-1]} in {year.group(0)}."

    def _would_overflow(self, prompt: str, name: str, args: dict[str, Any]) -> bool:
        """Whether the next call's result (a document, or search results) would push the input
        past the budget (the oracle knows how long it is): the input now, the turn that makes
        the call and its result, with a margin for the result's wrapping, and room for the
        arm's compaction turn after it unless it is the plan's last call
        (:meth:`~acmrl.arms.Arm.compaction_reserve`). Then it compacts first, whatever its
        pressure."""
        if name == "answer":
            return False
        text = str(self.env.session(self.task).call(name, args))
        turn = self._turn(_describe(name, args, self.task), name, args)
        n = sum(len(self.tok.encode(t, add_special_tokens=False)) for t in (prompt, turn, text))
        if self.arm_def.compacts:
            calls = [step for step in self.env.oracle_plan(self.task) if step[0] != "answer"]
            if calls and (name, args) != calls[-1]:
                n += self.arm_def.compaction_reserve(self, prompt)
        return n + 48 > self.budget

    def _search_last(self) -> tuple[str, dict[str, Any]]:
        plan = self.env.oracle_plan(self.task)
        return next(step for step in reversed(plan) if step[0] == "search")

    def compaction_turn(self, size: int, name: str, args: dict[str, Any]) -> str:
        """The teacher's compaction turn at a context of ``size`` tokens: why, then the call."""
        why = f"My context is at {size} of {self.budget} tokens"
        return self._turn(f"{why}, {self.arm_def.demo_compaction_says}", name, args)

    @staticmethod
    def _turn(rationale: str, name: str, args: dict[str, Any]) -> str:
        return f"{rationale}\n{format_tool_call(name, args)}"

    def _keep(self, title: str, sentence: str) -> bool:
        """Whether a sentence of the document ``title`` is a fact the question needs: the first
        entity's birth year, the link to another entity of the chain, or an event of the last
        one."""
        chain = self.task.metadata.get("entities", [])
        if chain and title == chain[0] and " born " in sentence:
            return True
        if any(e in sentence for e in chain if e != title):
            return True
        return bool(chain) and title == chain[-1] and _EVENT.search(sentence) is not None

    def _notes(self, prompt: str) -> str:
        """The summary of the steps the summariser is shown, from those steps alone (so the
        student, its own summariser, can learn to write it): the sentences of the documents read
        there that the question needs, verbatim; the documents found there that are still to be
        read; and which documents were read."""
        steps = prompt.split("Steps to summarise:", 1)[-1].split("\n\nWrite ", 1)[0]
        gold = self.task.metadata.get("gold_docs", [])
        facts: list[str] = []
        found: dict[str, str] = {}
        read: list[str] = []
        # a result runs to the next step of the transcript: the agent's next turn and call are
        # not part of the document (their sentences name the chain's entities too)
        chunks = [
            _SIGNAL.sub("", _NEXT_STEP.split(c, 1)[0]).strip()
            for c in steps.split("\nresult: ")[1:]
        ]
        for chunk in chunks:
            kept = self.env.notes_of(self.task, chunk)
            if kept is not None:  # the environment says what of this result matters
                facts += [line for line in kept if line not in facts]
                continue
            doc = _DOC.match(chunk)
            if doc and not chunk.startswith("Results for"):
                read.append(doc.group(1))
                self.opened.add(doc.group(1))
                for sentence in re.split(r"(?<=\.)\s+", doc.group(3)):
                    sentence = sentence.strip()
                    if self._keep(doc.group(2).strip(), sentence) and sentence not in facts:
                        facts.append(sentence)
            else:
                found |= {m.group(1): m.group(2) for m in _RESULT.finditer(chunk)}
        if not read and not found and not facts:  # a format the parser does not know
            facts = [
                f[0].upper() + f[1:]
                for f in self.task.metadata.get("facts", [])
                if f.split(" is ")[-1].rstrip(".") in steps
            ]
        if "Memory so far:" in prompt:  # the memory arm's reflection: merge into the memory
            prior = prompt.split("Memory so far:\n", 1)[1].split("\n\nSteps to summarise:")[0]
            kept: list[str] = []
            for line in prior.splitlines():
                line = line.removeprefix("- ").strip()
                if line.startswith("To read next: "):
                    doc_id, _, title = line[14:].partition(" (")
                    found.setdefault(doc_id, title.rstrip(").").strip())
                elif line.startswith("Documents read: "):
                    read = [*line[16:].rstrip(".").split(", "), *read]
                elif (
                    line
                    and line not in facts
                    and not line.startswith(("Nothing", "(empty", NEXT.removeprefix("- ")))
                ):
                    kept.append(line)
            facts = [*kept, *facts]
        lines = [f"- {f}" for f in facts]
        plan = [
            f"- To read next: {doc_id} ({title})."
            for doc_id, title in found.items()
            if doc_id in gold and doc_id not in self.opened
        ]
        if read:
            plan.append(f"- Documents read: {', '.join(dict.fromkeys(read))}.")
        plan += self._next_line(prompt)
        if "Knowledge state:" in prompt:  # agent.summary_format=structured: the two sections
            known = "\n".join(lines) or "- Nothing needed has been found yet."
            thoughts = "\n".join(plan) or "- I keep searching for what the task needs."
            return f"Knowledge state:\n{known}\nThoughts:\n{thoughts}"
        return "\n".join(lines + plan) or "- Nothing needed has been found yet."

    def _next_line(self, shown: str) -> list[str]:
        """The plan's next call, when what the summariser was shown determines it (a query
        made of names and years in the steps or the task, an id found there, an answer read
        there): the summary keeps the latest plan, so the turn after a compaction continues it
        instead of guessing from the facts alone."""
        name, args = _next_needed(self.env, self.task, self.seen, self.done)
        value = call_value(args)
        if name == "search":
            parts = re.findall(r"\b\d{4}\b|[A-Z][\w'-]*(?: [A-Z][\w'-]*)*", value)
            if not (parts and all(p in shown for p in parts)):
                return []
        elif value not in shown:
            return []
        line = plan_line(name, args)
        return [f"{NEXT}{line}"] if line else []


def demonstrate(
    env: Environment,
    tasks: list[Task],
    arms: list[str],
    tokenizer: Any,
    *,
    agent: AgentConfig,
    sampling: SamplingConfig,
    pressure: float = 0.6,
    pressure_spread: list[float] | None = None,
    answers: str = "plain",
    late_share: float = 0.0,
    concurrency: int = 16,
    policy: str = "expert",
) -> list[Trajectory]:
    """One demonstration per task and arm, run through the real agent loop; all policy turns are
    marked as the teacher's. ``policy``: ``expert`` (:class:`Demonstrator`) or ``best`` (each
    arm's :class:`~acmrl.teacher.ceiling.CeilingPolicy`)."""
    episodes = [
        Episode(f"{task.id}#{arm}#demo", env, task, arm, tokenizer, agent=agent, sampling=sampling)
        for task in tasks
        for arm in arms
    ]
    if not episodes:
        return []
    engine = oracle_engine(
        env,
        tokenizer,
        episodes[0].budget,
        pressure,
        pressure_spread,
        answers,
        late_share,
        policy,
        keep_code=agent.evolve_keep_code,
    )
    run_episodes(episodes, engine, concurrency=concurrency)
    out = []
    for ep in episodes:
        for step in ep.traj.steps:
            if step.call is not None and step.call.role == "policy":
                step.call.role, step.origin = "teacher", "teacher"
                step.call.logprobs = []
        ep.traj.edit = {
            "source": "",
            "step": 0,
            "kind": "demonstration",
            "action": None,
            "rationale": "",
            "teacher": "oracle",
        }
        out.append(ep.traj)
    return out


def oracle_engine(
    env: Environment,
    tokenizer: Any,
    budget: int,
    pressure: float = 0.75,
    pressure_spread: list[float] | None = None,
    answers: str = "plain",
    late_share: float = 0.0,
    policy: str = "expert",
    keep_code: bool = True,
) -> Any:
    """The oracle's expert plan as an engine: any episode whose id is ``<task>#<arm>#<n>`` is
    played by a :class:`Demonstrator` of that task and arm (policy, summariser and querier
    calls alike; compacting at :func:`pressure_for` of the task, or only when forced where
    :func:`is_late`), so every arm runs the same
    policy; with ``policy="best"`` by the arm's own best scripted policy
    (:class:`~acmrl.teacher.ceiling.CeilingPolicy`, with the same compaction points). :func:`demonstrate` runs on it, and ``acmrl eval engine.kind=oracle``: Table 2 with
    the policy held fixed, what each arm's context handling alone gives."""
    tasks = {t.id: t for split in env.splits for t in env.tasks(split)}
    demos: dict[str, Demonstrator] = {}

    def reply(session_id: str, prompt: str) -> str:
        eid = session_id.removesuffix("/summariser").removesuffix("/querier")
        task_id, arm, _ = eid.rsplit("#", 2)
        if eid not in demos:
            at = pressure_for(task_id, pressure, pressure_spread)
            late = is_late(task_id, late_share)
            if policy == "best":
                from acmrl.teacher.ceiling import CeilingPolicy  # it builds on Demonstrator

                demos[eid] = CeilingPolicy(
                    env,
                    tasks[task_id],
                    arm,
                    budget,
                    tokenizer,
                    pressure=at,
                    late=late,
                    noted=get_arm(arm).best_noted,
                    keep_code=keep_code,
                )
            else:
                demos[eid] = Demonstrator(
                    env, tasks[task_id], arm, budget, tokenizer, at, answers, late, keep_code
                )
        return demos[eid](session_id, prompt)

    return ScriptedEngine(tokenizer, reply, truncate=False)
