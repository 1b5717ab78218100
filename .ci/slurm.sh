#!/usr/bin/env bash
# A single-node SLURM cluster on localhost for the pipeline's SLURM test.
#
#   .ci/slurm.sh install   apt-get install slurm-wlm and munge (skipped when present)
#   .ci/slurm.sh start     write slurm.conf, start munged, slurmctld and slurmd; wait until idle
#   .ci/slurm.sh stop      stop the daemons started by `start`, by their pid files
#
# Needs root. State (config, spool, logs, pid files) lives in $LEROBOT_PIPE_SLURM_DIR
# (default /tmp/lerobot-pipe-slurm); /etc/slurm/slurm.conf links to the config there because
# the SLURM jobstep clears SLURM_CONF before its inner srun.
set -euo pipefail

state=${LEROBOT_PIPE_SLURM_DIR:-/tmp/lerobot-pipe-slurm}

install() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
        echo "slurm-wlm and munge already installed"
        return
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    local cpus mem_mb
    # Not nproc: it honours OMP_NUM_THREADS (1 in CI), which would make a 1-CPU node.
    cpus=$(getconf _NPROCESSORS_ONLN)
    # Leave 2 GB to the system; SLURM refuses a node that reports less than RealMemory.
    mem_mb=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 2048))
    cat >"$state/slurm.conf" <<CONF
ClusterName=lerobot-pipe
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
ReturnToService=2
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

node_idle() {
    sinfo --noheader --states=idle --format=%N 2>/dev/null | grep -qx localhost
}

start() {
    if [ -f "$state/slurmctld.pid" ] && node_idle; then
        echo "SLURM already running (state in $state)"
        return
    fi
    mkdir -p "$state/ctld" "$state/d"
    write_conf
    mkdir -p /etc/slurm
    ln -sfn "$state/slurm.conf" /etc/slurm/slurm.conf

    mkdir -p /run/munge /etc/munge
    chown munge:munge /run/munge
    [ -f /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    # A package install may have started daemons of its own (postinst scripts): reuse a running
    # munged, replace SLURM daemons that would not read our configuration.
    if ! munge -n >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
        cp /run/munge/munged.pid "$state/munged.pid"
    fi
    pkill -x slurmctld 2>/dev/null || true
    pkill -x slurmd 2>/dev/null || true
    sleep 0.5

    /usr/sbin/slurmctld
    /usr/sbin/slurmd -N localhost

    for _ in $(seq 60); do
        if node_idle; then
            sinfo
            return
        fi
        sleep 0.5
    done
    echo "the SLURM node did not become idle within 30 s; see $state/*.log" >&2
    sinfo >&2 || true
    exit 1
}

stop() {
    local daemon pidfile
    for daemon in slurmd slurmctld munged; do
        pidfile="$state/$daemon.pid"
        [ -f "$pidfile" ] || continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

case "${1:-}" in
install) install ;;
start) start ;;
stop) stop ;;
*)
    echo "usage: $0 install|start|stop" >&2
    exit 2
    ;;
esac
