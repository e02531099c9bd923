"""sweep: families of real jobs, watched and ranked: `jobkit sweep batch|nodes|network|models|xla`, `list`,
`resume`. Runs on a login node (it submits through submit.sh or run_local.sh and follows the logs).

jobs     Point (one job of a sweep), Outcome, the runners (Slurm via submit.sh, local via run_local.sh)
watch    one job's log: progress, phase, hang, verdict (TGS from jobkit.core.tgs, class from jobkit.core.failures)
engine   the monitoring policy: submit, watch, retry / exclude / stop, record, report as results land
state    $JOB_WORKSPACE/sweeps/<id>/: plan.json, points.jsonl, summary.md; resume = replay, re-attach to jobs left running
common   what every driver's command shares: options, checks, the run wrapper, tables
cli      the click group, `list` / `resume`, and the DRIVERS table (a driver is imported when it runs)
batch, nodes, network, models, xla   the drivers (decision logic + command)
memory, config_edit                  the batch driver's memory estimate and its --apply
xla_catalog                          the xla driver's catalog: loading, checking, profile files, points
xla_report                           the xla driver's ranking (noise band, verdicts) and its reports

May import: core, launch (memory reads the accelerator table).
"""
