"""code_nav's chain preset: arg_flow questions over a small code base whose answers are known by
hand, the shortcuts they exclude, and the tools that show definitions without their code."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from acmrl.envs import EnvError, load

FILES = {
    "post/__init__.py": "",
    "post/desk.py": """
        from post.routing import route
        from post.stamps import stamp


        def send(config, letter, verbose):
            handle = config.handle
            if verbose:
                print(handle)
            route(handle, letter.address, letter.body)
            stamp(letter, letter.address, None)


        def twice(a, b):
            route(a, b, a)
            route(b, a, b)


        class Clerk:
            def file(self, box, note):
                return self._sort(box.tray, note.text, box)

            def _sort(self, tray, text, box):
                return self._drop(text, tray)

            def _drop(self, item, where):
                return where.append(item)
    """,
    "post/routing.py": """
        from post.sink import deliver


        def route(target, address, payload):
            # a comment line
            deliver(payload, target)
    """,
    "post/stamps.py": """
        from post.sink import deliver


        def stamp(letter, where, mark):
            deliver(mark, where)
    """,
    "post/edge.py": """
        from post.sink import deliver


        def by_keyword(a, b, c):
            fan(a, sink=b, body=c)


        def fan(x, body, sink):
            deliver(body, sink)


        def outer(one, two, three):
            nest(one, two, three)


        def nest(a, b, c):
            def inner(b, a):
                return deliver(b, a)

            return inner


        def shadow(p1, p2, p3):
            from os.path import join as fan

            fan(p1, p2, p3)


        def long_caller(cfg, item, extra):
            relay(cfg.a, extra, item.v)


        def relay(u, w, z):
            k2(z, u)


        def k2(
            first,  # the one asked about
            second,
        ):
            return first
    """,
    "post/sink.py": """
        def deliver(body, sink):
            return sink(body)
    """,
}


def _write(root: Path, files: dict[str, str], pad: int | None = None) -> Path:
    """Write ``files`` under ``root``, each ``def`` padded with ``pad`` docstring lines."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip() if pad is None else _padded(text, pad))
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _write(tmp_path, FILES)


def test_arg_flow_questions_are_the_unguessable_ones(root):
    env = load("code_nav", root=root, preset="chain", eval_frac=0.0)
    tasks = {t.metadata["template"]: t for t in env.tasks("train")}
    got = sorted((t.prompt.split("`")[3], t.answer) for t in env.tasks("train"))
    # send -> route -> deliver: q=body is payload, f's third argument; q=sink is target, f's
    # first argument (a shortcut: dropped). stamp's answers are a constant (None) and an
    # argument at its own position; twice calls route twice (ambiguous); Clerk.file -> _sort ->
    # _drop: item is text, the
    # second argument, but the argument at item's position (first) is box.tray: kept
    assert got == [
        ("Clerk.file", "note.text"),
        ("long_caller", "item.v"),
        ("send", "letter.body"),
    ], got
    assert env.report["arg_flow"]["candidates"] == 3
    # not asked: fan passes on its parameters named like deliver's (body=c would name the
    # answer), nest's call is in a nested function, shadow's fan is a local import
    long = next(t for t in env.tasks("train") if t.answer == "item.v")
    assert [e.text for e in env.answer_evidence(long)] == [
        "relay(cfg.a, extra, item.v)",
        "def relay(u, w, z):",
        "k2(z, u)",
        "def k2(",
        "first,  # the one asked about",
        "second,",
        "):",
    ]
    assert set(tasks) == {"arg_flow"}
    send = next(t for t in env.tasks("train") if t.answer == "letter.body")
    assert "`deliver`" in send.prompt and "parameter `body`" in send.prompt
    assert send.metadata["arguments"] == ["handle", "letter.address", "letter.body"]
    for term in ("handle", "letter.address", "letter.body", "post/desk.py"):
        assert term in env.key_terms(send)


