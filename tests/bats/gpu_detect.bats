#!/usr/bin/env bats
# GPU vendor detection (utils/lib/gpu_detect.sh) on recorded sysfs/procfs shapes.

load test_helper

setup() {
  source "$REPO_DIR/utils/lib/gpu_detect.sh"
  FIX=$REPO_DIR/tests/fixtures/sysfs
}

@test "an MI300X node is amd, counting GPU nodes only (not CPU sockets)" {
  GPU_DETECT_ROOT=$FIX/mi300x
  [ "$(detect_gpu_vendor)" = amd ]
  [ "$(count_gpus amd)" -eq 2 ]
}

@test "an H100 node is nvidia with one GPU per driver entry" {
  GPU_DETECT_ROOT=$FIX/h100
  [ "$(detect_gpu_vendor)" = nvidia ]
  [ "$(count_gpus nvidia)" -eq 2 ]
}

@test "a kfd tree with only CPU nodes is no GPU" {
  GPU_DETECT_ROOT=$FIX/cpu-only
  [ "$(detect_gpu_vendor)" = none ]
  [ "$(count_gpus amd)" -eq 0 ]
}

@test "an empty root is no GPU" {
  GPU_DETECT_ROOT=$BATS_TEST_TMPDIR
  [ "$(detect_gpu_vendor)" = none ]
}
