#!/usr/bin/env bash
# Usage: bench/gpu_procs_check.sh [OUT_DIR]
# Summary: On a real GPU node: a process per device (LOCAL_WORLD_SIZE) against the node's real GPU count and JAX
#
# Not a test (CI has no GPU); run by hand on a GPU node with JAX (CUDA or ROCm) and click beside it. Prints:
#   1. what the kernel shows (the files utils/lib/gpu_detect.sh counts) and what count_visible_gpus makes of it;
#   2. _train.sh's own check: LOCAL_WORLD_SIZE above the GPU count is one line and exit 2, before training;
#      LOCAL_WORLD_SIZE=auto becomes the GPU count;
#   3. jobkit procs with JAX for real: each process initialises JAX's distributed runtime as `jobkit launch`
#      does (local_device_ids=[LOCAL_RANK]) and prints the devices it got; with more processes than GPUs the
#      one without a device fails, PROC_EXIT names it and the others are stopped.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$(mktemp -d)}
PY=${TRAIN_PYTHON:-python3}
export PYTHONUNBUFFERED=1

echo "== 1. the node's GPUs"
(nvidia-smi -L || rocm-smi --showproductname) 2>&1 | head -8
find /proc/driver/nvidia/gpus /sys/class/kfd/kfd/topology/nodes -maxdepth 1 -mindepth 1 2>&1 | head -8
# shellcheck source=utils/lib/gpu_detect.sh
source "$REPO/utils/lib/gpu_detect.sh"
vendor=$(detect_gpu_vendor)
gpus=$(count_visible_gpus "$vendor")
echo "detect_gpu_vendor=$vendor count_visible_gpus=$gpus"

echo "== 2. _train.sh's check (a fake workspace; MaxText need not be installed: the check comes first)"
ws=$OUT/ws; mkdir -p "$ws/job"
for lws in $((gpus + 1)) auto; do
  echo "-- LOCAL_WORLD_SIZE=$lws"
  JOB_WORKSPACE=$ws JOB_DIR=job LOCAL_WORLD_SIZE=$lws HANG_TIMEOUT=off TRAIN_PYTHON=$PY \
    timeout 120 "$REPO/_train.sh" tiny -- steps=1 2>&1 | grep -E "LOCAL_WORLD_SIZE|procs|_train.sh:|no MaxText" | head -6
  echo "exit ${PIPESTATUS[0]}"
done

echo "== 3. jobkit procs + JAX's runtime, LOCAL_WORLD_SIZE=$gpus, then more processes than GPUs"
probe='import os, sys, jax
sys.path.insert(0, os.environ["REPO_PY"])
from jobkit.launch import jax_distributed as jd
plan = jd.plan(os.environ, "none.yml", ["jax_distributed_initialization_timeout=60"])
plan and jd.start(plan)
print("process", jax.process_index(), "of", jax.process_count(), "local", jax.local_devices(), "global", len(jax.devices()))'
for lws in "$gpus" $((gpus + 1)) $((gpus + 2)); do
  echo "-- LOCAL_WORLD_SIZE=$lws"
  LOCAL_WORLD_SIZE=$lws NNODES=1 NODE_RANK=0 REPO_PY=$REPO/py timeout 300 \
    "$PY" "$REPO/py/bin/jobkit" procs -- "$PY" -c "$probe" 2>&1 | grep -Ev "^\[rank[0-9]+\]: [IW][0-9]{4} " | tail -12
  echo "exit ${PIPESTATUS[0]}"
done
