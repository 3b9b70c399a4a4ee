"""``env.name=mcp``: the tools of a Model Context Protocol server as an acmrl environment.

    env:
      name: mcp
      options:
        command: [python, my_server.py]   # a stdio server, started as a subprocess; or
        url: http://localhost:8000/mcp    # a server on the streamable HTTP transport
        tasks: tasks.jsonl                # the task set (below)
        metric: em                        # em | f1 | contains | ... or judge (env.judge)
        timeout_s: 30                     # per tool call

The server's tools become the agent's tools, with the schemas it lists (the session adds
``answer``). Tasks come from a JSONL file, one object per line:

    {"id": "q1", "prompt": "...", "answer": "..." or [...], "split": "eval",
     "aliases": {"...": ["..."]}, "answer_set": false, "evidence": ["a sentence", ...]}

``prompt`` and ``answer`` are required; ``id`` defaults to the line number, ``split`` to
``eval``. ``evidence`` (optional) lists sentences an agent must see to answer: the LLM teacher
gets them as the gold evidence it reviews a run against.

A tool call the server answers with an error, any other failure of a call, and one that takes
longer than ``timeout_s`` become ``Error:`` observations. A server that dies is restarted, the
call is tried once more, and the episode is marked (its trajectory's ``env_incidents`` metric);
after ``max_restarts`` failed restarts in a row the server is given up and every later call
says so at once: a run never crashes on it. Every server process the connection started is
stopped on close (terminated, then killed), a server stuck in its handshake too.

There is no expert plan: ``oracle_plan`` raises, so the scripted teacher, demonstrations and
the scripted ceilings of ``acmrl audit`` need another environment; the LLM teacher
(``teacher.kind=llm``) reviews runs against the answer and the evidence.

The MCP client is asynchronous; :class:`MCPConnection` keeps one open in an event loop on its
own thread and hands calls to it, so the synchronous rollout loop can use it. Needs the ``mcp``
package (``pip install 'acmrl[mcp]'``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import shlex
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from acmrl.envs.base import EnvError, Environment, Evidence, Handler, Plan, Session, Task, ToolError


class ServerDown(Exception):
    """The MCP server stopped answering (its process died, or its connection closed)."""


class CallRefused(Exception):
    """The server answered a call with a protocol error (an unknown tool, bad parameters)."""


class MCPConnection:
    """One MCP client session, kept open on an event loop in a thread of its own.

    ``command`` (argv of a stdio server) or ``url`` (streamable HTTP). ``call`` and
    ``list_tools`` block until the server answers; ``restart`` reconnects (a stdio server is
    started again). ``generation`` counts the connections made, so a session can tell that the
    server it started with was replaced."""

    def __init__(
        self,
        command: list[str] | None = None,
        url: str | None = None,
        *,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 60.0,
    ) -> None:
        if (command is None) == (url is None):
            raise EnvError("mcp: give exactly one of command (a stdio server) or url")
        self.command, self.url, self.env = command, url, env
        self.start_timeout_s = start_timeout_s
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._queue: asyncio.Queue | None = None
        self._served: Future | None = None  # the serving task's end (an error, or None)
        self._procs: list[Any] = []  # the server processes started (psutil.Process)
        atexit.register(self.close)  # a stdio server is stopped with the process that started it

    # -- lifetime ---------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            import mcp  # noqa: F401
        except ImportError as exc:
            raise EnvError(
                "env mcp needs the mcp package: pip install 'acmrl[mcp]' "
                f"(importing it failed: {exc})"
            ) from None
        self._loop, self._thread = loop_thread("mcp")
        ready: Future = Future()
        before = _children()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        try:
            ready.result(timeout=self.start_timeout_s)
        except FutureTimeout:
            self._procs = [p for p in _children().values() if p.pid not in before]
            self.close()
            raise EnvError(
                f"mcp: the server {self.label} did not start within {self.start_timeout_s} s"
            ) from None
        except Exception as exc:
            self._procs = [p for p in _children().values() if p.pid not in before]
            self.close()
            raise EnvError(f"mcp: cannot start the server {self.label}: {_reason(exc)}") from None
        # the server processes this connection started: stopped for sure on close, even where
        # the client's own shutdown cannot run (a server that hangs)
        self._procs = [p for p in _children().values() if p.pid not in before]
        self.generation += 1

    def close(self) -> None:
        """End the client (a stdio server is stopped); a server that hangs is cancelled."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        served, thread = self._served, self._thread
        if self._queue is not None:
            loop.call_soon_threadsafe(self._queue.put_nowait, None)  # ends the serving task
        if served is not None:
            with contextlib.suppress(Exception):  # a dead server may fail its own shutdown
                served.result(timeout=5)
            if not served.done():  # hung (in its handshake, or a call): cancel it
                served.cancel()
                with contextlib.suppress(Exception):
                    served.result(timeout=10)
        stop_loop(loop, thread)
        _stop(self._procs)
        self._procs = []
        self._queue = self._served = self._thread = None

    def restart(self) -> None:
        self.close()
        self.start()

    @property
    def label(self) -> str:
        """The server, as messages name it."""
        return self.url or shlex.join(self.command or [])

    async def _serve(self, ready: Future) -> None:
        """Hold the client open; run the queued calls one by one in this task (the client's
        context must be entered and left by one task)."""
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        target: Any = self.url
        if self.command is not None:
            # a transport rather than the parameters: mcp 2.0 (verifiers' pin) takes only that
            target = stdio_client(
                StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env)
            )
        self._queue = asyncio.Queue()
        try:
            async with Client(target) as client:
                ready.set_result(None)
                while (item := await self._queue.get()) is not None:
                    work, done = item
                    try:
                        done.set_result(await work(client))
                    except asyncio.CancelledError:
                        done.set_exception(ServerDown("the connection was closed"))
                        raise
                    except Exception as exc:  # handed to the caller, never lost
                        done.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ServerDown(_reason(exc)))
            self._fail_pending(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _fail_pending(self, exc: BaseException) -> None:
        while self._queue is not None and not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                item[1].set_exception(ServerDown(_reason(exc)))

    def _submit(self, work: Any, timeout: float) -> Any:
        if self._loop is None or self._queue is None or self._served is None:
            raise ServerDown("not connected")
        if self._served.done():
            raise ServerDown("the connection has closed")
        done: Future = Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (work, done))
        # the answer, or the connection's end, whichever comes first
        wait([done, self._served], timeout=timeout, return_when=FIRST_COMPLETED)
        if not done.done():
            if self._served.done():
                raise ServerDown("the connection has closed")
            raise FutureTimeout
        return done.result()

    # -- requests ---------------------------------------------------------------------------------

    def list_tools(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The server's tools as OpenAI function schemas (every page of the listing)."""

        async def work(client: Any) -> list[Any]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += list(page.tools)
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return tools

        try:
            listed = self._submit(work, timeout)
        except FutureTimeout:
            raise EnvError(f"mcp: the server did not list its tools within {timeout} s") from None
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or t.name,
                    "parameters": t.input_schema or {"type": "object", "properties": {}},
                },
            }
            for t in listed
        ]

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> tuple[str, bool]:
        """The tool's result as text, and whether the server marked it an error. Raises
        ``TimeoutError`` past ``timeout``, :class:`ServerDown` if the server is gone and
        :class:`CallRefused` for any other failure of the call."""
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED

        async def work(client: Any) -> Any:
            try:
                return await asyncio.wait_for(client.call_tool(name, arguments), timeout)
            except MCPError as exc:
                # a closed stdio pipe, or an HTTP server that lost the session (restarted)
                if exc.code == CONNECTION_CLOSED or "session terminated" in exc.message.lower():
                    raise ServerDown(exc.message) from None
                raise CallRefused(exc.message) from None
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                raise ServerDown(_reason(exc)) from None
            except (TimeoutError, ServerDown):
                raise
            except Exception as exc:  # e.g. a result that breaks the tool's own output schema
                raise CallRefused(_reason(exc)) from None

        try:
            result = self._submit(work, timeout + 10)
        except (FutureTimeout, TimeoutError):
            raise TimeoutError(name) from None
        return result_text(result), bool(getattr(result, "is_error", False))


