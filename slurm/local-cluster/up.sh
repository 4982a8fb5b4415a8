#!/usr/bin/env bash
# Start a one-node SLURM cluster with accounting on this machine, loopback only.
# Idempotent: starts only what is not already running, and returns at once when all is up.
# State, config, logs and pid files live in $RL_APP_SLURM_DIR (default /tmp/rl_app-slurm).
# /etc/slurm/slurm.conf is made a symlink to the config there, so plain sbatch/squeue/sacct
# (and submitit, which calls them) reach this cluster with no environment variable.
set -euo pipefail
source "$(dirname "$0")/common.sh"
start=$SECONDS

all_running() { for d in "${DAEMONS[@]}"; do our_pid "$d" >/dev/null || return 1; done; }
etc_conf_ok() { [[ $(readlink "$ETC_CONF" 2>/dev/null) == "$SLURM_CONF" ]]; }

# Without root nothing can be repaired, so a controller that answers is all we check then.
if ctld_up && { [[ $EUID -ne 0 ]] || { all_running && etc_conf_ok; }; }; then
  echo "local SLURM cluster already up ($STATE)"
  exit 0
fi
[[ $EUID -eq 0 ]] || die "the local SLURM cluster is not running and starting it needs root"
if [[ -e $ETC_CONF && ! -L $ETC_CONF ]]; then
  die "$ETC_CONF is a regular file, not ours; move it away to use the local cluster"
fi

# The ports are fixed; if another cluster (say, another state directory) holds one, stop here
# rather than leave half a cluster running.
for port_daemon in 6817:slurmctld 6818:slurmd 6819:slurmdbd; do
  if ! our_pid "${port_daemon#*:}" >/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/${port_daemon%:*}") 2>/dev/null; then
    die "127.0.0.1:${port_daemon%:*} is taken by another process (another cluster? run its down.sh)"
  fi
done

mkdir -p "$STATE"
chmod 755 "$STATE"   # non-root users need to reach the munge socket inside it

# --- packages --------------------------------------------------------------------------------
PKGS=(slurmctld slurmd slurm-client munge slurmdbd slurm-wlm-mysql-plugin mariadb-server)
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    echo "installing SLURM, munge and MariaDB packages (log: $STATE/apt.log) ..."
    # The packages' own init scripts would start system-wide daemons; we run our own instead.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    { DEBIAN_FRONTEND=noninteractive apt-get update &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PKGS[@]}"
    } >"$STATE/apt.log" 2>&1 || die "apt-get failed; see $STATE/apt.log"
    break
  fi
done

# slurmctld and slurmd look up this machine's own name.
getent hosts "$(hostname)" >/dev/null || echo "127.0.0.1 $(hostname)" >>/etc/hosts

# --- configuration ---------------------------------------------------------------------------
# Written on every start (cheap, deterministic), so a changed CPU count or memory is picked up.
mkdir -p "$STATE"/{slurmdbd,slurmctld,slurmd}
install -d -o munge -g munge -m 755 "$STATE/munged"
install -d -o mysql -g mysql -m 755 "$STATE/mariadbd"   # data/ inside stays private
MUNGE_SOCKET=$STATE/munged/munge.socket
MYSQL_SOCKET=$STATE/mariadbd/mariadbd.sock
CPUS=$(nproc)
MEM=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
[[ -n $MEM ]] || die "could not read RealMemory from 'slurmd -C'"

cat >"$STATE/slurm.conf" <<CONF
# Local one-node cluster written by slurm/local-cluster/up.sh; rewritten on every start.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Private munge socket; short credential lifetime so a requeued job can start again within
# seconds (its old credential must expire first).
AuthInfo=cred_expire=10,socket=$MUNGE_SOCKET
# Bind to 127.0.0.1 only, never to all interfaces.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$STATE/slurmctld
SlurmctldPidFile=$STATE/slurmctld/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld/slurmctld.log
SlurmdSpoolDir=$STATE/slurmd
SlurmdPidFile=$STATE/slurmd/slurmd.pid
SlurmdLogFile=$STATE/slurmd/slurmd.log
# No cgroups: track job processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# Cores are the only consumable: a job that gives no --mem must not claim the whole node's
# memory, or jobs (e.g. several collector jobs) would run one at a time.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Schedule every 2 s (default 60 s) so requeued and new jobs start quickly.
SchedulerParameters=sched_interval=2,bf_interval=2
KillWait=5
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
# Clients sign slurmdbd requests through the munge socket named here, not the AuthInfo one.
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
# Record GPU allocations too, so sacct's AllocTRES shows gres/gpu.
AccountingStorageTRES=gres/gpu
# One fake GPU, for scheduling only: jobs asking for it get CUDA_VISIBLE_DEVICES=0 but no device.
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=$CPUS RealMemory=$MEM Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