def test_the_oracle_plan_reads_three_windows_and_answers(root):
    env = load("code_nav", root=root, preset="chain", eval_frac=0.0, max_read_lines=5)
    task = next(t for t in env.tasks("train") if t.answer == "letter.body")
    plan = env.oracle_plan(task)
    names = [n for n, _ in plan]
    # send's call is on its 5th line: one window of 5 lines shows it
    assert names == ["find_def", "read_file"] * 3 + ["answer"]
    session = env.session(task)
    shown = "\n".join(str(session.call(n, a)) for n, a in plan)
    assert session.score() == 1.0
    for ev in env.answer_evidence(task):
        assert ev.text in shown
    assert [e.text for e in env.answer_evidence(task)] == [
        "route(handle, letter.address, letter.body)",
        "def route(target, address, payload):",  # which of f's arguments binds to payload
        "deliver(payload, target)",
        "def deliver(body, sink):",
    ]
    # a window too short for the call pages on
    short = load("code_nav", root=root, preset="chain", eval_frac=0.0, max_read_lines=2)
    task = next(t for t in short.tasks("train") if t.answer == "letter.body")
    reads = [a["start"] for n, a in short.oracle_plan(task) if n == "read_file"]
    assert reads[:3] == [5, 7, 9]  # send is defined on line 5, its call is on line 9


def test_chain_tools_show_where_not_what(root):
    env = load("code_nav", root=root, preset="chain", eval_frac=0.0, max_read_lines=3)
    task = env.tasks("train")[0]
    s = env.session(task)
    assert [t["function"]["name"] for t in env.tools()] == ["find_def", "read_file"]
    assert s.call("find_def", {"name": "deliver"}) == "post/sink.py:1: def deliver"
    assert s.call("find_def", {"name": "Clerk._sort"}) == "post/desk.py:22: def Clerk._sort"
    assert "No function or method named 'nothing'" in s.call("find_def", {"name": "nothing"})
    window = s.call("read_file", {"path": "post/routing.py", "start": 4})
    assert window.splitlines()[0] == "post/routing.py lines 4-6 of 6"
    assert "Error" in s.call("read_file", {"path": "post/routing.py", "start": 2, "end": 9})
    assert s.call("grep", {"pattern": "deliver"}).startswith("Error: unknown tool 'grep'")


def test_answers_compare_as_expressions(root):
    env = load("code_nav", root=root, preset="chain", eval_frac=0.0)
    task = next(t for t in env.tasks("train") if t.answer == "letter.body")
    assert env.score(task, "`letter . body`") == 1.0
    assert env.score(task, "letter.address") == 0.0
    assert env.score(task, "letter.body)") == 0.0  # not an expression


def test_unknown_preset_is_named(root):
    with pytest.raises(EnvError, match="no preset 'chains'"):
        load("code_nav", root=root, preset="chains")


def _padded(text: str, n: int) -> str:
    """``text`` with an ``n``-line docstring after every ``def`` line (long definitions)."""
    out = []
    for line in textwrap.dedent(text).lstrip().splitlines():
        out.append(line)
        if line.lstrip().startswith("def ") and line.rstrip().endswith(":"):
            pad = " " * (len(line) - len(line.lstrip()) + 4)
            out += [f'{pad}"""Notes.'] + [f"{pad}Line {i} of the notes." for i in range(n)]
            out.append(f'{pad}"""')
    return "\n".join(out) + "\n"


def _audit_config(
    tmp_path: Path, model: Path, files: dict[str, str], pad: int, preset: str, budget: int
) -> Any:
    """An audit of ``files`` (each ``def`` padded with ``pad`` docstring lines) under the
    preset, every question in the eval split: react, summary and acm, and the two trivial
    strategies that read the call."""
    from acmrl.config import AuditConfig

    _write(tmp_path / "code", files, pad)
    cfg = AuditConfig(output=str(tmp_path / "audit"))
    cfg.model.name = str(model)
    cfg.env.name = "code_nav"
    cfg.env.options = {"root": str(tmp_path / "code"), "preset": preset, "eval_frac": 1.0}
    cfg.agent.max_context_tokens = budget
    cfg.arms = ["react", "summary", "acm"]
    cfg.trivial = [
        "first_argument",
        "random_argument",
        *(["def_line"] if preset == "trace" else []),
    ]
    return cfg


def test_audit_of_the_chain_preset(tmp_path, default_model_dir):
    """On long definitions three windows overflow react; summary and acm carry the call's
    line in their notes and answer; a guess among the call's arguments is what reading one
    definition buys."""
    from acmrl.eval.audit import run_audit

    cfg = _audit_config(tmp_path, default_model_dir, FILES, 24, "chain", 1600)
    report = run_audit(cfg)
    rows = {(r["strategy"], r["arm"]): r for r in report["strategies"]}
    assert report["tasks"] == 3
    assert rows[("ceiling", "react")]["pass@1"] == 0.0
    assert rows[("ceiling", "react")]["overflow"] == 1.0
    for arm in ("summary", "acm"):
        assert rows[("ceiling", arm)]["pass@1"] == 1.0, arm
        assert rows[("ceiling", arm)]["overflow"] == 0.0, arm
    assert rows[("first_argument", "react")]["pass@1"] == 0.0  # excluded by construction


