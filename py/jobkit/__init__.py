"""jobkit: the Python side of the MaxText launcher, one `jobkit` command (cli.py) over modules of one concern.

Reading jobs
  cli          the click group; tgs, mfu, why and launch live there, the rest are imported when run
  clitypes     click parameter types shared by several commands
  logparse     a job log: header, step lines, footer
  tgs          throughput statistics over step windows, the end-of-run line
  failures     why a failed run failed
  config       a run's MaxText settings: key=value args and the yml
Training
  launch       the training entry (`jobkit launch <config.yml> [key=value ...]`, hand-parsed)
  mfu, mfu_stream, peaks, gpu
               the MFU decision, the stream that appends MFU to step lines, peak table, accelerator detection
Observability (RAY=1)
  exporter     the node metrics exporter engine (`jobkit exporter`)
  tb_events    reading TensorBoard event files
  tb_serve     the live TensorBoard bridge daemon (`jobkit tb-bridge serve`)
  tb_backfill  every step into the TSDB after the job (`jobkit tb-bridge backfill`)
  tb_bridge    the `jobkit tb-bridge` group
  promserver   a throwaway Prometheus on a TSDB (backfill, `jobkit tsdb view`)
  tsdb, tsdb_wal
               `jobkit tsdb view`, and the WAL check that runs before it
  ray_driver, ray_actor, ray_watchdog
               `jobkit ray-launch`: driver side, the per-node actor, the KILL-on-actor-death watchdog
  ray_start    `jobkit ray-start`: Ray's `ray start` without the CLI groups it never needs
Processes
  procfs       finding and stopping processes by PID (the twin of utils/lib/process.sh)

Nothing here imports MaxText, JAX or Ray at module level.
"""

__version__ = "0.1.0"
