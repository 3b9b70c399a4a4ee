"""``code_nav``: questions about a real code base, answered by reading it with read-only tools.

By default the code base is the standard library of the running interpreter; any directory can be
given with ``root=``. Questions come from ``ast`` (see :mod:`acmrl.envs.code_questions`) and, when
the root is the running interpreter's standard library, are checked against the imported objects;
a question whose static answer disagrees with the real object is dropped and counted in
``env.report``. Tools: ``list_dir``, ``read_file(path, start, end)``, ``grep(pattern, path)`` and
``answer``. Every path is confined to the root: ``..``, absolute paths elsewhere and symlinks that
lead outside are refused, and excluded directories (tests, caches) are invisible.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import random
import re
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any

from acmrl.context.render import tool_schema
from acmrl.envs.base import EnvError, Environment, Evidence, Handler, Plan, Task, ToolError
from acmrl.envs.code_flow import Flow, Fn, arg_flow, first_use, functions
from acmrl.envs.code_questions import TEMPLATES, Question, find_questions, index_modules
from acmrl.envs.scoring import Judge

DEFAULT_EXCLUDE = (
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "ensurepip",
    ".git",
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def package_root(name: str) -> Path:
    """The directory of an installed package (the ``trace`` preset's code base is torch's)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EnvError(f"code_nav: no installed package {name!r} to read (pass root=...)")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


