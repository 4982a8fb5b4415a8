#!/usr/bin/env bash
# Exit 0 when the local SLURM cluster answers (controller up, node usable), 1 otherwise.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ctld_up && sinfo -h -n localhost -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc|comp)$'
