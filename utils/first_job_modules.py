#!/usr/bin/env python3
"""Usage: utils/first_job_modules.py record [--venv DIR] [--output FILE] -- COMMAND ...
       utils/first_job_modules.py --help
Summary: Record which of the venv's modules a first job reads, for setup_env.sh to compile before it

utils/setup_env.sh installs the lock without bytecode, then compiles only the modules a first job imports
(configs/first_job_modules.txt), then the rest of the venv in the background at low priority. Compiling all
~17,000 modules takes ~50 s on 2 cores; the ~3,000 that `run_local.sh tiny` imports take a
few seconds, and a first job without their bytecode spends ~15 s more in its imports (every process compiles
what it imports again where Python may not write bytecode: PYTHONDONTWRITEBYTECODE, a read-only venv).

`record` runs COMMAND (e.g. `./run_local.sh tiny -- steps=3`, then again with RAY=1) with a hook in every
Python process it starts (a sitecustomize on PYTHONPATH): each module of the venv's site-packages that is
imported (from its source or its bytecode) is appended to a scratch file. It then merges what was read into
FILE (default configs/first_job_modules.txt), sorted and as site-packages-relative .py paths, keeping the
entries already there. Run it after a change of requirements.lock (`utils/first_job_modules.py record -- ./run_local.sh tiny -- steps=3`) and commit the file.

Exit codes: COMMAND's own exit code when it failed (nothing is written), 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LIST = REPO / "configs" / "first_job_modules.txt"

# The hook every recorded process runs: each module the path finder's SourceFileLoader turns into code (from
# source or cached bytecode) is appended to the log before it runs, so even a process that leaves with
# os._exit (training does) has written its lines. Files merely read as text (transformers reads hundreds of
# its model files to find their exports) do not count: only imports pay for bytecode.
SITECUSTOMIZE = """
import os
from importlib.machinery import SourceFileLoader
_log = os.environ.get("FIRST_JOB_MODULES_LOG")
_root = os.environ.get("FIRST_JOB_MODULES_ROOT", "")
_get_code = SourceFileLoader.get_code
def _recorded_get_code(self, fullname):
    path = getattr(self, "path", "")
    if path.startswith(_root) and path.endswith(".py"):
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (path + "\\n").encode())
        finally:
            os.close(fd)
    return _get_code(self, fullname)
if _log:
    SourceFileLoader.get_code = _recorded_get_code
"""


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"first_job_modules.py: no site-packages under {venv}; build it with utils/setup_env.sh")
    return found[-1]


def source_of(path: str, root: Path) -> str | None:
    """The site-packages-relative .py a read file stands for (a.py, or __pycache__/a.cpython-312.pyc)."""
    p = Path(path)
    if p.suffix == ".pyc":
        if p.parent.name != "__pycache__":
            return None
        p = p.parent.parent / (p.name.split(".")[0] + ".py")
    try:
        rel = p.relative_to(root)
    except ValueError:
        return None
    return str(rel) if (root / rel).is_file() else None


def record(venv: Path, output: Path, command: list[str]) -> int:
    root = site_packages(venv)
    with tempfile.TemporaryDirectory(prefix="first-job-modules-") as scratch:
        Path(scratch, "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = Path(scratch, "read.log")
        env = dict(os.environ, FIRST_JOB_MODULES_LOG=str(log), FIRST_JOB_MODULES_ROOT=str(root) + "/")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [scratch, os.environ.get("PYTHONPATH")]))
        rc = subprocess.run(command, env=env, check=False).returncode
        if rc != 0:
            print(f"first_job_modules.py: {command[0]} exited {rc}; {output} left as it was", file=sys.stderr)
            return rc
        read = log.read_text().splitlines() if log.exists() else []
    found = {s for s in (source_of(p, root) for p in read) if s}
    kept = set(output.read_text().split()) if output.exists() else set()
    output.write_text("".join(f"{p}\n" for p in sorted(found | kept)))
    print(f"first_job_modules.py: {len(found)} modules read, {len(found - kept)} new; {len(found | kept)} in {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="utils/first_job_modules.py", usage=__doc__.split("\n\n")[0][7:])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record", help="run COMMAND and add the modules it read to the list")
    rec.add_argument("--venv", type=Path, default=Path(os.environ.get("VENV_DIR", REPO / ".venv")))
    rec.add_argument("--output", type=Path, default=DEFAULT_LIST)
    rec.add_argument("command", nargs="+")
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    args = parser.parse_args(argv)
    return record(args.venv.resolve(), args.output, args.command)


if __name__ == "__main__":
    sys.exit(main())
