#!/usr/bin/env bash
# The main-job command of the README: set up .venv if needed, then run acmrl on the embedded default
# model (SmolLM2-135M-Instruct; converted from its GGUF file on first use and cached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/acmrl generate --prompt "${ACMRL_DEMO_PROMPT:-Name three uses of a search engine.}" "$@"
