"""The oracle teacher: places edits from the environment's ground truth.

It knows the expert's plan (``env.oracle_plan``), which documents each hop needs
(``metadata["gold_docs"]``) and the budget, and it reads what the student has seen so far. It
writes rationales only from that seen material, so they pass the validators of
:mod:`acmrl.teacher.assessment` on their own merit.

- **Injection** (arms with context tools): at the first policy step whose input reaches
  ``pressure`` x budget with nothing compacted since, the student should have compacted:
  ``manage_context`` (acm) or an ``evolve`` that cuts the documents already read down to their
  fact sentences (evolve). A react run that switches to acm is measured in acm's context (its
  longer system prompt and tools, counted with the student's tokenizer), so the edit lands
  where the replayed turns still fit; a run that overflowed gets the edit at its last step
  that fits. A step that gives the final answer gets none: nothing more is to be read, so a
  compaction there would only cost (compacting late is the cheaper timing GRPO can learn).
- **Correction**: the first unproductive step: an answer before the evidence was read, an
  answer that does not follow from the evidence in view, a call that repeats an earlier one (a
  second compaction is not a repeat), a call that failed, or a turn without a call; it is
  replaced by the next call the plan still needs given what has been seen, opening only
  documents whose id the context still shows. An ``evolve`` program that was refused, or
  that dropped a string the plan still needs and the teacher's own program keeps (given the
  student's State, ``state_at``), is replaced by the teacher's program at that step.
- **no_action** otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from acmrl.arms import arm_tools, get_arm
from acmrl.arms.evolve_edits import (
    dropped,
    gives_away,
    kept_lines,
    needed_terms,
    still_needed,
)
from acmrl.envs.base import ANSWER_TOOL, Environment, Task
from acmrl.rollout.records import Trajectory
from acmrl.teacher.assessment import Assessment, seen_text

# evolve: keep, in every tool output so far, only the sentences that state a relation or a year
# (and result lines, which start with an id); everything else of a document already read is filler


COMPACTING = ("manage_context", "evolve")


def _compacted(step: Any) -> bool:
    return any(a["name"] in COMPACTING for a in step.actions)


def _policy_steps(traj: Trajectory) -> list[Any]:
    return [s for s in traj.steps if s.call is not None and s.call.role == "policy"]


def _opened(doc_id: str, seen: str) -> bool:
    """Whether the full document was shown (an ``open`` result starts "[id] title" + blank line)."""
    return re.search(rf"\[{re.escape(doc_id)}\] [^\n]*\n\n", seen) is not None


def _next_needed(
    env: Environment,
    task: Task,
    seen: str,
    done: list[tuple[str, str]],
    visible: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The next call of the expert's plan the student still needs, given what it has seen.

    ``visible`` is what its context shows now (``seen`` minus what was compacted away): a
    document is opened by an id the student can see, else it is searched for again. Never an id
    it would have to remember from a context it no longer has.
    """
    plan = env.oracle_plan(task)
    visible = seen if visible is None else visible
    for i, (name, args) in enumerate(plan):
        if name == "open":
            if _opened(args["doc_id"], seen):
                continue
            if args["doc_id"] in visible or i == 0 or plan[i - 1][0] != "search":
                return name, args  # the id is in search results or notes: read it
            return plan[i - 1]  # find it first
        if name == "answer":
            return name, args
        if name != "search" and (name, json.dumps(args, sort_keys=True)) not in done:
            return name, args
    return plan[-1]


ANSWER_NOW = "so I can give my answer now."


def cited_answer(task: Task, visible: str) -> str | None:
    r"""The answer turn's rationale that cites its evidence (``teacher.answers: cited``): the
    sentence of a document in view that states the answer where the question asks for it
    (kb_search: "The X took place in <town> in <year>."), with that document's id. None when
    no document in view says so (the answer comes from a summary, or the task has no such
    sentence): the plain or plan-following rationale is used then.

    >>> from acmrl.envs.base import Task
    >>> t = Task("t", "?", "Velvet Kite Market", {"key_fact": "Ana was born in 1962.",
    ...          "entities": ["Ana", "Winrurhaven"]})
    >>> doc = "[kb-00071] Velvet Kite Market\n\nThe Velvet Kite Market took place in Winrurhaven"
    >>> print(cited_answer(t, doc + " in 1962. It was organised by Kite Works."))
    kb-00071 says the Velvet Kite Market took place in Winrurhaven in 1962, so I can give my answer now.
    >>> cited_answer(t, "[kb-00012] Ana\n\nAna was born in 1962.") is None
    True
    """
    meta = task.metadata
    year = re.search(r"\b\d{4}\b", meta.get("key_fact") or "")
    entities = meta.get("entities") or []
    if not (isinstance(task.answer, str) and year and entities):
        return None
    cited = None
    for m in re.finditer(r"[^.\n]*" + re.escape(task.answer) + r"[^.\n]*\.", visible):
        sentence = m.group(0).strip()
        if year.group(0) not in sentence or entities[-1] not in sentence:
            continue
        heads = list(re.finditer(r"^\[([^\]\s]+)\] [^\n]*\n\n", visible[: m.start()], re.M))
        if heads:  # the last document opened before the sentence is the one that says it
            cited = (heads[-1].group(1), sentence)
    if cited is None:
        return None
    doc, sentence = cited
    if sentence.startswith("The "):
        sentence = "the " + sentence[4:]
    return f"{doc} says {sentence.rstrip('.')}, {ANSWER_NOW}"


def _describe(
    name: str, args: dict[str, Any], task: Task | None = None, cited: str | None = None
) -> str:
    """The rationale of the plan's next call; ``cited`` (an answer's :func:`cited_answer`)
    replaces the plain answer rationale when given."""
    lookup = _lookup_rationale(task, args) if task is not None and name == "search" else None
    if lookup:
        return lookup
    if name == "answer" and cited:
        return cited
    if name == "search":
        return f"I need to find out more about {args['query']}, so I will search for it."
    if name == "open":
        return f"{args['doc_id']} is the document I need next; I should read it before I go on."
    if name == "answer":
        return f"I have read everything the question depends on, {ANSWER_NOW}"
    if name == "find_def":
        return f"I need to see where {args['name']} is defined."
    if name == "read_file" and "start" in args:
        return f"I read {args['path']} from line {args['start']}."
    return f"The next thing I need is to call {name} with {json.dumps(args)}."


NEXT = "- Next: "  # how a summary's plan line starts


def call_value(args: dict[str, Any]) -> str:
    """The one argument a plan line names (a query, a document id, an answer)."""
    return str(next(iter(args.values()), ""))


def plan_line(name: str, args: dict[str, Any]) -> str | None:
    """How a summary's plan names a call (after :data:`NEXT`), None for a call it does not.

    >>> plan_line("search", {"query": "Port Beagea 1967"})
    'search for "Port Beagea 1967".'
    """
    value = call_value(args)
    forms = {
        "search": f'search for "{value}".',
        "open": f"open {value}.",
        "answer": f'answer "{value}".',
        "find_def": f"find where {value} is defined.",
    }
    if name == "read_file" and "start" in args:
        return f"read {value} from line {args['start']}."
    return forms.get(name)


def followed_plan(visible: str, name: str, args: dict[str, Any]) -> str | None:
    """The rationale of a call that the plan of the last summary in view names: one rule for the
    turn after a compaction, so the student continues its plan instead of re-deriving it."""
    plans = re.findall(rf"^{re.escape(NEXT)}([^\n<]+)", visible, re.MULTILINE)
    line = plan_line(name, args)
    if not plans or line is None or plans[-1] != line:
        return None
    return f"My summary says what I do next: {line}"


def _lookup_rationale(task: Task, args: dict[str, Any]) -> str | None:
    """For a search that looks the answer up by the key fact (kb_search: the last town and the
    birth year), the fact and what is looked for, said before the query that combines them."""
    key, entities = task.metadata.get("key_fact"), task.metadata.get("entities", [])
    year = re.search(r"\b\d{4}\b", key or "")
    query = str(args.get("query", ""))
    if not (key and year and entities and year.group(0) in query and entities[-1] in query):
        return None
    return f"{key} I will search for the event of {entities[-1]} in {year.group(0)}."


def _facts_seen(task: Task, seen: str) -> list[str]:
    """Up to two of the task's hop facts whose object the agent has already read."""
    facts = [f for f in task.metadata.get("facts", []) if f.split(" is ")[-1].rstrip(".") in seen]
    return [f[0].upper() + f[1:] for f in facts[:2]]


