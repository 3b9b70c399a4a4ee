"""Questions about a code base, derived with ``ast`` and checked against the imported objects.

Four templates, each a question a developer really asks while reading code:

- ``reexport``: a package exposes a name; which module really defines it (re-exports followed)?
- ``mro_method``: a class inherits a method; which class in its MRO defines the one it uses?
- ``param_default``: the default of a parameter of a function found only by its (unique) name.
- ``subclasses``: which classes of a module directly subclass a given class (a set answer)?

When ``check_imports`` is on, each static answer is compared with the real object (``__module__``,
``__mro__``, ``inspect.signature``, ``__subclasses__``); a disagreement drops the question and is
counted, so a shipped question is one whose answer the interpreter confirms. Where importing is
impossible the question keeps its ``ast`` answer and says so in ``checked``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEMPLATES = ("reexport", "mro_method", "param_default", "subclasses")

# Modules with side effects on import (a browser, a printout) or that run a program.
_NO_IMPORT = {"antigravity", "this", "turtle", "__hello__", "__phello__"}


@dataclass
class Question:
    template: str
    key: str  # stable identity of the question (decides its split)
    prompt: str
    answer: str | list[str]
    answer_text: str  # what the oracle submits
    files: list[str]
    plan: list[tuple[str, dict[str, Any]]]
    answer_set: bool = False
    literal: str | None = None
    checked: str = "ast"
    group: str | None = None  # questions of one group share a split (default: the key alone)


@dataclass
class Module:
    name: str
    rel: str
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # the source, for quoting lines


def _module_name(rel: Path) -> str | None:
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def index_modules(root: Path, files: list[Path]) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in files:
        if path.suffix != ".py":
            continue
        rel = path.relative_to(root)
        name = _module_name(rel)
        if name is None:
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # not Python this interpreter can read; the tools still show it
        mod = Module(name, rel.as_posix(), tree, lines=text.splitlines())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                mod.defs[node.name] = node
                if isinstance(node, ast.ClassDef):
                    mod.classes[node.name] = node
        modules[name] = mod
    return modules


class _Importer:
    """Imports modules for the checks, quietly; ``None`` when a module cannot be imported."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.cache: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        if not self.enabled or name.split(".")[0] in _NO_IMPORT or name.endswith("__main__"):
            return None
        if name not in self.cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    self.cache[name] = importlib.import_module(name)
                except (Exception, SystemExit):  # any failure means: cannot check here
                    self.cache[name] = None
        return self.cache[name]

    def attr(self, module: str, name: str) -> Any:
        """``module.name`` of the imported module, or ``None``; lazy attributes may warn."""
        mod = self(module)
        if mod is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(mod, name, None)


def _absolute(package: str, level: int, module: str | None) -> str:
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, module] if module else base)


def _defining(modules: dict[str, Module], module: str, name: str, depth: int = 0) -> Module | None:
    """The module whose top-level ``class``/``def`` defines ``name``, following re-exports."""
    mod = modules.get(module)
    if mod is None or depth > 6:
        return None
    if name in mod.defs:
        return mod
    is_pkg = mod.rel.endswith("__init__.py")
    for node in mod.tree.body:
        if isinstance(node, ast.ImportFrom) and any(
            a.name == name and a.asname in (None, name) for a in node.names
        ):
            package = module if is_pkg else module.rpartition(".")[0]
            src = _absolute(package, node.level, node.module) if node.level else node.module or ""
            return _defining(modules, src, name, depth + 1)
    return None


def _reexport(modules: dict[str, Module], imp: _Importer) -> list[tuple[Question, bool | None]]:
    out = []
    for mod in modules.values():
        if not mod.rel.endswith("__init__.py"):
            continue
        for node in mod.tree.body:
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            src = _absolute(mod.name, node.level, node.module)
            for alias in node.names:
                exposed = alias.asname or alias.name
                if alias.name == "*" or exposed.startswith("_"):
                    continue
                final = _defining(modules, src, alias.name)
                if final is None or final.name == mod.name:
                    continue
                defn = final.defs[alias.name]
                q = Question(
                    "reexport",
                    f"reexport:{mod.name}:{exposed}",
                    f"The package `{mod.name}` exposes the name `{exposed}`. Which module really "
                    "defines it (where its `class` or `def` statement is)? Answer with the dotted "
                    "module name.",
                    [final.name, final.rel],
                    final.name,
                    [mod.rel, final.rel],
                    [
                        *_import_lookup(mod.rel, node, alias),
                        (
                            "grep",
                            {
                                "pattern": rf"^(async def|def|class) {alias.name}\b",
                                "path": final.rel,
                            },
                        ),
                        (
                            "read_file",
                            {"path": final.rel, "start": defn.lineno, "end": defn.lineno + 5},
                        ),
                    ],
                )
                out.append((q, _check_module(imp, mod.name, exposed, final.name)))
    return out


