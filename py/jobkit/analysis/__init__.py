"""analysis: reading finished jobs into reports and pages. Runs on a login node (matplotlib, promtool, xprof).

  command            `jobkit analyze JOB`: analysis.json and report.html under <job dir>/analysis/
  job                what a job's log and job dir say: identity, provenance, stages, steps and their times
  build              one job's analysis document and plot panels
  anomalies          what looks wrong in a job, each with its evidence
  hosts              per-host resource series from the job's TSDB
  tsdb_query         a TSDB read through PromQL: a throwaway Prometheus over a view, per-host lines downsampled (observe.tsdb_dump, the promtool dump, is the fallback)
  report             report.html: one self-contained page
  compare            `jobkit compare JOB...`: jobs side by side, terminal and HTML
  dashboard          the workspace page: every job in one table, TGS per model over time
  dashboard_serve    that page served on 127.0.0.1, rebuilt on load (handed a rebuild callable)
  dashboard_command  `jobkit dashboard [--serve]` (click only)
  plots              inline SVG plots for the pages (matplotlib, no JavaScript)
  profile            `jobkit profile JOB`: a captured profile's step-time composition and top ops
  hlo                `jobkit hlo JOB`: collectives and fusions of a job's XLA dump

May import: core, launch, observe, sweep, ops.
"""
