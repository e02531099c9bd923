"""docs/settings.md against the code: every environment variable the shipped sources read is a row of the page
or, if it is not a user's setting, in ALLOWED below with why; every row names something the code reads.

The scanner reads the tracked shell and Python sources that ship (SOURCES): the top-level *.sh and _job.sbatch,
utils/ (its shell and Python files, the shims too), configs/*.sh, py/jobkit/, and bench/, whose knobs
(BENCH_WORKSPACE, SCALE_KEEP, ...) the page lists under "Local Slurm cluster and benchmarks". tests/ is not
scanned: a test's own variables are no user's settings. A read is one of these forms (comment lines skipped;
only UPPER_CASE names that do not start with "_"):

  shell   ${NAME:-x} ${NAME:=x} ${NAME:+x} ${NAME-x} ${NAME+x} ${NAME:?x} ${NAME=x} ${NAME?x},
          setting_uint NAME ..., train_setting NAME ...
  Python  os.environ.get("NAME"  environ.get("NAME"  os.environ["NAME"]  os.getenv("NAME"  "NAME" in os.environ,
          env.get("NAME" / env["NAME"] (a mapping of the environment handed in, as most readers take one),
          any of these with a module constant (ENV_URLS = "JOBKIT_NOTIFY_URLS" ... os.environ.get(ENV_URLS)),
          and the project's readers of one setting: _env_int("NAME", ...), env_uint(env, "NAME", ...),
          _whole(env, "NAME", ...), find_tool(name, given, "NAME"), and a click option's envvar="NAME".

A plain `$NAME` is not a read here (most are the script's own variables), so a setting is read with one of the
forms above, as every one is today; a row for a setting read otherwise fails test (b) as stale.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from conftest import REPO

PAGE = REPO / "docs" / "settings.md"

# Names the sources read that are not a user's settings, each with why. A knob a user may set belongs in
# docs/settings.md, not here.
ALLOWED: dict[str, str] = {
    # The tier contract: the launchers set these for the training tier (docs/architecture.md#tier-contract).
    "JOB_ID": "the tier contract: the job's id, set by run_local.sh / _job.sbatch",
    "JOB_DIR": "the tier contract: <JOB_ID>-<JOB_NAME>, set by the launchers",
    "NNODES": "the tier contract: the node count, set by the launchers",
    "NODE_RANK": "the tier contract: this node's rank, set by the launchers (_job.sbatch --task from SLURM_NODEID)",
    "EXP_TAG": "the tier contract: the tag part of the MODEL_SPEC, set by the launchers",
    "MODEL_NAME_ALIAS": "the tier contract: the alias part of the MODEL_SPEC, set by the launchers",
    "JOB_WORKSPACE_HOST": "set by _container.sh: the host path of /outputs, for the paths training prints",
    "OUTPUT_PATH": "set by _train.sh: MaxText's base_output_directory, read by the TensorBoard plugin",
    "PASSTHROUGH_ARGS": "set by _train.sh for configs/<model>.env.sh: the arguments after --",
    "LOCAL_RANK": "set by jobkit procs for each process of LOCAL_WORLD_SIZE > 1",
    "GLOBAL_RANK": "set by jobkit procs for each process of LOCAL_WORLD_SIZE > 1",
    "PROCS_EXIT_FILE": "set by _train.sh for jobkit procs: the failed process whose core to find",
    "STAGE_RUNNING_PID": "_job.sbatch's own: the running stage's pid (utils/lib/stage_timeout.sh sets it)",
    "CONFIGS_DIR": "set by run_local.sh / submit.sh for utils/lib/resolve_model.sh: <repo>/configs",
    # What submit.sh and a requeue hand each other (py/jobkit/ops/requeue.py).
    "MAXTEXT_LAUNCHER_DIR": "set by submit.sh: the job's code snapshot, checked by _job.sbatch",
    "ARTIFACT_SHA256": "set by submit.sh: the snapshot's hash, checked by _job.sbatch before it runs anything",
    "SUBMIT_ARGV": "set by submit.sh: its arguments as JSON, what a requeue submits again",
    "ATTEMPT": "set by jobkit requeue for the attempt it submits",
    "RETRY_OF": "set by jobkit requeue: the job an attempt retries",
    "REQUEUE_ARTIFACT": "set by jobkit requeue: the snapshot the next attempt reuses",
    "REQUEUE_PREVIOUS_DIR": "set by jobkit requeue: the previous attempt's job dir, linked as previous",
    "REQUEUE_EXCLUDE": "set by jobkit requeue: hosts earlier attempts excluded",
    "JOBKIT_SWEEP_TOKEN": "set by jobkit sweep: marks a local job and its children so a sweep finds them again",
    # Set by one part of the project for another, never by a user.
    "RAY_AUTH_TOKEN_PATH": "Ray's own variable, set by observability.sh to the job's token file",
    "RAY_SERVICES_NICE": "set by observability.sh from OBS_NICE for ray_cluster.sh (a user's value is replaced)",
    "JOBKIT_RAY_SPAWN_NICE": "set by ray_cluster.sh from RAY_SERVICES_NICE for jobkit ray-start",
    "JOBKIT_PYSPY_SHIM_DIR": "set by ray_cluster.sh in every Ray node's environment (the py-spy shim's dir)",
    "JOBKIT_PYSPY_REAL": "set by ray_cluster.sh for the py-spy shim: the real py-spy",
    "PYSPY_LOCAL_RANK": "the py-spy shim's choice among LOCAL_WORLD_SIZE processes; nothing sets it (default 0)",
    "RAY_RAYLET_PID": "set by Ray in its workers; the actor reads the raylet's environment through it",
    "POLL_INTERVAL": "set by the metrics exporter for its plugins: the cycle's seconds",
    "HANG_HOST": "the hang watchdog's host name instead of the short hostname; nothing sets it (stacks files "
    "and NODE_EXIT lines must carry the Slurm node name, which the hostname is)",
    "COREDUMP_SET": "utils/lib/coredump.sh's own state: whether this shell changed core_pattern",
    "COREDUMP_SINCE": "utils/lib/coredump.sh's own state: when training started (cores newer than that)",
    "COREDUMP_WHERE": "utils/lib/coredump.sh's own state: where this node's cores go, in words",
    "TRAIN_SHELL_VENV": "set by _container.sh for the interactive shell's rc file",
    "FIRST_JOB_MODULES_LOG": "set by utils/first_job_modules.py for the job it records",
    "FIRST_JOB_MODULES_ROOT": "set by utils/first_job_modules.py for the job it records",
    "FIRST_RUN_LOG": "set by bench/first_run.sh for bench/first_run_phases.py",
    "CUDA_VERSION": "the training image's own environment, which jobkit image-info reports",
    "CUDNN_VERSION": "the training image's own environment, which jobkit image-info reports",
    "NCCL_VERSION": "the training image's own environment, which jobkit image-info reports",
    # Test hooks: point a reader at a recorded tree or file instead of this machine's.
    "GPU_DETECT_ROOT": "test hook: prefix for the GPU sysfs files (utils/lib/gpu_detect.sh)",
    "NCCL_SYSFS_ROOT": "test hook: prefix for /sys in utils/lib/nccl_env.sh",
    "PREFLIGHT_SYSFS_ROOT": "test hook: prefix for the /sys and /proc/sys files utils/preflight.sh reads",
    "IMAGE_PROBE_ROOT": "test hook: prefix for the files jobkit image-info's probe reads",
    "GPU_METRICS_ROOT": "test hook: a recorded tree for the GPU metrics plugin (bench/exporter_cpu.sh --root too)",
    "HOST_METRICS_ROOT": "test hook: a recorded tree for the host metrics plugin (bench/exporter_cpu.sh --root too)",
    "FREE_PORT_PROC": "test hook: where utils/lib/free_port.sh reads the tcp tables (/proc/net)",
    "COREDUMP_PATTERN_FILE": "test hook: replaces /proc/sys/kernel/core_pattern",
    "COREDUMP_STATE_DIR": "test hook: replaces /run/jobkit-coredump, the per-node record of who set core_pattern",
    # Slurm's own.
    "SLURMD_NODENAME": "Slurm's: the node name preflight and the ECC check print",
    "SLURM_GPUS_ON_NODE": "Slurm's: the GPUs of the allocation, which preflight reports",
    "SLURM_NODEID": "Slurm's: a task's node index, which becomes NODE_RANK",
    # The system's and the shell's.
    "HOSTNAME": "the system's: the host name coredump.sh prints",
    "USER": "the system's: the login name in tunnel hints, reservations and the monitor",
    "TMPDIR": "the system's: where temp files go",
    "PATH": "the system's",
    "PYTHONPATH": "Python's own: utils/first_job_modules.py adds a scratch dir in front",
    "VIRTUAL_ENV": "set by _container.sh when it activates the project venv",
    "PYENV_ROOT": "pyenv's own: where utils/setup_env.sh looks for its Pythons (default ~/.pyenv)",
    "XDG_CACHE_HOME": "the XDG base directory for caches (uv's cache under it)",
    "XDG_CONFIG_HOME": "the XDG base directory for configuration (jobkit/notify.conf under it)",
    "XDG_STATE_HOME": "the XDG base directory for state (jobkit's tracebacks under it)",
    "REPLY": "bash's: what a plain `read` reads into",
    # Script variables the ${NAME:-} pattern catches.
    "BASE": "bench/exporter_cpu.sh and bench/sweep_models.sh: a variable of the script (its --base option)",
    "ROOT": "bench/exporter_cpu.sh: a variable of the script (its --root option)",
    "TB": "bench/exporter_cpu.sh: a variable of the script (its --tb option)",
}

# --- the scanner ----------------------------------------------------------------------------------------------

NAME = r"[A-Z][A-Z0-9_]*"
SHELL_READ = re.compile(rf"\$\{{({NAME})(?::[-=+?]|[-=+?])|\b(?:setting_uint|train_setting)\s+({NAME})\b")
_ENV = r"(?:\benv\b|\benviron\b|\benv\))"  # env, self.env, os.environ, (os.environ if env is None else env)
PY_READS = (
    _ENV + r"\.get\(\s*{ref}",
    _ENV + r"\[\s*{ref}\s*\](?!\s*=[^=])",  # a read, not env["X"] = ...
    r"\bos\.getenv\(\s*{ref}",
    r"{ref}\s+in\s+(?:os\.)?environ\b",
    r"\b_env_int\(\s*{ref}",
    r"\b(?:env_uint|_whole)\(\s*\w+\s*,\s*{ref}",
    r"\bfind_tool\([^()]*,\s*{ref}\s*\)",
    r"\benvvar\s*=\s*{ref}",  # a click option's
)
QUOTED = rf"[\"']({NAME})[\"']"
CONSTANT = re.compile(rf"^({NAME})\s*(?::\s*str\s*)?=\s*{QUOTED}\s*(?:#.*)?$", re.M)


def _python_patterns(constants: Iterable[str]) -> list[re.Pattern[str]]:
    refs = [QUOTED] + [rf"\b({c})\b" for c in constants]
    return [re.compile(form.format(ref=ref)) for form in PY_READS for ref in refs]


def reads_in_shell(text: str) -> set[str]:
    found: set[str] = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for match in SHELL_READ.finditer(line):
            found.add(match.group(1) or match.group(2))
    return {n for n in found if not n.startswith("_")}


def reads_in_python(text: str) -> set[str]:
    constants = dict(CONSTANT.findall(text))
    patterns = _python_patterns(constants)
    found: set[str] = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for pattern in patterns:
            for match in pattern.finditer(line):
                ref = match.group(1)
                found.add(constants.get(ref, ref))
    return {n for n in found if not n.startswith("_")}


def _kind(path: str) -> str | None:
    """'sh', 'py' or None (not scanned) for a tracked file."""
    top, _, rest = path.partition("/")
    if not rest:
        return "sh" if path.endswith(".sh") or path == "_job.sbatch" else None
    if top == "configs":
        return "sh" if "/" not in rest and path.endswith(".sh") else None
    if top == "py":
        return "py" if path.startswith("py/jobkit/") and path.endswith(".py") else None
    if top not in ("utils", "bench"):
        return None
    if path.endswith(".py"):
        return "py"
    if path.endswith((".sh", ".bashrc")):
        return "sh"
    first = (REPO / path).read_text(errors="replace").partition("\n")[0]
    return "sh" if first.startswith("#!") and "bash" in first else "py" if "python" in first else None


def sources() -> dict[str, str]:
    """path -> 'sh' | 'py' for every tracked file the scanner reads."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    kinds = {p: _kind(p) for p in listed.splitlines() if (REPO / p).is_file()}
    return {p: k for p, k in kinds.items() if k}


