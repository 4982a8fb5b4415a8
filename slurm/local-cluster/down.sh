#!/usr/bin/env bash
# Stop the local SLURM cluster that up.sh started: cancel its jobs, then stop only the daemons
# named by the pid files in the state directory. Idempotent; exits 0 when nothing runs.
# Packages, config, accounting data and /etc/slurm/slurm.conf stay for the next up.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"

running=()
for d in "${DAEMONS[@]}"; do our_pid "$d" >/dev/null && running+=("$d"); done
if ((${#running[@]} == 0)); then
  echo "local SLURM cluster not running ($STATE)"
  exit 0
fi
[[ $EUID -eq 0 ]] || die "stopping the local SLURM cluster needs root"

# Cancel jobs while slurmctld and slurmdbd still run, so accounting records them as CANCELLED
# and no job step outlives slurmd.
if our_pid slurmctld >/dev/null && ctld_up; then
  mapfile -t jobs < <(squeue -h -o %A 2>/dev/null || true)
  if ((${#jobs[@]})); then
    echo "cancelling jobs: ${jobs[*]}"
    scancel "${jobs[@]}" || true
    for ((i = 0; i < 150; i++)); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.2; done
  fi
fi

for ((k = ${#DAEMONS[@]} - 1; k >= 0; k--)); do
  d=${DAEMONS[k]}
  pid=$(our_pid "$d") || continue
  kill -TERM "$pid" 2>/dev/null || true
  # Daemons save state on TERM (2-4 s); force only if one hangs.
  for ((i = 0; i < 150; i++)); do alive "$pid" || break; sleep 0.2; done
  if alive "$pid"; then
    echo "$d (pid $pid) ignored TERM for 30 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  # Gone for good once its parent (init) reaps it, usually within a second; wait so that
  # process listings right after down.sh are clean.
  for ((i = 0; i < 25; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.2; done
  rm -f "$(pidfile "$d")"
  echo "stopped $d"
done
