#!/usr/bin/env bash
# Summary: metrics exporter plugin: GPU temperature, power, clocks, memory, busy %, RAS/ECC and PCIe AER counts.
# Usage: gpu_metrics_plugin.sh <short hostname>
#
# Called once per exporter cycle (see utils/metrics_exporter.sh); prints Prometheus text exposition on
# stdout, every sample labelled host="<$1>" and gpu="<index>".
#   AMD:    read from sysfs with bash builtins only (no command started). GPU_METRICS_ROOT prefixes /sys.
#           GPUs = /sys/class/drm/card*/device with vendor 0x1002 and gpu_busy_percent or a hwmon dir;
#           index = position in the sorted list of PCI addresses.
#   NVIDIA: only when no AMD GPU was found and nvidia-smi is on PATH: ONE nvidia-smi call per cycle,
#           mapped onto the same names; "N/A"-style values are left out. index = nvidia-smi's index.
# Exit 99 (exporter never calls again) when there is no GPU: no AMD card, and nvidia-smi absent or failing
# on the first call. After one good nvidia-smi call the plugin prints "# STATE nvidia", and a later
# failure is a plain failure of that cycle (exit 1), not a permanent stop.
#
# Metrics ((+) = name of our own; the rest match the reference dashboards):
#   hw_gpu_temperature_celsius        hwmon temp2_input (junction), else temp3, else temp1; m°C/1000 | temperature.gpu
#   hw_gpu_power_watts                hwmon power1_input, else power1_average; µW/1e6 | power.draw
#   hw_gpu_clock_mhz{type=sclk|mclk}  pp_dpm_sclk / pp_dpm_mclk line marked "*", else hwmon freq1/freq2_input Hz/1e6
#                                     | clocks.sm / clocks.mem
#   hw_gpu_vram_used_bytes, hw_gpu_vram_total_bytes   mem_info_vram_used/_total | memory.used/.total MiB x 1048576
#   hw_gpu_busy_percent (+)           gpu_busy_percent | utilization.gpu
#   hw_gpu_ras_<block>_{ue,ce}_total  ras/aca_<block> or ras/<block>_err_count lines "ue: N" / "ce: N"
#                                     (xgmi_wafl is named xgmi: hw_gpu_ras_{umc,xgmi,gfx,mmhub,sdma,...}_*)
#   hw_gpu_pcie_correctable_total, hw_gpu_pcie_nonfatal_total, hw_gpu_pcie_fatal_total
#                                     aer_dev_correctable/_nonfatal/_fatal lines TOTAL_ERR_COR/_NONFATAL/_FATAL
#   hw_gpu_ecc_corrected_total, hw_gpu_ecc_uncorrected_total (+)   NVIDIA only: ecc.errors.*.volatile.total
set -u

HOST=${1:-}
if [[ -z $HOST ]]; then
  echo "Usage: gpu_metrics_plugin.sh <short hostname>" >&2
  exit 2
fi
[[ $HOST == -h || $HOST == --help ]] && { echo "Usage: gpu_metrics_plugin.sh <short hostname>"; exit 0; }
SYS=${GPU_METRICS_ROOT:-}/sys
shopt -s nullglob

