"""The evolve sandbox process: QuickJS in a child process whose time limit is enforced from outside.

QuickJS checks its own time limit between bytecode instructions only, so model-written code that
spends its time inside one native call (a catastrophic-backtracking regular expression, a huge
``String.prototype.repeat``) is never interrupted from within. :class:`JSWorker` therefore runs
every script in a persistent child process and waits for
the answer with a wall-clock deadline of the time limit plus a margin; past it, the child is
killed and respawned and the script is refused with the time-limit error. Inside the child the
same script still runs under QuickJS's own CPU-time, heap and stack limits, which stop the common
cases (a plain infinite loop, runaway recursion, allocation) with their precise error, sooner.

The child is this file run as a script, isolated (``python -I``), and imports nothing but
``quickjs``. Messages are length-prefixed bytes on its stdin and
stdout: a request is the limits, the code and the State JSON; a reply is a status byte (0: the
result JSON, 1: a refusal message) and its text. A worker belongs to the process that spawned it;
a forked child that inherits one starts its own.
"""

from __future__ import annotations

import atexit
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

KiB, MiB = 1024, 1024 * 1024
_REQUEST = struct.Struct("<IIIII")  # time_ms, heap_bytes, stack_bytes, len(code), len(state)
_REPLY = struct.Struct("<BI")  # status, len(text)
_READY = b"R"

# The harness wrapper. It captures the built-ins it relies on before the model's code runs, so
# that code cannot subvert them by patching globals or prototypes, and it removes the inputs
# from the global object.
WRAPPER = r"""
(function () {
  "use strict";
  const parse = JSON.parse, stringify = JSON.stringify, isArray = Array.isArray;
  const isFinite = Number.isFinite, ctor = Function, Err = Error;
  const input = parse(globalThis.__acmrl_state);
  const body = globalThis.__acmrl_code;
  delete globalThis.__acmrl_state;
  delete globalThis.__acmrl_code;
  let out;
  try {
    out = ctor("state", '"use strict";\n' + body)(input);
  } catch (e) {
    // the model may throw null/undefined; QuickJS reports running out of memory while throwing
    // as a null exception, so a null that reaches Python means the heap limit
    if (e === null || e === undefined) throw new Err("[harness] the code threw " + e);
    throw e;
  }
  if (out !== null && (typeof out === "object" || typeof out === "function") &&
      typeof out.then === "function") {
    throw new Err("[harness] evolve must return the State synchronously; it returned a Promise");
  }
  if (!isArray(out)) throw new Err("[harness] evolve must return the State array, got " + typeof out);
  return stringify(out, function (key, value) {
    const t = typeof value;
    if (t === "undefined" || t === "function" || t === "symbol" || t === "bigint") {
      throw new Err("[harness] the returned State holds a non-JSON value (" + t + ")");
    }
    if (t === "number" && !isFinite(value)) {
      throw new Err("[harness] the returned State holds a non-finite number");
    }
    return value;
  });
})()
"""


class SandboxRefused(Exception):
    """The script was refused; the message says why (it goes into the evolve receipt)."""


def time_limit_error(time_ms: int) -> str:
    return f"time limit of {time_ms} ms exceeded"


def js_error(exc: Exception, time_ms: int, heap_bytes: int, stack_bytes: int) -> str:
    import quickjs

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, quickjs.StackOverflow) or "stack overflow" in first:
        return f"stack limit of {stack_bytes // KiB} KiB exceeded"
    if "interrupted" in first:
        return time_limit_error(time_ms)
    # at the heap limit QuickJS may fail to allocate even the error's message, and the binding
    # then reports that it could not read it
    if "out of memory" in first or first == "null" or "Failed obtaining QuickJS error" in first:
        return f"memory limit of {heap_bytes // MiB} MiB exceeded"
    if "[harness] " in first:
        return first.split("[harness] ", 1)[1]
    return f"the code threw: {first[:300]}"


def run_here(state_json: str, code: str, time_ms: int, heap_bytes: int, stack_bytes: int) -> str:
    """Run ``code`` over the State in a fresh, limited QuickJS context of this process; return
    the result JSON. Only QuickJS's own limits apply here (the child process's side)."""
    import quickjs

    # A context that hit a limit is never reused: QuickJS can be left inconsistent by an
    # out-of-memory error, so each run gets its own context and drops it afterwards.
    ctx = quickjs.Context()
    ctx.set_memory_limit(heap_bytes)
    ctx.set_max_stack_size(stack_bytes)
    ctx.set_time_limit(time_ms / 1000.0)
    try:
        ctx.set("__acmrl_state", state_json)
        ctx.set("__acmrl_code", code)
        result = ctx.eval(WRAPPER)
    except quickjs.JSException as exc:
        raise SandboxRefused(js_error(exc, time_ms, heap_bytes, stack_bytes)) from None
    finally:
        del ctx
    if not isinstance(result, str):
        raise SandboxRefused("evolve did not produce a State")
    return result