class CodeTree:
    """Read-only, root-confined view of a directory; the handlers behind the tools."""

    def __init__(self, root: Path, exclude: tuple[str, ...], max_lines: int, max_hits: int) -> None:
        self.root = root
        self.exclude = set(exclude)
        self.max_lines = max_lines
        self.max_hits = max_hits

    def _excluded(self, name: str) -> bool:
        return name in self.exclude or name.startswith("config-")

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` (relative to the root), or a ToolError naming the problem."""
        raw = Path(path.strip() or ".")
        target = raw if raw.is_absolute() else self.root / raw
        real = target.resolve()
        if real != self.root and self.root not in real.parents:
            lexical = Path(os.path.normpath(target))
            inside = lexical == self.root or self.root in lexical.parents
            why = "goes through a symbolic link that leads" if inside else "is"
            raise ToolError(f"path {path!r} {why} outside the code base; paths are relative to it")
        rel = real.relative_to(self.root)
        if any(self._excluded(part) for part in rel.parts):
            raise ToolError(f"path {path!r} is excluded from the code base")
        if not real.exists():
            raise ToolError(f"no such file or directory: {path!r}")
        return real

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def files(self, top: Path) -> list[Path]:
        if top.is_file():
            return [top]
        out = []
        for d, dirs, names in os.walk(top):  # never follows directory links
            dirs[:] = sorted(x for x in dirs if not self._excluded(x))
            for name in sorted(names):
                p = Path(d, name)
                if p.is_symlink() and self.root not in p.resolve().parents:
                    continue
                out.append(p)
        return out

    # -- the tools ------------------------------------------------------------------------------

    def find_def(self, defs: list[Fn], name: str, path: str = ".") -> str:
        """Where functions and methods named ``name`` (``Class.method`` or a bare name) are
        defined under ``path``: ``path:line: def name``, never their code."""
        real = self.resolve(path)
        top = self.rel(real)
        hits = [
            f"{fn.mod.rel}:{fn.node.lineno}: def {fn.qual}"
            for fn in defs
            if name.strip() in (fn.qual, fn.node.name)
            and (top == "." or fn.mod.rel == top or fn.mod.rel.startswith(top.rstrip("/") + "/"))
        ]
        if not hits:
            return f"No function or method named {name!r} under {top}."
        more = len(hits) - self.max_hits
        shown = hits[: self.max_hits] + ([f"... {more} more; give a path"] if more > 0 else [])
        return "\n".join(shown)

    def list_dir(self, path: str = ".") -> str:
        real = self.resolve(path)
        if not real.is_dir():
            raise ToolError(f"{path!r} is a file, not a directory; use read_file")
        entries = sorted(
            e.name + ("/" if e.is_dir() else "")
            for e in real.iterdir()
            if not self._excluded(e.name)
        )
        shown = entries[:300]
        more = f"\n... and {len(entries) - 300} more" if len(entries) > 300 else ""
        return f"{self.rel(real)}/ ({len(entries)} entries)\n" + "\n".join(shown) + more

    def read_file(self, path: str, start: int = 1, end: int | None = None) -> str:
        real = self.resolve(path)
        if real.is_dir():
            raise ToolError(f"{path!r} is a directory; use list_dir")
        try:
            lines = real.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise ToolError(f"{path!r} is not a UTF-8 text file") from exc
        if start < 1 or (end is not None and end < start):
            raise ToolError(f"bad line range start={start} end={end}; lines are numbered from 1")
        if start > len(lines):
            raise ToolError(f"{path!r} has only {len(lines)} lines")
        stop = min(len(lines), end or len(lines), start + self.max_lines - 1)
        body = "\n".join(f"{i:5d}| {lines[i - 1]}" for i in range(start, stop + 1))
        note = ""
        if stop < min(len(lines), end or len(lines)):
            note = f"\n(showing {self.max_lines} lines at most; continue with start={stop + 1})"
        return f"{self.rel(real)} lines {start}-{stop} of {len(lines)}\n{body}{note}"

    def grep(self, pattern: str, path: str = ".") -> str:
        """Line by line, like grep: a match never spans lines."""
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression {pattern!r}: {exc}") from exc
        real = self.resolve(path)
        hits: list[str] = []
        total = 0
        for file in self.files(real):
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary files cannot match a text pattern
            for line_no, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(hits) < self.max_hits:
                        hits.append(f"{self.rel(file)}:{line_no}: {line.strip()[:160]}")
        if not hits:
            return f"No matches for {pattern!r} under {self.rel(real)}."
        if total > len(hits):
            more = total - len(hits)
            hits.append(f"... {more} more matches; narrow the pattern or the path")
        return "\n".join(hits)


ALL_TEMPLATES = (*TEMPLATES, "arg_flow", "first_use")
FLOW_TEMPLATES = ("arg_flow", "first_use")  # three definitions each (code_flow.py)
_WINDOW = re.compile(r"^(\S+) lines \d+-\d+ of \d+")  # read_file's first line
_NUMBERED = re.compile(r"^\s*(\d+)\| (.*)$", re.MULTILINE)

# chain and trace: questions whose three reads do not fit the budget together (docs/envs.md);
# root None is this interpreter's standard library, else the installed package of that name
PRESETS: dict[str | None, dict[str, Any]] = {
    None: {"templates": tuple(TEMPLATES), "window": None, "max_context_tokens": 8192},
    "chain": {"templates": ("arg_flow",), "window": 30, "max_context_tokens": 2048},
    "trace": {
        "templates": ("first_use",),
        "window": 50,
        "max_context_tokens": 2200,
        "root": "torch",
    },
}


def _same_expression(answer: str, expected: str) -> bool:
    """Whether ``answer`` is the Python expression ``expected`` (spacing and quotes aside)."""
    try:
        got = ast.parse(answer.strip().strip("`").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return ast.dump(got) == ast.dump(ast.parse(expected, mode="eval"))


_LINE = re.compile(r"\bline\s*:?\s*(\d+)", re.I)
_LEAD = re.compile(r"^(?:the\s+)?argument(?:\s+is)?\s*:?\s*", re.I)
_KEYWORD = re.compile(r"^[A-Za-z_]\w*\s*=(?!=)\s*(.+)$", re.S)


