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

@test "usable GPUs: the node's count, narrowed by the vendor's visibility variable, never widened" {
  GPU_DETECT_ROOT=$FIX/h100
  [ "$(CUDA_VISIBLE_DEVICES= count_visible_gpus nvidia)" -eq 2 ]
  [ "$(CUDA_VISIBLE_DEVICES=1 count_visible_gpus nvidia)" -eq 1 ]
  [ "$(CUDA_VISIBLE_DEVICES=0,1,2,3 count_visible_gpus nvidia)" -eq 2 ]
  GPU_DETECT_ROOT=$FIX/mi300x
  [ "$(HIP_VISIBLE_DEVICES=0 count_visible_gpus amd)" -eq 1 ]
  [ "$(ROCR_VISIBLE_DEVICES=1 count_visible_gpus amd)" -eq 1 ]
  [ "$(count_visible_gpus none)" -eq 0 ]
}
