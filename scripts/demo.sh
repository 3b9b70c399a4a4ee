#!/usr/bin/env bash
# The main-job command of the README: set up .venv if needed, then run `acmrl demo` on the embedded
# default model (SmolLM2-135M-Instruct; converted from its GGUF file on first use and cached):
# kb_search chain: tasks -> baseline eval -> annotation -> SFT -> eval -> export, under runs/demo
# (--size tiny adds a teacher round and GRPO).
# Extra arguments go to acmrl demo, e.g. `--size tiny` or `output=runs/demo2`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/acmrl demo "$@"
