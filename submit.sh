#!/usr/bin/env bash
# Usage: submit.sh <MODEL_SPEC> [sbatch args ...] [-- <maxtext key=value | _env_KEY=VALUE> ...]
# Summary: Submit a training job to Slurm (not available yet: use run_local.sh on one machine)
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x
case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
esac
echo "submit.sh: Slurm submission is not implemented yet; train on this machine with ./run_local.sh ${1:-<model>} [-- key=value ...]" >&2
exit 2
