"""The environment protocol: tasks, per-episode tool sessions, scoring and the expert's plan.

An environment owns tasks and tools, never a model. The rollout loop asks it for ``tasks(split)``,
opens a :class:`Session` per episode, forwards each parsed tool call to ``session.call`` and puts the
returned observation into the State. Every problem with a call (unknown tool, bad arguments, missing
document, path outside the root) comes back as an observation that starts with ``Error:`` and names
the problem, so the agent can react and nothing crashes. ``oracle_plan(task)`` lists the calls an
expert would make; the oracle teacher and the tests replay it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from acmrl.context.render import check_arguments, tool_schema
from acmrl.envs.scoring import METRICS, Judge, score_answer

Plan = list[tuple[str, dict[str, Any]]]
"""The expert's calls, in order: ``[(tool name, arguments), ...]``; the last is ``answer``."""

ANSWER_TOOL = "answer"
ANSWER_SCHEMA = tool_schema(
    ANSWER_TOOL,
    "Submit the final answer to the task. Give only the answer, as short as possible; this ends the task.",
    {"text": {"type": "string", "description": "The final answer."}},
)


class EnvError(ValueError):
    """Bad environment options or input files; the message names the option or file and the fix."""


class ToolError(Exception):
    """Raised by a tool handler; its message becomes the ``Error:`` observation."""


@dataclass(frozen=True)
class Task:
    """One task. ``answer`` is a string or a list of accepted alternatives; when
    ``metadata["answer_set"]`` is true the list is a set of items that must all be given.
    ``metadata["aliases"]`` may map an answer (or a set item) to its other accepted forms."""

    id: str
    prompt: str
    answer: str | list[str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Handler = Callable[..., str]


@dataclass(frozen=True)
class Evidence:
    """A sentence a policy must see in its context to give the answer from what it sees
    (:meth:`Environment.answer_evidence`): scripted policies answer only then, so a ceiling
    never rests on knowing the answer. ``doc_id`` is where it is read (None: anywhere);
    ``selector`` is what makes it relevant, read elsewhere (a sentence whose selector the agent
    has not yet seen cannot be known to matter); ``query`` is how an agent would ask its
    archive for it."""

    text: str
    doc_id: str | None = None
    selector: str | None = None
    query: str | None = None


class Session:
    """One episode's tools. ``call`` never raises for bad input: it returns an ``Error:`` observation."""

    def __init__(
        self,
        task: Task,
        tools: list[dict[str, Any]],
        handlers: dict[str, Handler],
        scorer: Callable[[str | None], float],
    ) -> None:
        self.task = task
        self.tools = [*tools, ANSWER_SCHEMA]
        self._handlers = handlers
        self._params = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}
        self._scorer = scorer
        self.answer: str | None = None
        self.calls = 0

    @property
    def done(self) -> bool:
        return self.answer is not None

    def call(self, name: str, arguments: dict[str, Any] | str) -> str | list:
        """Run one tool call; the observation the agent sees."""
        self.calls += 1
        if name not in self._params:
            return f"Error: unknown tool {name!r}; available tools: {', '.join(self._params)}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                return f"Error: the arguments of {name} are not valid JSON ({exc.msg})"
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name} must be a JSON object"
        problem = check_arguments(name, arguments, self._params[name])
        if problem is not None:
            return f"Error: {problem[1]}"
        if self.done:
            return "Error: the answer was already submitted; the task is over"
        if name == ANSWER_TOOL:
            self.answer = arguments["text"].strip()
            return "Answer submitted."
        try:
            return self._handlers[name](**arguments)
        except ToolError as exc:
            return f"Error: {exc}"

    def score(self, answer: str | None = None) -> float:
        """Score ``answer``, or the submitted answer when none is given (0.0 if there is none)."""
        return self._scorer(self.answer if answer is None else answer)


