#!/usr/bin/env bash
# One acmrl command as a Slurm job step, on every node or task of the allocation:
#
#   srun bash scripts/slurm/launch.sh train sft --config configs/sft.yaml [override ...]
#
# LAUNCH=accelerate (default; one Slurm task per node): `accelerate launch` starts GPUS_PER_NODE
#   processes on each node; node rank, main address and port come from Slurm's variables.
#   ACCELERATE_CONFIG picks a file of configs/accelerate/ (ddp.yaml, fsdp.yaml, ...).
# LAUNCH=srun (one Slurm task per process): the rank, local rank and world size are Slurm's
#   (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS); each process picks its device from LOCAL_RANK.
#   This is the form the CPU test runs (tests/test_slurm.py).
# ACMRL_PYTHON: the interpreter that has acmrl (default: python).
set -euo pipefail
: "${SLURM_JOB_ID:?launch.sh runs inside a Slurm allocation (sbatch / srun)}"
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)}
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export MASTER_ADDR MASTER_PORT
py=${ACMRL_PYTHON:-python}
case ${LAUNCH:-accelerate} in
accelerate)
    gpus=${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}
    [ "$gpus" -ge 1 ] || { echo "launch.sh: no GPU on $(hostname -s); set GPUS_PER_NODE or LAUNCH=srun" >&2; exit 2; }
    exec "$py" -m accelerate.commands.launch \
        ${ACCELERATE_CONFIG:+--config_file "$ACCELERATE_CONFIG"} \
        --num_machines "$SLURM_NNODES" --machine_rank "$SLURM_NODEID" \
        --num_processes $((SLURM_NNODES * gpus)) \
        --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" \
        -m acmrl.cli "$@"
    ;;
srun)
    export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID
    per_node=${SLURM_STEP_TASKS_PER_NODE:-$SLURM_NTASKS}  # e.g. "4(x2)" or "3,2"
    export LOCAL_WORLD_SIZE=${per_node%%[(,]*}
    exec "$py" -m acmrl.cli "$@"
    ;;
*) echo "launch.sh: LAUNCH must be accelerate or srun, got ${LAUNCH}" >&2; exit 2 ;;
esac
