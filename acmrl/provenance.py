"""Which code made a result: the installed acmrl's version and, when it runs from a git
checkout, the commit and whether tracked files differ from it.

Reports record it (``report.json``'s ``meta.code``, ``audit.json``'s ``code``) so that a
figure can be dated by commit, as the docs date every measurement. Episodes that a resumed run
kept from before are not re-stamped: a report says which code wrote it, not which code ran each
episode.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=4)
def code_version(root: Path | None = None) -> dict[str, Any]:
    """``{"acmrl": version, "commit": sha or None, "dirty": bool or None}`` of the checkout at
    ``root`` (by default the one this package runs from), read once per process."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed: str | None = version("acmrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = None
    root = root or Path(__file__).resolve().parent.parent
    commit, dirty = None, None
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout (a wheel)
        pass
    return {"acmrl": installed, "commit": commit, "dirty": dirty}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def describe_code(code: dict[str, Any] | None) -> str:
    """One phrase for a report: "acmrl 0.1.0 at 1a2b3c4 (with local changes)".

    >>> describe_code({"acmrl": "0.1.0", "commit": "1a2b3c4d5e6f", "dirty": True})
    'acmrl 0.1.0 at 1a2b3c4 (with local changes)'
    >>> describe_code({"acmrl": "0.1.0", "commit": None, "dirty": None})
    'acmrl 0.1.0'
    >>> describe_code(None)
    ''
    """
    if not code:
        return ""
    text = f"acmrl {code.get('acmrl') or '(version unknown)'}"
    if code.get("commit"):
        text += f" at {code['commit'][:7]}"
        if code.get("dirty"):
            text += " (with local changes)"
    return text