class OracleTeacher:
    name = "oracle"

    def __init__(
        self,
        env: Environment,
        *,
        pressure: float = 0.6,
        tokenizer: Any = None,
        switch_arms: bool = False,
        answers: str = "plain",
    ) -> None:
        self.env = env
        self.answers = answers  # teacher.answers: "cited" cites the evidence of an answer
        self.pressure = pressure
        self.switch_arms = switch_arms  # react runs get manage_context and go on as acm
        self.tokenizer = tokenizer  # decodes a step's prompt: what the student could see then

    def assess(
        self,
        task: Task,
        traj: Trajectory,
        budget: int,
        state_at: Callable[[int], list[dict[str, Any]]] | None = None,
    ) -> Assessment:
        """The edit for ``traj``; ``state_at(step)``: the student's State at a policy step,
        on which its evolve programs are rerun to see what they dropped (None: only a
        refused program is corrected)."""
        steps = _policy_steps(traj)
        injection = self._injection(task, traj, steps, budget)
        if injection is not None:
            return injection
        correction = self._correction(task, traj, steps, state_at)
        return correction or Assessment("no_action", teacher=self.name)

    def _injection(
        self, task: Task, traj: Trajectory, steps: list[Any], budget: int
    ) -> Assessment | None:
        switch = traj.arm == "react" and self.switch_arms
        if not get_arm(traj.arm).compacts and not switch:
            return None
        # a switched run replays the student's turns in the acm arm, whose system prompt and
        # tools are longer: its inputs are that much larger, and the edit must land where that
        # replay still fits, or the resumed run overflows before the edit is made
        extra = self._arm_overhead(task, "react", "acm", budget) if switch else 0
        compacted_at, fits = -1, None
        for i, s in enumerate(steps):
            n = len(s.call.prompt_ids) + extra
            if n > budget:
                break  # this input would not fit in the arm the run resumes in
            if _compacted(s):
                compacted_at = i
                continue
            if compacted_at >= i - 1 or i < 1:
                continue
            if any(a["name"] == ANSWER_TOOL for a in s.actions):
                return None  # the final answer: nothing more to read, no room to make
            fits = (i, n)
            if n >= self.pressure * budget and i >= 2:
                break
        else:
            if traj.status != "overflow":
                return None  # it never needed more room than it had
        if fits is None:
            return None
        i, n = fits
        action, how = self._compaction(task, traj, steps, i)
        why = f"My context is at {n} of {budget} tokens and I have more to read{self._keep(task, traj, i)}"
        a = Assessment("injection", i, action, f"{why} {how}", self.name)
        a.arm = "acm" if switch else None
        return a

    def _keep(self, task: Task, traj: Trajectory, i: int) -> str:
        """The rationale's list of what the compaction must keep; none before an evolve
        program, whose code names what it keeps: listing it again would lengthen a turn that
        the student must be able to write within its token limit (the programs are about 400
        to 540 tokens already)."""
        if traj.arm == "evolve":
            return "."
        facts = _facts_seen(task, seen_text(traj, i))
        said = " ".join(f.rstrip(".") + "." for f in facts)
        return f", and I must keep what I still need: {said}" if facts else "."

    def _compaction(
        self, task: Task, traj: Trajectory, steps: list[Any], i: int
    ) -> tuple[dict[str, Any], str]:
        """The compaction the student should make at step ``i`` and the sentence that says so:
        its arm's compaction call (:meth:`acmrl.arms.Arm.compaction`: ``manage_context`` for
        acm, and for react switching to acm; for evolve a program that cuts what was read down
        to the facts the plan still needs)."""
        arm = get_arm("acm" if traj.arm == "react" else traj.arm)
        before = [
            (a["name"], json.dumps(a["arguments"], sort_keys=True))
            for t in steps[:i]
            for a in t.actions
        ]
        name, args = arm.compaction(
            task,
            self.env.oracle_plan(task),
            seen_text(traj, i),
            repeats=len(set(before)) < len(before),
            keep=kept_lines(self.env, task, [o for t in steps[:i] for o in t.observations]),
        )
        return {"name": name, "arguments": args}, arm.injection_says

    def _arm_overhead(self, task: Task, arm: str, other: str, budget: int) -> int:
        """How many tokens more ``other``'s first input holds than ``arm``'s on ``task`` (its
        system prompt and tools), as the student's tokenizer counts them; 0 without one."""
        if self.tokenizer is None:
            return 0
        from acmrl.context.render import Renderer
        from acmrl.context.state import user

        tools = self.env.session(task).tools

        def first(a: str) -> int:
            system = get_arm(a).system_prompt(budget)
            return len(
                Renderer(self.tokenizer, system, arm_tools(tools, a)).ids([user(task.prompt)])
            )

        return max(0, first(other) - first(arm))

    def _correction(
        self,
        task: Task,
        traj: Trajectory,
        steps: list[Any],
        state_at: Callable[[int], list[dict[str, Any]]] | None = None,
    ) -> Assessment | None:
        gold = task.metadata.get("gold_docs", [])
        done: list[tuple[str, str]] = []
        for i, s in enumerate(steps):
            if self._bad_program(task, traj, steps, i, state_at):
                # the teacher's turn replaces the student's: its context shows no program yet,
                # so the rationale looks ahead, as an injection's does
                action, how = self._compaction(task, traj, steps, i)
                why = f"Before I read on I will make room{self._keep(task, traj, i)}"
                return Assessment("correction", i, action, f"{why} {how}", self.name)
            seen = seen_text(traj, i)
            calls = [(a["name"], json.dumps(a["arguments"], sort_keys=True)) for a in s.actions]
            answering = any(name == "answer" for name, _ in calls) or not s.actions
            unread = [d for d in gold if not _opened(d, seen)]
            why = None
            if answering and unread:
                why = (
                    "I have not read the documents the question depends on yet, so I cannot answer."
                )
            elif answering and self._wrong_answer(task, s, self._visible(s, seen)):
                # the evidence is in view and the answer does not follow from it
                why = "My answer does not match what I have read."
            elif any(c in done for c in calls if c[0] not in COMPACTING):
                # a second manage_context or evolve is a new compaction, not a repeated lookup
                why = "I already made this call and saw its result; repeating it gains nothing."
            elif s.errors or any(o.startswith("Error") for o in s.observations):
                why = "My last call did not work as written."
            if why is not None:
                visible = self._visible(s, seen)
                name, args = _next_needed(self.env, task, seen, done, visible)
                after = i > 0 and any(a["name"] == "manage_context" for a in steps[i - 1].actions)
                plan = followed_plan(visible, name, args) if after else None
                cited = (
                    cited_answer(task, visible)
                    if name == "answer" and self.answers == "cited"
                    else None
                )
                rationale = f"{why} {plan or _describe(name, args, task, cited)}"
                return Assessment(
                    "correction", i, {"name": name, "arguments": args}, rationale, self.name
                )
            done += calls
        return None

    def _bad_program(
        self,
        task: Task,
        traj: Trajectory,
        steps: list[Any],
        i: int,
        state_at: Callable[[int], list[dict[str, Any]]] | None,
    ) -> bool:
        """Whether step ``i``'s evolve program needs rewriting: it was refused, or (given
        ``state_at``) rerun on the student's State it drops a string the plan still needs (an
        id to open, a name or year the chain rests on; never the answer) that the teacher's
        program at that step keeps. The items each program returned are compared, without its
        own call (whose code names what it means to keep) and receipt."""
        events = [e for e in steps[i].events if e.kind == "evolve"]
        if not events:
            return False
        if any(not e.applied for e in events):
            return True
        code = next(
            (a["arguments"].get("code") for a in steps[i].actions if a["name"] == "evolve"), None
        )
        if state_at is None or not isinstance(code, str):
            return False
        from acmrl.context.evolve import apply_evolve, evolve_call

        try:
            state = state_at(i)
        except ValueError:  # the replay could not reach the step: no rerun, no verdict
            return False
        plan = self.env.oracle_plan(task)
        teacher = self._compaction(task, traj, steps, i)[0]["arguments"]["code"]
        own, kept = (apply_evolve([*state, evolve_call("check", c)]) for c in (code, teacher))
        if not (own.applied and kept.applied):
            return False
        terms = [
            t
            for t in {*needed_terms(task, plan), *still_needed(task, plan)}
            if not gives_away(t, task)
        ]
        spared = set(dropped(state, kept.state[:-2], terms))
        return any(t not in spared for t in dropped(state, own.state[:-2], terms))

    def _visible(self, step: Any, seen: str) -> str:
        """What the student's context showed at ``step`` (its decoded prompt), else ``seen``."""
        return self.tokenizer.decode(step.call.prompt_ids) if self.tokenizer else seen

    def _wrong_answer(self, task: Task, step: Any, visible: str) -> bool:
        """An answer call (or plain reply) that scores below 1 while the reference is in view."""
        texts = [a["arguments"].get("text", "") for a in step.actions if a["name"] == "answer"]
        if not step.actions:
            texts = [step.text]
        ref = task.answer if isinstance(task.answer, str) else None
        return (
            ref is not None
            and ref in visible
            and any(self.env.score(task, str(t)) < 1.0 for t in texts)
        )