def _same_use(answer: str, expected: str) -> bool:
    """first_use: ``<argument>, line <n>``: the last ``line <n>`` of the answer is the line
    (what follows it, a path say, is not read), and what precedes it, separators and "on" or
    "at" aside, is the argument: the same Python expression as the expected one (spacing and
    quotes aside), also when written as the call's keyword (``device=device``).

    >>> _same_use("self._buf , line 42", "self._buf, line 42"), _same_use("buf, line 42", "self._buf, line 42")
    (True, False)
    >>> _same_use("`self._buf` on line 42.", "self._buf, line 42"), _same_use("self._buf, line 41", "self._buf, line 42")
    (True, False)
    >>> [_same_use(a, "dev, line 7") for a in ("device=dev, line 7", "dev (line 7)", "dev at line 7 of a.py")]
    [True, True, True]
    >>> [_same_use(a, "dev, line 7") for a in ("**dev**, line 7", "Argument: dev, line 7", "dev \u2014 line 7", "'dev', line 7")]
    [True, True, True, True]
    >>> _same_use("f'{x}' line 7", "f'{x}', line 7"), _same_use("dev or cpu, line 7", "dev, line 7")
    (True, False)
    """
    got, want = list(_LINE.finditer(answer)), list(_LINE.finditer(expected))
    if not got or not want or int(got[-1].group(1)) != int(want[-1].group(1)):
        return False
    arg = _LEAD.sub("", answer[: got[-1].start()].strip())
    arg = re.sub(r"(?:[\s,;:(\u2013\u2014-]|\b(?:on|at|in)\b)+$", "", arg, flags=re.I)
    target = expected[: want[-1].start()].strip().rstrip(",").strip()
    for text in (arg.strip("` "), arg.strip("`*'\" ")):
        keyword = _KEYWORD.match(text)
        if _same_expression(text, target) or (
            keyword is not None and _same_expression(keyword.group(1), target)
        ):
            return True
    return False


def _split_of(key: str, eval_frac: float) -> str:
    bucket = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if bucket < eval_frac else "train"


