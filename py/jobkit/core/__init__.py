"""core: what every other subpackage stands on. Runs anywhere (training node, login node, container host).

  logparse    a job log: KEY=VALUE header, MaxText step lines, JOB SUMMARY footer
  step_summary  the job dir's steps.tsv: a line per step, written by global rank 0 while training; big logs' readers use it
  tgs         throughput (tokens/s/device) over step windows, the end-of-run line
  verdict     a finished run's PASS / STOPPED / FAIL (<class>) word
  metrics_state  whether a RAY=1 job's metrics were on: its TSDB, or off and the log's reason (one decision)
  failures    why a failed run failed: the catalogue configs/failure_signatures.yaml -> class, host, retry, advice
  hang_stacks  a hang's root cause from the watchdog's hang/<host>[.proc<i>].txt: each rank's (process's) state and frames, the odd one blamed
  hang_metrics  a hang judged from each host's metrics in the stall: a collective deadlock, or the host unlike the others
  hang_settings  the hang watchdog's HANG_* settings and JAX_HEARTBEAT_TIMEOUT, whose default outlasts them
  config      a run's MaxText settings: key=value args, the yml, which yml a job used
  nodelist    Slurm hostlists (`node[1-3,7]`) expanded in rank order
  procfs      processes from /proc, stopped by PID (the twin of utils/lib/process.sh)
  reaper      run a command as a child subreaper: what it leaves behind stays in the job and is stopped with it
  slurm       the one module that asks Slurm (squeue, sacct) about jobs
  tunnel      the ssh line that reaches a loopback dashboard from a laptop
  paths       where the checkout and the workspace are (the only `__file__` climb in the package)
  files       files written whole (temp name, rename), appended without following links, trusted only when ours
  errors      every exit code, and JobkitError: one line and a code at the CLI's edge
  clitypes    click types for numbers (finite, range-checked) and env settings shared by several commands
  lazy_group  a click group over a "module:attr" table, imported on use (jobkit's and jobkit sweep's)
  commands    `jobkit tgs`, `jobkit reap`, `jobkit metrics-state` (click only)

May import: the standard library, click and pyyaml, and other core modules. Nothing else of jobkit.
"""
