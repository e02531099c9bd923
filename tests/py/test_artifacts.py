"""`jobkit artifacts clean` on a workspace laid out as submit.sh leaves it (read-only snapshots, job dirs with
`artifact` and `log` links, real job logs), with PATH stubs for squeue / sacct that print the shapes the real
tools print. No Slurm is started."""

import os
import re
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import JOBKIT_LOGS

from jobkit.cli import main

SUMMARY = "==== JOB SUMMARY ====\n  Job:    {id}\n  Wall:   15s\n  Status: SUCCESS (exit 0)\n=====================\n"
DAY = 86400
FINISHED, QUEUED, REQUEUED, ORPHAN, FRESH = (
    "artifact_20261120_100000_aaaa",  # job 4242, ended
    "artifact_20261120_110000_bbbb",  # job 4243, queued (no log yet)
    "artifact_20261120_120000_cccc",  # job 4244 ended, its requeued attempt 4246 runs from the same snapshot
    "artifact_20261120_130000_dddd",  # no job dir links it, made a day ago
    "artifact_20261120_140000_eeee",  # no job dir links it yet, made just now (a submit in flight)
)
# `squeue -h -a -o '%A %i %T'`: a plain job, a running array task (unique id, then <base>_<index>), the
# array's pending tasks folded into one line, and another user's job.
SQUEUE = "4243 4243 PENDING\n4246 4246 RUNNING\n4251 4250_1 RUNNING\n4250 4250_[2-3] PENDING\n5001 5001 RUNNING\n"
# What squeue printed on a host with Slurm's client but no slurm.conf (exit 1).
SQUEUE_NO_CONFIG = (
    "squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "squeue: error: fetch_config: DNS SRV lookup failed\n"
    "squeue: error: _establish_config_source: failed to fetch config\n"
    "squeue: fatal: Could not establish a configuration source\n"
)


def make_snapshot(arts, name, age):
    """A snapshot as make_artifact leaves it: files, a subdir, a link to outside it, all made read-only."""
    path = arts / name
    (path / "utils" / "lib").mkdir(parents=True)
    (path / "submit.sh").write_text("#!/bin/bash\n")
    (path / "utils" / "lib" / "artifact.sh").write_text("x" * 10000)
    (path / "git_summary.txt").write_text("== SOURCE ==\n")
    (path / "outside").symlink_to(arts.parent.parent / "outside")
    for root, _, files in os.walk(path):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o444)
        os.chmod(root, 0o555)
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def make_job(ws, job_id, snapshot, log=True, finished=True, age=DAY):
    stem = f"{job_id}-JAX-tiny"
    (ws / stem).mkdir()
    (ws / stem / "artifact").symlink_to(f"../.artifacts/{snapshot}")
    (ws / stem / "log").symlink_to(f"../{stem}.log")
    if log:
        text = (JOBKIT_LOGS / "launch-tiny-20steps-mfu.log").read_text()
        (ws / f"{stem}.log").write_text(text + (SUMMARY.format(id=job_id) if finished else ""))
        os.utime(ws / f"{stem}.log", (time.time() - age, time.time() - age))


@pytest.fixture
def ws(tmp_path):
    ws = tmp_path / "outputs"
    arts = ws / ".artifacts"
    arts.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_text("not a snapshot\n")
    for name in (FINISHED, QUEUED, REQUEUED, ORPHAN):
        make_snapshot(arts, name, DAY)
    make_snapshot(arts, FRESH, 60)
    (arts / "artifact_20261120_150000_ffff").symlink_to(tmp_path / "outside")  # snapshot-named, but a link
    (arts / "artifact_backup").mkdir()  # not a snapshot name
    (arts / "notes.txt").write_text("mine\n")
    make_job(ws, "4242", FINISHED)
    make_job(ws, "4243", QUEUED, log=False)
    make_job(ws, "4244", REQUEUED)
    make_job(ws, "4246", REQUEUED, finished=False, age=600)
    return ws


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """PATH holds only these stubs; add(name, stdout, stderr, rc) writes one that records its arguments."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))

    def add(name, stdout="", stderr="", rc=0):
        (tmp_path / f"{name}.out").write_text(stdout)
        (tmp_path / f"{name}.err").write_text(stderr)
        stub = bindir / name
        stub.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "$@" > "{tmp_path}/{name}.argv"\n'
            f'while IFS= read -r l; do printf "%s\\n" "$l"; done < "{tmp_path}/{name}.out"\n'
            f'while IFS= read -r l; do printf "%s\\n" "$l" >&2; done < "{tmp_path}/{name}.err"\n'
            f"exit {rc}\n"
        )
        stub.chmod(0o755)

    return add


def run(ws, *args):
    return CliRunner().invoke(main, ["artifacts", "clean", "--workspace", str(ws), *args])


def tree(path):
    """Every path under PATH (links not followed), with link targets and file contents."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                out[os.path.relpath(p, path)] = "-> " + os.readlink(p)
            else:
                out[os.path.relpath(p, path)] = Path(p).read_text() if os.path.isfile(p) else "dir"
    return out


