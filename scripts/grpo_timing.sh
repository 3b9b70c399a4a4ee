#!/usr/bin/env bash
# GRPO shapes when to compact: on the tiny demo's demonstrations (35% of them
# answer right after the last read, 65% compact once more first), a 100-step SFT policy, then
# 8 GRPO steps of 2 tasks x 4 samples at temperature 0.8 on success minus Compaction Cost;
# both evaluated greedily on the demo's 16 held-out tasks, then `acmrl eval versus` (Pass@1,
# mean reward, Compaction Cost per success, mean compaction point) and the probability of
# answering at once at the last read (benchmarks/timing_decision.py). About 85 min on a 2-core
# CPU. Every stage is skipped when its output exists, so a rerun continues. ANSWERS picks the
# teacher's answer rationale (teacher.answers: plain, reasoned or cited; cited also measures
# the timing decision by the cited opening, timing_decision.py --cited). STEPS sets the GRPO
# steps (cited answers met the bar at 16, not at 8); a finished shorter run continues from its
# last checkpoint (--auto-resume), and checkpoints are kept every STEPS/4 steps.
#   bash scripts/grpo_timing.sh [OUT=runs/timing] [SFT_SEED=1] [ANSWERS=plain] [STEPS=8]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/timing}
SEED=${2:-1}
ANSWERS=${3:-plain}
STEPS=${4:-8}
bash scripts/setup.sh
A=.venv/bin/acmrl
D=$OUT/demo
C=$D/configs
$A demo --size tiny output="$D" stop_after=annotate answers="$ANSWERS"
cited=()
[ "$ANSWERS" = cited ] && cited=(--cited)
[ -f "$OUT/sft/final/adapter_config.json" ] || [ -f "$OUT/sft/final/config.json" ] ||
    $A train sft --config "$C/sft.yaml" seed="$SEED" optim.max_steps=100 save_every=50 \
        output="$OUT/sft"
[ -f "$OUT/eval-sft/report.json" ] ||
    $A eval --config "$C/eval-sft.yaml" model.name="$OUT/sft/final" output="$OUT/eval-sft"
[ -d "$OUT/grpo/checkpoints/step-$(printf %06d "$STEPS")" ] ||
    $A train grpo --config "$C/grpo.yaml" model.name="$OUT/sft/final" output="$OUT/grpo" \
        optim.max_steps="$STEPS" save_every=$((STEPS > 4 ? STEPS / 4 : 1)) save_total_limit=null \
        tasks_per_step=2 group_size=4 optim.lr=2e-4 sampling.temperature=0.8 \
        scale_advantages=true skip_failed_groups=true --auto-resume
EG=$OUT/eval-grpo  # the final policy's eval, named by its steps when not 8
[ "$STEPS" = 8 ] || EG=$OUT/eval-grpo-$STEPS
[ -f "$EG/report.json" ] ||
    $A eval --config "$C/eval-sft.yaml" model.name="$OUT/grpo/final" output="$EG"
$A eval versus "$OUT/eval-sft" "$EG" -c "$OUT/grpo/config.yaml" -o "$OUT/grpo_vs_start.md"
# every checkpoint but the last, which is grpo/final's policy (measured once, as final)
ckpts=$(ls -d "$OUT"/grpo/checkpoints/step-*/model 2>/dev/null |
    grep -v "step-$(printf %06d "$STEPS")/" || true)
.venv/bin/python benchmarks/timing_decision.py "${cited[@]}" "$OUT/eval-sft" "$OUT/sft/final" $ckpts \
    "$OUT/grpo/final" | tee "$OUT/timing_decision.md"
