#!/usr/bin/env bats
# utils/plugins/host_metrics_plugin.py and utils/plugins/gpu_metrics_plugin.py on fixture trees (tests/fixtures/metrics/),
# run as scripts (one cycle each). Byte-for-byte equality with the bash plugins they replaced: test_exporter_plugins.py.

load test_helper
bats_require_minimum_version 1.5.0

setup() {
  FIX=$REPO_DIR/tests/fixtures/metrics
  HOSTP=$REPO_DIR/utils/plugins/host_metrics_plugin.py
  GPUP=$REPO_DIR/utils/plugins/gpu_metrics_plugin.py
  PY=$(command -v python3)
}

# Every non-comment line is `name{labels} value`, host first; every family has HELP and TYPE.
assert_exposition() {
  local line n
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    if [[ $line == "# "* ]]; then
      [[ $line =~ ^"# "(HELP|TYPE|STATE)" " ]] || { echo "bad comment: $line"; return 1; }
      continue
    fi
    [[ $line =~ ^([a-z_][a-z0-9_]*)\{host=\"n1\"(,[a-z_]+=\"[^\"]*\")*\}\ -?[0-9]+(\.[0-9]+)?$ ]] || { echo "bad sample: $line"; return 1; }
    n=${BASH_REMATCH[1]}
    grep -qx "# TYPE $n \(gauge\|counter\)" <<<"$1" || { echo "no TYPE for $n"; return 1; }
    grep -q "^# HELP $n " <<<"$1" || { echo "no HELP for $n"; return 1; }
  done <<<"$1"
}

# A PATH holding nothing: the plugins must not need cat/awk/grep/sed/sort/date (nor nvidia-smi on an AMD node).
empty_path() {
  mkdir -p "$BATS_TEST_TMPDIR/nothing"
  echo "$BATS_TEST_TMPDIR/nothing"
}

@test "host plugin: exact values from the fixture tree" {
  HOST_METRICS_ROOT=$FIX/host run "$PY" "$HOSTP" n1
  [ "$status" -eq 0 ]
  [[ $output == *'hw_net_rx_bytes_total{host="n1",device="eth0"} 1305256425'* ]]
  [[ $output == *'hw_net_rx_packets_total{host="n1",device="eth0"} 31125'* ]]
  [[ $output == *'hw_net_tx_bytes_total{host="n1",device="eth0"} 1546039'* ]]
  [[ $output != *'device="lo"'* ]]
  [[ $output == *'hw_tcp_retransmits_total{host="n1"} 4'* ]]
  [[ $output == *'hw_tcp_estab_resets_total{host="n1"} 2'* ]]
  [[ $output == *'hw_tcp_out_resets_total{host="n1"} 24'* ]]
  [[ $output == *'hw_context_switches_total{host="n1"} 3339479'* ]]
  [[ $output == *'hw_procs_running{host="n1"} 6'* ]]
  [[ $output == *'hw_procs_blocked{host="n1"} 0'* ]]
  [[ $output == *'hw_oom_kills_total{host="n1"} 0'* ]]
  [[ $output == *'hw_mem_dirty_bytes{host="n1"} 13737984'* ]]
  [[ $output == *'hw_io_pressure_full_total_us{host="n1"} 26233393'* ]]
  [[ $output == *'hw_io_pressure_some_avg300_pct{host="n1"} 0.30'* ]]
  [[ $output == *'hw_memory_pressure_full_pct{host="n1"} 0.00'* ]]
  [[ $output == *'hw_rdma_rx_bytes_total{host="n1",device="mlx5_0",port="1"} 10000000000'* ]]
  [[ $output == *'hw_rdma_rx_errors_total{host="n1",device="mlx5_0",port="1"} 3'* ]]
  [[ $output == *'hw_rdma_port_state{host="n1",device="mlx5_0",port="1"} 1'* ]]
  [[ $output == *'hw_rdma_tx_bytes_total{host="n1",device="ionic_0",port="1"} 7000000000'* ]]
  [[ $output == *'hw_rdma_tx_ack_timeout_total{host="n1",device="ionic_0",port="1"} 2'* ]]
  [[ $output == *'hw_rdma_port_state{host="n1",device="ionic_0",port="1"} 0'* ]]
  [[ $output == *'hw_gpu_user_processes{host="n1"} 0'* ]]
}

@test "host plugin: valid exposition, host label on every sample, also on this machine's real /proc" {
  HOST_METRICS_ROOT=$FIX/host run "$PY" "$HOSTP" n1
  [ "$status" -eq 0 ]
  assert_exposition "$output"
  run "$PY" "$HOSTP" n1
  [ "$status" -eq 0 ]
  assert_exposition "$output"
  [[ $output == *'hw_context_switches_total{host="n1"} '* ]]
}

@test "host plugin: no argument is a usage error" {
  run "$PY" "$HOSTP"
  [ "$status" -eq 2 ]
}

@test "gpu plugin: AMD MI300X sysfs values, ordered by PCI address, BMC VGA ignored" {
  run env GPU_METRICS_ROOT=$FIX/mi300x PATH="$(empty_path)" "$PY" "$GPUP" n1
  [ "$status" -eq 0 ]
  assert_exposition "$output"
  [[ $output == *'hw_gpu_temperature_celsius{host="n1",gpu="0"} 45'$'\n'* ]]
  [[ $output == *'hw_gpu_temperature_celsius{host="n1",gpu="1"} 52.125'* ]]
  [[ $output == *'hw_gpu_power_watts{host="n1",gpu="0"} 187.5'* ]]
  [[ $output == *'hw_gpu_power_watts{host="n1",gpu="1"} 741'$'\n'* ]]
  [[ $output == *'hw_gpu_clock_mhz{host="n1",gpu="0",type="sclk"} 2100'* ]]
  [[ $output == *'hw_gpu_clock_mhz{host="n1",gpu="0",type="mclk"} 1300'* ]]
  [[ $output == *'hw_gpu_vram_used_bytes{host="n1",gpu="0"} 285212672'* ]]
  [[ $output == *'hw_gpu_vram_total_bytes{host="n1",gpu="1"} 206158430208'* ]]
  [[ $output == *'hw_gpu_busy_percent{host="n1",gpu="1"} 100'* ]]
  [[ $output == *'hw_gpu_ras_umc_ce_total{host="n1",gpu="0"} 3'* ]]
  [[ $output == *'hw_gpu_ras_umc_ue_total{host="n1",gpu="0"} 0'* ]]
  [[ $output == *'hw_gpu_ras_xgmi_ue_total{host="n1",gpu="0"} 1'* ]]
  [[ $output == *'hw_gpu_ras_sdma_ce_total{host="n1",gpu="1"} 0'* ]]
  [[ $output == *'hw_gpu_pcie_correctable_total{host="n1",gpu="0"} 2'* ]]
  [[ $output == *'hw_gpu_pcie_nonfatal_total{host="n1",gpu="1"} 1'* ]]
  [[ $output == *'hw_gpu_pcie_fatal_total{host="n1",gpu="0"} 0'* ]]
  [[ $output != *'gpu="2"'* ]]
  [[ $output != *'# STATE'* ]]
}

@test "gpu plugin: NVIDIA via one nvidia-smi call, units converted, N/A skipped" {
  make_stub nvidia-smi "echo \"\$*\" >>'$BATS_TEST_TMPDIR/smi.calls'; cat '$FIX/nvidia-smi-query-gpu-h100x8.csv'"
  GPU_METRICS_ROOT=$BATS_TEST_TMPDIR/empty run "$PY" "$GPUP" n1
  [ "$status" -eq 0 ]
  assert_exposition "$output"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/smi.calls")" -eq 1 ]
  [[ $(<"$BATS_TEST_TMPDIR/smi.calls") == *'--format=csv,noheader,nounits'* ]]
  [[ $output == *'hw_gpu_temperature_celsius{host="n1",gpu="3"} 36'* ]]
  [[ $output == *'hw_gpu_power_watts{host="n1",gpu="0"} 71.52'* ]]
  [[ $output != *'hw_gpu_power_watts{host="n1",gpu="6"}'* ]]
  [[ $output == *'hw_gpu_temperature_celsius{host="n1",gpu="6"} 37'* ]]
  [[ $output == *'hw_gpu_clock_mhz{host="n1",gpu="7",type="sclk"} 1980'* ]]
  [[ $output == *'hw_gpu_clock_mhz{host="n1",gpu="7",type="mclk"} 2619'* ]]
  [[ $output == *'hw_gpu_vram_total_bytes{host="n1",gpu="0"} 85520809984'* ]]
  [[ $output == *'hw_gpu_vram_used_bytes{host="n1",gpu="6"} 74794926080'* ]]
  [[ $output == *'hw_gpu_busy_percent{host="n1",gpu="6"} 97'* ]]
  [[ $output == *'hw_gpu_ecc_corrected_total{host="n1",gpu="3"} 2'* ]]
  [ "$(grep -c '^hw_gpu_power_watts{' <<<"$output")" -eq 7 ]
  [ "${lines[-1]}" = "# STATE nvidia" ]
}

@test "gpu plugin: nvidia-smi failing: exit 99 on first call, plain failure once it has worked" {
  make_stub nvidia-smi 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2; exit 9'
  GPU_METRICS_ROOT=$BATS_TEST_TMPDIR/empty _PLUGIN_STATE='' run "$PY" "$GPUP" n1
  [ "$status" -eq 99 ]
  GPU_METRICS_ROOT=$BATS_TEST_TMPDIR/empty _PLUGIN_STATE=nvidia run "$PY" "$GPUP" n1
  [ "$status" -eq 1 ]
}

@test "gpu plugin: no GPU at all -> exit 99, no output" {
  run --separate-stderr env GPU_METRICS_ROOT=$BATS_TEST_TMPDIR/empty PATH="$(empty_path)" "$PY" "$GPUP" n1
  [ "$status" -eq 99 ]
  [ -z "$output" ]
  # a host with only a non-AMD display card (the fixture's BMC VGA) is no GPU either
  mkdir -p "$BATS_TEST_TMPDIR/vga/sys"
  cp -a "$FIX/mi300x/sys/." "$BATS_TEST_TMPDIR/vga/sys/"
  rm "$BATS_TEST_TMPDIR/vga/sys/class/drm/card1" "$BATS_TEST_TMPDIR/vga/sys/class/drm/card2"
  run --separate-stderr env GPU_METRICS_ROOT=$BATS_TEST_TMPDIR/vga PATH="$(empty_path)" "$PY" "$GPUP" n1
  [ "$status" -eq 99 ]
  [ -z "$output" ]
}

@test "plugins start no commands: same output with an empty PATH" {
  local full
  full=$(HOST_METRICS_ROOT=$FIX/host "$PY" "$HOSTP" n1)
  run --separate-stderr env HOST_METRICS_ROOT=$FIX/host PATH="$(empty_path)" "$PY" "$HOSTP" n1
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [ "$output" = "$full" ]
  full=$(GPU_METRICS_ROOT=$FIX/mi300x "$PY" "$GPUP" n1)
  run --separate-stderr env GPU_METRICS_ROOT=$FIX/mi300x PATH="$(empty_path)" "$PY" "$GPUP" n1
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [ "$output" = "$full" ]
}

@test "plugins run from the plugins dir itself (as 'python3 <name>' there)" {
  cd "$REPO_DIR/utils/plugins"
  HOST_METRICS_ROOT=$FIX/host run --separate-stderr "$PY" host_metrics_plugin.py n1
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [[ $output == *'hw_procs_running{host="n1"} 6'* ]]
  GPU_METRICS_ROOT=$FIX/mi300x run --separate-stderr "$PY" gpu_metrics_plugin.py n1
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [[ $output == *'hw_gpu_power_watts{host="n1",gpu="0"} 187.5'* ]]
}