def loop_thread(name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop, running on a daemon thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name=name)
    thread.start()
    return loop, thread


def stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread | None) -> None:
    """Stop ``loop`` and its thread; the loop is closed once the thread has ended."""
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(timeout=10)
    if thread is None or not thread.is_alive():
        loop.close()


def _children() -> dict[int, Any]:
    """This process's child processes by pid."""
    import psutil

    return {p.pid: p for p in psutil.Process().children(recursive=False)}


def _stop(procs: list[Any], grace: float = 3.0) -> None:
    """Terminate what is still running of ``procs``, and kill what outlives ``grace``."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, left = psutil.wait_procs(alive, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=grace)


def result_text(result: Any) -> str:
    """A tool result's content as the text an agent reads: its text parts in order; other parts
    named by their type; the structured content as JSON when there is no text."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts) or "(empty result)"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


#: tool names an arm or the session defines: a server tool of one of these names would be shadowed
RESERVED = ("answer", "manage_context", "query_memory", "read_memory", "evolve")
TASK_KEYS = {"id", "prompt", "answer", "answers", "split", "aliases", "answer_set", "evidence"}


def read_tasks(path: str | Path) -> dict[str, list[Task]]:
    """Tasks per split from a JSONL file (module docstring); a bad line is named. Answers,
    answer sets and aliases are read as corpus_qa's question files read them."""
    from acmrl.envs.corpus_qa import _answers

    p = Path(path)
    if not p.is_file():
        raise EnvError(f"mcp: tasks file {p} does not exist")
    splits: dict[str, list[Task]] = {}
    seen: set[str] = set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"mcp: {p}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EnvError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise EnvError(f"{where}: a task is a JSON object")
        if unknown := sorted(set(row) - TASK_KEYS):
            raise EnvError(f"{where}: unknown key(s) {unknown}; a task has {sorted(TASK_KEYS)}")
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise EnvError(f"{where}: 'prompt' must be a non-empty string")
        if row.get("answer", row.get("answers")) in (None, "", []):
            raise EnvError(f"{where}: 'answer' is required and must not be empty")
        answer, answer_set, aliases = _answers(p, n, row)
        items = [answer] if isinstance(answer, str) else answer
        if not items or any(not str(a).strip() for a in items):
            raise EnvError(f"{where}: 'answer' must not be empty")
        evidence = row.get("evidence", [])
        if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
            raise EnvError(f"{where}: 'evidence' must be a list of strings")
        tid, split = row.get("id", f"line{n}"), row.get("split", "eval")
        if not isinstance(tid, str | int) or isinstance(tid, bool) or not str(tid).strip():
            raise EnvError(f"{where}: 'id' must be a non-empty string or an integer")
        if not isinstance(split, str) or not split.strip():
            raise EnvError(f"{where}: 'split' must be a non-empty string")
        if str(tid) in seen:
            raise EnvError(f"{where}: task id {str(tid)!r} is used twice")
        seen.add(str(tid))
        meta: dict[str, Any] = {"evidence": evidence}
        if answer_set:
            meta["answer_set"] = True
        if aliases:
            meta["aliases"] = aliases
        splits.setdefault(split, []).append(Task(str(tid), prompt.strip(), answer, meta))
    if not splits:
        raise EnvError(f"mcp: {p} holds no task")
    return splits


