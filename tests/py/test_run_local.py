"""End to end: ./run_local.sh trains the tiny model for real with MaxText on the CPU.

Each test starts the real launcher (native runtime, the project's .venv) in a private JOB_WORKSPACE and
checks what a user would look at: the log's header and summary, the job dir, TensorBoard events, the
exit code, and the closing TGS line. They share one JAX compile cache to keep the suite fast.
"""

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from job_observation import header, live_processes_of
from launch_env import launcher_env

REPO = Path(__file__).resolve().parents[2]
# Every test here runs ./run_local.sh for real (in its own body): all of them are e2e.
pytestmark = pytest.mark.e2e

STEP_RE = re.compile(r"completed step: (\d+), seconds: ([\d.]+).*?Tokens/s/device: ([\d.]+).*?loss: ([\d.]+)")


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture
def workspace(tmp_path):
    return tmp_path / "ws"


def run_local(workspace, jax_cache, *args, timeout=300):
    return subprocess.run(
        [str(REPO / "run_local.sh"), *args],
        env=launcher_env(workspace, jax_cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def only_job(workspace):
    logs = sorted(workspace.glob("local_*.log"))
    assert len(logs) == 1, f"expected one job log in {workspace}, found {logs}"
    log = logs[0]
    job_dir = workspace / log.name.removesuffix(".log")
    return log, job_dir


def steps(log_text):
    return {
        int(m.group(1)): (float(m.group(2)), float(m.group(3)), float(m.group(4))) for m in STEP_RE.finditer(log_text)
    }


def test_tiny_trains_with_header_summary_events_and_tgs_line(workspace, jax_cache):
    result = run_local(workspace, jax_cache, "tiny")
    assert result.returncode == 0, result.stdout[-3000:]

    log, job_dir = only_job(workspace)
    text = log.read_text()
    head = header(text)
    assert head["JOB_ID"].startswith("local_") and re.fullmatch(r"local_\d{8}_\d{6}_[0-9a-f]{4}", head["JOB_ID"])
    assert head["JOB_NAME"] == "JAX-tiny"
    assert head["NNODES"] == "1"
    assert head["MODEL_NAME"] == "tiny"
    assert log.name == f"{head['JOB_ID']}-JAX-tiny.log"
    assert (job_dir / "log").is_symlink() and (job_dir / "log").resolve() == log.resolve()

    per_step = steps(text)
    assert sorted(per_step) == list(range(20)), "the tiny config trains 20 steps"
    assert per_step[19][2] < per_step[0][2], "loss should fall over 20 steps"

    events = list(job_dir.glob("tiny/tensorboard/tiny/events.out.tfevents.*"))
    assert len(events) == 1, list(job_dir.rglob("*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent), size_guidance={"scalars": 0})
    acc.Reload()
    tb_loss = {e.step: e.value for e in acc.Scalars("learning/loss")}
    assert tb_loss[19] == pytest.approx(per_step[19][2], abs=1e-3)

    summary = text[text.index("==== JOB SUMMARY ====") :]
    assert "Status: SUCCESS (exit 0)" in summary
    assert f"Job:    {head['JOB_ID']} (JAX-tiny)" in summary

    # A clean run ends clean: _train.sh waited for the hang watchdog, which ends with training, so the reaper
    # under run_local.sh found nothing "left behind" (it used to stop the watchdog, a look behind training).
    watchdog = re.search(r"^\[_train\] hang watchdog: pid (\d+)", text, re.M)
    assert watchdog, text[-3000:]
    assert "left behind" not in result.stdout + result.stderr, result.stdout[-3000:]
    assert "was still running" not in text, "the watchdog ended by itself, it was not stopped"

    # The closing verdict: mean Tokens/s/device over steps 5-14, no MFU on a CPU, PASS.
    last = result.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"tiny 1N \(job (local_\S+)\): ([\d,]+) TGS/device — PASS", last)
    assert m, last
    assert m.group(1) == head["JOB_ID"]
    expected = sum(per_step[s][1] for s in range(5, 15)) / 10
    assert int(m.group(2).replace(",", "")) == pytest.approx(expected, rel=0.01)
    assert last in text, "the verdict line is in the log too"

    # JOB_UMASK's default (077): nothing the job wrote is readable by anyone else on a shared filesystem.
    shared = [p for p in [log, *job_dir.rglob("*")] if not p.is_symlink() and p.stat().st_mode & 0o077]
    assert shared == [], [(str(p), oct(p.stat().st_mode)) for p in shared[:5]]


def test_steps_and_env_override_reach_training(workspace, jax_cache):
    secret = "_env_WANDB_API_KEY=FAKEpassthru0000SECRET"
    result = run_local(
        workspace, jax_cache, "tiny", "--", "steps=7", "_env_FOO=bar", "_env_TUNE_PROFILE=baseline", secret
    )
    assert result.returncode == 0, result.stdout[-3000:]
    log, job_dir = only_job(workspace)
    text = log.read_text()
    assert sorted(steps(text)) == list(range(7))
    # The tag (job name, log and job dir names) keeps _env_ values of training's own knobs only (issue 21, S1).
    assert header(text)["EXP_TAG"] == "steps_7-_env_FOO-_env_TUNE_PROFILE_baseline-_env_WANDB_API_KEY"
    assert log.name.endswith("-JAX-tiny-steps_7-_env_FOO-_env_TUNE_PROFILE_baseline-_env_WANDB_API_KEY.log")
    assert (
        header(text)["PASSTHROUGH_ARGS"] == '"steps=7 _env_FOO=bar _env_TUNE_PROFILE=baseline _env_WANDB_API_KEY=***"'
    )
    assert "0000SECRET" not in text and "0000SECRET" not in result.stdout
    env_lines = (job_dir / "environment.node0.txt").read_text().splitlines()
    assert "FOO=bar" in env_lines and "WANDB_API_KEY=***" in env_lines
    assert "JAX_PLATFORMS=cpu" in env_lines


def test_failed_training_reports_failed_and_the_reason(workspace, jax_cache):
    result = run_local(workspace, jax_cache, "tiny", "--", "no_such_maxtext_key=1")
    assert result.returncode != 0
    log, _ = only_job(workspace)
    text = log.read_text()
    assert f"Status: FAILED (exit {result.returncode})" in text
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"tiny 1N \(job local_\S+\): .*FAIL \(config-error\)", last), last


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_cancels_training_and_leaves_nothing_running(workspace, jax_cache, sig, code):
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env=launcher_env(workspace, jax_cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As from a terminal: a suite started in the background (`cmd &` in a script) runs with SIGINT ignored,
        # and bash cannot trap a signal ignored on entry, so run_local.sh would never see the Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads started here
    )
    try:
        deadline = time.monotonic() + 180
        log = None
        while time.monotonic() < deadline:
            logs = list(workspace.glob("local_*.log")) if workspace.exists() else []
            if logs and "completed step: 3," in logs[0].read_text():
                log = logs[0]
                break
            assert proc.poll() is None, "training ended before it could be cancelled"
            time.sleep(0.5)
        assert log is not None, "training never reached step 3"
        job_id = header(log.read_text())["JOB_ID"]
        assert live_processes_of(job_id), "the training process should be visible while it runs"

        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code
    text = log.read_text()
    assert f"Status: CANCELLED (exit {code})" in text
    assert out.strip().splitlines()[-1].endswith("FAIL (cancelled)")
    time.sleep(0.5)
    assert live_processes_of(job_id) == []


def test_checkpointing_run_resumes_in_a_stable_alias_dir(workspace, jax_cache):
    first = run_local(
        workspace,
        jax_cache,
        "tiny:ck-a:",
        "--",
        "enable_checkpointing=true",
        "steps=3",
        "checkpoint_period=2",
        "async_checkpointing=false",
    )
    assert first.returncode == 0, first.stdout[-3000:]
    ckpt_root = workspace / "ck-a" / "tiny" / "checkpoints"
    assert ckpt_root.is_dir(), list(workspace.rglob("*"))[:50]
    saved = {int(p.name) for p in ckpt_root.iterdir() if p.name.isdigit()}
    assert saved, "a checkpoint should have been written"

    second = run_local(
        workspace,
        jax_cache,
        "tiny:ck-a:",
        "--",
        "enable_checkpointing=true",
        "steps=5",
        "checkpoint_period=2",
        "async_checkpointing=false",
    )
    assert second.returncode == 0, second.stdout[-3000:]
    # The rerun restores the newest checkpoint (step N = state after step N) and trains N+1 .. steps-1.
    assert f"restoring from this run's directory step {max(saved)}" in second.stdout
    assert sorted(steps(second.stdout)) == list(range(max(saved) + 1, 5))
