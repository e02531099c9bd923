"""observe: RAY=1 observability. The daemons run on training nodes beside training; the TSDB tools and the
backfill run wherever the job's files are (a login node after the job).

  exporter      the node metrics exporter engine (`jobkit exporter`, run by utils/metrics_exporter.sh)
  plugin_worker the long-lived process that runs one Python exporter plugin, a request per cycle (run by file
                path: stdlib only)
  plugin_text   the exposition text and /proc, /sys reads the Python exporter plugins share (stdlib only; the
                plugins import it by path)
  tb_events     reading TensorBoard event files: records, scalars, metric names
  tb_columns    the backfill's fast reader: a whole event file's scalars as numpy columns
  tb_serve      the live reader (Follower: newest scalars, new records only), run by the tb exporter plugin
                and as a daemon writing an exposition file (`jobkit tb-bridge serve`)
  tb_backfill   every step into the TSDB after the job (`jobkit tb-bridge backfill`)
  tsdb_block    a Prometheus TSDB block (XOR chunks, index v2) written from numpy columns: the backfill's writer
  tb_bridge     the `jobkit tb-bridge` group (click only)
  log_steps     steps the job log has that the event files lack, as backfill series
  promserver    a throwaway Prometheus on a TSDB: 127.0.0.1, waited for, stopped by PID
  tsdb          `jobkit tsdb view`: a finished job's TSDB, browsed; `await-scrape` for a running job's end
  final_scrape  waits until the job's Prometheus scraped every target after training ended (its last seconds)
  tsdb_dump     a TSDB read without changing it (`promtool tsdb dump`): analyze's series, a hang's window
  hang_tsdb     a hang's window in the TSDB: each host's GPU busy and power, network, CPU and GPU fault
                counters from the last progress to the HANG (judged by core.hang_metrics)
  tsdb_wal      the WAL check that runs before Prometheus may repair a WAL
  tsdb_blocks   a TSDB's blocks and which are damaged (meta.json Prometheus would skip): the one check for
                `prometheus.sh list`/`view` and `jobkit analyze` (`jobkit tsdb blocks`)
  ray_driver    `jobkit ray-launch`: the driver side (one actor per node, follow, stop)
  ray_actor     the per-node actor that runs the command as a plain subprocess
  ray_watchdog  KILLs the command's process group if its actor dies (run by file path: stdlib only, stays
                beside ray_actor)
  ray_start     `jobkit ray-start`: `ray start` without the CLI groups it never needs

May import: core, launch. Ray, TensorBoard and prometheus_client's heavier parts are imported inside the
functions that use them, so `jobkit tsdb` never pays for Ray.
"""