def test_clean_removes_only_unused_snapshots_and_says_why_others_stay(ws, slurm, tmp_path):
    slurm("squeue", SQUEUE)
    arts = ws / ".artifacts"
    assert stat.S_IMODE((arts / FINISHED).stat().st_mode) == 0o555, "snapshots are read-only, as submit.sh makes them"
    before = tree(tmp_path)

    result = run(ws)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "squeue.argv").read_text().split("\n")[:5] == ["-h", "-a", "-o", "%A %i %T", ""]
    lines = result.output.splitlines()
    sizes = [
        re.fullmatch(rf"removed {name} \(([\d.]+) KiB\)", line)
        for name, line in ((FINISHED, lines[0]), (ORPHAN, lines[3]))
    ]
    assert all(sizes), lines
    assert lines[1:3] + lines[4:5] == [
        f"kept {QUEUED}: job 4243 is queued (PENDING)",
        f"kept {REQUEUED}: job 4246 is running (RUNNING)",
        f"kept {FRESH}: no job dir links it yet, made 1 min ago (a submit may be in flight)",
    ]
    total = sum(float(m.group(1)) for m in sizes)
    assert float(sizes[0].group(1)) >= 10000 / 1024, "at least the snapshot's 10000-byte file"
    assert lines[5] == f"removed 2 snapshot(s), freed {total:.1f} KiB; kept 3"
    assert lines[6] == "the artifact link of 1 job dir(s) now dangles (kept: the job dirs are evidence)"

    assert sorted(os.listdir(arts)) == sorted(
        [QUEUED, REQUEUED, FRESH, "artifact_20261120_150000_ffff", "artifact_backup", "notes.txt"]
    )
    # Nothing else changed: the removed snapshots' files are the only paths gone.
    after = tree(tmp_path)
    gone = {p for p in before if p not in after}
    assert gone and all(p.startswith((f"outputs/.artifacts/{FINISHED}", f"outputs/.artifacts/{ORPHAN}")) for p in gone)
    assert {p: v for p, v in before.items() if p not in gone and not p.endswith(".argv")} == {
        p: v for p, v in after.items() if not p.endswith(".argv")
    }
    assert (tmp_path / "outside" / "keep.txt").read_text() == "not a snapshot\n", "links are never followed"
    assert os.path.islink(ws / "4242-JAX-tiny" / "artifact") and not (ws / "4242-JAX-tiny" / "artifact").exists()
    assert (ws / "4246-JAX-tiny" / "artifact" / "submit.sh").is_file()