def test_a_mixture_asks_its_members_for_notes_and_reads(root):
    from acmrl.envs.mixture import Mixture

    opts = {"root": str(root), "preset": "chain", "eval_frac": 0.0}
    mix = Mixture([{"name": "code_nav", "options": opts}, {"name": "kb_search"}])
    task = next(t for t in mix.tasks("train") if t.answer == "letter.body")
    window = mix.session(task).call("read_file", {"path": "post/desk.py", "start": 5})
    assert mix.notes_of(task, window) == [
        "post/desk.py:9: route(handle, letter.address, letter.body)"
    ]
    assert mix.read_tools == ("read_file", "open")


USE_FILES = {
    "net/__init__.py": "",
    "net/app.py": """
        from net.link import connect, noisy


        def start(settings, host_name, port_no):
            log = settings.log
            connect(host_name, settings.retries, port_no)


        def restart(host_name, tries, port_no):
            connect(host_name, tries, port_no)


        def again(host_name, port_no):
            noisy(host_name, port_no)
    """,
    "net/link.py": """
        from net.sock import open_socket


        def connect(host, tries, port):
            open_socket(port, host, tries)


        def noisy(host, port):
            print(host)
            open_socket(port, host, 1)
    """,
    "net/sock.py": """
        def open_socket(p, h, attempts):
            if attempts < 1:
                raise ValueError(attempts)
            addr = (h, p)
            return addr
    """,
    "net/more.py": """
        def pack(a, b):
            name = a.label
            store(name, b)


        def store(n, m):
            return n, m


        def hop(a, b):
            keep(b, a)


        def keep(x, y):
            z = y
            return x, z


        def lam(a, b):
            go = lambda: store(a, 1)
            keep(a, b)


        def derived(item, box):
            pack(item, box)


        def wrapped(item, box):
            print(hop(item, box))


        def fine(item, box):
            hop(item, box)


        def hidden(item, box):
            lam(item, box)
    """,
    "net/near.py": """
        def outer(a, b):
            inner(b, a)


        def inner(x, y):
            helper(y)


        def helper(z):
            return z + 1
    """,
}


@pytest.fixture
def use_root(tmp_path: Path) -> Path:
    return _write(tmp_path, USE_FILES)


