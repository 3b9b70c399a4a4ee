"""Long jobs log plain progress lines when stdout is not a terminal (a Slurm job's log)."""

from __future__ import annotations

import io

from acmrl.progress import LogProgress, progress


def test_log_progress_prints_lines_as_it_goes():
    out = io.StringIO()
    p = LogProgress("sft", stream=out, every_s=0.0)
    bar = p.add_task("sft", total=3, completed=0, info="")
    p.start()
    for step in (1, 2, 3):
        p.update(bar, completed=step, info=f"loss {1 / step:.2f}")
        assert out.getvalue().count("\n") == step  # each step is in the log when it happens
    p.stop()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sft 1/3 [0:00:0") and lines[0].endswith("loss 1.00")
    assert lines[-1].startswith("sft 3/3") and len(lines) == 3  # stop() adds no duplicate


def test_log_progress_throttles_but_always_shows_the_end():
    out = io.StringIO()
    with LogProgress("rollout", stream=out, every_s=3600) as p:
        bar = p.add_task("episodes", total=10, completed=0, last="")
        for _ in range(9):
            p.advance(bar)
    lines = out.getvalue().splitlines()
    assert lines == [lines[0], lines[-1]] and lines[0].startswith("rollout 1/10")
    assert lines[-1].startswith("rollout 9/10")  # the state at stop


def test_not_a_terminal_gets_log_lines(capsys):
    assert isinstance(progress("annotate"), LogProgress)  # pytest's captured stdout is no tty
