#!/usr/bin/env bash
# A real two-node Slurm cluster on this one host, for the Slurm launch tests: munged, slurmctld and
# two slurmd (node1, node2) started by hand, without systemd. No GPUs and no accounting; each node
# offers $SLURM_TEST_GPUS stand-in GPUs of type "standin" as a generic resource (gres.conf, each
# "device" a link to /dev/null), so that `--gres=gpu:N`, `--gres=gpu:standin:N` and
# `--gpus-per-node=N` are parsed and scheduled as on a GPU cluster; the jobs train on CPU.
#
#   bash tests/infra/slurm.sh            # start it (a second call finds it running and returns at once)
#   bash tests/infra/slurm.sh status     # sinfo of the running cluster; exit 1 when it is not up
#   bash tests/infra/slurm.sh stop       # stop the daemons this script started
#   export SLURM_CONF=/tmp/dtt-slurm/slurm.conf   # then sbatch, srun, sinfo, scontrol talk to it
#
# Everything lives under $SLURM_TEST_DIR (config, state, spool, logs); the clients find the cluster
# through SLURM_CONF alone (/etc/slurm is left to the host's own setup). Needs root (slurmd runs jobs as their users) and the Debian
# packages slurm-wlm and munge (installed here with apt when missing).
set -euo pipefail

DIR=${SLURM_TEST_DIR:-/tmp/dtt-slurm}
CPUS=${SLURM_TEST_CPUS:-$(nproc)}         # CPUs each node offers; both nodes share this host's cores
CTLD_PORT=${SLURM_TEST_CTLD_PORT:-16817}  # away from 6817, where a real slurmctld would listen
NODE_PORT=${SLURM_TEST_NODE_PORT:-17001}  # node1's slurmd; node2's is the next one
GPUS=${SLURM_TEST_GPUS:-2}                # stand-in GPUs (GRES gpu:standin) each node offers
NODES=(node1 node2)
CONF=$DIR/slurm.conf
GRES_CONF=$DIR/gres.conf                  # slurmd reads gres.conf next to slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
export SLURM_CONF=$CONF

