#!/usr/bin/env bash
# A real Slurm cluster on one machine, for dtrain's integration tests and CI: one munged, one
# slurmctld and two slurmd (nodes n1 and n2), everything under one directory, run as root.
#
#   scripts/slurm/cluster.sh up DIR      start (or check) the cluster; waits until both nodes idle
#   eval "$(scripts/slurm/cluster.sh env DIR)"   point sinfo/srun/sbatch/squeue/scancel at it
#   scripts/slurm/cluster.sh down DIR    stop it; idempotent
#   scripts/slurm/cluster.sh status DIR  exit 0 when it is up, print sinfo
#
# Needs Debian's slurmctld, slurmd, slurm-client and munge (scripts/setup.sh installs them).
# One cluster per machine at a time (fixed ports, fixed node names): `up` on a new DIR first
# stops the cluster of another DIR and kills leftover daemons of a crashed run. Tests that run
# in parallel must share one cluster (bring it up once, as a fixture), not start their own.
#
# What tests see (measured with Debian slurm-wlm 22.05.8; `up` takes about 1 s, `down` 2 s):
# - Nodes: n1 = 127.0.0.1 (slurmd port 17001), n2 = 127.0.0.2 (17002); slurmctld on
#   127.0.0.1:17000; srun's own ports in 17100-17199. n1 and n2 resolve through a tagged block
#   in /etc/hosts that `up` writes and `down` removes, so a worker taking MASTER_ADDR from the
#   first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ("n[1-2]" -> "n1") reaches
#   127.0.0.1, and a rank on n2 can bind 127.0.0.2. Both are loopback: nothing is remote.
# - `hostname` is the real machine name in every task of both nodes (both slurmd run on this
#   host); tell nodes apart by SLURMD_NODENAME or SLURM_TOPOLOGY_ADDR (n1/n2) or SLURM_NODEID,
#   never by hostname. SLURM_LAUNCH_NODE_IPADDR and SLURM_SRUN_COMM_HOST are 127.0.0.1.
#   Tasks inherit SLURM_CONF, so srun, scancel and scontrol work inside jobs.
# - CPUs=2 per node, as the machine has: `srun -N2 -n4` puts ranks 0-1 on n1 and 2-3 on n2.
#   (With more CPUs declared, Slurm packs that request 3+1.) `srun -N2 --ntasks-per-node=1`
#   gives one rank per node. More than 2 tasks on a node need `--overcommit` (-O): `srun -N2
#   -n8 -O` places 4+4. The partition has OverSubscribe=FORCE:4, so up to 4 jobs share the
#   CPUs and tests may run jobs in parallel. EnforcePartLimits=ALL makes an impossible request
#   (`-n8` without -O, `-N3`) fail at once instead of pending forever.
# - sbatch: the batch shell runs on the first node of the allocation (n1 for a 2-node job),
#   with SLURM_JOB_NODELIST=n[1-2] and no SLURM_STEP_* variables; `srun` inside it needs no
#   flags. The batch shell exports SLURM_NTASKS (e.g. 4 for `-N2 --ntasks-per-node=2`) and
#   srun reads it back as input: `srun -N2 --ntasks-per-node=1` there warns "can't honor
#   --ntasks-per-node", starts 4 tasks instead of 2 (with --cpus-per-task=2 it fails: "More
#   processors requested than permitted"); pass `--ntasks=<nodes>` as well. A step started right after the
#   previous one may print "step creation temporarily disabled, retrying" and wait about 1 s.
#   Steps of one job do not share CPUs unless started with `--overlap`.
# - Signals: `scancel --signal=TERM JOBID` sends SIGTERM to every process of every step (the
#   tasks and their children, not the batch shell); `scancel --batch --signal=TERM` to the
#   batch shell only. Plain `scancel JOBID`: SIGCONT and SIGTERM to all, SIGKILL after
#   KillWait=30 s. srun that itself receives SIGTERM ends its step with SIGKILL at once, so
#   `--signal=B:TERM@S` with `exec srun` gives the workers no grace: use `--signal=TERM@S`.
#   `--signal` may fire up to 60 s early (seen: 19 s early with -t 2 --signal=B:USR1@90).
# - Requeue: `scontrol requeue JOBID` of a `--requeue` job restarts the batch script with the
#   same job id about 2 minutes later (state PENDING, reason BeginTime); SLURM_RESTART_COUNT is
#   unset on the first run, then 1, 2, ... No accounting: sacct does not work.
# - Every `up` starts a fresh cluster (no jobs or node states recovered); job ids start at 1.
# - Logs: DIR/log/{slurmctld,slurmd-n1,slurmd-n2,munged}.log. slurmd logs "can not load PMIx
#   library" and munged "Unauthorized credential": both harmless.
set -euo pipefail

readonly CTLD_PORT=17000 N1_PORT=17001 N2_PORT=17002 SRUN_PORTS=17100-17199
readonly HOSTS_BEGIN="# BEGIN dtrain slurm test cluster" HOSTS_END="# END dtrain slurm test cluster"
readonly CONF_MARKER="# dtrain one-machine test cluster"
# Which DIR is up on this machine, so that `up` elsewhere can stop it first.
readonly CURRENT_FILE=/run/dtrain-slurm-test-cluster
readonly UP_TIMEOUT_S=60

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '2,10p' "$0" >&2
  exit 2
}