def test_first_use_follows_a_call_by_its_line_to_the_first_read(use_root):
    """start's line 6 -> connect -> open_socket: open_socket reads attempts first (line 2),
    connect's tries, start's settings.retries. noisy hands its values to two calls (print and
    open_socket), so "the function it hands them on to" names none: not asked. near.py's chain
    is asked only when no window shows two of its three definitions' spans."""
    env = load("code_nav", root=use_root, preset="trace", eval_frac=0.0)
    assert env.window == 50 and env.max_context_tokens == 2200
    tasks = {t.prompt.split(" ")[1]: t for t in env.tasks("train")}
    assert sorted(tasks) == ["10", "6"]  # start's call and restart's; not again's, not near.py
    task = tasks["6"]
    assert task.answer == "settings.retries, line 2"
    assert task.prompt.startswith("Line 6 of `net/app.py` (in `start`) calls a function")
    assert "connect" not in task.prompt and "open_socket" not in task.prompt
    assert tasks["10"].answer == "tries, line 2"
    # start's and restart's questions share h and k: one group, one split
    assert len({env._questions[t.id].group for t in tasks.values()}) == 1
    found = env.session(task).call("find_def", {"name": "open_socket", "path": "net/sock.py"})
    assert env.line_guess(task, str(found)) == "port_no, line 2"  # k's first parameter, def + 1
    assert env.line_guess(task, "") is None  # not before find_def has shown k's line
    assert task.metadata["arguments"] == ["host_name", "settings.retries", "port_no"]
    assert [e.text for e in env.answer_evidence(task)] == [
        "connect(host_name, settings.retries, port_no)",
        "def connect(host, tries, port):",
        "open_socket(port, host, tries)",
        "def open_socket(p, h, attempts):",
        "if attempts < 1:",
    ]
    plan = env.oracle_plan(task)
    assert plan[0] == ("read_file", {"path": "net/app.py", "start": 6})
    assert [n for n, _ in plan] == ["read_file"] + ["find_def", "read_file"] * 2 + ["answer"]
    session = env.session(task)
    shown = [str(session.call(n, a)) for n, a in plan]
    assert session.score() == 1.0
    assert env.notes_of(task, shown[4]) == [
        "net/sock.py:1: def open_socket(p, h, attempts):",
        "net/sock.py:2: if attempts < 1:",
    ]
    for good in ("settings.retries, line 2", "`settings . retries` on line 2.", "settings.retries line 2", "settings.retries (line 2 of net/sock.py)"):  # fmt: skip
        assert env.score(task, good) == 1.0, good
    for bad in ("settings.retries", "settings.retries, line 3", "tries, line 2", "line 2"):
        assert env.score(task, bad) == 0.0, bad
    # dev and test halve the eval split by group (an h -> k pair is never in both)
    every = load("code_nav", root=use_root, preset="trace", eval_frac=1.0, max_read_lines=3)
    dev, test = every.tasks("dev"), every.tasks("test")
    assert sorted(t.id for t in dev + test) == sorted(t.id for t in every.tasks("eval"))
    assert {t.metadata["split"] for t in dev} <= {"dev"} and len(dev + test) == 4
    group = {t.id: every._questions[t.id].group for t in dev + test}
    assert not {group[t.id] for t in dev} & {group[t.id] for t in test}
    # a mixture takes a member's task in eval and in dev (or test) as the same task
    opts = {"root": str(use_root), "preset": "trace", "eval_frac": 1.0, "max_read_lines": 3}
    mix = load("mixture", envs=[{"name": "code_nav", "options": opts}])
    assert len(mix.tasks("dev") + mix.tasks("test")) == len(mix.tasks("eval")) == 4
    # more.py at three-line windows: only fine's call is asked. derived's pack hands store a
    # value built from its parameter (a.label) beside one of the values, wrapped's line is
    # print's call too, hidden's lam passes one on in a lambda as well
    more = [t for t in every.tasks("eval") if "more.py" in t.prompt]
    assert [(t.prompt.split("(in `")[1].split("`")[0], t.answer) for t in more] == [
        ("fine", "item, line 15")
    ]
    # three-line windows show no two of near.py's spans together: its chain is asked too
    near = load("code_nav", root=use_root, preset="trace", eval_frac=0.0, max_read_lines=3)
    (outer,) = [t for t in near.tasks("train") if "near.py" in t.prompt]
    assert outer.answer == "a, line 10" and outer.metadata["arguments"] == ["b", "a"]


def test_audit_of_the_trace_preset(tmp_path, default_model_dir):
    """On long definitions react overflows before the third read; summary and acm keep the
    call's arguments and each hop in their notes and answer; the trivial strategies know no
    line of the last function; react's noted ceiling answers only where the budget lets it
    see the last two definitions."""
    from acmrl.eval.audit import run_audit

    files = {k: v for k, v in USE_FILES.items() if k not in ("net/near.py", "net/more.py")}
    cfg = _audit_config(tmp_path, default_model_dir, files, 40, "trace", 1900)
    report = run_audit(cfg)
    rows = {(r["strategy"], r["arm"]): r for r in report["strategies"]}
    assert report["tasks"] == 2
    assert rows[("ceiling", "react")]["pass@1"] == 0.0
    for arm in ("summary", "acm"):
        assert rows[("ceiling", arm)]["pass@1"] == 1.0, arm
    assert rows[("noted", "react")]["pass@1"] == 0.0  # notes do not bring the third read
    for name in ("first_argument", "random_argument"):
        assert rows[(name, "react")]["pass@1"] == 0.0, name
    # def_line finds k without reading it and guesses its first read at the train offset
    # (eval_frac=1.0: no train split, offset 1): open_socket's def is line 1, its first read
    # below its 42-line docstring, so the guess misses
    assert rows[("def_line", "react")]["pass@1"] == 0.0
    # with room for the last two definitions, react reads all three; the overflow rule then
    # drops the first read, and only the react whose thoughts repeated its lines answers
    cfg.output, cfg.agent.max_context_tokens = str(tmp_path / "audit2"), 2400
    cfg.arms, cfg.trivial = ["react"], []
    rows = {r["strategy"]: r for r in run_audit(cfg)["strategies"]}
    assert rows["ceiling"]["tool_calls"] == rows["noted"]["tool_calls"] == 6.0
    assert (rows["ceiling"]["pass@1"], rows["noted"]["pass@1"]) == (0.0, 1.0)