# -- the child ------------------------------------------------------------------------------------


def _read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def main() -> None:
    """The child's loop: one request in, one reply out, until stdin closes."""
    import quickjs  # noqa: F401  (imported before the parent is told the worker is ready)

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(_READY)
    stdout.flush()
    while True:
        try:
            time_ms, heap, stack, n_code, n_state = _REQUEST.unpack(
                _read_exact(stdin, _REQUEST.size)
            )
            code = _read_exact(stdin, n_code).decode()
            state = _read_exact(stdin, n_state).decode()
        except EOFError:
            return
        try:
            status, text = 0, run_here(state, code, time_ms, heap, stack)
        except SandboxRefused as exc:
            status, text = 1, str(exc)
        except Exception as exc:  # a binding error must not end the worker
            status, text = 1, f"the sandbox failed: {type(exc).__name__}: {exc}"[:400]
        payload = text.encode()
        stdout.write(_REPLY.pack(status, len(payload)) + payload)
        stdout.flush()


# -- the parent -----------------------------------------------------------------------------------


class JSWorker:
    """A persistent sandbox child process with a hard, wall-clock deadline per script.

    ``run`` is thread-safe (scripts run one at a time). ``margin_ms`` is added to a script's time
    limit before the child is killed; the child's startup never counts against a script.
    """

    def __init__(self, margin_ms: int = 250, start_timeout_s: float = 60.0) -> None:
        self.margin_ms = margin_ms
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._owner = 0
        self._lock = threading.Lock()
        self.restarts = 0  # children killed after an overrun or a crash

    def _spawn(self) -> None:
        # this very file, isolated (-I: no working folder, environment or user site on the
        # path): the child runs exactly this code whatever the caller's folder holds
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._ready, self._owner = False, os.getpid()

    def _live(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._owner != os.getpid() or self._proc.poll() is not None:
            if self._proc is not None and self._owner == os.getpid():
                self._kill()
            self._spawn()
        assert self._proc is not None
        if not self._ready:
            if self._read(self._proc, 1, time.monotonic() + self.start_timeout_s) != _READY:
                self._kill()
                raise SandboxRefused("the sandbox process did not start")
            self._ready = True
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.kill()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], n: int, deadline: float) -> bytes | None:
        """``n`` bytes from the child, or None at the deadline or at end of file."""
        assert proc.stdout is not None
        fd, chunks, got = proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, n - got)
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def run(
        self,
        state_json: str,
        code: str,
        time_ms: int,
        heap_bytes: int,
        stack_bytes: int,
        margin_ms: int | None = None,
    ) -> str:
        """The result JSON of ``code`` over the State; :class:`SandboxRefused` with the reason
        otherwise. Returns within ``time_ms`` + ``margin_ms`` (+ the pipe transfers)."""
        margin = self.margin_ms if margin_ms is None else margin_ms
        code_b, state_b = code.encode(), state_json.encode()
        header = _REQUEST.pack(time_ms, heap_bytes, stack_bytes, len(code_b), len(state_b))
        with self._lock:
            proc = self._live()
            assert proc.stdin is not None
            try:
                proc.stdin.write(header + code_b + state_b)
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._restart()
                raise SandboxRefused("the sandbox process failed") from None
            # the clock starts once the script is handed over: a large State's transfer is not
            # the script's time
            deadline = time.monotonic() + (time_ms + margin) / 1000.0
            head = self._read(proc, _REPLY.size, deadline)
            if head is None:
                crashed = proc.poll() is not None
                self._restart()
                if crashed:
                    raise SandboxRefused("the sandbox process crashed")
                raise SandboxRefused(time_limit_error(time_ms))
            status, size = _REPLY.unpack(head)
            body = self._read(proc, size, time.monotonic() + 30.0) if size else b""
            if body is None:
                self._restart()
                raise SandboxRefused("the sandbox process failed")
        text = body.decode()
        if status:
            raise SandboxRefused(text)
        return text

    def _restart(self) -> None:
        """Kill the child and start its successor now, so that it is ready by the next call."""
        self.restarts += 1
        self._kill()
        self._spawn()

    def close(self) -> None:
        with self._lock:
            if self._owner == os.getpid():
                self._kill()
            self._proc = None


_WORKER: JSWorker | None = None
_WORKER_LOCK = threading.Lock()


def worker() -> JSWorker:
    """This process's sandbox worker (started on first use, stopped at exit)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = JSWorker()
            atexit.register(_WORKER.close)
        return _WORKER


def _forget_after_fork() -> None:
    """A forked child starts its own worker: the inherited one (and its lock) is the parent's."""
    global _WORKER, _WORKER_LOCK
    _WORKER, _WORKER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


if __name__ == "__main__":
    main()