cat >"$STATE/gres.conf" <<CONF
AutoDetect=off
NodeName=localhost Name=gpu File=/dev/null
CONF

# slurmdbd refuses a config readable by others (it may hold a password).
install -m 600 /dev/null "$STATE/slurmdbd.conf"
cat >"$STATE/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
# DbdAddr alone still binds 0.0.0.0.
CommunicationParameters=NoInAddrAny
SlurmUser=root
PidFile=$STATE/slurmdbd/slurmdbd.pid
LogFile=$STATE/slurmdbd/slurmdbd.log
StorageType=accounting_storage/mysql
# MariaDB listens on a socket only (MYSQL_UNIX_PORT below); root logs in by unix-socket auth.
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
CONF

mkdir -p /etc/slurm
ln -sfn "$SLURM_CONF" "$ETC_CONF"

# --- daemons ---------------------------------------------------------------------------------
# Poll "$@" until it succeeds, for at most $1 seconds.
wait_for() {
  local end=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do ((SECONDS < end)) || return 1; sleep 0.2; done
}
# Fail with the daemon's log tail when it did not come up.
failed() {
  tail -n 5 "$STATE/$1/$1.log" >&2 2>/dev/null || true
  die "$1 did not start; see $STATE/$1/$1.log"
}
# Daemons get no terminal and no inherited stdout, so a caller capturing our output never hangs.
launch() { local name=$1; shift; "$@" </dev/null >>"$STATE/$name/$name.out" 2>&1; }

if ! our_pid munged >/dev/null; then
  # A private key and socket: independent of any system-wide munge.
  [[ -s $STATE/munged/munge.key ]] ||
    runuser -u munge -- mungekey --create --keyfile="$STATE/munged/munge.key"
  launch munged runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$STATE/munged/munge.key" \
    --pid-file="$(pidfile munged)" --log-file="$STATE/munged/munged.log" \
    --seed-file="$STATE/munged/munged.seed"
  wait_for 10 our_pid munged || failed munged
fi

if ! our_pid mariadbd >/dev/null; then
  if [[ ! -d $STATE/mariadbd/data/mysql ]]; then
    mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mariadbd/data" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$STATE/mariadbd/install.log" 2>&1 || die "mariadb-install-db failed; see $STATE/mariadbd/install.log"
  fi
  # --no-defaults: ignore /etc/mysql (system socket and TCP port); no network at all.
  setsid -f mariadbd --no-defaults --user=mysql --datadir="$STATE/mariadbd/data" \
    --socket="$MYSQL_SOCKET" --pid-file="$(pidfile mariadbd)" --skip-networking \
    --log-error="$STATE/mariadbd/mariadbd.log" </dev/null >/dev/null 2>&1
  wait_for 30 mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" ping || failed mariadbd
fi

if ! our_pid slurmdbd >/dev/null; then
  # The MySQL client library takes the socket path from MYSQL_UNIX_PORT.
  MYSQL_UNIX_PORT=$MYSQL_SOCKET launch slurmdbd slurmdbd
  wait_for 30 sacctmgr -n list cluster || failed slurmdbd
fi
# slurmctld registers with accounting only for a cluster known there.
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "could not add cluster $CLUSTER to accounting"
fi

if ! our_pid slurmctld >/dev/null; then
  launch slurmctld slurmctld
  wait_for 30 ctld_up || failed slurmctld
fi

if ! our_pid slurmd >/dev/null; then
  # -N: the node is named localhost whatever the hostname is.
  launch slurmd slurmd -N localhost
  wait_for 10 our_pid slurmd || failed slurmd
fi

node_ready() { sinfo -h -n localhost -o %t | grep -Eq '^(idle|mix|alloc)$'; }
wait_for 60 node_ready || die "node localhost did not become idle: $(sinfo -h -n localhost -o '%t %E')"
echo "local SLURM cluster up in $((SECONDS - start)) s ($STATE; clients use $ETC_CONF -> $SLURM_CONF)"
