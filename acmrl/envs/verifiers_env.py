"""``env.name=verifiers``: an environment built with the ``verifiers`` package, in every arm.

    env:
      name: verifiers
      options:
        taskset: docs_qa          # the taskset's id: an installed package, as `vf-eval` takes it
        config: {}                # fields of its TasksetConfig (e.g. {num_tasks: 100})
        path: envs/               # optional: a folder that holds the package (put on the path)
        splits: {train: "0:80", eval: "80:100"}   # optional: slices of load() order

verifiers (v1 API, ``import verifiers.v1 as vf``) splits an environment into a ``Taskset`` (its
tasks, each a ``vf.Task`` with its ``@vf.reward`` functions) and ``Toolset`` s (tool servers that
verifiers itself serves over MCP). acmrl loads the taskset, has verifiers start each toolset's
server (a subprocess, as ``vf-eval`` does) and connects to it with its own MCP client, so a
verifiers environment gets what an ``mcp`` one gets: the tools with their schemas, named as
verifiers names them (``<prefix>_<tool>``), ``Error:`` observations for failed calls and
timeouts, and a server that dies restarted and the episode marked (``env_incidents``).

**Score.** The task's own rewards and judges: acmrl hands them a ``vf.Trace`` built as
verifiers starts a rollout's (the task, its ``State`` type, its system prompt and prompt) with
the submitted answer as the one reply (``trace.last_reply``); the score is the trace's weighted
reward sum, and a score of 1 or more counts as a success, as everywhere in acmrl. The trace
holds no intermediate turns (an arm rewrites its own context, so there is no one conversation
to hand over): a reward that reads the tool calls sees none, and one whose source reads a field
only a whole rollout fills (``tool_messages``, ``num_turns``, ``usage``, ...) is named in a
warning at load. ``@vf.metric`` values are not kept.
A reward that raises, or does not finish within the task's scoring timeout (else
``scoring_timeout_s``), scores 0 with a warning, and marks the episode (``env_incidents``).

**Tasks.** ``id`` (else the position in the taskset) names a task; its prompt is the task's
prompt, after its ``system_prompt`` if it has one (the arm keeps its own system prompt). The
reference that the LLM teacher reviews against is the task data's ``answer`` field
(``answer_field``), and its gold evidence the ``evidence`` field, where they exist. Splits:
``splits`` maps a split to a slice ``"start:stop"`` of the taskset's order (slices must not
overlap); without it, a ``split`` field of the task data decides (every task must have one),
else every task is in ``eval``.

**Toolsets** run in the runtime their config names (a local subprocess by default); one whose
config gives a ``url`` is reached there. One server per toolset serves every episode of a
process, where verifiers starts a task-scoped toolset per rollout: a toolset that keeps state
on itself between calls mixes episodes, as an ``mcp`` server that keeps state per connection.

**What is refused, with the reason:** tasks that need containers (``NEEDS_CONTAINER``) or
define ``setup``/``finalize``/``stage_verifier`` (they run in the task's runtime), a reward or
judge that needs the runtime (verifiers would skip it and score with the rest: acmrl refuses
rather than score differently), a task with no reward, toolsets with a ``State`` type or a
``setup_task`` (they need verifiers' own rollout server), tasks whose toolsets differ, an
infinite taskset without ``limit``. ``@vf.stop`` and ``@vf.intercept`` hooks and a taskset's
own ``Harness``/``Env`` are not used: acmrl's arms are the harness. There is no expert plan,
as for ``mcp``: the LLM teacher reviews runs.

Needs ``pip install 'acmrl[verifiers]'`` (verifiers 0.4 pins ``mcp==2.0.0``; acmrl's client
works with it).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import sys
import threading
import warnings
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from acmrl.envs.base import EnvError, Evidence, Plan, Session, Task
from acmrl.envs.mcp import MCPConnection, ServedTools, _reason, loop_thread, stop_loop


def _verifiers() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise EnvError(
            "env verifiers needs the verifiers package (0.4, its v1 API): "
            f"pip install 'acmrl[verifiers]' (importing it failed: {exc})"
        ) from None
    return vf


# the Trace fields that only a whole rollout fills; acmrl's scoring trace leaves them empty
TURN_FIELDS = (
    "tool_messages",
    "assistant_messages",
    "num_turns",
    "num_input_tokens",
    "num_output_tokens",
    "num_total_tokens",
    "usage",
    "transcript",
    "branches",
)
_TURNS = re.compile(r"\.(" + "|".join(TURN_FIELDS) + r")\b")


def _reads_turns(fn: Any) -> bool:
    """A reward whose source reads one of :data:`TURN_FIELDS` of its trace."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return _TURNS.search(source) is not None


