#!/usr/bin/env bash
# Usage: utils/ecc_check.sh [--help]
# Summary: Report this node's GPU ECC error counts (rocm-smi or nvidia-smi); report only, never fails the job
#
# Run it on every node (the Slurm stage does `srun` it once per node). It prints lines that start with the
# node name:
#   <host>: OK (no uncorrectable/correctable ECC errors)
#   <host>: GPU[i] <where> CE=<corrected> UE=<uncorrected>      one line per GPU and memory with errors
#   <host>: no GPU tool (rocm-smi/nvidia-smi): ECC check skipped
#   <host>: <tool> ...: ECC check inconclusive                   the tool hung, failed or printed no counters
# AMD: `rocm-smi --showrasinfo`, every RAS block that has counters (UMC is HBM; others are on-chip).
# NVIDIA: `nvidia-smi -q -d ECC`, the Volatile counters (since the driver loaded), SRAM and DRAM.
# The exit status is 0 whatever is found; only a usage error exits 2.
#
#   ECC_TOOL_TIMEOUT   seconds the vendor tool may take (default 60)
#   GPU_DETECT_ROOT    prefix for the sysfs files that say which vendor's GPUs are present (tests)
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=ecc_check.sh
_UTILS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

case ${1:-} in
  -h | --help) _usage; exit 0 ;;
  "") ;;
  *) echo "$_PROG: unexpected argument '$1'; it checks this node only, run it once per node (e.g. with srun)" >&2; exit 2 ;;
esac

# shellcheck source=utils/lib/gpu_detect.sh
source "$_UTILS_DIR/lib/gpu_detect.sh"

_HOST=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || uname -n)}
_HOST=${_HOST%%.*}
_TIMEOUT=${ECC_TOOL_TIMEOUT:-60}
[[ $_TIMEOUT =~ ^[1-9][0-9]*$ ]] || { echo "$_PROG: ECC_TOOL_TIMEOUT=$_TIMEOUT is not a positive number of seconds; e.g. ECC_TOOL_TIMEOUT=60" >&2; exit 2; }

say() { echo "$_HOST: $*"; }

# rocm-smi --showrasinfo prints, per GPU, "GPU[i]: <tab>RAS INFO", a header, then one row per RAS block:
# "<BLOCK> <STATUS> <n> <n>" (blocks without counters have only two fields). rocm_smi.py fills the rows as
# correctable then uncorrectable in every version; some older versions printed the two column titles the other
# way round, so the titles are ignored and the position decides.
# Prints "<gpu> <block> <ce> <ue>" for rows with errors, then "gpus <n>" (GPUs that had a counter row).
parse_rocm_smi() {
  awk '
    /^GPU\[[0-9]+\]:/ { gpu = $1; sub(/^GPU\[/, "", gpu); sub(/\].*$/, "", gpu); next }
    gpu != "" && NF == 4 && $1 ~ /^[A-Z][A-Z0-9_]*$/ && $3 ~ /^[0-9]+$/ && $4 ~ /^[0-9]+$/ {
      seen[gpu] = 1
      if ($3 + 0 > 0 || $4 + 0 > 0) print gpu, $1, $3, $4
    }
    END { n = 0; for (g in seen) n++; print "gpus", n }
  '
}

# nvidia-smi -q -d ECC prints "GPU <bus id>" blocks in index order, each with "ECC Errors" > "Volatile" >
# "<SRAM|DRAM> <Correctable|Uncorrectable...> : <n or N/A>" (drivers since 535 split SRAM Uncorrectable into
# Parity and SEC-DED). Prints "<gpu> SRAM|DRAM <ce> <ue> <bus id>" for memories with errors, then "gpus <n>"
# (GPUs that reported numeric volatile counters).
parse_nvidia_smi() {
  awk '
    function flush() {
      if (gpu < 0) return
      if (numeric) seen++
      if (sce + sue > 0) print gpu, "SRAM", sce, sue, bus
      if (dce + due > 0) print gpu, "DRAM", dce, due, bus
    }
    /^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+[ \t]*$/ {
      flush(); gpu++; bus = $2; section = ""; numeric = 0; sce = sue = dce = due = 0; next
    }
    { line = $0; sub(/^[ \t]+/, "", line); sub(/[ \t]+$/, "", line) }
    line == "Volatile" || line == "Aggregate" || line ~ /^Aggregate Uncorrectable/ { section = line; next }
    /^    [^ ]/ { section = "" }
    section == "Volatile" && line ~ /^(SRAM|DRAM) / && index(line, ":") {
      value = line; sub(/^[^:]*:[ \t]*/, "", value)
      if (value !~ /^[0-9]+$/) next
      numeric = 1
      key = line; sub(/[ \t]*:.*$/, "", key)
      if (key ~ /^SRAM Correctable/) sce += value
      else if (key ~ /^SRAM Uncorrectable/) sue += value
      else if (key ~ /^DRAM Correctable/) dce += value
      else if (key ~ /^DRAM Uncorrectable/) due += value
    }
    BEGIN { gpu = -1; seen = 0 }
    END { flush(); print "gpus", seen }
  '
}

# Runs the tool with a time limit; prints its stdout. Returns the tool's status (124 on timeout).
run_tool() { timeout -k 5 "$_TIMEOUT" "$@" 2>/dev/null; }

report() { # TOOL DESCRIPTION PARSER ARGS...
  local tool=$1 what=$2 parser=$3 out rc=0 parsed gpus
  shift 3
  out=$(run_tool "$tool" "$@") || rc=$?
  if ((rc == 124 || rc == 137)); then
    say "$what did not answer within ${_TIMEOUT}s: ECC check inconclusive"
    return
  fi
  parsed=$("$parser" <<<"$out")
  gpus=$(sed -n 's/^gpus //p' <<<"$parsed")
  if [[ ${gpus:-0} == 0 ]]; then
    if ((rc != 0)); then
      say "$what failed (exit $rc) and printed no ECC counters: ECC check inconclusive"
    else
      say "$what printed no ECC counters (ECC disabled or unsupported on these GPUs): ECC check skipped"
    fi
    return
  fi
  local errors
  errors=$(grep -v '^gpus ' <<<"$parsed" || true)
  if [[ -z $errors ]]; then
    say "OK (no uncorrectable/correctable ECC errors)"
    return
  fi
  local gpu where ce ue bus
  while read -r gpu where ce ue bus; do
    say "GPU[$gpu] $where CE=$ce UE=$ue${bus:+ (bus $bus)}"
  done <<<"$errors"
}

# The tool of this node's GPU vendor first; the other one only when the kernel shows no GPU of either kind.
vendor=$(detect_gpu_vendor)
case $vendor in
  nvidia) tools=(nvidia-smi rocm-smi) ;;
  *) tools=(rocm-smi nvidia-smi) ;;
esac
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || continue
  case $tool in
    rocm-smi) report rocm-smi "rocm-smi --showrasinfo" parse_rocm_smi --showrasinfo ;;
    nvidia-smi) report nvidia-smi "nvidia-smi -q -d ECC" parse_nvidia_smi -q -d ECC ;;
  esac
  exit 0
done
say "no GPU tool (rocm-smi/nvidia-smi): ECC check skipped"
exit 0
