#!/usr/bin/env bash
# Annotation as a Slurm job array followed by a merge step:
#
#   bash scripts/slurm/annotate.sh N configs/annotate.yaml [override ...]
#
# submits N shard jobs and a merge job that starts once every shard has succeeded (afterok);
# prints "array ID" and "merge ID". Extra sbatch options go in SBATCH_ARGS.
set -euo pipefail
n=${1:?usage: annotate.sh N CONFIG [override ...]}
config=${2:?usage: annotate.sh N CONFIG [override ...]}
shift 2
here=$(dirname "$0")
# shellcheck disable=SC2086  # SBATCH_ARGS is a list of options
array=$(sbatch --parsable ${SBATCH_ARGS:-} --array="0-$((n - 1))" "$here/annotate.sbatch" \
    "$config" "$@")
array=${array%%;*}
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --dependency="afterok:$array" \
    --job-name=acmrl-annotate-merge --output='%x-%j.out' --export="ALL,ACMRL_MERGE=$n" \
    "$here/annotate.sbatch" "$config" "$@")
echo "array ${array}"
echo "merge ${merge%%;*}"