class ToolsetConnection(MCPConnection):
    """A verifiers ``Toolset``, served by verifiers (``verifiers.v1.mcp.serve``: a subprocess
    in the toolset's runtime) and reached over streamable HTTP; one whose config gives a
    ``url`` (a server running elsewhere) is reached there. ``restart`` serves it again."""

    def __init__(self, toolset: Any, *, start_timeout_s: float = 60.0) -> None:
        external = getattr(toolset.config, "url", None)
        super().__init__(url=external or "(not served)", start_timeout_s=start_timeout_s)
        self.toolset, self.external = toolset, bool(external)
        self._stop: asyncio.Event | None = None
        self._launcher: threading.Thread | None = None
        self._launch_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._finished = threading.Event()  # the serving context has been left
        # verifiers' teardown runs on worker threads, which the interpreter refuses once its
        # thread pools have shut down at exit: leave before them (threading's exit hooks run
        # in reverse order, and concurrent.futures registered its own at import)
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(self.close)

    @property
    def label(self) -> str:
        return f"{type(self.toolset).__module__} ({self.url})"

    def start(self) -> None:
        if not self.external:
            self._launch()
        try:
            super().start()
        except BaseException:
            self._end_launch()
            raise

    def _launch(self) -> None:
        from verifiers.v1.mcp import serve

        loop, self._launcher = loop_thread("vf-serve")
        self._launch_loop = loop
        served: Future = Future()
        self._finished.clear()

        async def hold() -> None:
            self._stop = asyncio.Event()
            try:
                async with serve(self.toolset) as url:
                    served.set_result(url)
                    await self._stop.wait()
            except BaseException as exc:
                if not served.done():
                    served.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
                raise
            finally:
                self._finished.set()

        def begin() -> None:
            self._task = loop.create_task(hold())

        loop.call_soon_threadsafe(begin)
        try:
            self.url = served.result(timeout=self.start_timeout_s)
        except FutureTimeout:
            self._end_launch()
            raise EnvError(
                f"verifiers: the toolset {type(self.toolset).__module__} was not served within "
                f"{self.start_timeout_s:g} s (is its package importable by a subprocess? give "
                "env.options.path)"
            ) from None
        except Exception as exc:
            self._end_launch()
            raise EnvError(
                f"verifiers: cannot serve the toolset {type(self.toolset).__module__}: "
                f"{_reason(exc)}"
            ) from None

    def close(self) -> None:
        super().close()
        self._end_launch()

    def _end_launch(self) -> None:
        """Leave verifiers' serving context, which stops the server and removes its runtime; a
        launch still starting is cancelled, and its own cleanup runs before the loop stops."""
        loop, self._launch_loop = self._launch_loop, None
        if loop is None:
            return
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if not self._finished.wait(timeout=30) and self._task is not None:
            loop.call_soon_threadsafe(self._task.cancel)  # still starting: cancel it there
            self._finished.wait(timeout=30)
        stop_loop(loop, self._launcher)
        self._stop = self._task = self._launcher = None


