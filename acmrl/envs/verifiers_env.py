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

**Score.** The task's own rewards: acmrl hands them a ``vf.Trace`` holding the prompt and the
submitted answer as the final reply (``trace.last_reply``), and the score is the trace's
weighted reward sum; a score of 1 or more counts as a success, as everywhere in acmrl. The
trace does not hold the episode's intermediate turns (an arm rewrites its own context, so
there is no one conversation to hand over); a reward that reads them, or that needs the task's
runtime (a container), is not supported, and a taskset with no other reward is refused.

**Tasks.** ``id`` (else ``idx``) names a task; its prompt is the task's prompt (its
``system_prompt``, if any, goes first: the arm keeps its own system prompt). The reference that
the LLM teacher reviews against is the task data's ``answer`` field (``answer_field``), and its
gold evidence the ``evidence`` field, where they exist. Splits: ``splits`` maps a split to a
slice ``"start:stop"`` of the taskset's order; without it, a ``split`` field of the task data
decides, else every task is in ``eval``.

**What is refused, with the reason:** tasksets that need containers (``NEEDS_CONTAINER``),
toolsets with per-rollout state or per-task setup (they need verifiers' own rollout server),
tasks whose toolsets differ, an infinite taskset without ``limit``. There is no expert plan, as
for ``mcp``: the LLM teacher reviews runs.

Needs ``pip install 'acmrl[verifiers]'`` (verifiers 0.4 pins ``mcp==2.0.0``; acmrl's client
works with it).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from acmrl.envs.base import EnvError, Plan, Task
from acmrl.envs.mcp import MCPConnection, ServedTools, _reason


def _verifiers() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise EnvError(
            "env verifiers needs the verifiers package (0.4, its v1 API): "
            f"pip install 'acmrl[verifiers]' (importing it failed: {exc})"
        ) from None
    return vf


class ToolsetConnection(MCPConnection):
    """A verifiers ``Toolset``, served by verifiers (``verifiers.v1.mcp.serve``: a subprocess
    in the toolset's runtime) and reached over streamable HTTP. ``restart`` serves it again."""

    def __init__(self, toolset: Any, *, start_timeout_s: float = 60.0) -> None:
        super().__init__(url="(not served)", start_timeout_s=start_timeout_s)
        self.toolset = toolset
        self._stop: asyncio.Event | None = None
        self._launcher: threading.Thread | None = None
        self._launch_loop: asyncio.AbstractEventLoop | None = None
        self._held: Future | None = None

    @property
    def label(self) -> str:
        return f"{type(self.toolset).__module__} ({self.url})"

    def start(self) -> None:
        from verifiers.v1.mcp import serve

        loop = asyncio.new_event_loop()
        self._launch_loop = loop
        self._launcher = threading.Thread(target=loop.run_forever, daemon=True, name="vf-serve")
        self._launcher.start()
        served: Future = Future()

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

        self._held = asyncio.run_coroutine_threadsafe(hold(), loop)
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
        try:
            super().start()
        except BaseException:
            self._end_launch()
            raise

    def close(self) -> None:
        super().close()
        self._end_launch()

    def _end_launch(self) -> None:
        """Leave verifiers' serving context: it stops the server and removes its runtime."""
        loop, self._launch_loop = self._launch_loop, None
        if loop is None:
            return
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._held is not None:
            try:
                self._held.result(timeout=30)
            except Exception:  # a server that died fails its own teardown
                self._held.cancel()
        loop.call_soon_threadsafe(loop.stop)
        if self._launcher is not None:
            self._launcher.join(timeout=10)
        if self._launcher is None or not self._launcher.is_alive():
            loop.close()
        self._stop = self._held = self._launcher = None


def _run(make: Any) -> Any:
    """Run the coroutine ``make()`` to its end from synchronous code, on a thread of its own
    when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    box: Future = Future()

    def target() -> None:
        try:
            box.set_result(asyncio.run(make()))
        except BaseException as exc:  # handed to the caller
            box.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return box.result()


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
        self._check(vf_tasks)
        self._vf: dict[str, Any] = {}
        tasks = []
        for t in vf_tasks:
            tid = str(t.data.id if t.data.id is not None else t.data.idx)
            if tid in self._vf:
                raise EnvError(f"verifiers: the taskset {taskset!r} has two tasks with id {tid!r}")
            self._vf[tid] = t
            tasks.append(self._task(tid, t, answer_field, evidence_field))
        self._tasks = self._split(tasks, vf_tasks, splits)
        first = vf_tasks[0]
        toolsets = list(type(ts).toolsets(ts.config)) + list(type(first).toolsets(first.config))
        self._open(
            [
                (ToolsetConnection(s, start_timeout_s=float(start_timeout_s)), s.server_name)
                for s in toolsets
            ]
        )

    # -- loading ----------------------------------------------------------------------------------

    def _check(self, tasks: list[Any]) -> None:
        from verifiers.v1.state import State, state_cls

        kinds = {type(t) for t in tasks}
        for kind in kinds:
            if getattr(kind, "NEEDS_CONTAINER", False):
                raise EnvError(
                    f"verifiers: {kind.__name__} needs a container runtime, which acmrl's "
                    "rollouts do not provide"
                )

        def runtime_free(fn: Any) -> bool:
            param = inspect.signature(fn).parameters.get("runtime")
            return param is None or param.default is not inspect.Parameter.empty

        for t in tasks[:1]:
            scorers = [*t.hooks("reward"), *(j.score for j in t.plugged_judges())]
            if not any(runtime_free(fn) for fn in scorers):
                raise EnvError(
                    f"verifiers: {type(t).__name__} has no reward that scores without the task's "
                    "runtime; acmrl scores the submitted answer"
                )
        shapes = {
            tuple((type(s), s.config.model_dump_json()) for s in type(t).toolsets(t.config))
            for t in tasks
        }
        if len(shapes) > 1:
            raise EnvError(
                "verifiers: the tasks have different toolsets; acmrl serves one set for all"
            )
        for t in tasks[:1]:
            for s in type(t).toolsets(t.config):
                base = type(s).__mro__
                own_setup = next(c for c in base if "setup_task" in c.__dict__)
                if (
                    state_cls(type(s)) is not State
                    or own_setup.__module__ != "verifiers.v1.mcp.server"
                ):
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
            out = {name: tasks[_slice(spec, name)] for name, spec in splits.items()}
            if empty := [name for name, got in out.items() if not got]:
                raise EnvError(f"verifiers: split(s) {empty} hold no task of {len(tasks)}")
            return out
        marks = [getattr(t.data, "split", None) for t in vf_tasks]
        if all(isinstance(m, str) and m for m in marks):
            out: dict[str, list[Task]] = {}
            for task, mark in zip(tasks, marks, strict=True):
                out.setdefault(mark, []).append(task)
            return out
        return {"eval": tasks}

    # -- scoring ----------------------------------------------------------------------------------

    def trace(self, task: Task, answer: str) -> Any:
        """The ``vf.Trace`` the task's rewards score: the prompt, and the answer as the final
        reply."""
        vf = _verifiers()
        from verifiers.v1 import types
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        t = self._vf[task.id]
        nodes = [
            MessageNode(message=types.UserMessage(content=t.data.prompt_text)),
            MessageNode(parent=0, message=types.AssistantMessage(content=answer), sampled=True),
        ]
        kind = type(t)
        return Trace(
            task=TraceTask(type=f"{kind.__module__}:{kind.__qualname__}", data=t.data),
            agent=AgentInfo(config=vf.AgentConfig()),
            tools=[],
            nodes=nodes,
            root_reply=answer,
            is_completed=True,
            ok=True,
        )

    def score(self, task: Task, answer: str | None) -> float:
        """The task's weighted reward sum for ``answer`` (0 without one)."""
        if answer is None:
            return 0.0
        trace = self.trace(task, answer)
        _run(lambda: self._vf[task.id].score(trace))
        return float(trace.reward)

    def oracle_plan(self, task: Task) -> Plan:
        raise NotImplementedError(
            "verifiers environments have no expert plan: use the LLM teacher (teacher.kind=llm), "
            "which reviews runs against the task's answer and evidence"
        )
