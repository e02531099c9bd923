"""Where the checkout and the workspace are: the one place that climbs from this package's own file.

Every module that needs `<repo>/configs`, `<repo>/utils` or the default workspace asks here, so moving a
module between subpackages can never leave a `parents[N]` pointing at the wrong directory.
"""

import os
from pathlib import Path

# py/jobkit/core/paths.py -> the repository root (the launcher scripts, configs/, utils/ live there)
REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIGS_DIR = REPO_ROOT / "configs"
UTILS_DIR = REPO_ROOT / "utils"


def workspace(given: str | os.PathLike | None = None) -> Path:
    """--workspace, else $JOB_WORKSPACE, else <repo>/outputs (where the launchers write)."""
    return Path(given or os.environ.get("JOB_WORKSPACE") or REPO_ROOT / "outputs")
