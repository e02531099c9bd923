"""COREDUMP=1 for real: a run_local.sh job of the tiny model whose training gets SIGSEGV after a few steps keeps
its core in <job dir>/cores/, the machine's core_pattern is back to what it was, and `jobkit why` names the signal
and the core, with commands that open it (py-spy's is run here). Where this machine's core_pattern cannot be set
(not root, read-only /proc/sys, a pattern that is not the kernel default), the same job must say where cores go
instead and leave the pattern alone. The stand-in-file cases (systemd, apport, not root) are in
tests/bats/coredump.bats."""

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from job_observation import TRAINING_CMDLINE, live_processes_of
from launch_env import launcher_env

# The test here runs ./run_local.sh tiny for real (in its own body): e2e.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
STATE_DIR = "/run/jobkit-coredump/"  # utils/lib/coredump.sh's default


def pattern_settable() -> bool:
    """Whether the job may set this machine's core_pattern: root, a writable file (writing back the value it
    holds proves it), and the kernel default in it."""
    current = CORE_PATTERN.read_text().rstrip("\n")
    if os.geteuid() != 0 or current != "core":
        return False
    try:
        CORE_PATTERN.write_text(current + "\n")
    except OSError:
        return False
    return True


def test_segfault_in_training_leaves_its_core_in_the_job_dir_and_why_names_it(tmp_path):
    before = CORE_PATTERN.read_text()
    settable = pattern_settable()
    workspace = tmp_path / "ws"
    env = launcher_env(workspace, COREDUMP="1", COREDUMP_WAIT="30")
    env.pop("COREDUMP_PATTERN_FILE", None)
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pid = None
    try:
        job_id = proc.stdout.readline().strip().split("=", 1)[1]
        head = []
        for line in proc.stdout:
            head.append(line)
            if "completed step: 3," in line:
                break
        during = CORE_PATTERN.read_text()
        during_target = Path(during.rsplit("/", 1)[0]).resolve() if during.startswith("/") else None
        (pid,) = live_processes_of(job_id, TRAINING_CMDLINE)
        os.kill(pid, signal.SIGSEGV)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        # A failed run must not leave this machine's cores pointing into a temp dir.
        if CORE_PATTERN.read_text() != before and CORE_PATTERN.read_text().startswith(STATE_DIR):
            CORE_PATTERN.write_text(before)
    output = "".join(head) + rest
    log = next(workspace.glob("local_*.log"))
    job_dir = log.with_suffix("")
    assert proc.returncode == 139, output[-3000:]
    assert CORE_PATTERN.read_text() == before, "core_pattern is the machine's: it must be put back"
    assert f"[coredump] training killed by SIGSEGV (exit 139) on {os.uname().nodename.split('.')[0]}" in output
    why = subprocess.run([str(REPO / ".venv" / "bin" / "jobkit"), "why", str(log)], capture_output=True, text=True)
    lines = why.stdout.splitlines()
    assert lines[0] == "killed-by-signal: SIGSEGV", why.stdout + why.stderr

    if not settable:  # the real "cannot set it" path: the job says where this node's cores go instead
        assert during == before
        assert re.search(r"^\[coredump\] cores go to: .+ \(core_pattern not changed: .+\)$", output, re.M), output
        assert any(line.startswith("  core: ") for line in lines[1:]), why.stdout
        return

    cores = job_dir / "cores"
    # While training runs, cores go to the job dir, through the node's short link (the kernel keeps 127 bytes).
    assert re.fullmatch(rf"{STATE_DIR}users/\d+\.\d+/core\.%h\.%e\.%p\n", during), during
    assert during_target == cores.resolve()
    assert not any(Path(STATE_DIR, "users").iterdir()), "the job's entry is gone with it"
    (core,) = cores.glob(f"core.*.{pid}")
    try:
        assert core.stat().st_size > 1 << 20
        assert re.search(rf"^== CORE DUMP {re.escape(str(core))} \(\d+(\.\d)?[KMG]iB\) ==$", output, re.M), output[
            -3000:
        ]
        # after the verdict's own lines (evidence, host, blamed because, retry, advice ...): the core and its tools
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"  core: {core} (")]
        assert lines[at + 1].startswith("    native stacks: gdb -batch -ex 'thread apply all bt' ")
        assert lines[at + 1].endswith(f"/python3 {core}") or lines[at + 1].endswith(f"/python {core}")
        assert lines[at + 2] == f"    python stacks: py-spy dump --core {core}"
        # The suggested py-spy command works on this very core and shows training's Python stack.
        py_spy = subprocess.run(
            [str(REPO / ".venv" / "bin" / "py-spy"), "dump", "--core", str(core)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert py_spy.returncode == 0, py_spy.stderr
        assert f"Signal 11: {core}" in py_spy.stdout and "train_loop" in py_spy.stdout, py_spy.stdout[-3000:]
    finally:
        core.unlink()  # hundreds of MB; the test's own temp dir
    assert live_processes_of(job_id) == []
