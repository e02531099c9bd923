"""`jobkit monitor`: events from real-shaped squeue/sacct answers (PATH stubs) and job logs, notifications
through real apprise to a real HTTP receiver, the state file, and the daemon."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from webhook import Receiver

from jobkit.cli import main
from jobkit.core import procfs
from jobkit.core.errors import EXIT_BAD_INPUT, EXIT_SETTINGS, EXIT_USAGE
from jobkit.ops import monitor

REPO = Path(__file__).resolve().parents[2]
HEADER = "JOB_ID={id}\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\nMAX_RETRIES={retries}\n"
STEP = "0: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, Tokens/s/device: {tgs}, loss: 5.9\n"
SUMMARY = "==== JOB SUMMARY ====\n  Status: {status} (exit {rc})\n=====================\n"


class Cluster:
    """squeue / sacct stubs answering from files, in the shapes real Slurm 22.05 prints for these options."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.dir = tmp_path / "slurm"
        self.dir.mkdir()
        self.queue = self.dir / "queue"  # lines "ID ID STATE", as squeue -h -o '%A %i %T'
        self.acct = self.dir / "acct"  # lines "ID|STATE", as sacct -n -X -P -o JobID,State
        self.queue.write_text("")
        self.acct.write_text("")
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "squeue").write_text(f"#!/bin/sh\n[ -e {self.dir}/down ] && exit 1\ncat {self.queue}\n")
        (bindir / "sacct").write_text(f"#!/bin/sh\ncat {self.acct}\n")
        for tool in ("squeue", "sacct"):
            (bindir / tool).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def set(self, queue: str = "", acct: str = ""):
        """QUEUE and ACCT as "ID|STATE" lines; squeue's are written in its own shape."""
        lines = [line.split("|") for line in queue.splitlines()]
        self.queue.write_text("".join(f"{job} {job} {state}\n" for job, state in lines))
        self.acct.write_text(acct)


