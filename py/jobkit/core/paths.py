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


def workspace_problem(ws: str | os.PathLike) -> str | None:
    """Why WS cannot be read as a workspace, in one line that names the fix; None when it can.

    The one wording every command that lists a workspace's jobs uses, so a file given as the workspace is
    called a file (not "does not exist"), and a directory we may not read says so."""
    if os.path.isdir(ws):
        if not os.access(ws, os.R_OK | os.X_OK):
            return (
                f"cannot read workspace {ws}: permission denied; pass one you can read (--workspace or JOB_WORKSPACE)"
            )
        return None
    if os.path.lexists(ws):
        return (
            f"workspace {ws} is a file, not a directory; pass the directory that holds the job logs "
            "(--workspace or JOB_WORKSPACE)"
        )
    return f"workspace {ws} does not exist; pass --workspace or set JOB_WORKSPACE"
