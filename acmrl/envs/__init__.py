"""Task suites behind one small protocol (see :mod:`acmrl.envs.base`).

``load(name, **options)`` builds an environment: a built-in name (``kb_search``, ``code_nav``,
``corpus_qa``, ``mixture``, several of them as one, ``mcp``, the tools of an MCP server, and ``verifiers``, an environment built with the
``verifiers`` package) or
a dotted path ``package.module:Class``
to your own :class:`Environment` subclass.

>>> env = load("kb_search", preset="tiny", seed=0)
>>> task = env.tasks("eval")[0]
>>> session = env.session(task)
>>> for name, args in env.oracle_plan(task):
...     _ = session.call(name, args)
>>> session.score()
1.0
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from acmrl.envs.base import EnvError, Environment, Plan, Session, Task, ToolError

BUILTINS = {
    "kb_search": "acmrl.envs.kb_search:KBSearch",
    "code_nav": "acmrl.envs.code_nav:CodeNav",
    "corpus_qa": "acmrl.envs.corpus_qa:CorpusQA",
    "mixture": "acmrl.envs.mixture:Mixture",
    "mcp": "acmrl.envs.mcp:MCPEnv",
    "verifiers": "acmrl.envs.verifiers_env:VerifiersEnv",
}

__all__ = ["BUILTINS", "EnvError", "Environment", "Plan", "Session", "Task", "ToolError", "load"]


def _resolve(name: str) -> type[Environment]:
    target = BUILTINS.get(name, name)
    if ":" not in target:
        raise EnvError(
            f"unknown environment {name!r}; built-ins: {', '.join(BUILTINS)}, "
            "or give a dotted path 'package.module:Class'"
        )
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise EnvError(f"cannot import environment {target!r}: {exc}") from exc
    if not (inspect.isclass(cls) and issubclass(cls, Environment)):
        raise EnvError(f"{target!r} is not an acmrl.envs.Environment subclass")
    return cls


def load(name: str, **options: Any) -> Environment:
    """Build the environment ``name`` with its options (presets are options too)."""
    cls = _resolve(name)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        params = [p for p in inspect.signature(cls).parameters if p not in ("self",)]
        raise EnvError(f"{name}: {exc}; it takes {', '.join(params)}") from exc
    return cls(**options)
