"""Progress for long jobs: a rich bar on a terminal, plain log lines anywhere else.

A rich live bar written to a pipe or a file (a Slurm job's log) appears only once, at the end, so
the log stays empty for hours. :func:`progress` returns rich's ``Progress`` when stdout is a
terminal and :class:`LogProgress` otherwise: the same calls (``add_task``, ``update``,
``advance``, ``start``, ``stop``, ``with``), each change printed as one flushed line with the
count, the elapsed time and the task's fields, at most one line per ``every_s`` seconds per task
(the last one always).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class _Task:
    name: str
    total: float | None
    completed: float
    fields: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    printed_at: float | None = None  # when the last line was printed
    printed: float | None = None  # the count it showed


class LogProgress:
    """Plain-line progress with the subset of ``rich.progress.Progress`` that acmrl uses."""

    def __init__(
        self, name: str, stream: TextIO | None = None, every_s: float = 10.0, disable: bool = False
    ) -> None:
        self.name, self.stream, self.every_s, self.disable = name, stream, every_s, disable
        self.tasks: dict[int, _Task] = {}

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        """The last state of every task, unless its line was printed already."""
        for task_id, task in self.tasks.items():
            if task.printed != task.completed:
                self._print(task_id, force=True)

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **fields: Any
    ) -> int:
        task_id = len(self.tasks)
        self.tasks[task_id] = _Task(description, total, completed, dict(fields))
        return task_id

    def update(
        self,
        task_id: int,
        *,
        completed: float | None = None,
        advance: float | None = None,
        total: float | None = None,
        **fields: Any,
    ) -> None:
        task = self.tasks[task_id]
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        if total is not None:
            task.total = total
        task.fields.update(fields)
        done = task.total is not None and task.completed >= task.total
        self._print(task_id, force=done)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _print(self, task_id: int, force: bool = False) -> None:
        task = self.tasks[task_id]
        now = time.monotonic()
        recent = task.printed_at is not None and now - task.printed_at < self.every_s
        if self.disable or (recent and not force):
            return
        task.printed_at, task.printed = now, task.completed
        s = int(now - task.started)
        total = f"/{task.total:g}" if task.total is not None else ""
        info = " ".join(str(v) for v in task.fields.values() if v)
        line = (
            f"{self.name} {task.completed:g}{total} [{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}]"
        )
        print(f"{line} {info}".rstrip(), file=self.stream or sys.stdout, flush=True)


def progress(name: str, *columns: Any, visible: bool = True, every_s: float = 10.0) -> Any:
    """A rich ``Progress`` with ``columns`` on a terminal; :class:`LogProgress` lines otherwise."""
    if sys.stdout.isatty():
        from rich.progress import Progress

        return Progress(*columns, disable=not visible)
    return LogProgress(name, every_s=every_s, disable=not visible)
