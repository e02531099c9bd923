# shellcheck shell=bash
# Summary: Which GPU vendor this node has, read from the kernel's own files (sourced library)
#
# detect_gpu_vendor prints amd, nvidia or none. It reads sysfs/procfs rather than vendor tools, which may be
# missing outside the training image; GPU_DETECT_ROOT (default empty = /) points it at a fixture tree in tests.
#   AMD:    /sys/class/kfd/kfd/topology/nodes/*/properties with a non-zero gfx_target_version (CPU nodes have 0)
#   NVIDIA: /proc/driver/nvidia/gpus/<pci id>/ directories, one per GPU

detect_gpu_vendor() {
  local root=${GPU_DETECT_ROOT:-} props
  for props in "$root"/sys/class/kfd/kfd/topology/nodes/*/properties; do
    [[ -r $props ]] || continue
    if grep -Eq '^gfx_target_version [1-9]' "$props"; then echo amd; return 0; fi
  done
  local gpu
  for gpu in "$root"/proc/driver/nvidia/gpus/*; do
    if [[ -d $gpu ]]; then echo nvidia; return 0; fi
  done
  echo none
}

# count_gpus VENDOR prints how many GPUs of that vendor the node has (0 for none).
count_gpus() {
  local root=${GPU_DETECT_ROOT:-} count=0 props gpu
  case $1 in
    amd)
      for props in "$root"/sys/class/kfd/kfd/topology/nodes/*/properties; do
        [[ -r $props ]] && grep -Eq '^gfx_target_version [1-9]' "$props" && count=$((count + 1))
      done ;;
    nvidia)
      for gpu in "$root"/proc/driver/nvidia/gpus/*; do [[ -d $gpu ]] && count=$((count + 1)); done ;;
  esac
  echo "$count"
}

# count_visible_gpus VENDOR prints how many of the node's GPUs this process may use: count_gpus, or fewer when
# the vendor's visibility variable lists fewer (CUDA_VISIBLE_DEVICES; HIP_ or ROCR_VISIBLE_DEVICES on AMD).
count_visible_gpus() {
  local count listed var
  count=$(count_gpus "$1")
  case $1 in
    amd) var=${HIP_VISIBLE_DEVICES-${ROCR_VISIBLE_DEVICES-}} ;;
    nvidia) var=${CUDA_VISIBLE_DEVICES-} ;;
    *) echo "$count"; return 0 ;;
  esac
  if [[ -n $var ]]; then
    listed=$(tr ',' '\n' <<<"$var" | grep -c .)
    (( listed < count )) && count=$listed
  fi
  echo "$count"
}