# True when PID runs (a zombie does not: without an init that reaps, killed daemons stay so).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ "${stat:0:1}" != Z ]]
}

# Prints the pid in FILE when that process runs.
live_pid() {
  local pid
  [[ -s "$1" ]] || return 1
  pid=$(<"$1")
  [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" && echo "$pid"
}

# Sends TERM to PIDS at once (each daemon takes 1.5-2 s to stop), waits up to 5 s, then KILL.
stop_pids() {
  local i pid alive=()
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    alive=()
    for pid in "$@"; do
      if running "$pid"; then alive+=("$pid"); fi
    done
    ((${#alive[@]})) || return 0
    sleep 0.1
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

# The cluster directory a daemon of this script belongs to, from its command line (munged,
# slurmctld, slurmd) or from the slurmd log it holds open (slurmstepd); nothing for others.
daemon_dir() {
  local proc=/proc/$1 comm cmd fd target
  comm=$(cat "$proc/comm" 2>/dev/null) || return 0
  case "$comm" in
    munged | slurmctld | slurmd)
      cmd=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || return 0
      sed -n -e 's|.*--key-file=\([^ ]*\)/munge/munge\.key.*|\1|p' \
        -e 's|.* -f \([^ ]*\)/slurm\.conf.*|\1|p' <<<"$cmd"
      ;;
    slurmstepd)
      for fd in "$proc"/fd/*; do
        target=$(readlink "$fd" 2>/dev/null) || continue
        if [[ "$target" =~ ^(.*)/log/slurmd-n[12]\.log ]]; then
          echo "${BASH_REMATCH[1]}"
          return 0
        fi
      done
      ;;
  esac
}

# Pids of this script's daemons (and slurmstepd) that belong to DIR, or with DIR empty, to any
# directory whose slurm.conf carries our marker or is gone: leftovers of crashed runs.
daemon_pids() {
  local want=$1 proc pid dir
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    dir=$(daemon_dir "$pid")
    [[ -n "$dir" ]] || continue
    if [[ -n "$want" ]]; then
      [[ "$dir" == "$want" ]] && echo "$pid"
    elif [[ ! -e "$dir/slurm.conf" ]] || grep -qF "$CONF_MARKER" "$dir/slurm.conf"; then
      echo "$pid"
    fi
  done
}

# PID and all its descendants, children first.
process_tree() {
  local stat
  while read -r stat; do
    stat=${stat#/proc/}
    process_tree "${stat%/stat}"
  done < <(grep -l "^[0-9]* ([^)]*) . $1 " /proc/[0-9]*/stat 2>/dev/null)
  echo "$1"
}

# Kills PIDS with their descendants (the tasks under a leftover slurmstepd).
kill_trees() {
  local pid tree
  for pid in "$@"; do
    mapfile -t tree < <(process_tree "$pid")
    kill -KILL "${tree[@]}" 2>/dev/null || true
  done
}

remove_hosts_block() {
  grep -qF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
  # /etc/hosts may be a bind mount (containers): rewrite it in place, never rename over it.
  local kept
  kept=$(sed "/^$HOSTS_BEGIN/,/^$HOSTS_END/d" /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts
}

add_hosts_block() {
  remove_hosts_block
  printf '%s\n127.0.0.1 n1\n127.0.0.2 n2\n%s\n' "$HOSTS_BEGIN" "$HOSTS_END" >>/etc/hosts
}

write_conf() {
  local dir=$1 host
  host=$(hostname -s)
  cat >"$dir/slurm.conf" <<EOF
$CONF_MARKER, written by scripts/slurm/cluster.sh; every path is under $dir.
ClusterName=dtraintest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$N1_PORT
SrunPortRange=$SRUN_PORTS
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The nodes declare more CPUs than the machine has; take the declared counts as they are.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
# Seconds between SIGTERM and SIGKILL at cancel, time limit or preemption (Slurm's default).
KillWait=30
InactiveLimit=0
EnforcePartLimits=ALL
MinJobAge=300
SchedulerType=sched/backfill
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$N1_PORT CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.2 Port=$N2_PORT CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
EOF
  # No SPANK plugins from /etc/slurm.
  : >"$dir/plugstack.conf"
}

log_tails() {
  local dir=$1 f
  for f in "$dir"/log/*.log; do
    [[ -e "$f" ]] || continue
    echo "--- $f (last 15 lines)" >&2
    tail -n 15 "$f" >&2
  done
}

# True when sinfo lists both nodes and every one of them is idle (or allocated/mixed).
# Runs a Slurm client command against DIR's cluster, for at most 5 s.
slurm_client() {
  local dir=$1
  shift
  SLURM_CONF=$dir/slurm.conf timeout 5 "$@"
}

# True when DIR's munged and slurmctld run. Slurm clients retry a controller that is down, or
# a munged that is gone, for 10 s or more: ask them only then.
controller_running() {
  live_pid "$1/run/munged.pid" >/dev/null && live_pid "$1/run/slurmctld.pid" >/dev/null
}

nodes_ready() {
  local states
  controller_running "$1" || return 1
  states=$(slurm_client "$1" sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [[ $(grep -cE '^n[12] (idle|alloc|mix)$' <<<"$states") == 2 ]]
}

cmd_down() {
  local dir=$1 name pid i pids jobs
  if [[ -e "$dir/slurm.conf" ]] && controller_running "$dir"; then
    # End the jobs first so that no slurmstepd or task outlives the daemons.
    slurm_client "$dir" scancel --quiet --full --signal=KILL --user=root 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do
      jobs=$(slurm_client "$dir" squeue -h -o %i 2>/dev/null) || break
      [[ -z "$jobs" ]] && break
      sleep 0.1
    done
  fi
  pids=()
  for name in slurmd-n1 slurmd-n2 slurmctld munged; do
    if pid=$(live_pid "$dir/run/$name.pid"); then pids+=("$pid"); fi
  done
  stop_pids "${pids[@]}"
  rm -f "$dir"/run/*.pid
  mapfile -t pids < <(daemon_pids "$dir")
  kill_trees "${pids[@]}"
  if [[ -s "$CURRENT_FILE" && $(<"$CURRENT_FILE") == "$dir" ]]; then rm -f "$CURRENT_FILE"; fi
  remove_hosts_block
}

cmd_up() {
  local dir=$1 previous pids i name
  if [[ -e "$dir/slurm.conf" ]] && live_pid "$dir/run/slurmd-n1.pid" >/dev/null &&
    live_pid "$dir/run/slurmd-n2.pid" >/dev/null && nodes_ready "$dir"; then
    echo "cluster.sh: already up in $dir" >&2
    return 0
  fi
  for name in mungekey munged slurmctld slurmd sinfo; do
    command -v "$name" >/dev/null ||
      die "$name not found; run scripts/setup.sh (Debian slurmctld slurmd slurm-client munge)"
  done
  # Another directory's cluster, or the daemons of a crashed run, would hold the ports.
  if [[ -s "$CURRENT_FILE" ]]; then
    previous=$(<"$CURRENT_FILE")
    if [[ "$previous" != "$dir" && -d "$previous" ]]; then
      echo "cluster.sh: stopping the test cluster in $previous first" >&2
      cmd_down "$previous"
    fi
  fi
  cmd_down "$dir"
  mapfile -t pids < <(daemon_pids "")
  if ((${#pids[@]})); then
    echo "cluster.sh: killing leftover test-cluster processes: ${pids[*]}" >&2
    kill_trees "${pids[@]}"
    sleep 0.5
  fi

  # A fresh cluster every time: no jobs or node states recovered from an earlier run.
  rm -rf "$dir"/{state,spool,run,log}
  mkdir -p "$dir"/{munge,state,spool/n1,spool/n2,run,log}
  # munged refuses a socket directory that others may write to.
  chmod 755 "$dir/munge"
  echo "$dir" >"$CURRENT_FILE"

  [[ -s "$dir/munge/munge.key" ]] || mungekey --create --keyfile="$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" || {
    log_tails "$dir"
    die "munged did not start (log above)"
  }
  write_conf "$dir"
  add_hosts_block
  slurmctld -f "$dir/slurm.conf" || {
    log_tails "$dir"
    die "slurmctld did not start (log above); stop with: $0 down $dir"
  }
  for name in n1 n2; do
    slurmd -f "$dir/slurm.conf" -N "$name" || {
      log_tails "$dir"
      die "slurmd for node $name did not start (log above); stop with: $0 down $dir"
    }
  done

  for ((i = 0; i < UP_TIMEOUT_S * 10; i++)); do
    nodes_ready "$dir" && return 0
    sleep 0.1
  done
  slurm_client "$dir" sinfo -N >&2 || true
  log_tails "$dir"
  die "nodes n1, n2 not idle after ${UP_TIMEOUT_S} s (sinfo, logs above); stop: $0 down $dir"
}

cmd_env() {
  local dir=$1
  [[ -e "$dir/slurm.conf" ]] || die "no cluster in $dir: run '$0 up $dir' first"
  echo "export SLURM_CONF=$dir/slurm.conf"
}

cmd_status() {
  local dir=$1
  [[ -e "$dir/slurm.conf" ]] || die "no cluster in $dir"
  slurm_client "$dir" sinfo -N
  nodes_ready "$dir"
}

(($# == 2)) || usage
[[ $(id -u) == 0 ]] || die "run as root (slurmd and /etc/hosts need it)"
[[ "$1" == up ]] && mkdir -p "$2"
# Absolute and symlink-free: the daemons' command lines and pid files name this path.
dir=$(cd "$2" 2>/dev/null && pwd -P) || dir=$(realpath -m "$2")
case "$1" in
  up) cmd_up "$dir" ;;
  down) cmd_down "$dir" ;;
  env) cmd_env "$dir" ;;
  status) cmd_status "$dir" ;;
  *) usage ;;
esac
