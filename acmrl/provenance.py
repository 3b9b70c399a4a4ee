"""Which code made a result: the installed acmrl's version and, when it runs from a git
checkout, the commit and whether tracked files differ from it.

Reports record it (``report.json``'s ``meta.code``, ``audit.json``'s ``code``) so that a
figure can be dated by commit, as the docs date every measurement. Episodes that a resumed run
kept from before are not re-stamped: a report says which code wrote it, not which code ran each
episode.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def code_version(root: Path | None = None) -> dict[str, Any]:
    """``{"acmrl": version, "commit": sha or None, "dirty": bool or None}`` of the checkout at
    ``root`` (by default the one this package runs from), read once per process."""
    return dict(_cached(Path(root or PACKAGE_ROOT)))


@functools.lru_cache(maxsize=4)
def _cached(root: Path) -> dict[str, Any]:
    return read_code_version(root)


def read_code_version(root: Path) -> dict[str, Any]:
    """:func:`code_version`, read now. The commit is ``root``'s own only: a package installed
    in a virtual environment that lies inside another repository is not that repository."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed: str | None = version("acmrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = None
    commit, dirty = None, None
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel")).resolve()
        if top == Path(root).resolve():
            commit = _git(root, "rev-parse", "HEAD")
            dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout (a wheel)
        pass
    return {"acmrl": installed, "commit": commit, "dirty": dirty}


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # a status read takes no index lock
    return subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
        env=env,
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
