"""`jobkit tag`: a finished job's steady-state TGS in its log and job dir names, on a workspace of real job logs
(fixtures with the launchers' JOB SUMMARY appended) and the links and records the launchers and sweeps leave."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS, NEEDS_ROOT, jobkit_without_root_powers

from jobkit.cli import main
from jobkit.core import logparse, tgs
from jobkit.ops import jobtag

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scale_simulate", REPO / "bench" / "scale" / "simulate.py")
simulate = importlib.util.module_from_spec(_spec)  # bench/scale's simulated job logs (srun -l, absl, a sparse middle)
_spec.loader.exec_module(simulate)

SUMMARY = "==== JOB SUMMARY ====\n  Job:    {id}\n  Wall:   29s\n  Status: {status}\n=====================\n"
PRE1 = "31-JAX-tiny-pre1"  # 2 nodes, steady steps 5-9 and 40-45 logged: 4,882 TGS/device (as `jobkit jobs` says)
TAGGED = f"{PRE1}-tgs4882"


def add_job(ws, stem, source, status="SUCCESS (exit 0)", job_dir=True):
    """A job as submit.sh leaves it: the log (with its summary unless status is None) and the job dir."""
    text = source.read_text()
    if status is not None:
        text += SUMMARY.format(id=stem.split("-")[0], status=status)
    (ws / f"{stem}.log").write_text(text)
    if job_dir:
        (ws / stem).mkdir()
        (ws / stem / "log").symlink_to(f"../{stem}.log")
        (ws / stem / "artifact").symlink_to("../.artifacts/artifact_20261122_054800_ab12")
        (ws / stem / "tensorboard").mkdir()
        (ws / stem / "tensorboard" / "events.out").write_text("events\n")


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "outputs"
    ws.mkdir()
    add_job(
        ws,
        PRE1,
        FIXTURES / "joblog" / "preempted-2node-sigterm.log",
        "STOPPED (exit 0)",
    )
    return ws


def run(*args):
    return CliRunner().invoke(main, list(args))


def snapshot(ws):
    """Every path under WS with what a link names or a file holds, to check nothing else changed."""
    out = {}
    for root, dirs, files in os.walk(ws):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, ws)
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                out[rel] = Path(path).read_text()
            else:
                out[rel] = "dir"
    return out


def test_tag_renames_log_and_dir_and_repoints_every_link_and_record(ws):
    # A requeued attempt's dir links its predecessor; a sweep recorded the log by its absolute path.
    (ws / "32-JAX-tiny-pre1").mkdir()
    (ws / "32-JAX-tiny-pre1" / "previous").symlink_to(f"../{PRE1}")
    (ws / PRE1 / "next").symlink_to("../32-JAX-tiny-pre1")
    (ws / PRE1 / "self").symlink_to(ws / PRE1 / "tensorboard")  # absolute, into the dir being renamed
    sweep = ws / "sweeps" / "b1"
    sweep.mkdir(parents=True)
    points = [
        {
            "event": "done",
            "key": "pdbs2",
            "outcome": {"log": str(ws / f"{PRE1}.log"), "job_id": "31"},
        },
        {
            "event": "done",
            "key": "pdbs4",
            "outcome": {"log": str(ws / "131-JAX-tiny-pre1.log"), "job_id": "131"},
        },
    ]
    (sweep / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    (sweep / "summary.md").write_text(f"| pdbs2 | 31 | PASS | outputs/{PRE1}.log |\n")

    result = run("tag", "31", "--workspace", str(ws))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"renamed {PRE1}.log -> {TAGGED}.log (4,882 TGS/device)"

    assert sorted(p.name for p in ws.iterdir()) == [
        TAGGED,
        f"{TAGGED}.log",
        "32-JAX-tiny-pre1",
        "sweeps",
    ]
    assert os.readlink(ws / TAGGED / "log") == f"../{TAGGED}.log"
    assert (ws / TAGGED / "log").resolve() == ws / f"{TAGGED}.log"
    assert os.readlink(ws / "32-JAX-tiny-pre1" / "previous") == f"../{TAGGED}"
    assert (ws / "32-JAX-tiny-pre1" / "previous" / "tensorboard" / "events.out").read_text() == "events\n"
    assert os.readlink(ws / TAGGED / "self") == str(ws / TAGGED / "tensorboard")
    # Links that never named the job are as they were (the snapshot link is relative to the workspace).
    assert os.readlink(ws / TAGGED / "artifact") == "../.artifacts/artifact_20261122_054800_ab12"
    assert os.readlink(ws / TAGGED / "next") == "../32-JAX-tiny-pre1"
    recorded = [json.loads(line) for line in (sweep / "points.jsonl").read_text().splitlines()]
    assert recorded[0]["outcome"]["log"] == str(ws / f"{TAGGED}.log")
    assert recorded[1] == points[1], "another job whose name ends the same is not touched"
    assert (sweep / "summary.md").read_text() == f"| pdbs2 | 31 | PASS | outputs/{TAGGED}.log |\n"
    assert not list(ws.rglob(".*jobkit-tag")), "no temporary file left behind"

    # The browsing commands find the tagged job by id and by its old name part.
    listed = run("jobs", "--workspace", str(ws), "--json")
    assert json.loads(listed.output)["log"] == str(ws / f"{TAGGED}.log")
    tail = run("tail", "pre1", "--workspace", str(ws), "--no-follow", "-n", "1")
    assert tail.exit_code == 0 and tail.stdout == "=====================\n"


def test_tag_again_does_nothing(ws):
    assert run("tag", "latest", "--workspace", str(ws)).exit_code == 0
    before = snapshot(ws)
    again = run("tag", "31", "--workspace", str(ws))
    assert again.exit_code == 0
    assert again.output == f"{TAGGED}: already tagged; nothing to do\n"
    assert snapshot(ws) == before


def test_dry_run_says_what_and_changes_nothing(ws):
    before = snapshot(ws)
    result = run("tag", str(ws / PRE1), "--dry-run", "--workspace", str(ws))  # the job dir's path names the job
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"would rename {PRE1}.log -> {TAGGED}.log (4,882 TGS/device)",
        f"would rename {PRE1}/ -> {TAGGED}/",
        f"would repoint {TAGGED}/log -> ../{TAGGED}.log",
    ]
    assert snapshot(ws) == before


def test_a_job_dir_log_link_names_the_real_log(ws):
    result = run("tag", str(ws / PRE1 / "log"), "--workspace", str(ws))
    assert result.exit_code == 0, result.output
    assert (ws / f"{TAGGED}.log").is_file() and (ws / TAGGED / "log").resolve() == ws / f"{TAGGED}.log"


@pytest.mark.parametrize(
    ("stem", "source", "status", "message"),
    [
        (
            "local_20261122_055000_ef56-JAX-tiny-no_such_key_1",
            JOBKIT_LOGS / "launch-config-error-no_such_key.log",
            "FAILED (exit 1)",
            "no steady-state steps (5-14) in its log, so no TGS to tag it with (runs need steps>=15)",
        ),
        (
            "local_20261122_054900_cd34-JAX-tiny-steps_3",
            JOBKIT_LOGS / "launch-tiny-3steps-mfu.log",
            "SUCCESS (exit 0)",
            "no steady-state steps (5-14) in its log, so no TGS to tag it with (runs need steps>=15)",
        ),
        (
            "local_20261122_054800_ab12-JAX-tiny",
            JOBKIT_LOGS / "launch-tiny-20steps-mfu.log",
            None,
            "no JOB SUMMARY in its log yet (still running?); tag it once it has finished",
        ),
    ],
)
def test_refused_jobs_are_left_as_they_were(ws, stem, source, status, message):
    add_job(ws, stem, source, status)
    before = snapshot(ws)
    result = run("tag", stem.split("-")[0], "--workspace", str(ws))
    assert result.exit_code == 1
    assert result.output == f"jobkit tag: {stem}: {message}\n"
    assert snapshot(ws) == before


def test_a_name_clash_is_refused_before_anything_is_renamed(ws):
    (ws / TAGGED).mkdir()  # someone's own dir with the name the job dir would get
    before = snapshot(ws)
    result = run("tag", "31", "--workspace", str(ws))
    assert result.exit_code == 1
    assert f"{ws / TAGGED} already exists; move it away (or rename it), then tag again" in result.output
    assert snapshot(ws) == before


def test_unknown_job_and_bad_usage(ws):
    unknown = run("tag", "zzz", "--workspace", str(ws))
    assert unknown.exit_code == 1
    assert unknown.output == f"jobkit tag: no job matching 'zzz' in {ws}; see 'jobkit jobs'\n"
    neither = run("tag", "--workspace", str(ws))
    assert neither.exit_code == 2 and "give one JOB" in neither.output
    both = run("tag", "31", "--all", "--workspace", str(ws))
    assert both.exit_code == 2


def test_a_failed_step_undoes_the_renames(ws, monkeypatch):
    from jobkit.ops import jobtag

    def broken(link, target):
        raise OSError("disk full")

    monkeypatch.setattr(jobtag, "_replace_link", broken)
    before = snapshot(ws)
    result = run("tag", "31", "--workspace", str(ws))
    assert result.exit_code == 1
    assert result.output == f"jobkit tag: {PRE1}: disk full; nothing was renamed\n"
    assert snapshot(ws) == before


def test_all_tags_finished_jobs_and_reports_each_skip(ws):
    add_job(
        ws,
        "local_20261122_054800_ab12-JAX-tiny",
        JOBKIT_LOGS / "launch-tiny-20steps-mfu.log",
    )
    add_job(
        ws,
        "local_20261122_055000_ef56-JAX-tiny-x",
        JOBKIT_LOGS / "launch-config-error-no_such_key.log",
    )
    add_job(
        ws,
        "local_20261122_055100_aa00-JAX-tiny-run",
        JOBKIT_LOGS / "launch-tiny-20steps-mfu.log",
        None,
        False,
    )
    add_job(
        ws,
        "33-JAX-tiny-tgs100",
        JOBKIT_LOGS / "launch-tiny-20steps-mfu.log",
        job_dir=False,
    )
    for i, log in enumerate(sorted(ws.glob("*.log"))):
        os.utime(log, (1_800_000_000 + i, 1_800_000_000 + i))
    result = run("tag", "--all", "--workspace", str(ws))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"renamed {PRE1}.log -> {TAGGED}.log (4,882 TGS/device)" in lines
    assert "renamed local_20261122_054800_ab12-JAX-tiny.log -> local_20261122_054800_ab12-JAX-tiny-tgs24719.log (24,719 TGS/device)" in lines  # fmt: skip
    skips = [line for line in lines if line.startswith("skip ")]
    assert skips == [
        "skip 33-JAX-tiny-tgs100: already tagged; nothing to do",
        (
            "skip local_20261122_055000_ef56-JAX-tiny-x: no steady-state steps (5-14) in its log, so no TGS to tag "
            "it with (runs need steps>=15)"
        ),
        (
            "skip local_20261122_055100_aa00-JAX-tiny-run: no JOB SUMMARY in its log yet (still running?); tag it "
            "once it has finished"
        ),
    ]
    logs = sorted(p.name for p in ws.glob("*.log"))
    assert logs == [
        f"{TAGGED}.log",
        "33-JAX-tiny-tgs100.log",
        "local_20261122_054800_ab12-JAX-tiny-tgs24719.log",
        "local_20261122_055000_ef56-JAX-tiny-x.log",
        "local_20261122_055100_aa00-JAX-tiny-run.log",
    ]
    assert (ws / "local_20261122_054800_ab12-JAX-tiny-tgs24719" / "log").resolve().is_file()
    assert run("tag", "--all", "--workspace", str(ws)).output.count("already tagged") == 3, "idempotent"


@NEEDS_ROOT
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_job_dir_it_may_not_change_is_refused_before_anything_is_renamed(ws, dry_run):
    (ws / PRE1).chmod(0)  # its `log` link could not be repointed: renaming the log would leave it dangling
    try:
        before = sorted(os.listdir(ws))
        result = jobkit_without_root_powers("tag", "latest", "--workspace", str(ws), *dry_run)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr == (
            f"jobkit tag: {PRE1}: cannot read and write {ws / PRE1} (permission denied), so its renames and links "
            "could not all be done; fix its permissions (or tag as its owner), then tag again\n"
        )
        assert sorted(os.listdir(ws)) == before
    finally:
        (ws / PRE1).chmod(0o755)
    assert os.readlink(ws / PRE1 / "log") == f"../{PRE1}.log"


@NEEDS_ROOT
def test_a_subdir_it_may_not_read_is_refused_before_anything_is_renamed(ws):
    (ws / PRE1 / "tensorboard").chmod(0)  # a link in it would not be seen, so not repointed
    try:
        before = sorted(os.listdir(ws))
        result = jobkit_without_root_powers("tag", "latest", "--workspace", str(ws), "--dry-run")
        assert result.returncode == 1
        assert result.stderr == (
            f"jobkit tag: {PRE1}: cannot read {ws / PRE1 / 'tensorboard'} (Permission denied), so the links in it "
            "could not be repointed; fix its permissions (or tag as its owner), then tag again\n"
        )
        assert sorted(os.listdir(ws)) == before
    finally:
        (ws / PRE1 / "tensorboard").chmod(0o755)


@NEEDS_ROOT
def test_all_skips_an_unreadable_log_and_tags_the_others(ws):
    add_job(ws, "local_20261122_054800_ab12-JAX-tiny", JOBKIT_LOGS / "launch-tiny-20steps-mfu.log")
    bad = ws / "local_20261122_054800_ab12-JAX-tiny.log"
    bad.chmod(0)
    result = jobkit_without_root_powers("tag", "--all", "--workspace", str(ws))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert (
        f"skip local_20261122_054800_ab12-JAX-tiny: cannot read {bad}: Permission denied; check its permissions"
        in result.stdout.splitlines()
    )
    assert (ws / f"{TAGGED}.log").is_file() and bad.exists(), "the readable job tagged, the other left alone"


def test_a_job_tagged_meanwhile_is_already_tagged(ws, monkeypatch):
    """Two `jobkit tag` at once: the one that lost the race reads the log, then finds it renamed."""
    from jobkit.ops import jobtag

    real = jobtag.steady_tgs

    def tagged_by_the_other(log):
        found = real(log)
        os.rename(log, ws / f"{TAGGED}.log")  # the other run renames it after this one has read it
        return found

    monkeypatch.setattr(jobtag, "steady_tgs", tagged_by_the_other)
    result = run("tag", "latest", "--workspace", str(ws))
    assert result.exit_code == 0, result.output
    assert result.output == f"{PRE1}: already tagged as {TAGGED}; nothing to do\n"


def _bytes_read() -> int:
    """What this process has read so far (every read call, a sparse hole's NULs too): /proc/self/io's rchar."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def _whole_read_tgs(log: Path) -> float:
    return tgs.summarize(logparse.parse_file(str(log))).tgs


def test_a_big_log_is_read_at_its_ends_only_and_tagged_with_the_whole_reads_number(tmp_path):
    """A finished 8-node log of 40,000 steps whose middle is a sparse hole (~80 MB of NULs without a newline):
    tag reads its head (steady window) and its end (JOB SUMMARY), a small part of it, and finds the number a
    whole read finds."""
    ws = tmp_path / "ws"
    ws.mkdir()
    log = ws / "900001-scale-8n.log"
    size = simulate.write_log(log, 8, 40_000, "SUCCESS", summary=False, hole=True)
    assert size > 4 * logparse.BIG_LOG
    before = _bytes_read()
    value, status = jobtag.steady_tgs(log)
    read = _bytes_read() - before
    assert read < size / 8, f"read {read} of {size} bytes: the middle was read"
    assert status == "SUCCESS" and value == _whole_read_tgs(log)
    result = run("tag", "900001", "--workspace", str(ws), "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (
        f"would rename 900001-scale-8n.log -> 900001-scale-8n-tgs{value:.0f}.log ({value:,.0f} TGS/device)"
    )


def test_a_log_read_at_its_ends_gives_the_number_of_a_whole_read(tmp_path, monkeypatch):
    # A 600-step log counts as big here, with an end that holds its last ~8 steps: only its ends are read.
    log = tmp_path / "900002-scale-4n.log"
    simulate.write_log(log, 4, 600, "SUCCESS", job_id="900002", summary=False)
    monkeypatch.setattr(logparse, "BIG_LOG", 64 << 10)
    monkeypatch.setattr(logparse, "END_BYTES", 8 << 10)
    assert logparse.parse_ends(str(log), tgs.steps_needed()).partial
    value, status = jobtag.steady_tgs(log)
    assert status == "SUCCESS" and value is not None and value == _whole_read_tgs(log)
