#!/usr/bin/env python3
"""Usage: bench/first_run_phases.py LABEL COMMAND ...
Summary: Run COMMAND, stamp each line of its output with the seconds since start, print one row of phases

Reads the lines `utils/setup_env.sh` and `run_local.sh` print and takes the moment each phase ended: uv
bootstrapped, packages installed, first job's modules compiled, venv ready, training's first step, the PASS
verdict line. Prints `LABEL <phase seconds ...>` (a dash where a phase did not show: an older layout without
it) and keeps the stamped output in $FIRST_RUN_LOG when set. Called by bench/first_run.sh.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# (column, the text of the line that ends the phase)
PHASES = (
    ("uv", "creating "),
    ("install", "installed in"),
    ("compile", "compiled in"),
    ("ready", "[setup_env] ready in"),
    ("step0", "completed step: 0,"),
    ("PASS", "— PASS"),
)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    label, command = argv[0], argv[1:]
    seen: dict[str, float] = {}
    log_path = os.environ.get("FIRST_RUN_LOG")
    log = open(log_path, "w") if log_path else None  # noqa: SIM115 - closed below
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - start
        if log:
            log.write(f"{now:7.2f} {line}")
        for name, text in PHASES:
            if name not in seen and text in line:
                seen[name] = now
    rc = proc.wait()
    total = time.monotonic() - start
    if log:
        log.close()
    cells = [f"{seen[n]:7.1f}" if n in seen else "      -" for n, _ in PHASES]
    print(f"{label:<14} {' '.join(cells)} {total:7.1f} {'ok' if rc == 0 else f'exit {rc}'}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
