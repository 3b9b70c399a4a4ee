#!/usr/bin/env bash
# The test command of the README: set up .venv if needed, lint, then run the whole test suite.
# Extra arguments go to pytest (for example `-m "not slow"` for the quick subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest "$@"
