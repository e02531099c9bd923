"""The environment the end-to-end tests start the launcher with (run_local.sh, submit.sh, _container.sh).

    from launch_env import launcher_env

    env = launcher_env(workspace, jax_cache)                       # native runtime, a shared compile cache
    env = launcher_env(workspace, RAY="1", EXPORTER_INTERVAL="2")  # plus the test's own settings
    env = launcher_env(workspace, runtime="podman", DOCKER_IMAGE=image)

The caller's environment minus the settings a developer's shell may carry that change what a job does
(training flags, a tuning profile, stage limits, an XLA dump, another venv or import path), with the job's
workspace, the container runtime (none: training runs natively from the repo's .venv) and, when given, the
JAX compile cache that several tests share to stay fast. Keyword arguments are added last and win.
"""

from __future__ import annotations

import os
from pathlib import Path

# Settings from the caller's shell that a test job must not inherit.
LEAKED = (
    "XLA_FLAGS",
    "JAX_PLATFORMS",
    "TUNE_PROFILE",
    "STAGE_TIMEOUTS",
    "ENABLE_XLA_DUMP",
    "VIRTUAL_ENV",
    "PYTHONPATH",
)


def launcher_env(
    workspace: Path | str, jax_cache: Path | str | None = None, *, runtime: str = "none", **extra: str
) -> dict[str, str]:
    """os.environ without LEAKED, with JOB_WORKSPACE=WORKSPACE, CONTAINER_RUNTIME=RUNTIME,
    JAX_CACHE_DIR=JAX_CACHE (when given), and EXTRA."""
    env = {name: value for name, value in os.environ.items() if name not in LEAKED}
    env.update(JOB_WORKSPACE=str(workspace), CONTAINER_RUNTIME=runtime)
    if jax_cache is not None:
        env["JAX_CACHE_DIR"] = str(jax_cache)
    env.update(extra)
    return env