_PLUGIN_DIR=${BASH_SOURCE[0]%/*}
[[ $_PLUGIN_DIR == "${BASH_SOURCE[0]}" ]] && _PLUGIN_DIR=.   # run as "bash <plugin>" from its own dir
# shellcheck source=utils/lib/metrics_exposition.sh
source "$_PLUGIN_DIR/../lib/metrics_exposition.sh"

# scaled INT DIGITS: INT / 10^DIGITS as a decimal string in REPLY (45500 3 -> 45.5), integer arithmetic only
scaled() {
  local v=$1 n=$2 neg='' int frac
  [[ $v =~ ^-?[0-9]+$ ]] || { REPLY=; return 0; }
  [[ $v == -* ]] && { neg=-; v=${v#-}; }
  while ((${#v} <= n)); do v=0$v; done
  int=${v:0:${#v}-n} frac=${v:${#v}-n}
  while [[ $frac == *0 ]]; do frac=${frac%0}; done
  REPLY=$neg$int${frac:+.$frac}
}

# --- AMD ------------------------------------------------------------------------------------------------
AMD_DEVS=()  # "pci_address device_dir", sorted by pci address
find_amd() {
  local c d pci line i j tmp
  local -a found=()
  for c in "$SYS"/class/drm/card*; do
    [[ ${c##*/} == *-* ]] && continue  # connectors (card0-DP-1)
    d=$c/device
    readval "$d/vendor"; [[ $REPLY == 0x1002 ]] || continue
    local -a hw=("$d"/hwmon/hwmon*)
    [[ -e $d/gpu_busy_percent || ${#hw[@]} -gt 0 ]] || continue
    pci=${c##*/}
    if [[ -r $d/uevent ]]; then
      while read -r line; do [[ $line == PCI_SLOT_NAME=* ]] && pci=${line#*=}; done <"$d/uevent"
    fi
    found+=("$pci $d")
  done
  # insertion sort (a handful of entries; no sort(1))
  for ((i = 1; i < ${#found[@]}; i++)); do
    tmp=${found[i]}
    for ((j = i - 1; j >= 0; j--)); do
      [[ ${found[j]} > $tmp ]] || break
      found[j + 1]=${found[j]}
    done
    found[j + 1]=$tmp
  done
  AMD_DEVS=("${found[@]}")
}

# dpm_current FILE: MHz of the line marked "*" ("1: 2100Mhz *") in REPLY
dpm_current() {
  local line
  REPLY=
  [[ -r $1 ]] || return 0
  while read -r line; do
    [[ $line == *'*'* ]] || continue
    line=${line#*: } REPLY=${line%%[!0-9]*}
    return 0
  done <"$1"
}

# collect_amd_one INDEX DEVICE_DIR LABELS
collect_amd_one() {
  local d=$2 lbl="$3" h f blk line ue ce kind want total
  local -a hw=("$d"/hwmon/hwmon*)
  h=${hw[0]:-}
  if [[ -n $h ]]; then
    for f in temp2_input temp3_input temp1_input; do
      [[ -r $h/$f ]] || continue
      readval "$h/$f"; scaled "$REPLY" 3
      add hw_gpu_temperature_celsius gauge "GPU temperature (junction when available), degrees C" "$lbl" "$REPLY"
      break
    done
    for f in power1_input power1_average; do
      [[ -r $h/$f ]] || continue
      readval "$h/$f"; scaled "$REPLY" 6
      add hw_gpu_power_watts gauge "GPU power draw, watts" "$lbl" "$REPLY"
      break
    done
  fi
  for kind in sclk:freq1 mclk:freq2; do
    dpm_current "$d/pp_dpm_${kind%%:*}"
    if [[ -z $REPLY && -n $h ]]; then readval "$h/${kind#*:}_input"; scaled "$REPLY" 6; fi
    add hw_gpu_clock_mhz gauge "GPU clock, MHz (sclk = shader/core, mclk = memory)" "$lbl,type=\"${kind%%:*}\"" "$REPLY"
  done
  readval "$d/mem_info_vram_used"; add hw_gpu_vram_used_bytes gauge "GPU memory (VRAM) in use, bytes" "$lbl" "$REPLY"
  readval "$d/mem_info_vram_total"; add hw_gpu_vram_total_bytes gauge "GPU memory (VRAM) size, bytes" "$lbl" "$REPLY"
  readval "$d/gpu_busy_percent"; add hw_gpu_busy_percent gauge "GPU busy, percent" "$lbl" "$REPLY"
  for f in "$d"/ras/aca_* "$d"/ras/*_err_count; do
    blk=${f##*/} blk=${blk#aca_} blk=${blk%_err_count} blk=${blk%_wafl}
    [[ $blk =~ ^[a-z0-9_]+$ && -r $f ]] || continue
    ue='' ce=''
    while read -r line; do
      case $line in
        ue:*) ue=${line#ue:} ;;
        ce:*) ce=${line#ce:} ;;
      esac
    done <"$f"
    add "hw_gpu_ras_${blk}_ue_total" counter "Uncorrectable RAS errors in the $blk block" "$lbl" "${ue// /}"
    add "hw_gpu_ras_${blk}_ce_total" counter "Correctable RAS errors in the $blk block" "$lbl" "${ce// /}"
  done
  for kind in correctable:TOTAL_ERR_COR nonfatal:TOTAL_ERR_NONFATAL fatal:TOTAL_ERR_FATAL; do
    f=$d/aer_dev_${kind%%:*} want=${kind#*:} total=
    [[ -r $f ]] || continue
    while read -r line total; do [[ $line == "$want" ]] && break; total=; done <"$f"
    add "hw_gpu_pcie_${kind%%:*}_total" counter "PCIe AER ${kind%%:*} errors reported by the GPU" "$lbl" "$total"
  done
}

# --- NVIDIA ---------------------------------------------------------------------------------------------
collect_nvidia() {
  local out line i
  local -a v
  out=$(nvidia-smi --query-gpu=index,temperature.gpu,power.draw,clocks.sm,clocks.mem,memory.used,memory.total,utilization.gpu,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits) || return 1
  [[ -n $out ]] || return 1
  while IFS=, read -r -a v; do
    for ((i = 0; i < ${#v[@]}; i++)); do v[i]=${v[i]// /}; done
    [[ ${v[0]:-} =~ ^[0-9]+$ && ${#v[@]} -ge 10 ]] || continue
    local lbl=",gpu=\"${v[0]}\""
    add hw_gpu_temperature_celsius gauge "GPU temperature (junction when available), degrees C" "$lbl" "${v[1]}"
    add hw_gpu_power_watts gauge "GPU power draw, watts" "$lbl" "${v[2]}"
    add hw_gpu_clock_mhz gauge "GPU clock, MHz (sclk = shader/core, mclk = memory)" "$lbl,type=\"sclk\"" "${v[3]}"
    add hw_gpu_clock_mhz gauge "GPU clock, MHz (sclk = shader/core, mclk = memory)" "$lbl,type=\"mclk\"" "${v[4]}"
    [[ ${v[5]} =~ ^[0-9]+$ ]] && add hw_gpu_vram_used_bytes gauge "GPU memory (VRAM) in use, bytes" "$lbl" "$((v[5] * 1048576))"
    [[ ${v[6]} =~ ^[0-9]+$ ]] && add hw_gpu_vram_total_bytes gauge "GPU memory (VRAM) size, bytes" "$lbl" "$((v[6] * 1048576))"
    add hw_gpu_busy_percent gauge "GPU busy, percent" "$lbl" "${v[7]}"
    add hw_gpu_ecc_corrected_total counter "Corrected ECC errors since driver load (volatile)" "$lbl" "${v[8]}"
    add hw_gpu_ecc_uncorrected_total counter "Uncorrected ECC errors since driver load (volatile)" "$lbl" "${v[9]}"
  done <<<"$out"
  return 0
}

find_amd
if ((${#AMD_DEVS[@]} > 0)); then
  for ((g = 0; g < ${#AMD_DEVS[@]}; g++)); do
    collect_amd_one "$g" "${AMD_DEVS[g]#* }" ",gpu=\"$g\""
  done
  flush
  exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  if collect_nvidia; then
    flush
    echo "# STATE nvidia"
    exit 0
  fi
  [[ ${_PLUGIN_STATE:-} == nvidia ]] && exit 1
fi
exit 99