def _import_lookup(
    path: str, node: ast.ImportFrom, alias: ast.alias
) -> list[tuple[str, dict[str, Any]]]:
    """The plan's steps that find where ``path`` imports ``alias`` from, using only what the agent
    sees: a grep for the name shows a one-line import whole; for a parenthesised import spread
    over lines, the same grep also shows the lines that open one, and the read covers the
    statement from its ``from`` line down to the name (both numbers are in the grep's output)."""
    line = getattr(alias, "lineno", node.lineno)
    if line == node.lineno:
        return [("grep", {"pattern": rf"\b{alias.name}\b", "path": path})]
    return [
        ("grep", {"pattern": rf"^from .* import \($|\b{alias.name}\b", "path": path}),
        ("read_file", {"path": path, "start": node.lineno, "end": line}),
    ]


def _check_module(imp: _Importer, package: str, exposed: str, expected: str) -> bool | None:
    obj = imp.attr(package, exposed)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return None
    return obj.__module__ == expected


def _class_defines(node: ast.ClassDef) -> set[str]:
    names = set()
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
    return names


def _chain(mod: Module, cls: str) -> list[str]:
    """``cls`` and its single-inheritance ancestors defined in the same module, nearest first."""
    chain = [cls]
    while True:
        bases = mod.classes[chain[-1]].bases
        if len(bases) != 1 or not isinstance(bases[0], ast.Name) or bases[0].id not in mod.classes:
            return chain
        if bases[0].id in chain:
            return chain
        chain.append(bases[0].id)


def _mro_method(modules: dict[str, Module], imp: _Importer) -> list[tuple[Question, bool | None]]:
    out = []
    for mod in modules.values():
        for cls in mod.classes:
            chain = _chain(mod, cls)
            if len(chain) < 2 or cls.startswith("_"):
                continue
            seen = _class_defines(mod.classes[cls])
            found = None
            for owner in chain[1:]:
                node = mod.classes[owner]
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.FunctionDef)
                        and not stmt.name.startswith("_")
                        and stmt.name not in seen
                    ):
                        found = (stmt, owner)
                        break
                if found:
                    break
                seen |= _class_defines(node)
            if found is None:
                continue
            method, owner = found
            pattern = "|".join(chain[: chain.index(owner) + 1])
            q = Question(
                "mro_method",
                f"mro_method:{mod.name}:{cls}:{method.name}",
                f"In module `{mod.name}`, the class `{cls}` does not define the method "
                f"`{method.name}` itself but gets it by inheritance. Which class's definition of "
                f"`{method.name}` does `{cls}` use? Answer with the class name.",
                [owner, f"{mod.name}.{owner}"],
                owner,
                [mod.rel],
                [
                    ("grep", {"pattern": rf"^class ({pattern})\b", "path": mod.rel}),
                    ("grep", {"pattern": rf"^\s+def {method.name}\s*\(", "path": mod.rel}),
                    (
                        "read_file",
                        {"path": mod.rel, "start": method.lineno - 1, "end": method.lineno + 2},
                    ),
                ],
            )
            out.append((q, _check_mro(imp, mod.name, cls, method.name, owner)))
    return out


def _check_mro(imp: _Importer, module: str, cls: str, method: str, owner: str) -> bool | None:
    obj = imp.attr(module, cls)
    if not inspect.isclass(obj):
        return None
    for klass in obj.__mro__:
        if method in vars(klass):
            return (klass.__module__, klass.__name__) == (module, owner)
    return False


def _first_literal_default(fn: ast.FunctionDef) -> tuple[str, str] | None:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    for arg, default in pairs:
        try:
            value = ast.literal_eval(default)
        except (ValueError, SyntaxError, TypeError):
            continue
        if value is not None and not arg.arg.startswith("_"):
            return arg.arg, repr(value)
    return None


