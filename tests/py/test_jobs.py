"""`jobkit jobs` and `jobkit tail` on a workspace of real job logs (fixtures, with the summaries the launchers
write), and `tail` following a log that grows."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS, NEEDS_ROOT, jobkit_without_root_powers

from jobkit.cli import main

SUMMARY = "==== JOB SUMMARY ====\n  Job:    {id}\n  Wall:   {wall}\n  Status: {status}\n=====================\n"


@pytest.fixture
def workspace(tmp_path):
    """Three jobs, oldest first: a tiny success, a 2-node early stop, a failed config (no steps)."""
    jobs = [
        ("local_20261122_054800_ab12-JAX-tiny.log", JOBKIT_LOGS / "launch-tiny-20steps-mfu.log", "15s", "SUCCESS (exit 0)"),
        ("31-JAX-tiny-pre1.log", FIXTURES / "joblog" / "preempted-2node-sigterm.log", "29s", "STOPPED (exit 0)"),
        ("local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log", JOBKIT_LOGS / "launch-config-error-no_such_key.log",
         "9s", "FAILED (exit 1)"),
    ]  # fmt: skip
    for i, (name, source, wall, status) in enumerate(jobs):
        path = tmp_path / name
        path.write_text(source.read_text() + SUMMARY.format(id=name.split("-")[0], wall=wall, status=status))
        os.utime(path, (1_800_000_000 + i, 1_800_000_000 + i))
    (tmp_path / "notes.log").write_text("not a job\n")
    return tmp_path


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_jobs_table_lists_every_job_oldest_first_with_status_wall_and_tgs(workspace):
    result = run("jobs", "--workspace", str(workspace))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["JOB", "NAME", "NODES", "STATUS", "WALL", "TGS/device", "TRY", "METRICS", "WHY"]
    rows = [line.split() for line in lines[1:]]
    assert [r[0] for r in rows] == ["local_20261122_054800_ab12", "31", "local_20261122_055000_ef56"]
    assert [r[3] for r in rows] == ["SUCCESS", "STOPPED", "FAILED"]
    assert [r[4] for r in rows] == ["15s", "29s", "9s"]
    assert rows[1][2] == "2" and rows[2][5] == "-", "no steps, no TGS"
    tgs_line = run("tgs", "--line", str(workspace / "local_20261122_054800_ab12-JAX-tiny.log")).output
    assert rows[0][5] in tgs_line, "the same steady-state TGS as the end-of-run line"
    assert [r[6] for r in rows] == ["-", "-", "-"], "never to be requeued"
    assert [r[7] for r in rows] == ["-", "-", "-"], "no RAY=1, no metrics asked for"
    assert rows[0][8] == rows[1][8] == "-", "a success and an early stop: nothing to classify"
    why = json.loads(
        run("why", "--json", str(workspace / "local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log")).output
    )
    assert rows[2][8] == why["class"] != "-", "the failed config: jobkit why's class"


def test_jobs_shows_each_attempt_of_a_requeued_job(workspace):
    first = workspace / "31-JAX-tiny-pre1.log"
    text = first.read_text()
    second = workspace / "32-JAX-tiny-pre1.log"
    second.write_text(text.replace("JOB_ID=31", "JOB_ID=32\nATTEMPT=2\nRETRY_OF=31\nMAX_RETRIES=2", 1))
    first.write_text(text.replace("JOB_ID=31", "JOB_ID=31\nMAX_RETRIES=2", 1))
    result = run("jobs", "--workspace", str(workspace), "--json")
    records = {r["job_id"]: r for r in map(json.loads, result.output.splitlines())}
    assert (records["31"]["attempt"], records["31"]["attempts"], records["31"]["retry_of"]) == (1, 3, "")
    assert (records["32"]["attempt"], records["32"]["attempts"], records["32"]["retry_of"]) == (2, 3, "31")
    table = {
        line.split()[0]: line.split()[6] for line in run("jobs", "--workspace", str(workspace)).output.splitlines()[1:]
    }
    assert (table["31"], table["32"]) == ("1/3", "2/3")


def test_jobs_marks_a_ray_job_without_a_tsdb_with_the_reason_its_log_gives(workspace):
    first = workspace / "31-JAX-tiny-pre1.log"  # RAY=1, and its first node said why there are no metrics
    first.write_text(
        first.read_text().replace(
            "JOB_ID=31",
            "JOB_ID=31\nRAY=1\n0: [observability] metrics are off: prometheus.sh: apt-get install prometheus "
            "failed (training goes on)",
            1,
        )
    )
    (workspace / "31-JAX-tiny-pre1" / "prometheus" / "targets").mkdir(parents=True)  # the exporter's: no TSDB
    ok = workspace / "local_20261122_054800_ab12-JAX-tiny.log"  # RAY=1 with a TSDB
    ok.write_text(ok.read_text().replace("JOB_ID=", "RAY=1\nJOB_ID=", 1))
    (workspace / "local_20261122_054800_ab12-JAX-tiny" / "prometheus" / "wal").mkdir(parents=True)
    result = run("jobs", "--workspace", str(workspace))
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[1:] if not line.startswith("jobkit")}
    assert rows["31"][7] == "off" and rows["local_20261122_054800_ab12"][7] == "on"
    assert rows["local_20261122_055000_ef56"][7] == "-"
    assert "jobkit jobs: job 31: RAY=1 but metrics off: prometheus.sh: apt-get install prometheus failed" in (
        result.output.splitlines()
    )
    records = {
        r["job_id"]: r
        for r in map(json.loads, run("jobs", "--workspace", str(workspace), "--json").output.splitlines())
    }
    assert (records["31"]["metrics"], records["31"]["metrics_off_why"]) == (
        "off",
        "prometheus.sh: apt-get install prometheus failed",
    )
    assert (
        records["local_20261122_054800_ab12"]["metrics"],
        records["local_20261122_054800_ab12"]["metrics_off_why"],
    ) == (
        "on",
        None,
    )


def test_jobs_says_a_ray_job_that_ended_without_a_tsdb_and_no_reason_is_off_and_a_running_one_not_yet(workspace):
    ended = workspace / "31-JAX-tiny-pre1.log"
    ended.write_text(ended.read_text().replace("JOB_ID=31", "JOB_ID=31\nRAY=yes", 1))
    running = workspace / "40-JAX-tiny.log"
    running.write_text("JOB_ID=40\nNNODES=1\nRAY=1\n")
    records = {
        r["job_id"]: r
        for r in map(json.loads, run("jobs", "--workspace", str(workspace), "--json").output.splitlines())
    }
    assert (records["31"]["metrics"], records["31"]["metrics_off_why"]) == (
        "off",
        "no TSDB, and the log says no reason",
    )
    assert (records["40"]["metrics"], records["40"]["metrics_off_why"]) == ("?", None), "a TSDB may still come"


def test_jobs_filters_and_json(workspace):
    last = run("jobs", "--workspace", str(workspace), "--last", "1", "--json")
    records = [json.loads(line) for line in last.output.splitlines()]
    assert [r["job_id"] for r in records] == ["local_20261122_055000_ef56"]
    assert records[0]["status"] == "FAILED" and records[0]["tgs"] is None
    none = run("jobs", "--workspace", str(workspace), "--model", "llama2-70b")
    assert none.exit_code == 0 and none.output.strip() == f"no jobs in {workspace} for model llama2-70b"
    missing = run("jobs", "--workspace", str(workspace / "nope"))
    assert missing.exit_code == 1
    assert "does not exist; pass --workspace or set JOB_WORKSPACE" in missing.output


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("latest", "local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log"),
        ("31", "31-JAX-tiny-pre1.log"),
        ("no_such_key", "local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log"),
    ],
)
def test_tail_resolves_latest_id_and_name_part(workspace, spec, expected):
    result = run("tail", spec, "--workspace", str(workspace), "--no-follow", "-n", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == (workspace / expected).read_text().splitlines()[-2:]
    assert result.stderr == f"jobkit tail: {workspace / expected}\n", "which log the spec named"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("local_20261122_054800", "local_20261122_054800_ab12-JAX-tiny.log"),  # an id up to one of its '_'
        ("31-JAX", "31-JAX-tiny-pre1.log"),  # the log name's start
        ("12", "12-JAX-tiny-x.log"),  # a whole id, though '12' is in both local ids' dates too
    ],
)
def test_tail_matches_ids_whole_or_up_to_an_underscore(workspace, spec, expected):
    (workspace / "12-JAX-tiny-x.log").write_text("JOB_ID=12\na line\n")
    result = run("tail", spec, "--workspace", str(workspace), "--no-follow", "-n", "1")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"jobkit tail: {workspace / expected}\n"


@pytest.mark.parametrize("spec", ["3", "2026", "0548"])
def test_a_piece_of_an_id_names_no_job(workspace, spec):
    # '3' is in 31, '2026' and '0548' in the local ids: none is a whole id, an id's leading part or a name part.
    result = run("tail", spec, "--workspace", str(workspace), "--no-follow")
    assert result.exit_code == 1
    assert result.output == f"jobkit tail: no job matching '{spec}' in {workspace}; see 'jobkit jobs'\n"


def test_an_empty_job_is_refused(workspace):
    result = run("tail", "", "--workspace", str(workspace), "--no-follow")
    assert result.exit_code == 1
    assert result.output == (
        "jobkit tail: give a job: latest, a job id, a unique part of its name, or its log / job dir path\n"
    )


def test_a_file_given_as_the_workspace_is_called_a_file(workspace):
    log = workspace / "31-JAX-tiny-pre1.log"
    for command in (["jobs"], ["tail", "latest"], ["tag", "--all"], ["analyze", "latest"], ["dashboard"]):
        result = run(*command, "--workspace", str(log))
        assert result.exit_code == 1
        assert result.output == (
            f"jobkit {command[0]}: workspace {log} is a file, not a directory; pass the directory that holds the "
            "job logs (--workspace or JOB_WORKSPACE)\n"
        )


@NEEDS_ROOT
def test_an_unreadable_log_is_one_row_and_the_others_are_listed(workspace):
    bad = workspace / "31-JAX-tiny-pre1.log"
    bad.chmod(0)
    result = jobkit_without_root_powers("jobs", "--workspace", str(workspace))
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"jobkit jobs: cannot read {bad}: Permission denied; its row says unreadable\n"
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [(r[0], r[3]) for r in rows] == [
        ("local_20261122_054800_ab12", "SUCCESS"),
        ("31", "unreadable"),
        ("local_20261122_055000_ef56", "FAILED"),
    ]
    assert rows[1][-1] == "?", "nothing can be said of why it ended"


@NEEDS_ROOT
@pytest.mark.parametrize("follow", [[], ["--no-follow"]])
def test_tail_of_an_unreadable_log_is_one_line(workspace, follow):
    bad = workspace / "31-JAX-tiny-pre1.log"
    bad.chmod(0)
    result = jobkit_without_root_powers("tail", "31", "--workspace", str(workspace), *follow)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"jobkit tail: cannot read {bad}: Permission denied; check its permissions\n"


def test_tail_errors_name_the_fix(workspace):
    unknown = run("tail", "zzz", "--workspace", str(workspace))
    assert unknown.exit_code == 1
    assert unknown.output.strip() == f"jobkit tail: no job matching 'zzz' in {workspace}; see 'jobkit jobs'"
    ambiguous = run("tail", "JAX-tiny", "--workspace", str(workspace))
    assert (
        ambiguous.exit_code == 1
        and "matches 3 jobs" in ambiguous.output
        and "give more of the name" in ambiguous.output
    )


def test_tail_follows_a_growing_log(workspace):
    log = workspace / "local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log"
    proc = subprocess.Popen(
        ["jobkit", "tail", "latest", "--workspace", str(workspace), "-n", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.strip() == log.read_text().splitlines()[-1].strip()
        time.sleep(0.5)
        with log.open("a") as fh:
            fh.write("a line written after tail started\n")
        assert proc.stdout.readline() == "a line written after tail started\n"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@NEEDS_ROOT
def test_metrics_state_lists_each_log_marks_an_unreadable_one_and_goes_on(workspace):
    off = workspace / "31-JAX-tiny-pre1.log"
    off.write_text(off.read_text().replace("JOB_ID=31", "JOB_ID=31\nRAY=true", 1))
    closed = workspace / "50-JAX-tiny.log"
    closed.write_text("JOB_ID=50\nNNODES=1\nRAY=1\n")
    os.utime(closed, (1_700_000_000, 1_700_000_000))  # the oldest
    closed.chmod(0)
    try:
        result = jobkit_without_root_powers("metrics-state", "--workspace", str(workspace))
        only_off = jobkit_without_root_powers("metrics-state", "--workspace", str(workspace), "--off")
    finally:
        closed.chmod(0o644)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "31-JAX-tiny-pre1  off  no TSDB: no TSDB, and the log says no reason",
        f"50-JAX-tiny  ?  cannot read {closed}: Permission denied",
        "local_20261122_054800_ab12-JAX-tiny  -  RAY=1 not asked",
        "local_20261122_055000_ef56-JAX-tiny-no_such_key_1  -  RAY=1 not asked",
    ]
    assert only_off.stdout.splitlines() == [
        f"50-JAX-tiny  ?  cannot read {closed}: Permission denied",
        "31-JAX-tiny-pre1  off  no TSDB: no TSDB, and the log says no reason",
    ], "oldest first"


def test_metrics_state_summary_takes_one_job_log(workspace):
    two = run("metrics-state", "--summary", str(workspace / "31-JAX-tiny-pre1.log"), str(workspace / "notes.log"))
    assert two.exit_code == 1 and "--summary takes one job log" in two.output
    not_a_log = run("metrics-state", "--summary", str(workspace / "notes.log"))
    assert not_a_log.exit_code == 1 and "not a job log" in not_a_log.output
    assert run("metrics-state", "--summary", str(workspace / "31-JAX-tiny-pre1.log")).output == "", "no RAY=1"


OBS_OFF = "0: [observability] metrics are off: no prometheus binary on PATH (training goes on)\n"


def _steps(first: int, last: int, ranks: int = 4) -> str:
    return "".join(
        f"{r}: I1124 16:18:29.991666 1405007143 metric_logger.py:265] completed step: {s}, seconds: 1.005, "
        f"TFLOP/s/device: 398.010, Tokens/s/device: 32604.975, total_weights: 262144, loss: 2.221\n"
        for s in range(first, last + 1)
        for r in range(ranks)
    )


def _ray_log(path: Path, hole: int) -> int:
    """A finished RAY=1 job whose `[observability]` line comes before its first step (rank 0 prints it before
    training starts), with HOLE bytes of sparse middle (NULs, no newline) between its first and last 300 steps."""
    with open(path, "w") as fh:
        fh.write("JOB_ID=77\nJOB_NAME=ray\nNNODES=4\nMODEL_NAME=m\nRAY=1\n== Training BEGIN (no timeout) ==\n")
        fh.write(OBS_OFF + _steps(0, 299))
        fh.flush()
        fh.buffer.seek(hole, os.SEEK_CUR)
        fh.write(_steps(90_000, 90_299) + SUMMARY.format(id=77, wall="25h", status="SUCCESS (exit 0)"))
    return path.stat().st_size


def _bytes_read() -> int:
    """What this process has read so far (every read call, a sparse hole's NULs too): /proc/self/io's rchar."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def test_metrics_state_reads_a_big_log_above_its_first_step_and_at_its_end(tmp_path):
    log = tmp_path / "77-ray.log"
    size = _ray_log(log, 80 << 20)
    before = _bytes_read()
    summary = run("metrics-state", "--summary", str(log))
    listed = run("metrics-state", "--workspace", str(tmp_path))
    read = _bytes_read() - before
    assert summary.exit_code == 0 and summary.output == "off (no prometheus binary on PATH)\n"
    assert listed.output == "77-ray  off  no TSDB: no prometheus binary on PATH\n"
    assert read < size / 8, f"read {read} of {size} bytes for both: the middle was read"


def test_metrics_state_of_a_log_read_at_its_ends_is_the_whole_reads(tmp_path, monkeypatch):
    from jobkit.core import logparse

    log = tmp_path / "77-ray.log"
    _ray_log(log, 0)  # ~180 KB, whole
    whole = logparse.parse_file(str(log)).metrics_off
    monkeypatch.setattr(logparse, "BIG_LOG", 16 << 10)  # its ends only: the head to step 64, the last 4 MB
    monkeypatch.setattr(logparse, "END_BYTES", 16 << 10)
    assert logparse.parse_ends(str(log), 0).partial
    assert whole == "no prometheus binary on PATH"
    assert run("metrics-state", "--summary", str(log)).output == f"off ({whole})\n"
    (tmp_path / "77-ray" / "prometheus" / "wal").mkdir(parents=True)  # a TSDB: on, whatever the log says
    assert run("metrics-state", "--summary", str(log)).output == f"{tmp_path / '77-ray' / 'prometheus'}\n"
