#!/usr/bin/env bash
# A throw-away single-node Slurm cluster for tests, from Debian's Slurm 22.05 and MUNGE.
#
#   tests/slurm/slurm.sh install                        apt-get installs slurmctld, slurmd,
#                                                       slurm-client and munge if missing
#   tests/slurm/slurm.sh start DIR PORT PARTITION...    a fresh cluster under DIR; slurmctld on
#                                                       PORT, slurmd on PORT+1
#   tests/slurm/slurm.sh stop DIR                       cancels its jobs, stops its daemons,
#                                                       removes DIR
#
# The cluster: a munged of its own (socket in DIR/munge, Debian's key /etc/munge/munge.key), one
# slurmctld and one slurmd for this machine (reached at 127.0.0.1, whether or not its host name
# resolves), as root, with every state, spool, log and pid file in
# DIR. Process tracking by parent process (proctrack/linuxproc), no task plugin and no accounting,
# so nothing needs cgroups or a database. Each PARTITION holds this machine's node, oversubscribed
# up to 8 jobs per core, so a test can run a whole deployment's jobs on two cores; the first is the
# default. KillWait is 30 s, Slurm's default: a cancelled job has that long between SIGTERM and
# SIGKILL. DIR/env exports SLURM_CONF for the Slurm commands (sbatch, squeue, scancel, scontrol).
#
# With SLURM_OWNER_PID=PID in the environment, start also leaves a watchdog that stops the cluster
# once PID is gone (for test scripts that may die before calling stop). On failure start prints
# the daemons' logs and stops what it started.
set -euo pipefail

readonly PACKAGES=(slurmctld slurmd slurm-client munge)
readonly MARKER=.slurm-sh-cluster  # in DIR: stop only ever deletes a DIR that has it

say() { echo "slurm: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { die "usage: $0 install | start DIR PORT PARTITION... | stop DIR"; }

cmd_install() {
  bash "$(dirname "${BASH_SOURCE[0]}")/../install_packages.sh" slurm "${PACKAGES[@]}"
}

pid_of() { cat "$1" 2>/dev/null || true; }

cmd_stop() {
  local d=$1 pid
  [[ -e $d/$MARKER ]] || { [[ ! -e $d ]] && return 0; die "$d was not made by $0; not touching it"; }
  if [[ -f $d/slurm.conf ]]; then
    # Every job first, so that nothing the jobs started outlives the cluster.
    SLURM_CONF=$d/slurm.conf timeout 10 scancel --full --signal=KILL --state=RUNNING --quiet 2>/dev/null || true
    SLURM_CONF=$d/slurm.conf timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null || true
  fi
  for name in slurmd slurmctld; do
    pid=$(pid_of "$d/$name.pid")
    [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
  done
  # The job step daemons of this cluster's jobs, and whatever they still hold.
  for pid in $(pgrep -f "slurmstepd" 2>/dev/null || true); do
    if tr '\0' ' ' < "/proc/$pid/environ" 2>/dev/null | grep -q "SLURM_CONF=$d/slurm.conf"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for _ in $(seq 50); do
    local alive=0
    for name in slurmd slurmctld; do
      pid=$(pid_of "$d/$name.pid")
      [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && alive=1
    done
    ((alive == 0)) && break
    sleep 0.1
  done
  for name in slurmd slurmctld; do
    pid=$(pid_of "$d/$name.pid")
    [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null || true
  done
  pid=$(pid_of "$d/munge/pid")
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
  pid=$(pid_of "$d/watchdog.pid")
  [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null || true
  rm -rf "$d"
}

cmd_start() {
  local d=$1 port=$2
  shift 2
  (($# > 0)) || usage
  for tool in munged slurmctld slurmd sbatch; do
    command -v "$tool" >/dev/null || die "$tool is not installed (run: $0 install)"
  done
  [[ -e $d ]] && cmd_stop "$d"
  mkdir -p "$d"/{state,spool,log,munge}
  touch "$d/$MARKER"
  d=$(cd "$d" && pwd)
  # munged refuses a socket directory it does not own, or one others cannot reach through.
  chown munge:munge "$d/munge"
  chmod 711 "$d/munge"
  runuser -u munge -- munged --socket="$d/munge/socket" --key-file=/etc/munge/munge.key \
    --log-file="$d/munge/log" --pid-file="$d/munge/pid" --seed-file="$d/munge/seed" ||
    { cat "$d/munge/log" >&2 2>/dev/null; cmd_stop "$d"; die "munged did not start"; }

  local host memory cpus first=1 partitions=""
  host=$(hostname)
  cpus=$(nproc)
  memory=$(awk '/MemTotal/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)
  for p in "$@"; do
    partitions+="PartitionName=$p Nodes=$host Default=$([[ $first == 1 ]] && echo YES || echo NO) MaxTime=INFINITE State=UP OverSubscribe=FORCE:8"$'\n'
    first=0
  done
  cat > "$d/slurm.conf" <<EOF
ClusterName=weft-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/socket
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
KillWait=30
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
$partitions
EOF
  echo "export SLURM_CONF=$d/slurm.conf" > "$d/env"
  slurmctld -f "$d/slurm.conf" && slurmd -f "$d/slurm.conf" ||
    { tail -n 30 "$d"/log/*.log >&2 2>/dev/null; cmd_stop "$d"; die "the daemons did not start"; }
  # Ready once the node takes jobs.
  local state=""
  for _ in $(seq 200); do
    state=$(SLURM_CONF=$d/slurm.conf sinfo -h -N -n "$host" -o %t 2>/dev/null | head -n 1 || true)
    [[ $state == idle* || $state == mix* ]] && break
    sleep 0.1
  done
  if [[ $state != idle* && $state != mix* ]]; then
    tail -n 30 "$d"/log/*.log >&2 2>/dev/null
    cmd_stop "$d"
    die "the node did not become idle (state '$state')"
  fi
  if [[ -n ${SLURM_OWNER_PID:-} ]]; then
    (
      trap '' HUP
      while kill -0 "$SLURM_OWNER_PID" 2>/dev/null; do sleep 2; done
      [[ -e $d/$MARKER ]] && "$0" stop "$d" >/dev/null 2>&1
    ) < /dev/null > /dev/null 2>&1 &
    echo $! > "$d/watchdog.pid"
  fi
  say "cluster up in $d (slurmctld on port $port; partitions: $*)"
}

case "${1:-}" in
  install) cmd_install ;;
  start) (($# >= 4)) || usage; cmd_start "$2" "$3" "${@:4}" ;;
  stop) (($# == 2)) || usage; cmd_stop "$2" ;;
  *) usage ;;
esac