class MCPSession(Session):
    """A session whose environment calls go to the MCP server(s). ``incidents`` lists what
    happened to a server during the episode (a restart it caused or saw); ``generations`` holds
    the connection each server's first call went to."""

    incidents: list[str]
    generations: dict[int, int]


class ServedTools(Environment):
    """The tools of one or more MCP connections, as an environment's tools: the routing of a
    tool name to its server, restarts, and every failure turned into an ``Error:`` observation.
    :class:`MCPEnv` has one server; ``env.name=verifiers`` one per toolset."""

    timeout_s: float = 30.0
    max_restarts: int = 3

    def _open(self, servers: list[tuple[MCPConnection, str]]) -> None:
        """Start each ``(connection, prefix)`` and list its tools; a tool is offered as
        ``prefix_name`` (bare with an empty prefix). Every connection is closed on failure."""
        self.connections = [c for c, _ in servers]
        self._route: dict[str, tuple[int, str]] = {}
        self._tools: list[dict[str, Any]] = []
        self.restarts = 0  # restarts made
        self.failed_restarts: dict[int, int] = {}  # in a row, per server
        self.down: dict[int, str] = {}  # the servers given up, and why
        try:
            for i, (conn, prefix) in enumerate(servers):
                conn.start()
                for tool in conn.list_tools():
                    raw = tool["function"]["name"]
                    name = f"{prefix}_{raw}" if prefix else raw
                    if name in RESERVED:
                        raise EnvError(
                            f"{self.name}: the server {conn.label} has a tool {name!r}, a name "
                            f"acmrl's arms use ({', '.join(RESERVED)}); rename it on the server"
                        )
                    if name in self._route:
                        raise EnvError(f"{self.name}: two servers offer a tool named {name!r}")
                    self._route[name] = (i, raw)
                    self._tools.append({**tool, "function": {**tool["function"], "name": name}})
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every server this environment started."""
        for conn in getattr(self, "connections", []):
            conn.close()

    @property
    def connection(self) -> MCPConnection:
        """The first server's connection (the only one of an ``mcp`` environment)."""
        return self.connections[0]

    def tools(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self._tools]

    def answer_evidence(self, task: Task) -> list[Evidence]:
        """The task's ``evidence`` sentences, when it gives them; else the answer."""
        given = task.metadata.get("evidence") or []
        return [Evidence(e) for e in given] or super().answer_evidence(task)

    def session(self, task: Task) -> Session:
        session = MCPSession(task, self.tools(), {}, lambda a: self.score(task, a))
        session.incidents, session.generations = [], {}
        session._handlers = self._handlers_for(session)
        return session

    def _handlers(self, task: Task) -> dict[str, Handler]:  # sessions build their own
        raise NotImplementedError

    def _handlers_for(self, session: MCPSession) -> dict[str, Handler]:
        def handler(name: str) -> Handler:
            return lambda **arguments: self._call(session, name, arguments)

        return {t["function"]["name"]: handler(t["function"]["name"]) for t in self._tools}

    def _call(self, session: MCPSession, name: str, arguments: dict[str, Any]) -> str:
        try:
            return self._run(session, name, arguments)
        except ToolError:
            raise
        except Exception as exc:  # whatever else goes wrong is an observation, never a crash
            raise ToolError(f"{name}: {_reason(exc)}") from None

    def _run(self, session: MCPSession, name: str, arguments: dict[str, Any]) -> str:
        i, raw = self._route[name]
        conn = self.connections[i]
        for attempt in (1, 2):
            if i in self.down:
                raise ToolError(f"the tool server is down ({self.down[i]})")
            generation = conn.generation
            if i not in session.generations:
                session.generations[i] = generation
            elif session.generations[i] != generation:  # another episode's call restarted it
                session.incidents.append(f"{name}: the server was restarted during the episode")
                session.generations[i] = generation
            try:
                text, error = conn.call(raw, arguments, self.timeout_s)
            except TimeoutError:
                raise ToolError(f"{name} did not answer within {self.timeout_s:g} s") from None
            except CallRefused as exc:
                raise ToolError(f"{name}: {exc}") from None
            except ServerDown as exc:
                if attempt == 2:
                    raise ToolError(f"the tool server stopped answering ({exc})") from None
                self._restart(session, i, name, _reason(exc))
                continue
            if error:
                raise ToolError(text)
            return text
        raise AssertionError("unreachable")

    def _restart(self, session: MCPSession, i: int, name: str, why: str) -> None:
        """Start server ``i`` again after it stopped; after ``max_restarts`` failures in a row it
        is given up: later calls answer at once that it is down."""
        conn = self.connections[i]
        try:
            conn.restart()
        except EnvError as again:
            self.failed_restarts[i] = self.failed_restarts.get(i, 0) + 1
            session.incidents.append(f"{name}: the server stopped ({why}); no restart ({again})")
            if self.failed_restarts[i] >= self.max_restarts:
                self.down[i] = f"{self.failed_restarts[i]} restarts failed; the last: {again}"
                warnings.warn(
                    f"{self.name}: {self.down[i]}; later calls get an Error: observation",
                    stacklevel=2,
                )
            raise ToolError(f"the tool server stopped and did not restart ({again})") from None
        self.restarts += 1
        self.failed_restarts[i] = 0
        session.incidents.append(f"{name}: the server stopped ({why}); restarted")
        session.generations[i] = conn.generation


class MCPEnv(ServedTools):
    """The tools of an MCP server and a JSONL task set (module docstring)."""

    name = "mcp"

    def __init__(
        self,
        tasks: str,
        command: str | list[str] | None = None,
        url: str | None = None,
        metric: str = "em",
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        max_restarts: int = 3,
        server_env: dict[str, str] | None = None,
        max_context_tokens: int | None = None,
        judge: Any = None,
    ) -> None:
        super().__init__(metric=metric, judge=judge)
        if isinstance(command, str):
            command = shlex.split(command)
        if command is not None and not command:
            raise EnvError("mcp: command is empty")
        self._tasks = read_tasks(tasks)
        self.timeout_s = float(timeout_s)
        self.max_restarts = int(max_restarts)
        self.max_context_tokens = max_context_tokens
        conn = MCPConnection(command, url, env=server_env, start_timeout_s=float(start_timeout_s))
        self._open([(conn, "")])

    def oracle_plan(self, task: Task) -> Plan:
        raise NotImplementedError(
            "mcp environments have no expert plan: use the LLM teacher (teacher.kind=llm), "
            "which reviews runs against the task's answer and evidence"
        )
