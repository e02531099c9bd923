"""jobkit: the Python side of the MaxText launcher, one `jobkit` command over subpackages of one concern each.

  cli.py     the click group and its command table (name -> module, summary); imports no command to list them
  core/      reading what jobs leave behind: logs, steps and TGS, failures, nodelists, procfs, Slurm, paths, errors
  launch/    the training entry (`jobkit launch`), MFU and peak TFLOP/s, accelerator detection
  observe/   RAY=1 observability: node exporter, TensorBoard bridge, throwaway Prometheus, TSDB tools, Ray launch
  sweep/     families of real jobs, watched and ranked (`jobkit sweep ...`)
  ops/       operating jobs: hang watchdog, monitor, notify, requeue, jobs/tail, tag, artifacts, why
  bridge/    the host-command bridge: agents in containers run policy-checked cluster commands on the host
  analysis/  pages and reports over finished jobs: analyze, compare, dashboard, profile, hlo
  image/     what a training image holds (`jobkit image-info`)

Imports only go down this order: core < launch < observe < sweep < ops < bridge < analysis < image < cli (a module may
import its own subpackage and any below it; tests/py/test_layers.py fails on an upward import or a cycle).
Each subpackage's __init__ says what lives there, where it runs and what it may import; none of them imports
a module at package import time. Nothing here imports MaxText, JAX or Ray at module level.
"""
