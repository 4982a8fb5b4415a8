# shellcheck shell=bash disable=SC2034  # variables here are used by the scripts that source this
# Shared by up.sh, down.sh and status.sh (sourced, not run).
# Every file of the local cluster lives under one state directory, one sub-directory per daemon
# holding its pid file, log and data: $STATE/<daemon>/<daemon>.pid and .log.

STATE=$(realpath -m "${RL_APP_SLURM_DIR:-/tmp/rl_app-slurm}")
CLUSTER=rl_app
ETC_CONF=/etc/slurm/slurm.conf
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)   # start order; down.sh stops in reverse

# Exported for this script's own slurm commands and the daemons it starts (they find gres.conf and
# slurmdbd.conf beside it); the caller's environment is not touched.
export SLURM_CONF=$STATE/slurm.conf

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

pidfile() { echo "$STATE/$1/$1.pid"; }

# True when process $1 runs: exists and is not a zombie (a killed daemon stays a zombie until
# its parent reaps it, and kill -0 still succeeds on it).
alive() {
  local _pid _comm state
  read -r _pid _comm state _ 2>/dev/null <"/proc/$1/stat" && [[ $state != Z ]]
}

# Print the pid of daemon $1 if its pid file names a live process of that program (checking the
# program name guards against a pid reused by something else after a crash).
our_pid() {
  local f pid
  f=$(pidfile "$1")
  [[ -r $f ]] || return 1
  pid=$(tr -dc 0-9 <"$f")
  [[ -n $pid ]] && alive "$pid" || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] || return 1
  echo "$pid"
}

# True when slurmctld of this cluster answers. Without a config file scontrol would look for one
# through DNS and hang, so check for the file first.
ctld_up() { [[ -r $SLURM_CONF ]] && timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }
