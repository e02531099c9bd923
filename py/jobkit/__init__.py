"""jobkit: the Python side of the MaxText launcher.

Modules, one concern each:
  launch      training entry (`python -m jobkit.launch <config.yml> [key=value ...]`)
  peaks       dense peak TFLOP/s per accelerator and dtype
  gpu         which accelerator this host has (rocminfo / amd-smi / nvidia-smi)
  config      a run's MaxText settings: key=value args and the yml
  mfu         dtype resolution and the MFU decision for one run
  mfu_stream  stdout/stderr wrapper that appends MFU to MaxText step lines
  logparse    reading a job log: header, step lines, footer
  tgs         throughput statistics over step windows, summary line
  failures    why a failed run failed
  cli         `python -m jobkit tgs|mfu|why`

Nothing here imports MaxText or JAX at module level.
"""

__version__ = "0.1.0"
