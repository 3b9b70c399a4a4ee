#!/usr/bin/env bash
# The main-job command of the README: set up .venv if needed, then run `acmrl demo` on the embedded
# default model (SmolLM2-135M-Instruct; converted from its GGUF file on first use and cached):
# tasks -> baseline eval -> annotation -> SFT -> GRPO -> eval -> export, under runs/demo.
# Extra arguments go to acmrl demo, e.g. `--size small` or `output=runs/demo2`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/acmrl demo "$@"
