"""``arg_flow``: which argument of a call reaches a parameter two calls down, derived with ``ast``.

The question a developer asks before changing a call: ``f`` calls ``h(a, b, c)``; ``h`` hands
some of its parameters on to ``k``; which of ``f``'s arguments becomes ``k``'s parameter ``q``?
Answering it takes three definitions: ``f`` (the call and its arguments), ``h`` (which of its
parameters it passes to ``k``, and where) and ``k`` (which position is ``q``). The argument must
be carried from the first read to the last, and which one matters is known only at the end.

A question is kept only where each of the three reads is needed and no shortcut names the
answer: ``h`` passes at least two of its own parameters to ``k`` by position (so ``k``'s
signature decides), the answer is not the argument at ``q``'s position in ``f``'s call, not
named like ``q`` or ``h``'s parameter, not ``f``'s first argument, and not a constant (a value
such as ``None`` or ``''`` is a guess's favourite), and ``h``'s parameter is not itself named
``q`` (then whatever binds to ``q`` in ``h`` is the answer, ``k`` unread). ``f`` calls ``h`` once and ``h`` calls ``k``
once, ``h``'s parameter is not reassigned before it is passed on, and ``h`` and ``k`` take no
``*args``, ``**kwargs``, positional-only parameters or decorators, so the binding is the
call's own. Calls resolve statically: a module's function (imported ones followed through
re-exports) or ``self.<method>`` of the calling method's own class. The answer is ``ast``'s;
nothing is imported.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from acmrl.envs.code_questions import Module, Question, _defining

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class Fn:
    """A function of the code base: its module, its class (methods) and its definition."""

    mod: Module
    cls: str | None
    node: ast.FunctionDef

    @property
    def qual(self) -> str:
        return f"{self.cls}.{self.node.name}" if self.cls else self.node.name

    def positional(self) -> list[str]:
        names = [a.arg for a in self.node.args.args]
        return names[1:] if self.cls else names  # a method's self is bound already


def _inside(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s body; a nested function, class or lambda is yielded but not
    entered (its calls and names are another scope's)."""
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _locals(fn: ast.FunctionDef) -> set[str]:
    """The names bound in ``fn``'s own scope: every parameter, assignment, import, nested
    ``def``/``class`` and ``except ... as`` (a call through one is not the module's function)."""
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
    for n in _inside(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            names.add(n.id)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            names |= {(x.asname or x.name).split(".")[0] for x in n.names}
        elif (isinstance(n, ast.ExceptHandler) and n.name) or isinstance(n, _SCOPES[:3]):
            names.add(n.name)
    return names


def _stored(fn: ast.FunctionDef) -> set[str]:
    """The names ``fn``'s body assigns (a parameter among them is not the caller's value)."""
    return {
        n.id
        for n in _inside(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del)
    }


def _simple(fn: ast.FunctionDef) -> bool:
    a = fn.args
    return not (a.vararg or a.kwarg or a.posonlyargs or fn.decorator_list)


def functions(modules: dict[str, Module]) -> list[Fn]:
    """Every module-level function and every method of a module-level class."""
    out = []
    for mod in modules.values():
        for node in mod.tree.body:
            if isinstance(node, ast.FunctionDef):
                out.append(Fn(mod, None, node))
            elif isinstance(node, ast.ClassDef):
                out += [Fn(mod, node.name, m) for m in node.body if isinstance(m, ast.FunctionDef)]
    return out


class _Resolver:
    def __init__(self, modules: dict[str, Module], fns: list[Fn]) -> None:
        self.modules = modules
        self.methods = {(f.mod.name, f.cls, f.node.name): f for f in fns if f.cls}
        self.top = {(f.mod.name, f.node.name): f for f in fns if not f.cls}

    def callee(self, caller: Fn, call: ast.Call, local: set[str]) -> Fn | None:
        func = call.func
        if isinstance(func, ast.Name) and func.id not in local:
            found = self.top.get((caller.mod.name, func.id))
            if found is None and func.id not in caller.mod.defs:
                where = _defining(self.modules, caller.mod.name, func.id)
                found = self.top.get((where.name, func.id)) if where is not None else None
            return found
        is_self = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        if is_self and caller.cls and func.value.id == "self" == _first_param(caller.node):
            return self.methods.get((caller.mod.name, caller.cls, func.attr))
        return None


def _first_param(fn: ast.FunctionDef) -> str | None:
    return fn.args.args[0].arg if fn.args.args else None


def _bind(call: ast.Call, fn: Fn) -> dict[str, tuple[ast.expr, int | None]] | None:
    """``fn``'s parameter -> (argument, position or None for a keyword), or None if the call
    unpacks (``*xs``, ``**kw``) or does not fit the signature."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    pos = fn.positional()
    names = set(pos) | {a.arg for a in fn.node.args.kwonlyargs}
    if len(call.args) > len(pos) or any(k.arg not in names for k in call.keywords):
        return None
    bound: dict[str, tuple[ast.expr, int | None]] = {
        p: (a, i)
        for i, (p, a) in enumerate(zip(pos, call.args, strict=False))  # fewer args: defaults
    }
    for k in call.keywords:
        if k.arg in bound:
            return None
        bound[k.arg] = (k.value, None)
    return bound


@dataclass(frozen=True)
class Flow:
    """Where the three reads of an ``arg_flow`` question are: each definition's file and line,
    and the lines the agent must see (the argument in ``f``'s call, ``h``'s signature, the
    parameter in ``h``'s call, ``k``'s signature)."""

    f: tuple[str, str, int]  # (path, qualified name, def line)
    h: tuple[str, str, int]
    k: tuple[str, str, int]
    f_call: tuple[int, int]  # first and last line of f's call to h
    h_call: tuple[int, int]
    arguments: tuple[str, ...]  # f's call's arguments as written
    evidence: tuple[str, ...]  # the lines (stripped) that show the answer's chain
    h_sig: tuple[int, int]  # first and last line of h's signature
    k_sig: tuple[int, int]
    k_use: int | None = None  # first_use: the line of k's body that first uses the value
    handed: int = 1  # first_use: how many of the call's values k receives (which matters is
    # known only at k's read when two or more)
    received: tuple[str, ...] = ()  # first_use: those arguments, in k's parameter order


def _signature(fn: ast.FunctionDef, lines: list[str]) -> tuple[int, int]:
    """The lines of ``fn``'s ``def`` (a signature may span several): up to the line where its
    brackets close and the colon ends it, never into the body."""
    depth = 0
    for n in range(fn.lineno, fn.body[0].lineno):
        code = lines[n - 1].split("#", 1)[0].rstrip()
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0 and code.endswith(":"):
            return fn.lineno, n
    return fn.lineno, fn.lineno


def _line(mod_lines: list[str], n: int) -> str:
    return mod_lines[n - 1].strip()


_Bound = dict[str, tuple[ast.expr, int | None]]


def _outer_calls(
    res: _Resolver, fns: list[Fn], min_args: int = 2, alone: bool = False
) -> Iterator[tuple[Fn, ast.Call, Fn, _Bound, list[str]]]:
    """Every call of one function ``f`` to another, ``h``, that a question can start from:
    ``f`` calls ``h`` once, ``h`` is :func:`_simple`, the call binds to ``h``'s signature and
    passes at least ``min_args`` arguments, written differently; with ``alone``, no other call
    that resolves starts on the call's line (so the line names the call). Yields ``(f, call,
    h, bound, texts)``: ``h``'s parameters bound to the call's arguments, and the arguments as
    written."""
    for f in fns:
        local_f = _locals(f.node)
        calls = [(c, res.callee(f, c, local_f)) for c in _inside(f.node) if isinstance(c, ast.Call)]
        counts: dict[int, int] = {}
        starts: dict[int, int] = {}
        for c, h in calls:
            if h is not None:
                counts[id(h.node)] = counts.get(id(h.node), 0) + 1
                starts[c.lineno] = starts.get(c.lineno, 0) + 1
        for call, h in calls:
            if h is None or h.node is f.node or counts[id(h.node)] != 1 or not _simple(h.node):
                continue
            if alone and starts[call.lineno] != 1:
                continue
            bound = _bind(call, h)
            texts = [ast.unparse(a) for a in _values(call)]
            if bound is None or len(texts) < min_args or len(set(texts)) != len(texts):
                continue
            yield f, call, h, bound, texts


def _values(call: ast.Call) -> list[ast.expr]:
    """A call's arguments: the positional ones, then the keywords' values."""
    return [*call.args, *(k.value for k in call.keywords)]


def _inner_calls(res: _Resolver, f: Fn, h: Fn) -> Iterator[tuple[ast.Call, Fn]]:
    """``h``'s calls to a function ``k`` (neither ``f`` nor ``h``) that it calls once, that is
    :func:`_simple` and whose signature the call binds to."""
    local_h = _locals(h.node)
    inner = [(c, res.callee(h, c, local_h)) for c in _inside(h.node) if isinstance(c, ast.Call)]
    for c2, k in inner:
        if k is None or k.node in (h.node, f.node) or not _simple(k.node):
            continue
        if sum(other is not None and other.node is k.node for _, other in inner) != 1:
            continue
        if _bind(c2, k) is not None:
            yield c2, k


def arg_flow(modules: dict[str, Module], fns: list[Fn]) -> list[tuple[Question, Flow]]:
    """Every ``arg_flow`` question of the code base (``fns``: its :func:`functions`)."""
    res = _Resolver(modules, fns)
    out: list[tuple[Question, Flow]] = []
    seen: set[str] = set()
    for f, call, h, bound, texts in _outer_calls(res, fns):
        out += _from_h(res, f, call, h, bound, texts, seen)
    return out


def _from_h(
    res: _Resolver,
    f: Fn,
    call: ast.Call,
    h: Fn,
    bound: dict[str, tuple[ast.expr, int | None]],
    texts: list[str],
    seen: set[str],
) -> list[tuple[Question, Flow]]:
    stored = _stored(h.node)
    params = set(h.positional()) | {a.arg for a in h.node.args.kwonlyargs}
    out = []
    for c2, k in _inner_calls(res, f, h):
        passed = [
            (j, a.id)
            for j, a in enumerate(c2.args)
            if isinstance(a, ast.Name) and a.id in params and a.id not in stored
        ]
        if len(passed) < 2:  # one parameter passed on would name itself without k's signature
            continue
        kpos = k.positional()
        for j, p in passed:
            if p not in bound:
                continue
            arg, _ = bound[p]
            answer, q = ast.unparse(arg), kpos[j]
            same_pos = j < len(call.args) and ast.unparse(call.args[j]) == answer
            # p == q: h passes on its parameter named q (a keyword f writes as q=... too), so
            # the answer is what binds to q in h without reading k
            if (
                p == q
                or isinstance(arg, ast.Constant)
                or same_pos
                or answer in (q, p)
                or answer == texts[0]
            ):
                continue
            key = f"arg_flow:{f.mod.name}:{f.qual}:{h.qual}:{k.qual}:{q}"
            if key in seen:
                continue
            seen.add(key)
            fl, hl, kl = (x.mod.lines for x in (f, h, k))
            h_sig, k_sig = _signature(h.node, hl), _signature(k.node, kl)
            lines = [
                _line(fl, arg.lineno),
                *(_line(hl, n) for n in range(h_sig[0], h_sig[1] + 1)),
                _line(hl, c2.args[j].lineno),
                *(_line(kl, n) for n in range(k_sig[0], k_sig[1] + 1)),
            ]
            flow = Flow(
                (f.mod.rel, f.qual, f.node.lineno),
                (h.mod.rel, h.qual, h.node.lineno),
                (k.mod.rel, k.qual, k.node.lineno),
                (call.lineno, call.end_lineno or call.lineno),
                (c2.lineno, c2.end_lineno or c2.lineno),
                tuple(texts),
                tuple(dict.fromkeys(x for x in lines if x)),
                h_sig,
                k_sig,
            )
            prompt = (
                f"In `{f.mod.rel}`, `{f.qual}` calls `{h.qual}` (defined in `{h.mod.rel}`), "
                f"which passes some of its parameters on to `{k.qual}` (defined in "
                f"`{k.mod.rel}`). Which argument of `{f.qual}`'s call becomes the parameter "
                f"`{q}` of `{k.qual}`? Answer with the argument as `{f.qual}` writes it."
            )
            files = list(dict.fromkeys([f.mod.rel, h.mod.rel, k.mod.rel]))
            q_ = Question("arg_flow", key, prompt, answer, answer, files, [])
            q_.group = f"arg_flow:{h.mod.name}:{h.qual}:{k.qual}"  # one split per h -> k
            out.append((q_, flow))
    return out


def first_load(k: Fn, name: str) -> int | None:
    """The first line of ``k``'s body that reads ``name``, nested scopes included (a lambda
    that reads it reads the value)."""
    lines = [
        n.lineno
        for stmt in k.node.body
        for n in ast.walk(stmt)
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    ]
    return min(lines, default=None)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


_BINDERS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.NamedExpr)


def _tainted(h: Fn, given: set[str]) -> set[str]:
    """``given`` and every local of ``h`` bound from one of them (``name = x.attr``, ``for y in
    x``, ``with x as y``), to a fixed point."""
    out = set(given)
    for _ in range(8):
        before = len(out)
        for n in _inside(h.node):
            if isinstance(n, _BINDERS):
                source = n.iter if isinstance(n, ast.For | ast.AsyncFor) else n.value
                target = n.targets if isinstance(n, ast.Assign) else [n.target]
                if source is not None and _names(source) & out:
                    out |= set().union(*(_names(t) for t in target))
            elif (
                isinstance(n, ast.withitem)
                and n.optional_vars is not None
                and _names(n.context_expr) & out
            ):
                out |= _names(n.optional_vars)
        if len(out) == before:
            break
    return out


def _passes(nodes: Iterable[ast.AST], given: set[str]) -> list[tuple[int, int, ast.Call]]:
    """Where a call among ``nodes`` is passed one of ``given`` as a plain name: ``(line,
    column, call)`` of each such name."""
    return [
        (a.lineno, a.col_offset, c)
        for c in nodes
        if isinstance(c, ast.Call)
        for a in _values(c)
        if isinstance(a, ast.Name) and a.id in given
    ]


def _apart(spans: list[tuple[str, int, int]], window: int) -> bool:
    """Whether no window of ``window`` lines shows two of the spans ``(path, first, last)``."""
    return all(
        a[0] != b[0] or max(a[2], b[2]) - min(a[1], b[1]) >= window
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
    )


def first_use(
    modules: dict[str, Module], fns: list[Fn], window: int = 50
) -> list[tuple[Question, Flow]]:
    """Every ``first_use`` question of the code base (``fns``: its :func:`functions`): line
    ``N`` of ``f`` calls ``h``, whose first call that is passed one of the values is ``k``'s;
    which of the call's arguments does ``k`` read first, and on which line? The question
    names only ``f``'s file and the line, so the three reads follow each other: ``f``'s call
    names ``h`` and binds its arguments to ``h``'s parameters, ``h``'s body names ``k`` and
    which parameter goes where, ``k``'s body shows which it reads first; the call's arguments,
    seen first, are needed at the end, and which of them matters is known only there.

    The question says which call of ``h`` is ``k``'s without naming it: the first (in the
    source's order) that is passed one of the values as a plain name, unchanged. A question is
    kept where the line names the call (no other call spans it but those inside the call's own
    arguments), the argument is one short line and not a constant, ``h`` reassigns none of the
    values, that first call resolves to ``k`` (not to a builtin or a method of some object) and
    is neither inside nor around another call passed one, no nested function or lambda of ``h``
    passes one of the values on (a reader could count it), ``k`` is handed each of the values
    it gets (or a local bound from one) as a plain parameter name (a value built from one,
    ``x.attr`` or ``x + 1``, would not be the call's argument), ``k``'s first read of them is
    on a line of its own, and each needed span (the call; ``h`` from its ``def`` to its call
    of ``k``; ``k`` from its ``def`` to the read) fits one ``window`` while no window shows two
    of them, so three reads are needed."""
    res = _Resolver(modules, fns)
    out: list[tuple[Question, Flow]] = []
    seen: set[str] = set()
    for f, call, h, bound, texts in _outer_calls(res, fns, min_args=1, alone=True):
        inner = {id(n) for n in ast.walk(call)}
        if any(
            isinstance(c, ast.Call)
            and id(c) not in inner
            and c.lineno <= call.lineno <= (c.end_lineno or c.lineno)
            for c in _inside(f.node)
        ):
            continue  # line N is also another call's: it would not name h's
        given = set(bound)
        if given & _stored(h.node):
            continue  # a value reassigned somewhere in h is "unchanged" only up to there
        own = _passes(_inside(h.node), given)  # h's own calls, nested scopes aside
        nested = [n for n in _inside(h.node) if isinstance(n, _SCOPES)]
        if not own or any(_passes(ast.walk(n), given) for n in nested):
            continue
        c2 = min(own, key=lambda x: (x[0], x[1]))[2]
        around = {id(n) for n in ast.walk(c2)}
        if any(c is not c2 and (id(c) in around or c2 in ast.walk(c)) for _, _, c in own):
            continue  # first in the source is not first to run: min(r, g(x))
        k = res.callee(h, c2, _locals(h.node))
        if k is None or k.node in (h.node, f.node) or not _simple(k.node):
            continue
        to_k = _bind(c2, k)
        if to_k is None:
            continue
        names = _tainted(h, given)
        handed = {q: a for q, (a, _) in to_k.items() if _names(a) & names}
        if any(not (isinstance(a, ast.Name) and a.id in given) for a in handed.values()):
            continue  # a value built from one (x.attr, x + 1) is not the call's argument
        recv = {q: a.id for q, a in handed.items() if isinstance(a, ast.Name)}
        uses = {q: first_load(k, q) for q in recv}
        if not uses or any(n is None for n in uses.values()):
            continue
        line = min(n for n in uses.values() if n is not None)
        firsts = [q for q, n in uses.items() if n == line]
        arg = bound[recv[firsts[0]]][0]
        one_line = arg.lineno == arg.end_lineno and len(ast.unparse(arg)) <= 60
        if len(firsts) != 1 or isinstance(arg, ast.Constant) or not one_line:
            continue
        h_sig, k_sig = _signature(h.node, h.mod.lines), _signature(k.node, k.mod.lines)
        spans = [
            (f.mod.rel, call.lineno, call.end_lineno or call.lineno),
            (h.mod.rel, h_sig[0], c2.end_lineno or c2.lineno),
            (k.mod.rel, k_sig[0], line),
        ]
        if any(b - a >= window for _, a, b in spans) or not _apart(spans, window):
            continue
        key = f"first_use:{f.mod.name}:{f.qual}:{call.lineno}"
        if key not in seen:
            seen.add(key)
            order = [*k.positional(), *(a.arg for a in k.node.args.kwonlyargs)]
            got = tuple(ast.unparse(bound[recv[q]][0]) for q in order if q in recv)
            q_, flow = _use_question(f, call, h, c2, k, texts, arg, recv, firsts[0], line, key)
            out.append((q_, dataclasses.replace(flow, received=got)))
    return _joined(out)


def _joined(out: list[tuple[Question, Flow]]) -> list[tuple[Question, Flow]]:
    """One group (one split) per set of questions linked by a shared ``h`` or a shared ``k``:
    a policy trained on one could otherwise answer another from memory (``k``'s read line, or
    which call ``h`` makes first) without its reads."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, fl in out:
        a, b = find(f"h:{fl.h[0]}:{fl.h[1]}"), find(f"k:{fl.k[0]}:{fl.k[1]}")
        if a != b:
            parent[max(a, b)] = min(a, b)
    for q, fl in out:
        q.group = f"first_use:{find(f'h:{fl.h[0]}:{fl.h[1]}')}"
    return out


def _param_line(fn: Fn, name: str) -> int:
    """The line of ``fn``'s signature that names its parameter ``name``."""
    a = fn.node.args
    return next(x.lineno for x in [*a.args, *a.kwonlyargs] if x.arg == name)


def _use_question(
    f: Fn,
    call: ast.Call,
    h: Fn,
    c2: ast.Call,
    k: Fn,
    texts: list[str],
    arg: ast.expr,
    recv: dict[str, str],
    q: str,
    line: int,
    key: str,
) -> tuple[Question, Flow]:
    """The question and its flow. Its evidence is the lines that carry the chain, each with the
    name it follows (a signature's or a call's bracket-only lines say nothing): the call's
    first line (it names ``h``) and the argument's, ``h``'s parameter and the lines of its call
    of ``k`` that name ``k`` and pass the parameter, ``k``'s parameter and its first read."""
    fl, hl, kl = (x.mod.lines for x in (f, h, k))
    h_sig, k_sig = _signature(h.node, hl), _signature(k.node, kl)
    p = recv[q]  # h's parameter that k's q receives
    passes = [a for a in _values(c2) if getattr(a, "id", None) == p]
    f_call = (call.lineno, call.end_lineno or call.lineno)
    lines = [
        _line(fl, call.lineno),
        _line(fl, arg.lineno),
        _line(hl, _param_line(h, p)),
        _line(hl, c2.lineno),
        *(_line(hl, a.lineno) for a in passes[:1]),
        _line(kl, _param_line(k, q)),
        _line(kl, line),
    ]
    flow = Flow(
        (f.mod.rel, f.qual, f.node.lineno),
        (h.mod.rel, h.qual, h.node.lineno),
        (k.mod.rel, k.qual, k.node.lineno),
        f_call,
        (c2.lineno, c2.end_lineno or c2.lineno),
        tuple(texts),
        tuple(dict.fromkeys(x for x in lines if x)),
        h_sig,
        k_sig,
        k_use=line,
        handed=len(recv),
    )
    answer = f"{ast.unparse(arg)}, line {line}"
    prompt = (
        f"Line {call.lineno} of `{f.mod.rel}` (in `{f.qual}`) calls a function of this code "
        "base. Follow the values of that call's arguments into it, to the first call in its "
        "body that is passed one of them unchanged, as a plain name; call the function that "
        f"call calls k. Of the arguments of the call on line {call.lineno}, which one does k "
        "read first, and on which line of k's file? Answer as: <the argument as the call "
        "writes it>, line <number>."
    )
    files = list(dict.fromkeys([f.mod.rel, h.mod.rel, k.mod.rel]))
    q_ = Question("first_use", key, prompt, answer, answer, files, [])
    q_.group = f"first_use:{h.mod.name}:{h.qual}:{k.qual}"  # joined per h and per k later
    return q_, flow