def scanned() -> dict[str, list[str]]:
    """name -> the files that read it."""
    where: dict[str, list[str]] = {}
    for path, kind in sorted(sources().items()):
        text = (REPO / path).read_text(errors="replace")
        for name in reads_in_shell(text) if kind == "sh" else reads_in_python(text):
            where.setdefault(name, []).append(path)
    return where


# --- the page -------------------------------------------------------------------------------------------------

ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def rows(text: str) -> dict[str, list[str]]:
    """NAME -> its row's cells, for every table line whose first cell is one `NAME`."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match and re.fullmatch(rf"_?{NAME}", match.group(1)):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            found[match.group(1)] = cells
    return found


def first_cells(text: str) -> list[str]:
    """The first cell of every table line below the header rows, as written."""
    cells = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*(variable\s*\||-)", line):
            cells.append(line.strip("|").split("|")[0].strip())
    return cells


PAGE_TEXT = PAGE.read_text()
ROWS = rows(PAGE_TEXT)
SCANNED = scanned()


def test_every_setting_the_code_reads_has_a_row_or_is_allowed_with_why():
    missing = {n: SCANNED[n] for n in sorted(SCANNED) if n not in ROWS and n not in ALLOWED}
    lines = "\n".join(f"  {n}  (read in {', '.join(paths[:3])})" for n, paths in missing.items())
    assert not missing, (
        f"settings read by the code with no row in docs/settings.md:\n{lines}\n"
        "add a row to docs/settings.md or, if it is not a setting, to ALLOWED with why"
    )


def test_every_row_names_a_setting_the_code_reads():
    # _DEBUG starts with "_", which the scanner leaves out (bash's own names do); it is read as ${_DEBUG:-}.
    debug_read = any("${_DEBUG:-}" in (REPO / p).read_text() for p, k in sources().items() if k == "sh")
    stale = sorted(n for n in ROWS if n not in SCANNED and not (n == "_DEBUG" and debug_read))
    assert not stale, f"rows of docs/settings.md for variables no shipped source reads: {stale}; remove them"


def test_no_name_is_both_a_row_and_allowed():
    both = sorted(set(ROWS) & set(ALLOWED))
    assert not both, f"{both}: a row of docs/settings.md and in ALLOWED; a setting is one or the other"


def test_allowed_names_are_still_read_and_say_why():
    unread = sorted(n for n in ALLOWED if n not in SCANNED)
    assert not unread, f"ALLOWED names nothing reads any more: {unread}; remove them"
    assert all(len(why) >= 10 for why in ALLOWED.values())


def test_each_row_is_one_variable_with_four_filled_cells():
    bad = [c for c in first_cells(PAGE_TEXT) if not re.fullmatch(rf"`_?{NAME}`", c)]
    assert not bad, f"first cells that are not one `NAME` (one variable per row): {bad}"
    short = {n: cells for n, cells in ROWS.items() if len(cells) != 4 or not all(cells)}
    assert not short, f"rows without four non-empty cells (variable, default, meaning, refused): {sorted(short)}"
    headers = re.findall(r"^\|([^\n]*)\|\n\|[-| ]+\|$", PAGE_TEXT, re.M)
    assert headers and all([h.strip() for h in hdr.split("|")] == ["variable", "default", "meaning", "refused"]
                           for hdr in headers), "each table's header is | variable | default | meaning | refused |"  # fmt: skip


def test_each_variable_has_one_row():
    names = [c.strip("`") for c in first_cells(PAGE_TEXT)]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"variables with more than one row: {twice}"


# --- the scanner, proved on small snippets -----------------------------------------------------------------


SHELL_SNIPPET = r"""
a=${ONE:-1} b=${TWO:=2} c=${THREE:+x} d=${FOUR-4} e=${FIVE+5} f=${SIX:?unset}
  # g=${COMMENTED:-0}