def _param_default(
    modules: dict[str, Module], imp: _Importer
) -> list[tuple[Question, bool | None]]:
    counts = Counter(
        n for m in modules.values() for n, d in m.defs.items() if isinstance(d, ast.FunctionDef)
    )
    out = []
    for mod in modules.values():
        for name, fn in mod.defs.items():
            if not isinstance(fn, ast.FunctionDef) or counts[name] != 1 or name.startswith("_"):
                continue
            picked = _first_literal_default(fn)
            if picked is None:
                continue
            param, literal = picked
            source = ast.unparse(_default_node(fn, param))
            q = Question(
                "param_default",
                f"param_default:{mod.name}:{name}:{param}",
                f"Somewhere in this code base there is exactly one top-level function named "
                f"`{name}`. What is the default value of its parameter `{param}`? Answer with the "
                "Python literal, e.g. 10, 'utf-8' or True.",
                sorted({literal, source}),
                literal,
                [mod.rel],
                [
                    ("grep", {"pattern": rf"^def {name}\s*\(", "path": "."}),
                    ("read_file", {"path": mod.rel, "start": fn.lineno, "end": fn.body[0].lineno}),
                ],
                literal=literal,
            )
            out.append((q, _check_default(imp, mod.name, name, param, literal)))
    return out


def _default_node(fn: ast.FunctionDef, param: str) -> ast.expr:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    for arg, d in zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True):
        if arg.arg == param:
            return d
    return next(
        d
        for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
        if arg.arg == param and d is not None
    )


def _check_default(imp: _Importer, module: str, fn: str, param: str, literal: str) -> bool | None:
    obj = imp.attr(module, fn)
    if not callable(obj):
        return None
    try:
        parameter = inspect.signature(obj).parameters.get(param)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: cannot check
    if parameter is None:
        return False
    expected = ast.literal_eval(literal)
    return type(parameter.default) is type(expected) and parameter.default == expected


def _subclasses(modules: dict[str, Module], imp: _Importer) -> list[tuple[Question, bool | None]]:
    out = []
    for mod in modules.values():
        for base in mod.classes:
            subs = [
                c
                for c, node in mod.classes.items()
                if any(isinstance(b, ast.Name) and b.id == base for b in node.bases)
            ]
            if not 2 <= len(subs) <= 8:
                continue
            q = Question(
                "subclasses",
                f"subclasses:{mod.name}:{base}",
                f"Which classes defined in module `{mod.name}` directly subclass `{base}`? "
                "List all of their names, separated by commas.",
                subs,
                ", ".join(subs),
                [mod.rel],
                [
                    (
                        "grep",
                        {"pattern": rf"^class \w+\(([^)]*[\s,])?{base}\s*[,)]", "path": mod.rel},
                    )
                ],
                answer_set=True,
            )
            out.append((q, _check_subclasses(imp, mod.name, base, subs)))
    return out


def _check_subclasses(imp: _Importer, module: str, base: str, subs: list[str]) -> bool | None:
    obj = imp.attr(module, base)
    if not inspect.isclass(obj):
        return None
    try:
        real = {k.__name__ for k in type.__subclasses__(obj) if k.__module__ == module}
    except TypeError:
        return None
    return real == set(subs)


_FINDERS = {
    "reexport": _reexport,
    "mro_method": _mro_method,
    "param_default": _param_default,
    "subclasses": _subclasses,
}


def find_questions(
    root: Path,
    files: list[Path],
    templates: list[str],
    *,
    check_imports: bool,
    modules: dict[str, Module] | None = None,
) -> tuple[list[Question], dict[str, dict[str, int]]]:
    """All questions of ``templates`` in the code base, and per template: ``candidates`` found by
    ``ast``, ``confirmed`` by the imported object, ``mismatch`` (dropped) and ``ast_only``
    (``modules``: :func:`index_modules` of ``files``, when the caller has it already)."""
    modules = index_modules(root, files) if modules is None else modules
    imp = _Importer(check_imports)
    questions: list[Question] = []
    report: dict[str, dict[str, int]] = {}
    for template in templates:
        found = _FINDERS[template](modules, imp)
        counts = Counter(
            "confirmed" if ok else "ast_only" if ok is None else "mismatch" for _, ok in found
        )
        report[template] = {
            "candidates": len(found),
            **{k: counts[k] for k in ("confirmed", "mismatch", "ast_only")},
        }
        for q, ok in found:
            if ok is False:
                continue
            q.checked = "import" if ok else "ast"
            questions.append(q)
    return questions, report