class _Scorer:
    """One event loop on a thread of its own for the tasks' rewards, so that a reward keeping a
    client between calls (an ``AsyncOpenAI`` judge) finds its loop alive on the next call."""

    def __init__(self) -> None:
        self.loop, _ = loop_thread("vf-score")

    def run(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)


class RewardFailed(Exception):
    """A task's reward or judge raised, or did not finish in time."""


def _overrides(cls: type, method: str, base: type) -> bool:
    """Whether ``cls`` (or a class between it and ``base``) redefines ``base.method``."""
    return next(c for c in cls.__mro__ if method in c.__dict__) is not base


def _slice(spec: str, split: str) -> slice:
    try:
        a, b = (int(x) if x.strip() else None for x in str(spec).split(":"))
    except ValueError:
        raise EnvError(
            f"verifiers: splits.{split} is {spec!r}; give a slice 'start:stop' of the "
            "taskset's order, e.g. '0:80'"
        ) from None
    return slice(a, b)


class VerifiersEnv(ServedTools):
    """A ``verifiers`` taskset and its toolsets (module docstring)."""

    name = "verifiers"

    def __init__(
        self,
        taskset: str,
        config: dict[str, Any] | None = None,
        path: str | None = None,
        splits: dict[str, str] | None = None,
        limit: int | None = None,
        answer_field: str = "answer",
        evidence_field: str = "evidence",
        timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        max_restarts: int = 3,
        scoring_timeout_s: float = 600.0,
        max_context_tokens: int | None = None,
    ) -> None:
        super().__init__(metric="em")
        if path is not None:
            folder = Path(path).resolve()
            if not folder.is_dir():
                raise EnvError(f"verifiers: path {path} is not a folder")
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
            # the toolset servers are subprocesses: they import the package from here too
            parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if str(folder) not in parts:
                os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, parts)])
        vf = _verifiers()
        from verifiers.v1.utils.generic import concrete_type
        from verifiers.v1.utils.loaders import taskset_class

        try:
            cls = taskset_class(taskset)
        except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as exc:
            raise EnvError(f"verifiers: cannot load the taskset {taskset!r}: {exc}") from None
        config_cls = concrete_type(cls, vf.TasksetConfig) or vf.TasksetConfig
        try:
            ts = cls(config_cls.model_validate({**(config or {}), "id": taskset}))
        except Exception as exc:  # a pydantic ValidationError names the bad field
            raise EnvError(f"verifiers: bad config for the taskset {taskset!r}: {exc}") from None
        if limit is not None:
            ts = ts.take(int(limit))
        elif not ts.bounded:
            raise EnvError(f"verifiers: the taskset {taskset!r} is infinite; set env.options.limit")
        vf_tasks = list(ts)
        if not vf_tasks:
            raise EnvError(f"verifiers: the taskset {taskset!r} has no task")
        self.taskset_id = taskset
        self.timeout_s = float(timeout_s)
        self.max_restarts = int(max_restarts)
        self.max_context_tokens = max_context_tokens
        first = vf_tasks[0]
        toolsets = [*type(ts).toolsets(ts.config), *type(first).toolsets(first.config)]
        self._check(toolsets, vf_tasks)
        self._scorer = _Scorer()
        self.scoring_timeout_s = float(scoring_timeout_s)
        self._vf: dict[str, Any] = {}
        tasks = []
        for t in vf_tasks:
            tid = str(t.data.id if t.data.id is not None else t.data.idx)
            if tid in self._vf:
                raise EnvError(f"verifiers: the taskset {taskset!r} has two tasks with id {tid!r}")
            self._vf[tid] = t
            tasks.append(self._task(tid, t, answer_field, evidence_field))
        self._tasks = self._split(tasks, vf_tasks, splits)
        self._open(
            [
                (ToolsetConnection(s, start_timeout_s=float(start_timeout_s)), s.server_name)
                for s in toolsets
            ]
        )

    # -- loading ----------------------------------------------------------------------------------

    def _check(self, toolsets: list[Any], tasks: list[Any]) -> None:
        """Refuse, by name, what acmrl cannot run as verifiers would."""
        from verifiers.v1.state import State, state_cls
        from verifiers.v1.task import Task as VfTask

        def needs_runtime(fn: Any) -> bool:
            param = inspect.signature(fn).parameters.get("runtime")
            return param is not None and param.default is inspect.Parameter.empty

        firsts = {type(t): t for t in reversed(tasks)}  # one task of each kind
        for kind, t in firsts.items():
            if getattr(kind, "NEEDS_CONTAINER", False):
                raise EnvError(
                    f"verifiers: {kind.__name__} needs a container runtime, which acmrl's "
                    "rollouts do not provide"
                )
            hooks = [
                h for h in ("setup", "finalize", "stage_verifier") if _overrides(kind, h, VfTask)
            ]
            if hooks:
                raise EnvError(
                    f"verifiers: {kind.__name__} defines {', '.join(hooks)}, which run in the "
                    "task's runtime; acmrl runs no task runtime"
                )
            scorers = {fn.__name__: fn for fn in t.hooks("reward")}
            scorers |= {j.reward_name: j.score for j in t.plugged_judges()}
            if not scorers:
                raise EnvError(f"verifiers: {kind.__name__} has no reward or judge to score with")
            if runtime := sorted(n for n, fn in scorers.items() if needs_runtime(fn)):
                raise EnvError(
                    f"verifiers: {kind.__name__}'s reward(s) {runtime} need the task's runtime, "
                    "which acmrl does not run (verifiers would skip them and score with the rest)"
                )
            if turns := sorted(n for n, fn in scorers.items() if _reads_turns(fn)):
                warnings.warn(
                    f"verifiers: {kind.__name__}'s reward(s) {turns} read the rollout's turns "
                    f"({', '.join(TURN_FIELDS)}); acmrl scores on a trace of the prompt and the "
                    "answer alone (no tool message, one turn, no usage), so they may score "
                    "otherwise than in a verifiers rollout",
                    stacklevel=2,
                )
        shapes = {
            tuple((type(s), s.config.model_dump_json()) for s in type(t).toolsets(t.config))
            for t in tasks
        }
        if len(shapes) > 1:
            raise EnvError(
                "verifiers: the tasks have different toolsets; acmrl serves one set for all"
            )
        from verifiers.v1.mcp.server import ServerBase

        for s in toolsets:
            if state_cls(type(s)) is not State or _overrides(type(s), "setup_task", ServerBase):
                raise EnvError(
                    f"verifiers: the toolset {type(s).__name__} keeps per-rollout state or "
                    "sets itself up per task; that needs verifiers' own rollout server, "
                    "which acmrl does not run"
                )

    @staticmethod
    def _task(tid: str, t: Any, answer_field: str, evidence_field: str) -> Task:
        data = t.data
        prompt = data.prompt_text.strip()
        if data.system_prompt:
            prompt = f"{data.system_prompt.strip()}\n\n{prompt}"
        if not prompt:
            raise EnvError(f"verifiers: task {tid!r} has no prompt")
        answer = getattr(data, answer_field, None)
        if isinstance(answer, (list, tuple)):
            answer = [str(a) for a in answer]
        meta: dict[str, Any] = {"verifiers_task": type(t).__name__}
        if answer is None:
            answer, meta["reference"] = "", False
        evidence = getattr(data, evidence_field, None)
        if isinstance(evidence, str):
            evidence = [evidence]
        if evidence:
            meta["evidence"] = [str(e) for e in evidence]
        return Task(tid, prompt, answer if isinstance(answer, list) else str(answer), meta)

    def _split(
        self, tasks: list[Task], vf_tasks: list[Any], splits: dict[str, str] | None
    ) -> dict[str, list[Task]]:
        if splits:
            out, owner = {}, {}
            for name, spec in splits.items():
                out[name] = tasks[_slice(spec, name)]
                if not out[name]:
                    raise EnvError(
                        f"verifiers: split {name} ({spec}) holds no task of {len(tasks)}"
                    )
                for task in out[name]:
                    if task.id in owner:
                        raise EnvError(
                            f"verifiers: splits {owner[task.id]} and {name} overlap (task "
                            f"{task.id!r})"
                        )
                    owner[task.id] = name
            return out
        marks = [getattr(t.data, "split", None) for t in vf_tasks]
        if not any(marks):
            return {"eval": tasks}
        if missing := [
            t.id for t, m in zip(tasks, marks, strict=True) if not isinstance(m, str) or not m
        ]:
            raise EnvError(
                f"verifiers: {len(missing)} task(s) have no split field (e.g. {missing[0]!r}) and "
                "the others do; give env.options.splits"
            )
        out: dict[str, list[Task]] = {}
        for task, mark in zip(tasks, marks, strict=True):
            out.setdefault(mark, []).append(task)
        return out

    def answer_evidence(self, task: Task) -> list[Evidence]:
        if task.metadata.get("reference") is False:  # no answer field: the evidence, if any
            return [Evidence(e) for e in task.metadata.get("evidence") or []]
        return super().answer_evidence(task)

    # -- scoring ----------------------------------------------------------------------------------

    def trace(self, task: Task, answer: str) -> Any:
        """The ``vf.Trace`` the task's rewards score, built as verifiers starts a rollout's (the
        task, its State type, the prompt with its system prompt) with the answer as the one
        reply: no intermediate turns."""
        vf = _verifiers()
        from verifiers.v1 import types
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        t = self._vf[task.id]
        messages: list[Any] = []
        if t.data.system_prompt:
            messages.append(types.SystemMessage(content=t.data.system_prompt))
        if isinstance(t.data.prompt, str):
            messages.append(types.UserMessage(content=t.data.prompt))
        else:
            messages += list(t.data.prompt or [])
        messages.append(types.AssistantMessage(content=answer))
        nodes = [
            MessageNode(parent=i - 1 if i else None, message=m, sampled=i == len(messages) - 1)
            for i, m in enumerate(messages)
        ]
        return Trace(
            task=TraceTask(type=type(t).__name__, data=t.data, key=t.key, hash=t.hash),
            state=state_cls(type(t))(),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=nodes,
            root_reply=answer,
            is_completed=True,
            ok=True,
        )

    def _score(self, task: Task, answer: str) -> float:
        t = self._vf[task.id]
        trace = self.trace(task, answer)
        limit = t.data.timeout.scoring or self.scoring_timeout_s
        try:
            self._scorer.run(t.score(trace), timeout=limit)
        except FutureTimeout:
            raise RewardFailed(f"the rewards did not finish within {limit:g} s") from None
        except Exception as exc:
            raise RewardFailed(_reason(exc)) from None
        return float(trace.reward)

    def score(self, task: Task, answer: str | None, incidents: list[str] | None = None) -> float:
        """The task's weighted reward sum for ``answer`` (0 without one, and 0 with a warning
        when a reward fails; in an episode, the failure is added to its ``incidents``, which
        mark it: ``env_incidents``)."""
        if answer is None:
            return 0.0
        try:
            return self._score(task, answer)
        except RewardFailed as exc:
            marked = ""
            if incidents is not None:
                incidents.append(f"reward: {exc}")
                marked = ", episode marked"
            warnings.warn(
                f"verifiers: task {task.id}: a reward failed ({exc}); scored 0{marked}",
                stacklevel=3,
            )
            return 0.0

    def session(self, task: Task) -> Session:
        s = super().session(task)
        s._scorer = lambda answer: self.score(task, answer, s.incidents)  # type: ignore[attr-defined]
        return s

    def oracle_plan(self, task: Task) -> Plan:
        raise NotImplementedError(
            "verifiers environments have no expert plan: use the LLM teacher (teacher.kind=llm), "
            "which reviews runs against the task's answer and evidence"
        )