class Environment:
    """Base of the built-in environments. Subclasses fill ``_tasks`` and implement ``_handlers``."""

    name = "environment"
    max_context_tokens: int | None = None

    def __init__(self, *, metric: str = "em", judge: Judge | None = None) -> None:
        if metric not in (*METRICS, "judge"):
            raise EnvError(
                f"metric={metric!r} is not known; choose one of {', '.join(METRICS)}, judge"
            )
        if metric == "judge" and judge is None:
            raise EnvError(
                f"{self.name}: metric=judge scores with an LLM judge, and none is configured: "
                "set env.judge.model (a local model, or one served at env.judge.base_urls), or "
                f"choose an exact metric ({', '.join(METRICS)})"
            )
        self.metric = metric
        self.judge = judge
        self._tasks: dict[str, list[Task]] = {}

    @property
    def splits(self) -> list[str]:
        return list(self._tasks)

    def tasks(self, split: str = "train") -> list[Task]:
        if split not in self._tasks:
            raise EnvError(f"{self.name} has no split {split!r}; splits: {', '.join(self._tasks)}")
        return list(self._tasks[split])

    def tools(self) -> list[dict[str, Any]]:
        """The environment's tool schemas (the session adds ``answer``)."""
        raise NotImplementedError

    def _handlers(self, task: Task) -> dict[str, Handler]:
        raise NotImplementedError

    def session(self, task: Task) -> Session:
        return Session(task, self.tools(), self._handlers(task), lambda a: self.score(task, a))

    def oracle_plan(self, task: Task) -> Plan:
        raise NotImplementedError

    def has_plan(self, *tasks: Task) -> str | None:
        """None when the environment has an expert plan for every one of ``tasks``; else why
        not (what ``oracle_plan`` raised, and for which task), for the stages that need one."""
        for task in tasks:
            try:
                self.oracle_plan(task)
            except NotImplementedError as exc:
                why = str(exc) or f"{self.name} has no expert plan (oracle_plan)"
                return f"{why} (task {task.id})" if len(tasks) > 1 else why
        return None

    def key_terms(self, task: Task) -> list[str]:
        """The strings an agent must carry through a compaction to finish ``task``: what its
        summaries are measured on (:func:`acmrl.rollout.records.terms_kept`). By default the
        documents and files the expert's plan reads (``doc_id`` / ``path`` arguments) and the
        accepted answers; strings under two characters are left out (they match anywhere).

        >>> class Docs(Environment):
        ...     def oracle_plan(self, task):
        ...         return [("search", {"query": "the author"}), ("open", {"doc_id": "d7"}),
        ...                 ("answer", {"text": task.answer[0]})]
        >>> Docs().key_terms(Task("t", "Who wrote it?", ["Ann Lee", "A. Lee"]))
        ['d7', 'Ann Lee', 'A. Lee']
        """
        try:
            plan = self.oracle_plan(task)
        except NotImplementedError:
            plan = []
        read = [args[k] for _, args in plan for k in ("doc_id", "path") if k in args]
        answers = task.answer if isinstance(task.answer, list) else [task.answer]
        terms = [str(t).strip() for t in [*read, *answers]]
        return list(dict.fromkeys(t for t in terms if len(t) >= 2 and re.search(r"\w", t)))

    # the calls that read a document whose facts a teacher's summary keeps: a demonstration
    # may compact right after one (teacher.pressure)
    read_tools: tuple[str, ...] = ("open",)

    def notes_of(self, task: Task, result: str) -> list[str] | None:
        """The lines of one tool result that a teacher's summary keeps verbatim for ``task``
        (what the question is known to need once that result is read); None leaves it to the
        teacher's own reading of documents (kb_search's sentences)."""
        return None

    def answer_evidence(self, task: Task) -> list[Evidence]:
        """What a policy must see to give the answer (:class:`Evidence`). By default the answer
        itself: the first accepted answer, or every item of an answer set.

        >>> Environment().answer_evidence(Task("t", "?", ["Ann Lee", "A. Lee"]))
        [Evidence(text='Ann Lee', doc_id=None, selector=None, query=None)]
        """
        answers = task.answer if isinstance(task.answer, list) else [task.answer]
        shown = answers if task.metadata.get("answer_set") else answers[:1]
        return [Evidence(str(a)) for a in shown]

    def score(self, task: Task, answer: str | None) -> float:
        """The task score of ``answer``: the judge's when one is configured, else the metric."""
        if answer is None:
            return 0.0
        if self.judge is not None:
            ref = task.answer if isinstance(task.answer, str) else " | ".join(task.answer)
            return float(self.judge(task.prompt, ref, answer))
        return score_answer(
            answer,
            task.answer,
            metric=self.metric,
            answer_set=bool(task.metadata.get("answer_set")),
            aliases=task.metadata.get("aliases"),
        )
