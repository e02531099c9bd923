"""launch: the training entry and what it needs to report MFU. Runs on a training node, inside its image.

  entry       `jobkit launch <config.yml> [key=value ...]`: finds MaxText's train module, runs it, exits fast
              (also `python -m jobkit.launch ...`, through __main__.py)
  jax_distributed  initialises JAX's distributed runtime for a multi-node run (heartbeat from
              JAX_HEARTBEAT_TIMEOUT), before MaxText, and tells MaxText to skip its own
  procs       `jobkit procs -- CMD`: LOCAL_WORLD_SIZE processes per node, one per device, each line behind
              `[rank<G>]: `; the first failure stops the others
  tb_redact   keeps secret-looking config keys (hf_access_token, ...) out of MaxText's TensorBoard text summaries
  mfu         decides once per run whether MFU is reported, and against which peak
  mfu_stream  appends `MFU: X.XX%` to the step lines training prints
  peaks       dense peak TFLOP/s per device, by accelerator and dtype
  gpu         which accelerator this host has, from the vendor tools
  commands    `jobkit launch`, `jobkit procs` and `jobkit mfu` (click only)

May import: core. The training image may hold only the standard library and click beside MaxText, so nothing
here imports numpy, yaml or anything heavy at module level.
"""