grace=$(setting_uint SEVEN 3) || exit 2
x=$(train_setting EIGHT "")
y=${_PRIVATE:-} z=${lower:-} w=$PLAIN
export NINE=${NINE:-9}
"""

PY_SNIPPET = """
import os
ENV_URLS = "TEN"
a = os.environ.get("ONE", "")
b = os.environ["TWO"]
c = os.getenv("THREE")
if "FOUR" in os.environ: pass
d = env.get("FIVE") or self.env.get(ENV_URLS)
e = (os.environ if env is None else env).get("SIX", "1")
# f = os.environ.get("COMMENTED")
g = _env_int("SEVEN", 10), clitypes.env_uint(setting, "EIGHT", 0), find_tool("promtool", given, "NINE")
@click.option("--address", envvar="ELEVEN")
env["WRITTEN"] = "1"
h = os.environ.get("_PRIVATE"), os.environ.get("lower"), os.environ.get(name)
"""


def test_the_scanner_finds_every_shell_form_and_skips_comments():
    assert reads_in_shell(SHELL_SNIPPET) == {"ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"}


def test_the_scanner_finds_every_python_form_and_skips_comments():
    assert reads_in_python(PY_SNIPPET) == {
        "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE", "TEN", "ELEVEN",
    }  # fmt: skip


def test_the_row_reader_takes_one_name_per_row_and_its_cells():
    table = "| variable | default | meaning | refused |\n|---|---|---|---|\n| `A_B` | 1 | m | — |\n| `C`, `D` | x | y | z |\n"
    assert rows(table) == {"A_B": ["`A_B`", "1", "m", "—"]}
    assert first_cells(table) == ["`A_B`", "`C`, `D`"]


@pytest.mark.parametrize("path", ["_job.sbatch", "run_local.sh", "utils/lib/settings.sh", "py/jobkit/cli.py"])
def test_the_shipped_entry_points_are_scanned(path):
    assert path in sources()