def test_dry_run_removes_nothing(ws, slurm, tmp_path):
    slurm("squeue", SQUEUE)
    before = tree(ws)
    result = run(ws, "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"would remove {FINISHED} (" in result.output and f"would remove {ORPHAN} (" in result.output
    assert "would remove 2 snapshot(s), would free " in result.output
    assert tree(ws) == before


def test_without_squeue_it_refuses_and_names_the_override(ws, slurm):
    before = tree(ws)
    result = run(ws)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith(
        "jobkit artifacts clean: cannot ask Slurm which jobs are queued or running (squeue is not on PATH); "
        "nothing removed"
    )
    assert "pass --no-scheduler if you know no job of this workspace is queued or running" in result.output
    assert tree(ws) == before


def test_a_failing_squeue_is_refused_with_its_own_words(ws, slurm):
    slurm("squeue", stderr=SQUEUE_NO_CONFIG, rc=1)
    before = tree(ws)
    result = run(ws)
    assert result.exit_code == 1
    assert "(squeue failed (exit 1: squeue: fatal: Could not establish a configuration source))" in result.output
    assert tree(ws) == before


def test_no_scheduler_still_keeps_jobs_whose_files_say_they_may_run(ws, slurm):
    # 4243 has no log and a young dir (queued?); 4246's log has no summary and changed 10 min ago.
    result = run(ws, "--no-scheduler")
    assert result.exit_code == 0, result.output
    assert f"kept {QUEUED}: job 4243 has no log yet and its dir is under a minute old (queued?)" in result.output
    assert f"kept {REQUEUED}: job 4246's log has no JOB SUMMARY and changed 10 min ago (may still run)" in result.output
    assert not (ws / ".artifacts" / FINISHED).exists() and not (ws / ".artifacts" / ORPHAN).exists()


def test_sacct_saying_a_quiet_job_is_over_frees_its_snapshot(ws, slurm, tmp_path):
    slurm("squeue", "4243 4243 PENDING\n")  # 4246 is not listed, but its log has no summary
    slurm("sacct", "4246|CANCELLED by 1000\n")
    result = run(ws)
    assert result.exit_code == 0, result.output
    assert "-j\n4246\n" in (tmp_path / "sacct.argv").read_text()
    assert f"removed {REQUEUED} (" in result.output
    assert not (ws / ".artifacts" / REQUEUED).exists()


def test_a_quiet_job_sacct_cannot_vouch_for_keeps_its_snapshot(ws, slurm):
    slurm("squeue", "4243 4243 PENDING\n")
    slurm("sacct", stderr="sacct: error: Problem talking to the database: Connection refused\n", rc=1)
    result = run(ws)
    assert result.exit_code == 0, result.output
    assert f"kept {REQUEUED}: job 4246's log has no JOB SUMMARY" in result.output
    assert (ws / ".artifacts" / REQUEUED / "submit.sh").is_file()


def test_nothing_to_clean(tmp_path, slurm):
    (tmp_path / "ws").mkdir()
    result = run(tmp_path / "ws")
    assert result.exit_code == 0 and result.output == f"no snapshots in {tmp_path / 'ws' / '.artifacts'}\n"
    missing = run(tmp_path / "nope")
    assert missing.exit_code == 1 and "does not exist; pass --workspace or set JOB_WORKSPACE" in missing.output
    (tmp_path / "a.log").write_text("x\n")
    a_file = run(tmp_path / "a.log")  # the workspace given is a file: called a file, not "does not exist"
    assert a_file.exit_code == 1 and "is a file, not a directory" in a_file.output


def test_per_user_snapshot_dirs_are_cleaned_and_a_linked_user_dir_is_not_followed(tmp_path, slurm):
    # submit.sh's layout since audit row F2: .artifacts/<user>/artifact_*; job dirs link ../.artifacts/<user>/...
    ws = tmp_path / "outputs"
    mine = ws / ".artifacts" / "alice"
    mine.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    make_snapshot(mine, FINISHED, DAY)
    make_snapshot(mine, QUEUED, DAY)
    make_snapshot(tmp_path / "outside", ORPHAN, DAY)
    (ws / ".artifacts" / "bob").symlink_to(tmp_path / "outside")  # a user dir that is a link: never entered
    make_job(ws, "4242", f"alice/{FINISHED}")
    make_job(ws, "4243", f"alice/{QUEUED}", log=False)
    slurm("squeue", SQUEUE)

    result = run(ws)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert re.fullmatch(rf"removed alice/{FINISHED} \([\d.]+ KiB\)", lines[0]), lines
    assert lines[1] == f"kept alice/{QUEUED}: job 4243 is queued (PENDING)"
    assert sorted(os.listdir(mine)) == [QUEUED]
    assert (tmp_path / "outside" / ORPHAN / "submit.sh").is_file()