@pytest.fixture
def env(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("JOB_WORKSPACE", str(ws))
    monkeypatch.delenv("JOBKIT_NOTIFY_URLS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return ws, Cluster(tmp_path, monkeypatch)


def write_log(ws: Path, job_id: str, steps=(), status=None, rc=0, body="", retries=0, tgs=lambda n: 1000.0) -> Path:
    log = ws / f"{job_id}-tiny.log"
    text = HEADER.format(id=job_id, retries=retries) + "".join(STEP.format(n=n, tgs=tgs(n)) for n in steps) + body
    if status:
        text += SUMMARY.format(status=status, rc=rc)
    log.write_text(text)
    return log


def poll(*args) -> list[tuple[str, str, str]]:
    result = CliRunner().invoke(main, ["monitor", "--once", "--no-notify", *args])
    assert result.exit_code == 0, result.output
    events = []
    for line in result.output.splitlines()[1:]:
        _, _, job_id, rest = line.split(" ", 3)
        kind, text = rest.split(": ", 1)
        events.append((job_id, kind, text))
    return events


def test_a_job_from_queue_to_end_is_told_once_per_event(env):
    ws, slurm = env
    slurm.set("500|PENDING\n")
    assert poll("500") == [("500", "state", "PENDING")]
    slurm.set("500|RUNNING\n")
    write_log(ws, "500")
    assert poll("500") == [("500", "state", "(tiny 2N) RUNNING (was PENDING)")]
    write_log(ws, "500", steps=range(3))
    assert poll("500") == [("500", "first-step", "(tiny 2N) first step (step 0)")]
    assert poll("500") == []  # nothing new, nothing said
    body = "0: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\ntiny 2N (job 500): TGS n/a — FAIL (oom)\n"
    write_log(ws, "500", steps=range(3), status="FAILED", rc=1, body=body)
    slurm.set("", "500|FAILED\n")
    assert poll("500") == [
        ("500", "state", "(tiny 2N) FAILED (was RUNNING)"),
        ("500", "verdict", "tiny 2N (job 500): TGS n/a — FAIL (oom)"),
        (
            "500",
            "failure",
            "(tiny 2N) oom; evidence: 0: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory; "
            "host: node1 (rank 0's prefix (srun -l) -> node 1 of JOB_NODELIST); retry: never",
        ),  # the advice would take the line past FAILURE_LINE_MAX: left to `jobkit why`
    ]
    state = json.loads((ws / ".monitor" / "state.json").read_text())
    assert state["jobs"]["500"]["done"] is True
    assert poll("500") == []


def test_a_requeued_job_is_followed_into_its_next_attempt(env):
    ws, slurm = env
    body = "0: == HANG detected (phase training, last step 4, 9 s since) ==\n== REQUEUED as job 501 (attempt 2 of 2): hang: training ==\n"
    write_log(ws, "500", steps=range(5), status="HANG", rc=143, body=body, retries=1)
    slurm.set("501|PENDING\n", "500|FAILED\n")
    events = poll("500")
    assert ("500", "requeued", "REQUEUED as job 501 (attempt 2 of 2): hang: training") in events
    assert ("501", "state", "PENDING") in events


def test_without_a_requeue_line_a_job_with_retries_is_watched_a_while(env, monkeypatch):
    ws, slurm = env
    write_log(
        ws, "500", steps=range(5), status="FAILED", rc=1, body="0: Traceback (most recent call last):\n", retries=2
    )
    slurm.set("", "500|FAILED\n")
    poll("500")
    state_file = ws / ".monitor" / "state.json"
    assert not json.loads(state_file.read_text())["jobs"]["500"].get("done")
    monkeypatch.setattr(monitor, "REQUEUE_WAIT", 0)
    CliRunner().invoke(main, ["monitor", "--once", "--no-notify", "500"])
    assert json.loads(state_file.read_text())["jobs"]["500"]["done"] is True


def test_hang_marker_and_a_stall_the_watchdog_did_not_report(env):
    ws, slurm = env
    slurm.set("500|RUNNING\n501|RUNNING\n")
    write_log(ws, "500", steps=range(8))
    hang = ws / "500-tiny" / "hang"
    hang.mkdir(parents=True)
    (hang / "HANG").write_text("phase training, last step 7, 312 s since, noticed on node1 (rank 0)\njob=500\n")
    write_log(ws, "501", steps=range(8))
    (ws / "501-tiny" / "hang").mkdir(parents=True)  # a teammate's marker for 501 (an older job's, moved): ignored
    (ws / "501-tiny" / "hang" / "HANG").write_text("planted\njob=400\n")
    first = poll("--stall", "1", "500", "501")
    assert (
        "500",
        "hang",
        f"(tiny 2N) HANG detected — phase training, last step 7, 312 s since, noticed on node1 (rank 0); stacks in {hang}/",
    ) in first
    time.sleep(1.2)
    second = poll("--stall", "1", "500", "501")
    assert [e[:2] for e in second] == [("501", "stalled")]
    assert (
        second[0][2].startswith("(tiny 2N) no new step for ")
        and "since step 7 (and no watchdog report)" in second[0][2]
    )
    assert poll("--stall", "1", "500", "501") == []  # one stall, one alert
    write_log(ws, "501", steps=range(9))
    poll("--stall", "1", "500", "501")
    time.sleep(1.2)
    assert [e[:2] for e in poll("--stall", "1", "500", "501")] == [("501", "stalled")]  # a new stall is news


def test_throughput_drop_below_the_jobs_own_steady_state(env):
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500", steps=range(30))
    assert [e[1] for e in poll("500")] == ["state", "first-step"]
    slow = lambda n: 1000.0 if n < 30 else 600.0  # noqa: E731
    write_log(ws, "500", steps=range(45), tgs=slow)
    assert poll("500") == [], "one poll's low steps are a suspicion, not news"
    write_log(ws, "500", steps=range(54), tgs=slow)
    assert poll("500") == [], "the last 10 steps still overlap the ones the suspicion came from"
    write_log(ws, "500", steps=range(55), tgs=slow)
    (drop,) = poll("500")
    assert drop == (
        "500",
        "tgs-drop",
        "(tiny 2N) TGS 600/device over steps 45-54, 40% below its steady state 1,000 (steps 5-14); low since step 44",
    )
    write_log(ws, "500", steps=range(80), tgs=slow)
    assert poll("500") == [], "one drop, one alert"
    write_log(ws, "500", steps=range(90), tgs=lambda n: 1000.0 if n < 30 else 850.0)
    assert poll("500") == []  # 15% is inside the default 20%


def resumed(n: int) -> float:
    """The issue's resumed attempt: restored at step 201, slow after the restore to step 210, then ~7,000,
    with a burst of load on the shared host over steps 219-228 (2,131)."""
    return 300.0 if n == 201 else 5000.0 if n <= 210 else 2131.0 if 219 <= n <= 228 else 7000.0


def test_a_burst_in_a_resumed_attempts_first_poll_is_no_tgs_drop(env):
    """The issue's case: first-step (step 201) and a tgs-drop 0 s apart, typed failure, for a job that passed.
    The attempt had no steady state of its own yet, and the burst was over by the next poll."""
    ws, slurm = env
    slurm.set("501|RUNNING\n")
    write_log(ws, "501", steps=range(201, 229), tgs=resumed)
    assert [e[1] for e in poll("501")] == ["state", "first-step"]
    write_log(ws, "501", steps=range(201, 241), tgs=resumed)
    assert poll("501") == [], "the burst did not last: nothing to say"
    record = json.loads((ws / ".monitor" / "state.json").read_text())["jobs"]["501"]
    assert record["tgs_ref"] == [7000.0, 211, 220], "the attempt's steady state, after its restore"
    assert "low_from" not in record


def test_a_resumed_attempt_is_measured_against_its_own_settled_steady_state(env):
    ws, slurm = env
    slurm.set("501|RUNNING\n")
    rate = lambda n: 3000.0 if n > 240 else resumed(n) if n < 219 or n > 228 else 7000.0  # noqa: E731
    write_log(ws, "501", steps=range(201, 246), tgs=rate)
    assert [e[1] for e in poll("501")] == ["state", "first-step"]
    write_log(ws, "501", steps=range(201, 256), tgs=rate)
    (drop,) = poll("501")
    assert drop == (
        "501",
        "tgs-drop",
        "(tiny 2N) TGS 3,000/device over steps 246-255, 57% below its steady state 7,000 (steps 211-220); "
        "low since step 245",
    )


def test_a_state_file_from_before_the_attempts_own_steady_state_is_still_read(env):
    """Records written before issue 23 kept bare TGS numbers under other keys: they are left alone."""
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500", steps=range(30))
    old = {"seen": [], "state": "RUNNING", "tgs_steady": [1000.0] * 10, "tgs_recent": [1000.0] * 10}
    state = ws / ".monitor" / "state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"started": 1, "jobs": {"500": old}, "follow": []}))
    assert [e[1] for e in poll("500")] == ["first-step"]
    assert json.loads(state.read_text())["jobs"]["500"]["tgs_ref"] == [1000.0, 5, 14]


def test_a_replaced_log_starts_its_steady_state_over(env):
    """The reference is the log's own: a log rewritten in place (a new attempt under the same name) does not
    inherit the first one's steady state."""
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500", steps=range(60), tgs=lambda n: 1000.0)
    poll("500")
    for last in (215, 230, 245):  # shorter than the first log: the monitor reads it from the start again
        write_log(ws, "500", steps=range(201, last), tgs=lambda n: 600.0)
        assert [e[1] for e in poll("500")] == [], last
    record = json.loads((ws / ".monitor" / "state.json").read_text())["jobs"]["500"]
    assert record["first_step"] == 201 and record["tgs_ref"] == [600.0, 206, 215]


def test_all_of_the_users_jobs_without_ids_and_a_local_run(env):
    ws, slurm = env
    slurm.set("600|RUNNING\n")
    write_log(ws, "600", steps=range(2))
    local = "local_20261124_080000_abcd"
    write_log(ws, local, steps=range(2), status="SUCCESS", body="tiny 1N (job x): 1,000 TGS/device — PASS\n")
    events = poll()
    assert ("600", "state", "(tiny 2N) RUNNING") in events
    assert (local, "state", "(tiny 2N) COMPLETED") in events
    assert (local, "verdict", "tiny 1N (job x): 1,000 TGS/device — PASS") in events
    assert not any(kind == "failure" for _, kind, _ in events)


def test_squeue_down_changes_nothing_and_says_nothing(env):
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500")
    poll("500")
    (slurm.dir / "down").write_text("")
    assert poll("500") == []


def test_failures_are_notified_and_a_bad_target_is_reported_once_per_poll(env, monkeypatch):
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500", steps=range(3))
    with Receiver() as hook:
        with Receiver() as gone:
            dead = gone.url
        monkeypatch.setenv("JOBKIT_NOTIFY_URLS", f"{hook.url} {dead}")
        first = CliRunner().invoke(main, ["monitor", "--once", "500"])
        assert first.exit_code == 0
        assert hook.posts == []  # RUNNING and a first step are not failures
        (ws / "500-tiny" / "hang").mkdir(parents=True)
        (ws / "500-tiny" / "hang" / "HANG").write_text("phase training, last step 2, 9 s since\njob=500\n")
        second = CliRunner().invoke(main, ["monitor", "--once", "500"])
        posts = hook.wait(1)
    assert second.exit_code == 0, second.output
    assert [p["title"] for p in posts] == ["job 500: hang"]
    assert posts[0]["message"].startswith("(tiny 2N) HANG detected — phase training, last step 2")
    assert posts[0]["type"] == "failure"
    failed = [line for line in second.output.splitlines() if "notification failed" in line]
    assert len(failed) == 1 and "Connection error" in failed[0]
    assert "json:// #2: not delivered" in failed[0] and "127.0.0.1" not in failed[0]  # scheme and position only


def test_level_all_sends_progress_too(env, monkeypatch):
    ws, slurm = env
    slurm.set("500|RUNNING\n")
    write_log(ws, "500", steps=range(3))
    with Receiver() as hook:
        monkeypatch.setenv("JOBKIT_NOTIFY_URLS", hook.url)
        result = CliRunner().invoke(main, ["monitor", "--once", "--level", "all", "500"])
        posts = hook.wait(2)
    assert result.exit_code == 0
    assert sorted(p["title"] for p in posts) == ["job 500: first-step", "job 500: state"]
    assert {p["type"] for p in posts} == {"info"}


@pytest.mark.parametrize(
    ("kind", "text", "typed"),
    [
        ("tgs-drop", "TGS 600/device over steps 45-54, 40% below its steady state", "warning"),
        ("metrics-off", "RAY=1 but metrics are off: prometheus.sh: no binary", "warning"),
        ("hang", "HANG detected", "failure"),
        ("first-step", "step 0", None),
    ],
)
def test_what_level_failures_sends_and_how_each_event_is_typed(kind, text, typed, monkeypatch):
    """A tgs-drop or metrics off is worth a word while the job trains on, but it is no failure: the job may
    still pass (the agent's report: a tgs-drop typed failure for a job that passed)."""
    sent = []
    monkeypatch.setattr(monitor.notify, "send", lambda title, body, targets, level: sent.append(level) or [])
    targets = monitor.notify.Targets(["json://localhost"], "test")
    assert monitor.deliver([monitor.Event("7", kind, text)], targets, "failures") == []
    assert sent == ([typed] if typed else [])


def test_a_malformed_url_does_not_stop_the_monitor(env, monkeypatch):
    ws, slurm = env
    slurm.set("", "500|FAILED\n")
    write_log(ws, "500", steps=range(3), status="FAILED", rc=1, body="0: Traceback (most recent call last):\n")
    monkeypatch.setenv("JOBKIT_NOTIFY_URLS", "nota://url")
    result = CliRunner().invoke(main, ["monitor", "--once", "500"])
    assert result.exit_code == 0
    assert result.output.count("notification failed") == 1
    assert "not a URL apprise knows" in result.output
    assert " job 500 failure: (tiny 2N) python-exception" in result.output


@pytest.mark.parametrize(
    ("args", "setup", "message", "code"),
    [
        (["tiny-job"], None, "'tiny-job' is not a job id", EXIT_USAGE),
        # bad-input mon25: no Slurm job id has 23 digits (they are 32-bit); it was followed without a word
        (["99999999999999999999999"], None, "'99999999999999999999999' is not a job id", EXIT_USAGE),
        (["4294967296"], None, "'4294967296' is not a job id", EXIT_USAGE),
        (["500"], "corrupt", "cannot be read", EXIT_BAD_INPUT),
        (["500"], "shared-config", "readable or writable by others", EXIT_SETTINGS),
    ],
)
def test_bad_input_is_one_line(env, args, setup, message, code):
    ws, _ = env
    if setup == "corrupt":
        (ws / ".monitor").mkdir()
        (ws / ".monitor" / "state.json").write_text("{not json")
    if setup == "shared-config":
        conf = Path(os.environ["XDG_CONFIG_HOME"]) / "jobkit" / "notify.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text("json://127.0.0.1:9/x\n")
        conf.chmod(0o644)
    result = CliRunner().invoke(main, ["monitor", "--once", *args])
    assert result.exit_code == code
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    if setup == "corrupt":
        assert (ws / ".monitor" / "state.json").read_text() == "{not json"  # the user's file is left as it was


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xe2\x28\xa1 binary\x00", "not UTF-8 text"),
        (b'{"jobs": 5}', "no start time"),
        (b'{"started": 1, "jobs": 5}', "'jobs' is not an object"),
        (b'{"started": 1, "jobs": {"500": {"seen": [], "state": null, "offset": "x"}}}', "job 500's record is not"),
        (
            b'{"started": 1, "jobs": {"500": {"seen": [], "state": null, "tgs_last": [1, 2]}}}',
            "job 500's record is not",
        ),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_a_state_file_the_monitor_did_not_write_is_one_line(env, tmp_path, content, problem):
    ws, cluster = env
    cluster.set("500|RUNNING")
    write_log(ws, "500", steps=range(3))
    state = tmp_path / "badstate.json"
    state.write_bytes(content)
    result = CliRunner().invoke(main, ["monitor", "--once", "--no-notify", "--state", str(state), "500"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.output.startswith(f"jobkit monitor: state file {state} cannot be read ({problem}")
    assert result.output.endswith("); move it away to start afresh\n") and result.output.count("\n") == 1
    assert state.read_bytes() == content, "the user's file is left as it was"


def test_once_and_daemon_together_are_refused(env, tmp_path):
    state = tmp_path / "m" / "state.json"
    result = CliRunner().invoke(main, ["monitor", "--once", "--daemon", "--no-notify", "--state", str(state)])
    assert result.exit_code == EXIT_USAGE
    assert result.output == (
        "jobkit monitor: --once polls once in the foreground (for cron), --daemon keeps polling in the background; "
        "give one of them\n"
    )
    assert not state.parent.exists(), "nothing written"


def test_a_job_nobody_knows_is_warned_about_once(env):
    ws, cluster = env
    cluster.set("500|RUNNING")
    write_log(ws, "500", steps=range(3))
    result = CliRunner().invoke(main, ["monitor", "--once", "--no-notify", "99999999", "500"])
    assert result.exit_code == 0, result.output
    assert result.stderr.endswith(
        f" monitor: WARNING: job 99999999 has no log in {ws} and the scheduler does not know it; "
        "check the id (and --workspace)\n"
    )
    assert result.stderr.count("\n") == 1, "job 500 is known: no warning for it"
    cluster.set("99999999|PENDING")  # it is known once the scheduler lists it
    assert "WARNING" not in CliRunner().invoke(main, ["monitor", "--once", "--no-notify", "99999999"]).output


def test_state_is_never_written_through_a_planted_link(env, tmp_path):
    ws, slurm = env
    slurm.set("700|RUNNING\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    state = ws / ".monitor" / "state.json"
    state.parent.mkdir()
    state.with_name("state.json.tmp").symlink_to(victim)  # the old fixed temp name, planted by a teammate
    poll("700")
    assert victim.read_text() == "mine\n"
    assert "700" in json.loads(state.read_text())["jobs"]
    state.with_name("state.log").symlink_to(victim)
    result = CliRunner().invoke(main, ["monitor", "--daemon", "--no-notify", "700"])
    assert result.exit_code == EXIT_BAD_INPUT and victim.read_text() == "mine\n"
    assert result.output.strip() == (
        f"jobkit monitor: cannot append to {state.with_name('state.log')} (Too many levels of symbolic links); "
        "remove it if it is a link"
    )


def test_daemon_runs_in_the_background_refuses_a_second_and_stops(env, tmp_path):
    ws, slurm = env
    slurm.set("700|RUNNING\n")
    state = tmp_path / "m" / "state.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    state.parent.mkdir()
    state.with_name("state.pid").symlink_to(victim)  # planted: replaced by the daemon's pid file, not followed
    jobkit = [sys.executable, "-m", "jobkit"]
    run_env = dict(os.environ)
    start = subprocess.run([*jobkit, "monitor", "--daemon", "--no-notify", "--interval", "0.2", "--state", str(state), "700"],
                           env=run_env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert start.returncode == 0, start.stderr
    pid_file, log_file = state.with_name("state.pid"), state.with_name("state.log")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "job 700 state: RUNNING" not in (
        log_file.read_text() if log_file.exists() else ""
    ):
        time.sleep(0.1)
    pid = int(pid_file.read_text().split()[0])
    try:
        assert "job 700 state: RUNNING" in log_file.read_text()
        assert pid_file.read_text().split()[2] == str(state.resolve()) and pid_file.stat().st_mode & 0o077 == 0
        assert victim.read_text() == "mine\n" and not pid_file.is_symlink()
        # A pid file planted for another state file (a teammate's write in a shared workspace) names this
        # running monitor: --stop of that state file must not signal it.
        planted = tmp_path / "team" / ".monitor" / "state.json"
        planted.parent.mkdir(parents=True)
        for text in (f"{pid}\n", pid_file.read_text().replace(str(state.resolve()), str(planted.resolve()) + "x")):
            planted.with_name("state.pid").write_text(text)
            refused = subprocess.run([*jobkit, "monitor", "--stop", "--state", str(planted)], env=run_env, capture_output=True, text=True, timeout=30)  # fmt: skip
            assert refused.returncode == 1 and "no monitor running for" in refused.stderr, refused.stderr
            assert procfs.alive(pid)
        again = subprocess.run([*jobkit, "monitor", "--daemon", "--state", str(state)], env=run_env, capture_output=True, text=True, timeout=30)  # fmt: skip
        assert again.returncode == 1 and f"already running as pid {pid}" in again.stderr
        stop = subprocess.run([*jobkit, "monitor", "--stop", "--state", str(state)], env=run_env, capture_output=True, text=True, timeout=30)  # fmt: skip
        assert stop.returncode == 0 and stop.stdout.strip() == f"stopped monitor {pid}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists()
        assert not pid_file.exists()
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


def test_stop_signals_no_process_that_is_not_a_monitor_even_when_pid_and_start_time_match(env, tmp_path):
    """bad-input mon21, the rule of issue 23: a pid file is believed when the process's start time AND its command
    line match what wrote it. Here the file is well formed, ours, names this state file and the live process's
    real start time, but the process is a `sleep`, not a jobkit monitor."""
    state = tmp_path / "m" / "state.json"
    state.parent.mkdir()
    decoy = subprocess.Popen(["sleep", "60"])
    try:
        start = procfs.stat(decoy.pid).start
        state.with_name("state.pid").write_text(f"{decoy.pid} {start} {state.resolve()}\n")
        result = CliRunner().invoke(main, ["monitor", "--stop", "--state", str(state)])
        assert result.exit_code == 1 and "no monitor running for" in result.output, result.output
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def test_an_ended_job_whose_teardown_did_not_backfill_gets_its_backfill_from_the_monitor(env, prometheus_installed):
    from jobkit.observe import tb_backfill

    ws, slurm = env
    write_log(ws, "500", steps=range(6), status="CANCELLED", rc=143)
    slurm.set("", "500|CANCELLED\n")
    tsdb = ws / "500-tiny" / "prometheus"
    tsdb.mkdir(parents=True)
    # What a RAY=1 job records when its Prometheus starts; a time limit ended it before its teardown backfilled.
    tb_backfill.record_pending(REPO / "tests" / "fixtures" / "tensorboard", str(tsdb), ["job=exporters"], "vm")
    events = poll("500")
    (backfill,) = [e for e in events if e[1] == "backfill"]
    assert backfill[2].startswith("completed the TSDB's TensorBoard backfill: ")
    done = json.loads((tsdb / tb_backfill.DONE).read_text())
    assert done["steps"] == 6 and done["samples"] > 6
    assert not (tsdb / tb_backfill.PENDING).exists()
    assert list(tsdb.glob("01*"))  # a real TSDB block, written by promtool
    assert poll("500") == []


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "0.05", "1e300"])
def test_interval_must_be_a_finite_number_of_seconds(tmp_path, interval):
    """--interval nan passed FloatRange(0.1) and crashed time.sleep after the first poll (audit mon5/mon8)."""
    result = CliRunner().invoke(
        main, ["monitor", "--once", "--no-notify", "--interval", interval], env={"JOB_WORKSPACE": str(tmp_path)}
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--interval'" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("option", "value"), [("--stall", "nan"), ("--stall", "inf"), ("--tgs-drop", "nan")])
def test_stall_and_tgs_drop_must_be_finite(tmp_path, option, value):
    result = CliRunner().invoke(
        main, ["monitor", "--once", "--no-notify", option, value], env={"JOB_WORKSPACE": str(tmp_path)}
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert list(tmp_path.iterdir()) == []


def lost_job(ws: Path, tmp_path: Path, retries: int = 1, answer: str = "", rc: int = 0) -> Path:
    """Job 500, its log cut off with no JOB SUMMARY (its batch host died), and what submit.sh saved for a
    requeue: a snapshot whose submit.sh records its arguments and environment and answers ANSWER."""
    write_log(ws, "500", steps=range(3), retries=retries)
    snap = tmp_path / "snap"
    snap.mkdir()
    answer = answer or f"Submitted job 501 (tiny)\\n  job dir:  {ws / '501-tiny'}\\n"
    (snap / "submit.sh").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$@" >{tmp_path}/argv\nenv >{tmp_path}/child_env\nprintf "%b" "{answer}"\nexit {rc}\n'
    )
    (snap / "submit.sh").chmod(0o755)
    job_dir = ws / "500-tiny"
    job_dir.mkdir()
    saved = [f"MAXTEXT_LAUNCHER_DIR={snap}", "SUBMIT_ARGV=" + json.dumps(["tiny", "-N", "2", "--", "steps=9"])]
    (job_dir / "submit_env.json").write_text(json.dumps(saved))
    (job_dir / "submit_env.json").chmod(0o600)
    return job_dir


def test_requeue_resubmits_a_job_whose_batch_host_died_once_excluding_that_host(env, tmp_path, monkeypatch):
    ws, slurm = env
    job_dir = lost_job(ws, tmp_path)
    monkeypatch.setenv("MAX_RETRIES", "0")  # the monitor's own environment: the job's header decides
    slurm.set("501|PENDING\n", "500|NODE_FAIL\n")
    events = poll("--requeue", "500")
    why = "node-fail: its batch host node1 died (Slurm: NODE_FAIL, no JOB SUMMARY)"
    assert ("500", "requeued", f"REQUEUED as job 501 (attempt 2 of 2): {why}; excluding node1") in events
    assert ("501", "state", "PENDING") in events  # followed into its next attempt
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == ["tiny", "-N", "2", "--exclude=node1", "--", "steps=9"]
    child = dict(line.split("=", 1) for line in (tmp_path / "child_env").read_text().splitlines() if "=" in line)
    assert child["ATTEMPT"] == "2" and child["RETRY_OF"] == "500" and child["REQUEUE_EXCLUDE"] == "node1"
    assert json.loads((job_dir / "requeue.json").read_text())["job_id"] == "501"
    # At most once: a second monitor (another state file) finds the batch script's claim and submits nothing.
    (tmp_path / "argv").unlink()
    again = poll("--requeue", "--state", str(tmp_path / "other.json"), "500")
    assert (
        "500",
        "not-requeued",
        f"already requeued as job 501, excluding node1 (see {job_dir / 'requeue.json'}); a job is requeued at most once",
    ) in again
    assert not (tmp_path / "argv").exists()


@pytest.mark.parametrize(
    ("opt_in", "retries", "state", "kind", "text"),
    [
        (False, 1, "NODE_FAIL", None, None),
        (True, 0, "NODE_FAIL", "not-requeued", "retries used up (0 allowed, this was attempt 1)"),
        (
            True,
            1,
            "CANCELLED",
            "not-requeued",
            "cancelled without a JOB SUMMARY (not retried: only FAILED or NODE_FAIL is)",
        ),
    ],
    ids=["not-asked", "no-retries", "cancelled"],
)
def test_requeue_of_a_lost_job_only_when_asked_and_by_the_rules(env, tmp_path, opt_in, retries, state, kind, text):
    ws, slurm = env
    lost_job(ws, tmp_path, retries=retries)
    slurm.set("", f"500|{state}\n")
    events = poll(*(["--requeue"] if opt_in else []), "500")
    assert ("500", "failure", f"(tiny 2N) {state.lower()} (the log has no JOB SUMMARY)") in events
    said = [(k, t) for _, k, t in events if "requeue" in k]
    assert said == ([] if kind is None else [(kind, said[0][1])]) and (text is None or text in said[0][1])
    assert not (tmp_path / "argv").exists()


def test_a_failed_monitor_requeue_is_an_event_and_blocks_no_later_one(env, tmp_path):
    ws, slurm = env
    job_dir = lost_job(ws, tmp_path, answer="submit.sh: sbatch refused the job: bad partition\\n", rc=1)
    slurm.set("", "500|FAILED\n")
    events = poll("--requeue", "500")
    assert (
        "500",
        "requeue-failed",
        "submit.sh failed (exit 1): submit.sh: sbatch refused the job: bad partition",
    ) in events
    assert not (job_dir / "requeue.json").exists() and (job_dir / "requeue.failed.json").exists()


OFF_LINE = "0: [observability] metrics are off: prometheus.sh: apt-get install prometheus failed (training goes on)\n"


def test_a_ray_job_whose_metrics_are_off_is_told_once_with_the_reason_and_is_no_failure(env):
    ws, slurm = env
    slurm.set("600|RUNNING\n610|RUNNING\n620|RUNNING\n")
    for job_id in ("600", "610", "620"):
        log = write_log(ws, job_id, steps=range(3))
        head = "RAY=1\n" + OFF_LINE if job_id == "600" else "RAY=1\n" if job_id == "610" else ""
        log.write_text(log.read_text().replace("MAX_RETRIES", head + "MAX_RETRIES", 1))
    (ws / "610-tiny" / "prometheus" / "wal").mkdir(parents=True)  # 610 has its TSDB; 620 never asked (no RAY)
    events = poll("600", "610", "620")
    off = [e for e in events if e[1] == "metrics-off"]
    assert off == [
        (
            "600",
            "metrics-off",
            "(tiny 2N) RAY=1 but metrics are off: prometheus.sh: apt-get install prometheus failed "
            f"(no TSDB in {ws}/600-tiny/prometheus)",
        )
    ]
    assert not monitor.is_failure(monitor.Event(*off[0])), "a warning: the job trains on"
    write_log(ws, "600", steps=range(6)).write_text(
        (ws / "600-tiny.log").read_text().replace("MAX_RETRIES", "RAY=1\n" + OFF_LINE + "MAX_RETRIES", 1)
    )
    assert [e for e in poll("600", "610", "620") if e[1] == "metrics-off"] == [], "once per job"


def test_a_ray_job_without_a_tsdb_or_a_reason_is_told_at_its_end_not_while_it_runs(env):
    ws, slurm = env
    slurm.set("630|RUNNING\n")
    log = write_log(ws, "630", steps=range(3))
    log.write_text(log.read_text().replace("MAX_RETRIES", "RAY=1\nMAX_RETRIES", 1))
    assert [e for e in poll("630") if e[1] == "metrics-off"] == [], "its TSDB may still come"
    write_log(ws, "630", steps=range(3), status="SUCCESS")
    log.write_text(log.read_text().replace("MAX_RETRIES", "RAY=1\nMAX_RETRIES", 1))
    slurm.set("", "630|COMPLETED\n")
    assert [e for e in poll("630") if e[1] == "metrics-off"] == [
        ("630", "metrics-off", f"(tiny 2N) RAY=1 but metrics are off: no TSDB, and the log says no reason "
         f"(no TSDB in {ws}/630-tiny/prometheus)")
    ]  # fmt: skip


def test_a_failure_line_says_how_the_host_was_blamed_the_retry_and_the_advice_where_it_fits():
    from jobkit.core import failures
    from jobkit.ops import monitor

    found = failures.Failure(
        "gpu-hardware", evidence="x", host="gpu02", retry="retry-without-node", advice="check dmesg there",
        blame_how="srun names it",
    )  # fmt: skip
    assert monitor.failure_text("(tiny 2N) ", found) == (
        "(tiny 2N) gpu-hardware; evidence: x; host: gpu02 (srun names it); retry: retry-without-node; "
        "advice: check dmesg there"
    )
    long = failures.Failure("oom", evidence="e" * 280, retry="never", advice="lower the batch")
    assert monitor.failure_text("", long) == f"oom; evidence: {'e' * 280}; retry: never"


def test_a_hang_failure_says_where_it_was_noticed_and_whom_the_stacks_blame(env):
    """The failure event reads the hang's stacks (core.hang_stacks, as `jobkit why` does): noticed on node1,
    blamed on node2, whose training was stopped (a recorded stacks file), retried without it."""
    ws, slurm = env
    body = "0: == HANG detected (phase training, last step 40, 31 s since) ==\n"
    log = write_log(ws, "500", steps=range(3), status="HANG", rc=143, body=body)
    hang = log.with_suffix("") / "hang"
    hang.mkdir(parents=True, mode=0o755)
    (hang / "HANG").write_text("phase training, last step 40, 31 s since, noticed on node1 (rank 0)\njob=500\n")
    recorded = REPO / "tests" / "fixtures" / "hang" / "local-allgather"
    for src, host, rank in (("n0.txt", "node1", 0), ("n1.txt", "node2", 1)):
        text = (
            recorded.joinpath(src)
            .read_text()
            .replace(f"HANG on n{rank} (rank {rank})", f"HANG on {host} (rank {rank})")
        )
        (hang / f"{host}.txt").write_text(text)
    slurm.set("", "500|FAILED\n")
    (failure,) = [text for _, kind, text in poll("500") if kind == "failure"]
    assert failure.startswith(
        "(tiny 2N) hang: training; evidence: 0: == HANG detected (phase training, last step 40, 31 s since) ==; "
        "noticed: on node1 (rank 0), phase training, last step 40, 31 s since; host: node2 (stacks: node2's training "
        "(rank 1, pid "
    ), failure
    assert "is stopped (T): stopped by a signal" in failure
    assert "; retry: retry-without-node" in failure, failure
