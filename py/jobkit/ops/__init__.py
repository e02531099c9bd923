"""ops: operating jobs while they run and right after. The hang watchdog runs on every training node; the
rest run on a login node (or wherever the workspace is).

  hang_watchdog  notices training stopped making progress, captures every node's stacks, acts
  monitor        follows jobs from a login node and turns what happens into events and notifications
  notify         sends a message to the user's targets through apprise
  requeue        submits a Slurm job again when its outcome is worth another attempt
  jobs           `jobkit jobs` / `jobkit tail`: the workspace's jobs, one job's log followed
  jobtag         `jobkit tag`: a finished job's steady TGS in its log and job dir names
  artifacts      `jobkit artifacts clean`: code snapshots no job can need any more
  why            `jobkit why`: why a run failed, and where its core dump is
  coredump       a job's core dumps: where, how big, how to open them (for why)

May import: core, launch, observe, sweep.
"""