class CodeNav(Environment):
    """The ``code_nav`` environment; see the module docstring."""

    name = "code_nav"

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        seed: int = 0,
        *,
        preset: str | None = None,
        templates: tuple[str, ...] | list[str] | None = None,
        exclude: tuple[str, ...] | list[str] = DEFAULT_EXCLUDE,
        eval_frac: float = 0.2,
        n_train: int | None = None,
        n_eval: int | None = None,
        check_imports: bool | None = None,
        max_read_lines: int | None = None,
        max_grep_hits: int = 40,
        max_context_tokens: int | None = None,
        metric: str = "em",
        judge: Judge | None = None,
    ) -> None:
        super().__init__(metric=metric, judge=judge)
        if preset not in PRESETS:
            raise EnvError(f"code_nav has no preset {preset!r}; presets: {list(PRESETS)}")
        p = PRESETS[preset]
        if root is not None:
            root_path = Path(root).expanduser().resolve()
        else:
            root_path = package_root(p["root"]) if p.get("root") else stdlib_root()
        if not root_path.is_dir():
            raise EnvError(f"code_nav root={str(root)!r} is not a directory")
        templates = tuple(templates) if templates is not None else p["templates"]
        unknown = sorted(set(templates) - set(ALL_TEMPLATES))
        if unknown:
            raise EnvError(
                f"code_nav has no template(s) {unknown}; templates: {list(ALL_TEMPLATES)}"
            )
        self.preset = preset
        self.root = root_path
        self.max_context_tokens = max_context_tokens or p["max_context_tokens"]
        # the chain preset reads a fixed window from a line (a viewer, as an opened document),
        # finds definitions by name and has no grep: a grep line would show the call itself
        self.window = (max_read_lines or p["window"]) if p["window"] else None
        # a window's needed lines are what the teacher's notes keep (notes_of): a summary may
        # follow a read; the other templates' reads have no notes, so only an overflow compacts
        self.read_tools = ("read_file",) if self.window else ()
        lines = max_read_lines or self.window or 200
        self.tree = CodeTree(root_path, tuple(exclude), lines, max_grep_hits)
        if check_imports is None:  # only the interpreter's own stdlib can be imported safely
            check_imports = root_path == stdlib_root()
        files = self.tree.files(root_path)
        modules = index_modules(root_path, files)  # parsed once for every template
        classic = [t for t in templates if t in TEMPLATES]
        questions, self.report = find_questions(
            root_path, files, classic, check_imports=check_imports, modules=modules
        )
        self._flows: dict[str, Flow] = {}
        flowing = [t for t in templates if t in FLOW_TEMPLATES]
        fns = functions(modules) if self.window or flowing else []
        self._defs: list[Fn] = fns if self.window else []
        for template in flowing:
            flows = (
                first_use(modules, fns, self.window or 50)
                if template == "first_use"
                else arg_flow(modules, fns)
            )
            n = len(flows)
            self.report[template] = {"candidates": n, "confirmed": 0, "mismatch": 0, "ast_only": n}
            for q, flow in flows:
                questions.append(q)
                self._flows[q.key] = flow
        rng = random.Random(seed)
        self._questions: dict[str, Question] = {}
        for split, limit in (("train", n_train), ("eval", n_eval)):
            chosen = [q for q in questions if _split_of(q.group or q.key, eval_frac) == split]
            rng.shuffle(chosen)
            if limit is not None:
                chosen = chosen[:limit]
            self._tasks[split] = [self._task(split, q) for q in chosen]
        # dev and test halve the eval split by group: settings and checkpoints are chosen on
        # dev, reports are read on test (never used for a choice)
        self._tasks["dev"], self._tasks["test"] = [], []
        for q in (self._questions[t.id] for t in self._tasks["eval"]):
            half = "dev" if _split_of(f"{q.group or q.key}#dev", 0.5) == "eval" else "test"
            self._tasks[half].append(self._task(half, q))
        # first_use: how far below its def k's first read most often is, on the train split
        offsets = Counter(
            fl.k_use - fl.k[2]
            for t in self._tasks["train"]
            if (fl := self._flows.get(self._questions[t.id].key)) and fl.k_use is not None
        )
        self._use_offset = offsets.most_common(1)[0][0] if offsets else 1

    def _task(self, split: str, q: Question) -> Task:
        task_id = f"code_nav/{q.template}/{hashlib.sha1(q.key.encode()).hexdigest()[:12]}"
        self._questions[task_id] = q
        return Task(
            id=task_id,
            prompt=q.prompt,
            answer=q.answer,
            metadata={
                "env": self.name,
                "split": split,
                "template": q.template,
                "checked": q.checked,
                "answer_set": q.answer_set,
                "gold_files": q.files,
                "literal": q.literal,
                **(
                    {"arguments": list(self._flows[q.key].arguments)}
                    if q.key in self._flows
                    else {}
                ),
            },
        )

    def tools(self) -> list[dict[str, Any]]:
        s = {"type": "string"}
        i = {"type": "integer"}
        if self.window:
            return [
                tool_schema(
                    "find_def",
                    "Find where a function or method is defined (a name or Class.method); "
                    "prints path:line, not the code.",
                    {
                        "name": {**s, "description": "Function or Class.method name."},
                        "path": {**s, "description": "File or directory (default '.')."},
                    },
                    required=["name"],
                ),
                tool_schema(
                    "read_file",
                    f"Show {self.window} lines of a file from line start (numbered).",
                    {
                        "path": {**s, "description": "File path."},
                        "start": {**i, "description": "First line (default 1)."},
                    },
                    required=["path"],
                ),
            ]
        return [
            tool_schema(
                "list_dir",
                "List a directory of the code base (paths are relative to its root, '.' is the root).",
                {"path": {**s, "description": "Directory path."}},
            ),
            tool_schema(
                "read_file",
                f"Read lines start..end (1-based, inclusive; at most {self.tree.max_lines} at a time) of a file.",
                {
                    "path": {**s, "description": "File path."},
                    "start": {**i, "description": "First line (default 1)."},
                    "end": {**i, "description": "Last line (default: end of file)."},
                },
                required=["path"],
            ),
            tool_schema(
                "grep",
                "Search files under a path for a Python regular expression (multi-line mode); "
                "prints path:line: text for each match.",
                {
                    "pattern": {**s, "description": "Python regular expression."},
                    "path": {**s, "description": "File or directory to search (default '.')."},
                },
                required=["pattern"],
            ),
        ]

    def _handlers(self, task: Task) -> dict[str, Handler]:
        if self.window:
            return {
                "find_def": lambda name, path=".": self.tree.find_def(self._defs, name, path),
                "read_file": lambda path, start=1: self.tree.read_file(path, start),
            }
        return {
            "list_dir": self.tree.list_dir,
            "read_file": self.tree.read_file,
            "grep": self.tree.grep,
        }

    def oracle_plan(self, task: Task) -> Plan:
        q = self._questions[task.id]
        flow = self._flows.get(q.key)
        plan = self._flow_plan(flow) if flow is not None else q.plan
        return [*plan, ("answer", {"text": q.answer_text})]

    def _flow_plan(self, flow: Flow) -> Plan:
        """Find each definition and read windows from its ``def`` until the line that matters
        (the call in ``f`` and ``h``, the signature of ``k`` or, for first_use, the line where
        ``k`` first reads the value) has been shown whole. first_use names the call's line,
        so ``f`` is read from there, unsearched."""
        width = self.tree.max_lines
        plan: Plan = []
        for (path, qual, line), last in (
            (flow.f, flow.f_call[1]),
            (flow.h, flow.h_call[1]),
            (flow.k, max(flow.k_sig[1], flow.k_use or 0)),
        ):
            if flow.k_use is not None and (path, qual, line) == flow.f:
                plan.append(("read_file", {"path": path, "start": flow.f_call[0]}))
                continue
            plan.append(("find_def", {"name": qual, "path": path}))
            start = line
            while True:
                plan.append(("read_file", {"path": path, "start": start}))
                if last < start + width:
                    break
                start += width
        return plan

    def line_guess(self, task: Task, context: str) -> str | None:
        """first_use: the answer of a reader who skipped ``k``'s window: the first argument
        ``k`` receives (``h``'s call shows it) on the line ``find_def`` gives plus the train
        split's most common offset of the first read; None for other questions and while
        ``context`` does not show ``find_def``'s line for ``k``."""
        flow = self._flows.get(self._questions[task.id].key)
        if flow is None or flow.k_use is None or not flow.received:
            return None
        if f"{flow.k[0]}:{flow.k[2]}: def " not in context:
            return None
        return f"{flow.received[0]}, line {flow.k[2] + self._use_offset}"

    def key_terms(self, task: Task) -> list[str]:
        """arg_flow: the default terms and every argument of ``f``'s call (which one matters is
        known only after the last read, so a summary must keep them all)."""
        terms = super().key_terms(task)
        args = [a for a in task.metadata.get("arguments", []) if len(a) >= 2]
        return list(dict.fromkeys([*terms, *args]))

    def notes_of(self, task: Task, result: str) -> list[str] | None:
        """arg_flow: a window's lines that the question names as needed (the call to ``h`` in
        ``f``, ``h``'s signature and its call to ``k``, ``k``'s signature), as ``path:line:
        code``; the other templates leave it to the teacher."""
        flow = self._flows.get(self._questions[task.id].key)
        head = _WINDOW.match(result)
        if flow is None or head is None:
            return None
        spans = [
            (flow.f[0], flow.f_call),
            (flow.h[0], flow.h_sig),
            (flow.h[0], flow.h_call),
            (flow.k[0], flow.k_sig),
            *([(flow.k[0], (flow.k_use, flow.k_use))] if flow.k_use else []),
        ]
        wanted = {(path, n) for path, (a, b) in spans for n in range(a, b + 1)}
        out = []
        for m in _NUMBERED.finditer(result):
            if (head.group(1), int(m.group(1))) in wanted:
                out.append(f"{head.group(1)}:{m.group(1)}: {m.group(2).strip()}")
        return out

    def answer_evidence(self, task: Task) -> list[Evidence]:
        """arg_flow: the lines that make the chain (the argument in ``f``'s call, ``h``'s
        signature, the parameter in ``h``'s call, ``k``'s signature); else the answer."""
        flow = self._flows.get(self._questions[task.id].key)
        if flow is None:
            return super().answer_evidence(task)
        return [Evidence(line) for line in flow.evidence]

    def score(self, task: Task, answer: str | None) -> float:
        """Parameter defaults compare as Python values (``-1`` is not ``1``, ``'a'`` is ``"a"``),
        arg_flow arguments as expressions (``d[ 'k' ]`` is ``d["k"]``)."""
        template = task.metadata.get("template")
        if answer is not None and self.judge is None and template == "arg_flow":
            return float(_same_expression(answer, str(task.answer)))
        if answer is not None and self.judge is None and template == "first_use":
            return float(_same_use(answer, str(task.answer)))
        if answer is not None and self.judge is None and "literal" in task.metadata:
            literal = task.metadata["literal"]
            if literal is not None:
                try:
                    value = ast.literal_eval(answer.strip().strip("`").strip())
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    return 0.0
                expected = ast.literal_eval(literal)
                return float(type(value) is type(expected) and value == expected)
        return super().score(task, answer)
