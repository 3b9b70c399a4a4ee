"""code_nav: ast-derived questions with known answers, the import check, root confinement, and
the real standard library of this interpreter."""

from __future__ import annotations

import os
import re
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from acmrl.envs import EnvError, load
from acmrl.envs.code_questions import TEMPLATES

FILES = {
    "shapes/__init__.py": """
        from .base import Shape
        from .round import Circle, area as circle_area
        from .helpers import scale
        from .late import Thing
        from .multi import (
            first,
            second,
        )
        Thing = dict  # rebinds the re-exported name at runtime
    """,
    "shapes/multi.py": """
        def first():
            return 1

        def second():
            return 2
    """,
    "shapes/base.py": """
        class Shape:
            def describe(self):
                return "shape"

            def area(self):
                raise NotImplementedError

        class Polygon(Shape):
            def area(self):
                return 0

        class Square(Polygon):
            def side(self):
                return 1

        class Triangle(Polygon):
            pass

        class Hexagon(Polygon):
            pass
    """,
    "shapes/round.py": """
        from .impl.circle import Circle

        def area (r, pi=3.14):  # a space before the parenthesis, as distutils writes
            return pi * r * r
    """,
    "shapes/impl/__init__.py": "",
    "shapes/impl/circle.py": """
        class Circle:
            pass
    """,
    "shapes/helpers.py": """
        def scale(shape, factor=-2, *, mode='fast', strict=None):
            return shape
    """,
    "shapes/late.py": """
        class Thing:
            pass
    """,
    "tests/test_skip.py": "def hidden(x=1):\n    return x\n",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    (tmp_path / "secret.txt").write_text("outside the root\n")
    os.symlink(tmp_path / "secret.txt", root / "shapes" / "leak.txt")
    os.symlink(tmp_path, root / "shapes" / "up")
    return root


def by_template(env) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for split in env.splits:
        for t in env.tasks(split):
            out.setdefault(t.metadata["template"], {})[t.prompt] = t.answer
    return out


def test_questions_from_ast_have_the_right_answers(tree):
    env = load("code_nav", root=tree, eval_frac=0.5)
    qs = by_template(env)
    reexports = {p.split("`")[3]: a for p, a in qs["reexport"].items()}
    assert reexports["Circle"] == ["shapes.impl.circle", "shapes/impl/circle.py"]  # followed
    assert reexports["circle_area"][0] == "shapes.round"
    assert reexports["scale"][0] == "shapes.helpers"
    mro = {p.split("`")[3]: a for p, a in qs["mro_method"].items()}
    assert mro["Square"] == ["Polygon", "shapes.base.Polygon"]  # area overridden in Polygon
    assert mro["Polygon"] == ["Shape", "shapes.base.Shape"]  # describe from Shape
    defaults = {p.split("`")[1]: a for p, a in qs["param_default"].items()}
    assert defaults == {"area": ["3.14"], "scale": ["-2"]}  # None is skipped, hidden/ excluded
    (subs,) = qs["subclasses"].values()
    assert subs == ["Square", "Triangle", "Hexagon"]
    assert env.report["reexport"]["ast_only"] == env.report["reexport"]["candidates"]


def test_every_oracle_plan_scores_one(tree):
    env = load("code_nav", root=tree, eval_frac=0.5)
    tasks = env.tasks("train") + env.tasks("eval")
    assert len(tasks) == sum(r["candidates"] for r in env.report.values())
    for task in tasks:
        session = env.session(task)
        for name, args in env.oracle_plan(task):
            obs = session.call(name, args)
            assert not obs.startswith("Error"), (task.prompt, name, args, obs)
        assert session.score() == 1.0, task.prompt


def _shown_lines(observation: str) -> set[tuple[str, int]]:
    """(path, line) pairs an observation names: grep's ``path:N:`` hits, a read's numbered lines."""
    shown = set()
    for line in observation.splitlines():
        m = re.match(r"^([^:\s]+):(\d+): ", line)
        if m:
            shown.add((m.group(1), int(m.group(2))))
    return shown


def test_every_line_an_oracle_plan_reads_was_shown_to_the_agent_first(tree):
    """The teacher's plans are demonstrations a student imitates: a read_file starts at, or just
    above, a line an earlier tool output of the same episode showed in that file (a grep hit),
    never at a number the plan took from the ast alone (a one-line re-export is found by grep
    alone; one spread over lines is read from its `from` line, which the same grep shows)."""
    env = load("code_nav", root=tree, eval_frac=0.5)
    tasks = env.tasks("train") + env.tasks("eval")
    multi = [t for t in tasks if "`second`" in t.prompt]
    assert multi and any(n == "read_file" for n, _ in env.oracle_plan(multi[0]))
    for task in tasks:
        session, shown = env.session(task), set()
        for name, args in env.oracle_plan(task):
            if name == "read_file":
                near = [n for p, n in shown if p == args["path"] and 0 <= n - args["start"] <= 2]
                assert near, (task.prompt, args, sorted(shown))
            shown |= _shown_lines(session.call(name, args))
        assert session.score() == 1.0, task.prompt


def test_import_check_drops_an_answer_the_interpreter_contradicts(tree, monkeypatch):
    monkeypatch.syspath_prepend(str(tree))
    env = load("code_nav", root=tree, check_imports=True, eval_frac=0.5)
    assert env.report["reexport"]["mismatch"] == 1  # Thing is rebound to dict at runtime
    # Shape, Circle, circle_area, scale, first, second
    assert env.report["reexport"]["confirmed"] == 6
    assert env.report["mro_method"] == {  # Square, Triangle, Hexagon: area; Polygon: describe
        "candidates": 4,
        "confirmed": 4,
        "mismatch": 0,
        "ast_only": 0,
    }
    prompts = [t.prompt for s in env.splits for t in env.tasks(s)]
    assert not [p for p in prompts if "`Thing`" in p]
    assert all(t.metadata["checked"] == "import" for s in env.splits for t in env.tasks(s))


def test_parameter_defaults_compare_as_python_values(tree):
    env = load("code_nav", root=tree, templates=["param_default"], eval_frac=0.0)
    task = next(t for t in env.tasks("train") if "`scale`" in t.prompt)
    assert env.score(task, "-2") == 1.0
    assert env.score(task, "`-2`") == 1.0
    assert env.score(task, "2") == 0.0  # SQuAD normalisation would have called this right
    assert env.score(task, "-2.0") == 0.0  # a float is not the int default
    assert env.score(task, "minus two") == 0.0


def test_tools_stay_inside_the_root(tree):
    env = load("code_nav", root=tree)
    s = env.session(env.tasks("train")[0] if env.tasks("train") else env.tasks("eval")[0])
    assert "is outside the code base" in s.call("read_file", {"path": "../secret.txt"})
    assert "is outside the code base" in s.call(
        "read_file", {"path": str(tree.parent / "secret.txt")}
    )
    leak = s.call("read_file", {"path": "shapes/leak.txt"})
    assert "symbolic link that leads outside" in leak and "outside the root" not in leak
    assert "symbolic link" in s.call("list_dir", {"path": "shapes/up"})
    assert "symbolic link" in s.call("grep", {"pattern": "root", "path": "shapes/up/secret.txt"})
    assert "outside the root" not in s.call("grep", {"pattern": "outside", "path": "."})
    assert "excluded" in s.call("read_file", {"path": "tests/test_skip.py"})
    assert "tests" not in s.call("list_dir", {"path": "."})
    # the absolute path of a file inside the root is fine
    assert "class Circle" in s.call("read_file", {"path": str(tree / "shapes/impl/circle.py")})


def test_tool_errors_name_the_problem(tree):
    env = load("code_nav", root=tree)
    s = env.session((env.tasks("train") + env.tasks("eval"))[0])
    assert (
        s.call("read_file", {"path": "shapes/nope.py"})
        == "Error: no such file or directory: 'shapes/nope.py'"
    )
    assert "is a directory; use list_dir" in s.call("read_file", {"path": "shapes"})
    assert "is a file, not a directory" in s.call("list_dir", {"path": "shapes/base.py"})
    assert "lines are numbered from 1" in s.call(
        "read_file", {"path": "shapes/base.py", "start": 0}
    )
    assert "has only" in s.call("read_file", {"path": "shapes/base.py", "start": 999})
    assert "bad regular expression '(('" in s.call("grep", {"pattern": "(("})
    assert s.call("grep", {"pattern": "zzz_nothing"}).startswith("No matches")
    out = s.call("read_file", {"path": "shapes/base.py", "start": 2, "end": 3})
    assert out.splitlines()[1:] == [
        "    2|     def describe(self):",
        '    3|         return "shape"',
    ]
    assert "shapes/base.py:8: class Polygon(Shape):" in s.call(
        "grep", {"pattern": r"^class Polygon"}
    )
    with pytest.raises(EnvError, match="is not a directory"):
        load("code_nav", root=tree / "nowhere")
    with pytest.raises(EnvError, match=r"no template\(s\) \['trivia'\]"):
        load("code_nav", root=tree, templates=["trivia"])


def test_read_file_pages_long_files(tree):
    env = load("code_nav", root=tree, max_read_lines=3)
    s = env.session((env.tasks("train") + env.tasks("eval"))[0])
    out = s.call("read_file", {"path": "shapes/base.py"})
    assert "lines 1-3 of" in out and "continue with start=4" in out


def test_the_standard_library_here():
    """Counts per template on this interpreter's stdlib; each shipped answer was confirmed on
    the imported object (or could not be imported), and the expert's plan gets it right."""
    env = load("code_nav")
    for template in TEMPLATES:
        counts = env.report[template]
        assert counts["confirmed"] >= 40, (template, counts)
        assert counts["mismatch"] <= 0.1 * counts["candidates"], (template, counts)
    tasks = env.tasks("eval")
    assert Counter(t.metadata["template"] for t in tasks).keys() == set(TEMPLATES)
    for task in tasks:
        session = env.session(task)
        for name, args in env.oracle_plan(task):
            assert not session.call(name, args).startswith("Error"), (task.prompt, name, args)
        assert session.score() == 1.0, task.prompt
