#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying the recipes and for the slow test.
#
#   bash scripts/slurm/local_cluster.sh start DIR   # writes DIR/slurm.conf, starts the daemons
#   export SLURM_CONF=DIR/slurm.conf                # every client (sbatch, srun, squeue) needs it
#   bash scripts/slurm/local_cluster.sh stop DIR
#
# Needs root and Debian's slurmctld, slurmd and slurm-client (Slurm 22.05 here:
# apt-get install -y --no-install-recommends slurmctld slurmd slurm-client). Authentication is
# auth/none: a test cluster on one machine, never a shared one.
set -euo pipefail
cmd=${1:?usage: local_cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: local_cluster.sh start|stop DIR}")
host=$(hostname -s)

stop() {
    for name in slurmd slurmctld; do
        if [ -f "$dir/$name.pidnum" ]; then
            kill "$(cat "$dir/$name.pidnum")" 2>/dev/null || true
        fi
    done
    for _ in $(seq 50); do
        alive=0
        for name in slurmd slurmctld; do
            [ -f "$dir/$name.pidnum" ] && kill -0 "$(cat "$dir/$name.pidnum")" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    rm -f "$dir"/*.pidnum
}

case "$cmd" in
start)
    for bin in slurmctld slurmd sbatch; do
        command -v "$bin" >/dev/null || {
            echo "local_cluster.sh: $bin not found; install slurmctld slurmd slurm-client" >&2
            exit 2
        }
    done
    [ "$(id -u)" = 0 ] || { echo "local_cluster.sh: the daemons need root" >&2; exit 2; }
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc obeys OMP_NUM_THREADS
    # what slurmd measures; declaring more memory than that drains the node
    mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    cat >"$dir/slurm.conf" <<CONF
ClusterName=acmrl-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$((6817 + $$ % 500 * 2))
SlurmdPort=$((6818 + $$ % 500 * 2))
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=${mem:-1000} State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    slurmctld -f "$dir/slurm.conf" -i
    slurmd -f "$dir/slurm.conf" -N "$host"
    # the daemons delete their pid files on exit: keep the pids to stop them by
    for _ in $(seq 100); do
        [ -f "$dir/slurmctld.pid" ] && [ -f "$dir/slurmd.pid" ] && break
        sleep 0.1
    done
    cp "$dir/slurmctld.pid" "$dir/slurmctld.pidnum"
    cp "$dir/slurmd.pid" "$dir/slurmd.pidnum"
    for _ in $(seq 100); do
        state=$(SLURM_CONF="$dir/slurm.conf" sinfo -h -N -o %t 2>/dev/null || true)
        [ "$state" = idle ] && { echo "SLURM_CONF=$dir/slurm.conf"; exit 0; }
        sleep 0.2
    done
    echo "local_cluster.sh: the node did not become idle (state: ${state:-none}); logs in $dir/log" >&2
    stop
    exit 1
    ;;
stop) stop ;;
*) echo "usage: local_cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
