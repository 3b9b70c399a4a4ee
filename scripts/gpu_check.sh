#!/usr/bin/env bash
# The GPU check, prepared for a lent GPU machine (no network; torch, transformers, peft and
# accelerate are there, acmrl's other needs are not used by the check).
#
#   bash scripts/gpu_check.sh --prepare    # here: copy SmolLM2's tokenizer to .gpucheck/ (4 MB)
#   bash scripts/gpu_check.sh [ARGS]       # there, with .gpucheck carried: ARGS go to gpu_check.py
#
# With the device tool: run(command="bash scripts/gpu_check.sh", carry=[".gpucheck"],
# timeout_s=420). It builds a randomly initialised ~360M-parameter Llama from a config (nothing
# larger than 64 MiB can be carried), runs 10 bf16 SFT steps of 8 x 2,048 tokens and one GRPO
# step (64 episodes of up to 128 tokens, hf engine), and prints tokens/s, peak memory and the
# engine-trainer logprob mismatch; the figures also go to $OUT/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then
    # the last line: a first use converts the model and prints its progress before the path
    tok=$(.venv/bin/python -c "from acmrl.models import ensure_default_model; print(ensure_default_model())" | tail -n 1)
    mkdir -p .gpucheck/tokenizer
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json config.json; do
        [ ! -f "$tok/$f" ] || cp "$tok/$f" .gpucheck/tokenizer/
    done
    [ -f .gpucheck/tokenizer/tokenizer.json ] || {
        echo "gpu_check.sh --prepare: no tokenizer.json in $tok" >&2
        exit 1
    }
    grep -qx "/.gpucheck/" .git/info/exclude 2>/dev/null || echo "/.gpucheck/" >>.git/info/exclude
    du -sh .gpucheck
    exit 0
fi
[ -f .gpucheck/tokenizer/tokenizer.json ] || {
    echo "gpu_check.sh: no .gpucheck/tokenizer: run 'bash scripts/gpu_check.sh --prepare' here first and carry .gpucheck" >&2
    exit 2
}
out=${OUT:-/tmp/acmrl-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 scripts/gpu_check.py --tokenizer .gpucheck/tokenizer --out "$out/run" "$@" 2>&1 |
    tee "$out/gpu_check.log" | grep -v "it/s]"
cp "$out/run/gpu_check.json" "$out/" 2>/dev/null || true
rm -rf "$out/run"