log() { echo "slurm.sh: $*" >&2; }
die() { log "$*"; exit 1; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_idle() {
  # Both nodes answer and are free: states idle (or mix/alloc while a job runs on a live cluster).
  local states
  states=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
  for n in "${NODES[@]}"; do
    grep -Eq "^$n (idle|mix|alloc)$" <<<"$states" || return 1
  done
}

running() {
  alive "$DIR/run/slurmctld.pid" || return 1
  for n in "${NODES[@]}"; do alive "$DIR/run/slurmd-$n.pid" || return 1; done
  nodes_idle
}

install_packages() {
  local need=()
  command -v slurmctld >/dev/null || need+=(slurm-wlm)
  command -v munged >/dev/null || need+=(munge)
  [ ${#need[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing ${need[*]}: install them (Debian/Ubuntu: sudo apt-get install -y ${need[*]}) and run again"
  fi
  log "installing ${need[*]} ..."
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing: create it with mungekey (or reinstall munge)"
  # munged refuses to run as root and wants its socket and log folders owned by its user.
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$DIR/run/munged.ours"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged started but does not answer; see /var/log/munge/munged.log"
}

render_config() {
  local host ports=$NODE_PORT n
  host=$(hostname -s)
  {
    echo "# Written by tests/infra/slurm.sh: a two-node test cluster on $host. Do not edit; rerun the script."
    echo "ClusterName=dtt"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$DIR/state"
    # %n: one spool, pid and log file per slurmd, as both run on this host.
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    # No cgroups in a sandbox without systemd: track processes by parent id, bind nothing.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    # The nodes claim this host's cores each; no check against the hardware they share.
    echo "SlurmdParameters=config_overrides"
    # No slurmdbd: finished jobs stay in `scontrol show job` for MinJobAge seconds (up to a minute
    # more until the purge runs) and forever in jobcomp.txt. Below 6 s, `sbatch --wait` polls every
    # 2 s instead of after 2, 10, 42 s, ... (its sleep grows only while under MinJobAge/2).
    echo "MinJobAge=5"
    # Refuse what no node can run at submit time (as real clusters do) instead of pending forever.
    echo "EnforcePartLimits=ALL"
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$DIR/log/jobcomp.txt"
    # GPUs as a generic resource (gres.conf): requests for them schedule; task/none binds nothing.
    echo "GresTypes=gpu"
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$ports CPUs=$CPUS Gres=gpu:standin:$GPUS State=UNKNOWN"
      ports=$((ports + 1))
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
  }
}

render_gres_config() {
  # slurmd drops a GPU without a device file ("file-less GPU") and wants a character or block
  # device: links to /dev/null serve, both slurmd share them.
  echo "# Written by tests/infra/slurm.sh: stand-in GPUs for scheduling, no hardware behind them."
  echo "AutoDetect=off"
  echo "NodeName=$(IFS=,; echo "${NODES[*]}") Name=gpu Type=standin File=$DIR/dev/gpu[0-$((GPUS - 1))]"
}

forget_etc_config() {
  # Clients find this cluster through SLURM_CONF only: a link at /etc/slurm/slurm.conf (older versions
  # of this script made one) would make it the Slurm of every program on this host, such as the
  # partition check of `<package> check` in unrelated tests.
  if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$CONF" ]; then rm -f "$ETC_CONF"; fi
}

hosts_entries() {
  # The node names must resolve: torchrun's master is the first host of the allocation.
  local missing=()
  for n in "${NODES[@]}"; do getent hosts "$n" >/dev/null || missing+=("$n"); done
  [ ${#missing[@]} -eq 0 ] || echo "127.0.0.1 ${missing[*]}" >>/etc/hosts
}

start() {
  local want
  want=$(render_config)
  if [ "$(cat "$CONF" 2>/dev/null)" = "$want" ] && running; then
    log "running (SLURM_CONF=$CONF)"
    return
  fi
  [ "$(id -u)" = 0 ] || die "run as root: slurmd must start jobs as their users"
  install_packages
  stop_daemons quiet  # a cluster from an older config of this script, or one half up
  mkdir -p "$DIR"/{state,spool,run,log}
  echo "$want" >"$CONF"
  mkdir -p "$DIR/dev"
  for i in $(seq 0 $((GPUS - 1))); do ln -sfn /dev/null "$DIR/dev/gpu$i"; done
  render_gres_config >"$GRES_CONF"
  forget_etc_config
  hosts_entries
  start_munge
  # -i: start even when state files from an earlier cluster in $DIR do not match.
  /usr/sbin/slurmctld -i -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
  for n in "${NODES[@]}"; do
    /usr/sbin/slurmd -N "$n" -f "$CONF" || die "slurmd -N $n did not start; see $DIR/log/slurmd-$n.log"
  done
  for _ in $(seq 150); do
    if nodes_idle; then
      log "up: ${NODES[*]} idle, $CPUS CPUs each (SLURM_CONF=$CONF)"
      return
    fi
    sleep 0.2
  done
  sinfo -N >&2 || true
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-*.log >&2 || true
  die "the nodes did not become idle within 30 s"
}

stop_daemons() {
  # TERM to all at once, then wait: each daemon takes a few seconds to shut down.
  local pidfile pids=() names=() i
  for pidfile in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid"; do
    alive "$pidfile" || continue
    pids+=("$(cat "$pidfile")")
    names+=("$(basename "$pidfile" .pid)")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || break  # true while any of them lives
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    kill -0 "${pids[$i]}" 2>/dev/null && kill -9 "${pids[$i]}"
    [ "${1:-}" = quiet ] || log "stopped ${names[$i]} (${pids[$i]})"
  done
  return 0
}

stop() {
  stop_daemons
  if [ -f "$DIR/run/munged.ours" ] && alive /run/munge/munged.pid; then
    kill "$(cat /run/munge/munged.pid)" && log "stopped munged"
  fi
  rm -f "$DIR/run/munged.ours"
  forget_etc_config
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) if running; then sinfo -N; else log "not running"; exit 1; fi ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
