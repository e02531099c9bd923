"""Requeue: what is retried, which hosts are excluded, how the next attempt is submitted (units), and real
attempts on the local Slurm cluster (a time limit, a hang)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main
from jobkit.core import logparse
from jobkit.core.errors import EXIT_ACTION_FAILED, EXIT_ANSWER_NO, EXIT_SETTINGS
from jobkit.ops import hang_watchdog, requeue

HEADER = "JOB_ID=500\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\n"
STEP = "0: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, Tokens/s/device: 1000.0, loss: 5.9\n"


def job_log(body: str, status: str, rc: int, header: str = HEADER, steps: int = 3) -> str:
    text = header + "".join(STEP.format(n=n) for n in range(steps)) + body
    return text + f"==== JOB SUMMARY ====\n  Status: {status} (exit {rc})\n=====================\n"


def watched(job_dir: Path, job_id: str = "500") -> Path:
    """JOB_DIR with what the job's own watchdog and batch script leave after a hang and a time-limit warning:
    a log line alone is not believed (a teammate may have appended it)."""
    (job_dir / "hang").mkdir(parents=True)
    (job_dir / "hang" / "HANG").write_text(hang_watchdog.marker_body("phase training, last step 41", job_id))
    hang_watchdog.request_time_limit_stop(job_dir, job_id)
    return job_dir


@pytest.fixture
def job_dir(tmp_path):
    return watched(tmp_path / "500-tiny")


def decide(text: str, job_dir: Path, **env):
    return requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "2", **env}, job_dir)


@pytest.mark.parametrize(
    ("body", "status", "rc", "why"),
    [
        ("0: == HANG detected (phase training, last step 41, 312 s since) ==\n", "HANG", 143, "hang: training"),
        (
            "== TIME LIMIT near (Slurm's warning, 300s ahead): ... ==\nTraining stopped: Job received termination signal (SIGTERM).\n",
            "STOPPED",
            0,
            "time-limit",
        ),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO TIME LIMIT ***\n",
            "CANCELLED",
            143,
            "time-limit",
        ),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO PREEMPTION ***\n",
            "CANCELLED",
            143,
            "preempted",
        ),
        ("1: jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out\n", "FAILED", 1, "distributed-timeout"),
    ],
)
def test_retryable_outcomes_are_retried(body, status, rc, why, job_dir):
    decision = decide(job_log(body, status, rc), job_dir)
    assert decision.retry, decision
    assert decision.why.startswith(why)
    assert decision.exclude == []


@pytest.mark.parametrize(
    ("body", "status", "rc", "why"),
    [
        ("", "SUCCESS", 0, "succeeded"),
        ("Training stopped: Job received termination signal (SIGTERM).\n", "STOPPED", 0, "stopped-early: Job received"),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 ***\n",
            "CANCELLED",
            143,
            "cancelled",
        ),
        ("0: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n", "FAILED", 1, "oom"),
        ("0: MAXTEXT CONFIG ERROR: bad key\n", "FAILED", 1, "config-error"),
        ("0: Traceback (most recent call last):\n0: KeyError: 'x'\n", "FAILED", 1, "python-exception"),
    ],
)
def test_other_outcomes_are_not_retried(body, status, rc, why, job_dir):
    decision = decide(job_log(body, status, rc), job_dir)
    assert not decision.retry
    assert decision.why.startswith(why), decision.why


def test_node_failure_excludes_the_node_slurm_names_and_keeps_earlier_exclusions(job_dir):
    body = "srun: error: Node failure on node2\nslurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    decision = decide(job_log(body, "CANCELLED", 143), job_dir, REQUEUE_EXCLUDE="node7")
    assert decision.retry
    assert decision.exclude == ["node7", "node2"]


def test_gpu_fault_on_a_rank_excludes_that_ranks_host(job_dir):
    body = "1: :0:rocdevice.cpp            :3020: 1234567 us: Callback: Queue 0x7f aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION\n"
    decision = decide(job_log(body, "FAILED", 134), job_dir)
    assert decision.retry and decision.exclude == ["node2"]


CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "failures" / "corpus"


# Each catalogue class -> the requeue's decision and exclude list, on the corpus's real-text logs. The old
# requeue (its own RETRYABLE / BLAME_HOST sets) got the rows marked `old:` wrong.
@pytest.mark.parametrize(
    ("case", "cls", "retried", "exclude"),
    [
        ("jax-no-cuda-devices", "no-gpu", True, ["gpu01"]),  # old: never
        ("jax-unknown-backend-gpu", "no-gpu", False, []),  # a CPU-only jaxlib: the same on every node
        ("preflight-workspace-not-writable", "preflight-failed", True, ["gpu02"]),  # old: never
        ("nccl-ib-completion-error-rank2", "collective-error", True, ["gpu03"]),  # old: no exclude
        ("ionic-cqe-error", "collective-error", True, ["gpu02"]),  # old: no exclude
        ("nccl-ib-async-port-error", "collective-error", True, ["gpu02"]),  # old: no exclude
        ("nccl-unhandled-system-error", "collective-error", True, []),
        ("jax-heartbeat-bare-task-number", "task-died", True, ["gpu02"]),  # old: no exclude
        ("jax-task-heartbeat-timeout", "task-died", True, ["gpu03"]),  # old: no exclude
        ("jax-peer-sigkilled", "task-died", True, ["gpu02"]),  # old: no exclude
        ("jax-barrier-timeout-names-the-late-task", "distributed-timeout", True, []),
        ("training-stage-timeout", "stage-timeout", True, []),  # old: never
        ("image-pull-timeout", "stage-timeout", True, []),  # old: never
        ("image-pull-denied", "image-pull", True, []),  # old: never; same nodes
        ("image-tarball-missing", "image-pull", False, []),
        ("source-checkout-github-500", "source-checkout", True, []),  # old: never
        ("slurm-controller-down", "controller-down", True, []),  # old: never
        ("python-segfault-rank1", "killed-by-signal", True, []),  # old: never; same nodes
        ("srun-task-killed-silently", "task-died", True, ["gpu03"]),  # old: never; a SIGKILLed task's node is left out
        ("cleanup-exit-143-after-training-end", "cleanup-after-success", False, []),
        ("rocm-gpu-hang", "gpu-hardware", True, ["gpu02"]),
        ("slurm-node-failure-4node", "node-fail", True, ["gpu03"]),
        ("maxtext-config-error", "config-error", False, []),
        ("train-env-bad-profile", "config-error", False, []),
        ("xla-unknown-flag", "unknown-xla-flag", False, []),
        ("compile-oom-traceback", "oom", False, []),
        ("slurm-cgroup-oom", "oom", False, []),
        ("srun-step-refused-gres", "step-refused", False, []),
        ("orbax-tensorstore-missing-array", "checkpoint-error", False, []),
        ("python-exception-rank0", "python-exception", False, []),
    ],
)
def test_the_catalogue_entry_decides_retry_and_exclusion(case, cls, retried, exclude, tmp_path):
    text = (CORPUS / f"{case}.log").read_text()
    decision = requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "2"}, tmp_path)
    assert decision.why.startswith(cls), decision
    assert (decision.retry, decision.exclude) == (retried, exclude), decision.why
    assert decision.rule.startswith("catalogue entry "), decision.rule  # which entry decided
    assert "; advice: " in decision.rule


def test_a_site_local_policy_overrides_the_shipped_one(tmp_path, monkeypatch, job_dir):
    """The policy is data: a site that never wants a NIC error retried says so without code."""
    local = tmp_path / "site.yaml"
    local.write_text("signatures:\n  - id: nccl-ib-completion-error\n    retry: never\n")
    monkeypatch.setenv("FAILURE_SIGNATURES_FILE", str(local))
    text = (CORPUS / "nccl-ib-completion-error-rank2.log").read_text()
    decision = requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "2"}, job_dir)
    assert not decision.retry
    assert decision.rule.startswith("catalogue entry nccl-ib-completion-error: never; advice: ")


def test_a_failure_of_a_retry_without_node_entry_that_names_no_host_excludes_none(job_dir):
    body = "1: RuntimeError: Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices.\n"
    decision = decide(job_log(body, "FAILED", 1, header=HEADER.replace("JOB_NODELIST=node[1-2]\n", "")), job_dir)
    assert decision.retry and decision.exclude == []
    assert decision.why == "no-gpu (no host blamed: none excluded)"


def test_the_time_limit_line_is_decided_by_its_catalogue_entry(job_dir):
    decision = decide(job_log(TIME_LIMIT, "STOPPED", 0), job_dir)
    assert decision.retry
    assert decision.rule.startswith("catalogue entry time-limit-warning: retry; advice: ")


def test_a_hang_blames_nobody(job_dir):
    decision = decide(
        job_log("1: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143), job_dir
    )
    assert decision.retry and decision.exclude == []


def test_retries_are_counted_by_attempt(job_dir):
    text = job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143)
    assert decide(text, job_dir, ATTEMPT="2").retry
    last = decide(text, job_dir, ATTEMPT="3")
    assert not last.retry
    assert "retries used up (2 allowed, this was attempt 3)" in last.why
    assert not decide(text, job_dir, MAX_RETRIES="0").retry


HANG_LINE = "0: == HANG detected (phase training, last step 4, 9 s since) ==\n"
TIME_LIMIT = "== TIME LIMIT near (Slurm's warning, 300s ahead): ... ==\nTraining stopped: Job received termination signal (SIGTERM).\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a teammate's file needs root (chown)")
@pytest.mark.parametrize(
    ("body", "status", "rc", "plant", "why"),
    [
        (HANG_LINE, "HANG", 143, None, "the log says HANG, but this job's watchdog left no marker in {job_dir}"),
        (
            HANG_LINE,
            "HANG",
            143,
            "hang/HANG",
            "the log says HANG, but ignored {job_dir}/hang belongs to uid 65534, not to this user (uid 0) (not retried)",
        ),
        (
            TIME_LIMIT,
            "STOPPED",
            0,
            "time-limit-stop",
            "the log says TIME LIMIT, but ignored {job_dir}/time-limit-stop belongs to uid 65534",
        ),
    ],
)
def test_a_hang_or_time_limit_a_teammate_wrote_into_the_log_is_not_retried(tmp_path, body, status, rc, plant, why):
    job_dir = tmp_path / "team" / "500-tiny"  # a team workspace: anyone may write the log and the job dir
    job_dir.mkdir(parents=True)
    for d in (job_dir.parent, job_dir):
        d.chmod(0o777)
    if plant:  # what the teammate wrote, in the right form for this job: only its owner gives it away
        (job_dir / plant).parent.mkdir(exist_ok=True)
        (job_dir / plant).write_text(hang_watchdog.marker_body("planted by mallory", "500"))
        for path in {job_dir / plant, (job_dir / plant).parent} - {job_dir}:
            os.lchown(path, 65534, 65534)
    decision = decide(job_log(body, status, rc), job_dir)
    assert not decision.retry
    assert why.format(job_dir=job_dir) in decision.why


def test_a_log_without_summary_is_never_requeued(job_dir):
    text = HEADER + STEP.format(n=1)
    decision = requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "3"}, job_dir)
    assert not decision.retry and "no JOB SUMMARY" in decision.why


@pytest.mark.parametrize(
    ("args", "hosts", "expected"),
    [
        (["-N", "2"], ["node2"], ["-N", "2", "--exclude=node2"]),
        (["-N", "2", "--exclude=node5"], ["node2"], ["-N", "2", "--exclude=node5,node2"]),
        (["-x", "node5,node6", "-N2"], ["node6", "node2"], ["-N2", "--exclude=node5,node6,node2"]),
        (["-xnode5", "--time=10"], [], ["-xnode5", "--time=10"]),
        (["--exclude", "node5", "-p", "gpu"], ["node2"], ["-p", "gpu", "--exclude=node5,node2"]),
    ],
)
def test_exclusions_are_merged_into_one_option(args, hosts, expected):
    assert requeue.with_exclude(args, hosts) == expected


def test_submit_argv_splits_at_the_first_double_dash():
    assert requeue.split_submit_argv(["tiny:a:", "-N", "2", "--", "steps=5", "--", "x"]) == (
        "tiny:a:",
        ["-N", "2"],
        ["steps=5", "--", "x"],
    )
    assert requeue.split_submit_argv(["tiny"]) == ("tiny", [], [])
    with pytest.raises(requeue.RequeueError, match="only jobs submitted with submit.sh"):
        requeue.split_submit_argv([])


def fake_snapshot(tmp_path: Path, answer: str, rc: int = 0) -> Path:
    """A snapshot whose submit.sh records its arguments and environment and answers like submit.sh."""
    snap = tmp_path / "artifact"
    snap.mkdir()
    script = snap / "submit.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {tmp_path}/argv\n'
        f"env > {tmp_path}/env\n"
        f"printf '%b' '{answer}'\n"
        f"exit {rc}\n"
    )
    script.chmod(0o755)
    return snap


def test_requeue_submits_the_same_arguments_from_the_snapshot_once(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    log = ws / "500-tiny.log"
    log.write_text(job_log("srun: error: Node failure on node2\n", "CANCELLED", 143))
    new_dir = ws / "501-tiny"
    snap = fake_snapshot(tmp_path, f"Submitted job 501 (tiny)\\n  job dir:  {new_dir}\\n")
    env = {
        "MAX_RETRIES": "1",
        "MAXTEXT_LAUNCHER_DIR": str(snap),
        "SUBMIT_ARGV": "tiny:a: -N 2 --exclude=node9 -- steps=50 'run_name=a b'",
        "PATH": "/usr/bin:/bin",
    }
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (ws / "500-tiny").mkdir()
    (ws / "500-tiny" / "requeue.tmp").symlink_to(victim)  # the old fixed temp name, planted by a teammate
    decision, job_id = requeue.requeue(log, env)
    assert job_id == "501"
    assert victim.read_text() == "mine\n"
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == ["tiny:a:", "-N", "2", "--exclude=node9,node2", "--", "steps=50", "run_name=a b"]
    child = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert child["ATTEMPT"] == "2" and child["RETRY_OF"] == "500"
    assert child["REQUEUE_ARTIFACT"] == str(snap) and child["REQUEUE_PREVIOUS_DIR"] == "500-tiny"
    assert child["REQUEUE_EXCLUDE"] == "node2"
    job_dir = ws / "500-tiny"
    assert (job_dir / "next").readlink() == Path("../501-tiny")
    record = json.loads((job_dir / "requeue.json").read_text())
    assert record["job_id"] == "501" and record["decision"]["exclude"] == ["node2"]
    # A second call (a monitor, a rerun) finds the claim and submits nothing.
    (tmp_path / "argv").unlink()
    again, second = requeue.requeue(log, env)
    assert second is None and "already requeued" in again.why
    assert not (tmp_path / "argv").exists()


def test_submit_argv_reads_back_exactly_what_submit_sh_was_given(tmp_path):
    """submit.sh saves its arguments for a requeue; a space, quotes, a tab and non-ASCII come back unchanged
    (the `printf %q` form it wrote before turned a tab into $'..', which shlex read back as other words)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in {
        "sbatch": f'printf %s "$SUBMIT_ARGV" >{tmp_path}/submit_argv\necho 7',
        "squeue": "echo RUNNING",
        "scontrol": "exit 0",
    }.items():
        (stubs / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (stubs / name).chmod(0o755)
    argv = [
        "tiny:rt",
        "-N",
        "1",
        '--comment=a\tb "q" it\'s ü',
        "--",
        "run_name=x y",
        'dataset_path=/d/it\'s "ü"',
        "s=\\n",
    ]
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "JOB_WORKSPACE": str(tmp_path / "ws"),
        "CONTAINER_RUNTIME": "none",
        "EARLY_DEATH_CHECK_SECONDS": "0",
    }
    run = subprocess.run([str(REPO / "submit.sh"), *argv], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    saved = (tmp_path / "submit_argv").read_text()
    assert requeue.read_submit_argv(saved) == argv
    assert requeue.split_submit_argv(requeue.read_submit_argv(saved))[2] == argv[5:]
    assert not list((tmp_path / "ws").glob("7-*/submit_env.json"))  # MAX_RETRIES unset: no requeue, nothing kept
    # With retries, the job dir keeps what a requeue outside the job needs (the monitor's), for the owner only.
    again = subprocess.run(
        [str(REPO / "submit.sh"), *argv],
        env={**env, "MAX_RETRIES": "1", "JOB_WORKSPACE": str(tmp_path / "ws2")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    (kept,) = (tmp_path / "ws2").glob("7-*/submit_env.json")
    assert kept.stat().st_mode & 0o777 == 0o600
    got = requeue.job_env(kept.parent, {})
    assert requeue.read_submit_argv(got["SUBMIT_ARGV"]) == argv
    assert (Path(got["MAXTEXT_LAUNCHER_DIR"]) / "submit.sh").is_file() and got["ARTIFACT_SHA256"]


def test_submit_argv_of_jobs_submitted_before_json_is_still_read():
    assert requeue.read_submit_argv("tiny:a: -N 2 -- 'run_name=a b' x\\ y") == [
        "tiny:a:",
        "-N",
        "2",
        "--",
        "run_name=a b",
        "x y",
    ]
    with pytest.raises(ValueError):
        requeue.read_submit_argv('["tiny", 2]')


def test_a_failed_submission_is_one_line_and_recorded(tmp_path, job_dir):
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    snap = fake_snapshot(tmp_path, "submit.sh: sbatch refused the job: bad partition\\n", rc=1)
    env = {"MAX_RETRIES": "1", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    result = CliRunner(env=env).invoke(main, ["requeue", str(log)], env=env)
    assert result.exit_code == EXIT_ACTION_FAILED
    assert (
        result.output.strip()
        == "== REQUEUE FAILED: submit.sh failed (exit 1): submit.sh: sbatch refused the job: bad partition =="
    )
    # Nothing reached Slurm: the claim is given back (renamed, with what failed), so it blocks no later requeue.
    assert not (tmp_path / "500-tiny" / "requeue.json").exists()
    assert "bad partition" in json.loads((tmp_path / "500-tiny" / "requeue.failed.json").read_text())["error"]


def test_a_requeue_that_submitted_nothing_does_not_block_a_later_one_but_a_submitted_one_does(tmp_path, job_dir):
    """rq7: a failed requeue used to leave its claim behind, and every later one said 'already requeued'."""
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log(HANG_LINE, "HANG", 143))
    bad = fake_snapshot(tmp_path, "submit.sh: sbatch refused the job: bad partition\\n", rc=1)
    env = {"MAX_RETRIES": "2", "MAXTEXT_LAUNCHER_DIR": str(bad), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    assert CliRunner().invoke(main, ["requeue", str(log)], env=env).exit_code == EXIT_ACTION_FAILED
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env=env)
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("== would requeue: hang: training as attempt 2 of 3, excluding no hosts (again: ")
    assert "bad partition" in dry.output and "requeue.failed.json" in dry.output
    (tmp_path / "ok").mkdir()
    good = fake_snapshot(tmp_path / "ok", f"Submitted job 501 (tiny)\\n  job dir:  {tmp_path / '501-tiny'}\\n")
    done = CliRunner().invoke(main, ["requeue", str(log)], env={**env, "MAXTEXT_LAUNCHER_DIR": str(good)})
    assert done.exit_code == 0 and done.output.startswith("== REQUEUED as job 501 (attempt 2 of 3)"), done.output
    # At most once still holds for the one that was submitted.
    again = CliRunner().invoke(main, ["requeue", str(log)], env={**env, "MAXTEXT_LAUNCHER_DIR": str(good)})
    assert again.exit_code == EXIT_ANSWER_NO and "already requeued as job 501" in again.output


def test_a_submit_that_may_have_reached_slurm_keeps_its_claim(tmp_path, job_dir):
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log(HANG_LINE, "HANG", 143))
    # sbatch took the job; submit.sh failed after (its answer could not be read): another submit could double it.
    snap = fake_snapshot(tmp_path, "submit.sh: could not read a job id from sbatch answer: x\\n", rc=1)
    env = {"MAX_RETRIES": "2", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    assert CliRunner().invoke(main, ["requeue", str(log)], env=env).exit_code == EXIT_ACTION_FAILED
    (tmp_path / "argv").unlink()
    later = CliRunner().invoke(main, ["requeue", str(log)], env=env)
    assert later.exit_code == EXIT_ANSWER_NO and "a requeue was claimed and may have reached Slurm" in later.output
    assert "RETRY_OF=500, move " in later.output and not (tmp_path / "argv").exists()


def test_checks_that_need_no_claim_come_first_and_leave_nothing(tmp_path, job_dir):
    """rq6/rq7: a requeue refused for its snapshot or its arguments claims nothing; the fixed one runs."""
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log(HANG_LINE, "HANG", 143))
    for env in ({"MAX_RETRIES": "2"}, {"MAX_RETRIES": "2", "MAXTEXT_LAUNCHER_DIR": str(tmp_path), "SUBMIT_ARGV": "x"}):
        result = CliRunner().invoke(main, ["requeue", str(log)], env=env)
        assert result.exit_code == EXIT_ACTION_FAILED and result.output.startswith(
            "== REQUEUE FAILED: no snapshot with submit.sh"
        )
        dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env=env)
        assert dry.exit_code == EXIT_ACTION_FAILED
        assert (
            dry.output.startswith("== REQUEUE WOULD FAIL: no snapshot with submit.sh")
            and "(decided: hang" in dry.output
        )
    assert not [p.name for p in job_dir.iterdir() if p.name.startswith("requeue")]  # no claim was taken
    snap = fake_snapshot(tmp_path, f"Submitted job 501 (tiny)\\n  job dir:  {tmp_path / '501-tiny'}\\n")
    env = {"MAX_RETRIES": "2", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    assert CliRunner().invoke(main, ["requeue", str(log)], env=env).exit_code == 0


def test_dry_run_and_not_retried_exit_codes(tmp_path, job_dir):
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    snap = fake_snapshot(tmp_path, "")
    env = {"MAX_RETRIES": "1", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2"}
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env=env)
    assert dry.exit_code == 0
    assert dry.output.strip().startswith(
        "== would requeue: hang: training as attempt 2 of 2, excluding no hosts [catalogue entry hang-watchdog: retry"
    )
    assert "; advice: progress stopped" in dry.output
    assert not (tmp_path / "500-tiny" / "requeue.json").exists()
    off = CliRunner().invoke(main, ["requeue", str(log)], env={"MAX_RETRIES": "0"})
    assert off.exit_code == EXIT_ANSWER_NO
    assert "retries used up (0 allowed, this was attempt 1)" in off.output


@pytest.mark.parametrize("data", [bytes(range(256)) * 16, b""], ids=["random", "empty"])
def test_a_file_that_is_not_a_job_log_is_refused_and_nothing_is_made(tmp_path, data):
    log = tmp_path / "500-tiny.log"
    log.write_bytes(data)
    env = {"MAX_RETRIES": "2"}
    for args in (["--dry-run", str(log)], [str(log)]):
        result = CliRunner().invoke(main, ["requeue", *args], env=env)
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert result.stderr == (
            f"jobkit requeue: {log}: not a job log (no KEY=VALUE header with JOB_ID and NNODES); "
            "give a log written by submit.sh or run_local.sh\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["500-tiny.log"]  # no job dir made for requeue.json


def test_help_says_what_is_retried_how_often_and_what_dry_run_does():
    result = CliRunner().invoke(main, ["requeue", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for policy in ("retry:", "retry-without-node:", "never:"):
        assert policy in text
    for cls in ("gpu-hardware", "no-gpu", "stage-timeout", "cleanup-after-success", "config-error"):
        assert cls in text  # the classes, read from the catalogue when the help is shown
    for needle in ("MAX_RETRIES", "REQUEUE_EXCLUDE", "--dry-run", "At most once per job", "requeue.json"):
        assert needle in text
    assert "doc)" not in text  # it used to send the reader to the module's docstring


def test_dry_run_on_a_job_already_requeued_names_the_next_job_the_rule_and_the_exclude_list(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    log = ws / "500-tiny.log"
    log.write_text(job_log("srun: error: Node failure on node2\n", "CANCELLED", 143))
    snap = fake_snapshot(tmp_path, f"Submitted job 501 (tiny)\\n  job dir:  {ws / '501-tiny'}\\n")
    env = {"MAX_RETRIES": "2", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    assert requeue.requeue(log, env)[1] == "501"
    claim = ws / "500-tiny" / "requeue.json"
    before = claim.read_bytes()
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env={"MAX_RETRIES": "2"})
    assert dry.exit_code == EXIT_ANSWER_NO
    assert dry.output == (
        f"== not requeued: already requeued as job 501, excluding node2 (see {claim}); "
        "a job is requeued at most once ==\n"
    )
    assert claim.read_bytes() == before  # --dry-run writes nothing
    claim.write_text(json.dumps({"decision": {"exclude": []}, "error": "submit.sh failed (exit 1): no Slurm"}))
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env={"MAX_RETRIES": "2"})
    assert "a requeue was claimed and may have reached Slurm (submit.sh failed (exit 1): no Slurm)" in dry.output
    assert f"move {claim} away to requeue again, excluding no hosts" in dry.output
    claim.write_bytes(b"\x00\xff garbage")
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env={"MAX_RETRIES": "2"})
    assert dry.exit_code == EXIT_ANSWER_NO and len(dry.output.splitlines()) == 1
    assert f"already requeued ({claim} cannot be read: " in dry.output and "\x00" not in dry.output


@pytest.mark.parametrize("raw", ["abc", "-1", "1.5", "2x", "1234567890"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_bad_max_retries_is_refused_not_read_as_a_number(tmp_path, job_dir, raw, dry_run):
    """MAX_RETRIES=abc was read as 0 and -1 echoed as '-1 allowed' (audit rq2/rq3); submit.sh refuses both."""
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(
        main, ["requeue", *(["--dry-run"] if dry_run else []), str(log)], env={"MAX_RETRIES": raw}
    )
    assert result.exit_code == EXIT_SETTINGS, result.output
    assert result.output.strip() == (
        f"== REQUEUE FAILED: MAX_RETRIES={raw!r} is not a whole number of 1 to 9 digits;"
        " set it to one (e.g. MAX_RETRIES=0) or unset it =="
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_max_retries_is_read_as_decimal(tmp_path, job_dir):
    text = job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143)
    assert requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "010"}, job_dir).max_retries == 10


# --------------------------------------------------------------------------------- real jobs on the cluster
# (imports here, after the unit tests, keep the units runnable without the cluster helpers' set-up cost)
import signal  # noqa: E402
import time  # noqa: E402

from job_observation import TRAINING_CMDLINE, header, live_processes_of  # noqa: E402
from prom_query import View, free_port  # noqa: E402
from slurm_cluster import job_env, local_cluster, local_cluster_3nodes, read, submit_job, wait_for  # noqa: E402, F401  (the fixtures)
from webhook import Receiver  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JOBKIT = str(REPO / ".venv" / "bin" / "jobkit")
CHECKPOINTING = ["enable_checkpointing=true", "async_checkpointing=false"]


def rank0_steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"^0: .*completed step: (\d+),", text, re.M)]


def step_or_early_end(log: Path, step: int) -> bool:
    """True once rank 0 reached STEP; fails the test at once, with the log's tail, if the job hung or ended first."""
    text = read(log)
    if (rank0_steps(text) or [0])[-1] >= step:
        return True
    if re.search(r"== HANG detected|^Status: ", text, re.M):
        pytest.fail(f"the job ended or hung before step {step}:\n{text[-4000:]}")
    return False


def next_attempt(log: Path, timeout: float) -> tuple[str, Path]:
    m = wait_for(
        lambda: re.search(r"^== REQUEUED as job (\d+) .*==$", read(log), re.M), timeout, f"{log.name} requeued"
    )
    new_id = m.group(1)
    new_log = wait_for(lambda: next(log.parent.glob(f"{new_id}-*.log"), None), 240, f"job {new_id}'s log")
    return new_id, new_log


def training_pids(job_id, rank):
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    return [p for p in pids if f"NODE_RANK={rank}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


def test_time_limit_saves_a_checkpoint_and_the_requeued_attempt_resumes_from_it(local_cluster, tmp_path):  # noqa: F811
    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    # Slurm checks limits about every 30 s: a 45 s warning lands 45-75 s before the 2-minute limit.
    # RAY=1: training saves under Ray too (only training gets the TERM), and the TSDB holds every logged step.
    env.update(MAX_RETRIES="1", TIME_LIMIT_SIGNAL_LEAD="45", RAY="1", EXPORTER_INTERVAL="2", TENSORBOARD="0")
    job_id, log = submit_job(
        env, "tiny:tl:", "-N", "2", "--time=2", "--", "steps=100000", "enable_autocheckpoint=true", *CHECKPOINTING
    )
    second = None
    try:
        second, second_log = next_attempt(log, 240)
        # The second attempt reaches its own time limit too, and MAX_RETRIES=1 is used up.
        wait_for(lambda: re.search(r"^== not requeued: .*==$", read(second_log), re.M), 240, "the second attempt's end")
    finally:
        local_cluster.run(["scancel", job_id, *([second] if second else [])], check=False)
    first_text, second_text = log.read_text(), second_log.read_text()
    assert re.search(r"^== TIME LIMIT near \(Slurm's warning, 45s ahead\)", first_text, re.M), first_text[-3000:]
    stopped = re.search(
        r"Status: STOPPED \(exit 0\) — time limit near; .*checkpoint at step (\d+) in (\S+)", first_text
    )
    assert stopped, first_text[-3000:]
    saved = int(stopped.group(1))
    assert Path(stopped.group(2)).is_dir()
    assert re.search(
        rf"^== REQUEUED as job {second} \(attempt 2 of 2\): time-limit \[catalogue entry [\w-]+: retry; .*\] ==$",
        first_text,
        re.M,
    )
    head = header(second_text)
    assert (head["ATTEMPT"], head["RETRY_OF"], head["MAX_RETRIES"]) == ("2", job_id, "1")
    assert f"restoring from this run's directory step {saved}" in second_text
    # MaxText logs a step's metrics one step late: the first line of the resumed run is the saved step's or the next.
    assert saved <= rank0_steps(second_text)[0] <= saved + 1, rank0_steps(second_text)[:3]
    assert re.search(
        r"^== not requeued: time-limit; retries used up \(1 allowed, this was attempt 2\) \[catalogue entry .*\] ==$",
        second_text,
        re.M,
    ), second_text[-2000:]
    first_dir, second_dir = log.with_suffix(""), second_log.with_suffix("")
    assert (first_dir / "next").resolve() == second_dir.resolve()
    assert (second_dir / "previous").resolve() == first_dir.resolve()
    assert (first_dir / "artifact").resolve() == (second_dir / "artifact").resolve()  # the same snapshot
    wait_for(lambda: not live_processes_of(job_id) and not live_processes_of(second), 60, "both attempts gone")
    # A node's watchdog, not a TERM to the whole step, asked training to save and stop (the first TERM is
    # enough: MaxText's preemption sync point stops every process, often before the other watchdog looks).
    assert re.search(r"^\d: \[hang\] node\d: Slurm's time limit is near: TERM to training", first_text, re.M)
    assert "CANCELLED AT" not in first_text
    logged = sorted(set(rank0_steps(first_text)))
    view = View(first_dir, free_port())
    try:
        counted = view.query("count_over_time(tb_learning_loss[2h])", log.stat().st_mtime + 60)
    finally:
        _, err = view.stop()
    assert [s["value"][1] for s in counted] == [str(len(logged))], (counted, len(logged), err)


def test_two_node_hang_is_told_by_the_monitor_blamed_from_its_stacks_and_requeued_without_that_node(
    local_cluster,  # noqa: F811
    tmp_path,
):
    """Rank 1 frozen (SIGSTOP): the watchdog takes both nodes' stacks, node2's training is stopped (T), so the hang
    is blamed on node2 and retried without it. This cluster has two nodes: without node2 a 2-node job cannot be
    placed, and sbatch says so at once; that refusal proves the exclusion (on a bigger cluster the job runs on the
    others, and the time-limit test proves a requeued attempt resumes from its checkpoint)."""
    ws = tmp_path / "ws"
    env = job_env(local_cluster, ws, tmp_path / "jax_cache")
    # A 30 s floor: under a loaded CI machine a 5 s one saw a healthy step gap as a hang before the freeze.
    env.update(HANG_TIMEOUT="30", HANG_STEP_FACTOR="5", MAX_RETRIES="1")
    state = tmp_path / "monitor.json"
    with Receiver() as hook:
        job_id, log = submit_job(env, "tiny:hq:", "-N", "2", "--", "steps=40", "checkpoint_period=10", *CHECKPOINTING)
        monitor_env = {**env, "JOBKIT_NOTIFY_URLS": hook.url}
        watch = [JOBKIT, "monitor", "--workspace", str(ws), "--state", str(state)]
        monitor = subprocess.Popen([*watch, "--interval", "1", job_id], env=monitor_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            wait_for(lambda: step_or_early_end(log, 3), 300, "step 3")
            (pid,) = training_pids(job_id, rank=1)
            os.kill(pid, signal.SIGSTOP)
            ended = wait_for(
                lambda: re.search(r"^== (REQUEUED|REQUEUE FAILED|not requeued).*==$", read(log), re.M),
                300,
                "the requeue",
            )
            wait_for(
                lambda: json.loads(read(state) or "{}").get("jobs", {}).get(job_id, {}).get("done"),
                60,
                "the monitor done",
            )
        finally:
            monitor.terminate()
            out, _ = monitor.communicate(timeout=30)
            local_cluster.run(["scancel", job_id], check=False)
            for pid in live_processes_of(job_id, TRAINING_CMDLINE):
                os.kill(pid, signal.SIGKILL)
        posts = [f"{p['title']}: {p['message']}" for p in hook.posts]
        # A restarted monitor (the same state file) repeats nothing.
        again = subprocess.run([*watch, "--once", job_id], env=monitor_env, capture_output=True, text=True, timeout=60)
        assert len(hook.posts) == len(posts)
    text = log.read_text()
    # The watchdog fired, both hosts' stacks are in, the job ended as HANG.
    assert re.search(r"^\d: == HANG detected \(phase training, last step \d+, \d+ s since\) ==$", text, re.M), text[
        -4000:
    ]
    assert re.search(r"Status: HANG \(exit \d+\) — phase training", text), text[-3000:]
    hang = log.with_suffix("") / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == ["node1.txt", "node2.txt"]
    assert "state T (stopped)" in (hang / "node2.txt").read_text()
    # Blamed on node2 from its stacks, so requeued without it: refused here for want of nodes.
    assert ended.group(0).startswith("== REQUEUE FAILED: submit.sh failed (exit 1): ") and "node2" in ended.group(0), (
        ended.group(0)
    )
    record = json.loads((log.with_suffix("") / "requeue.failed.json").read_text())
    assert record["decision"]["exclude"] == ["node2"] and record["decision"]["why"].startswith("hang"), record
    why = subprocess.run([JOBKIT, "why", "--json", str(log)], capture_output=True, text=True, timeout=60, env=env)
    verdict = json.loads(why.stdout)
    assert (verdict["class"], verdict["host"], verdict["retry"]) == ("hang", "node2", "retry-without-node"), verdict
    # The monitor: one line per event, on stdout and (failures) to the webhook.
    events = re.findall(r"^\S+ job (\S+) ([\w-]+): (.*)$", out, re.M)
    kinds = [(j, k) for j, k, _ in events]
    for expected in [(job_id, "first-step"), (job_id, "hang"), (job_id, "failure"), (job_id, "requeue-failed")]:
        assert expected in kinds, out
    (failure,) = [t for j, k, t in events if (j, k) == (job_id, "failure")]
    # either watchdog may notice first (the frozen rank's own sees its stale step too); the stacks blame node2
    assert re.search(r"noticed: on node[12] ", failure) and "host: node2 (stacks: node2's training" in failure, failure
    assert len(events) == len(set(events)), out  # nothing told twice
    assert any(p.startswith(f"job {job_id}: hang: (tiny 2N) HANG detected — phase training") for p in posts), posts
    assert any(p.startswith(f"job {job_id}: requeue-failed: ") for p in posts), posts
    assert again.returncode == 0 and " job " not in again.stdout, again.stdout


def saved_steps(text: str) -> list[int]:
    """The steps whose checkpoint MaxText finished saving (its `Saved a checkpoint at step N.` line), rank 0's."""
    return [
        int(s) for s in re.findall(r"^0: .*checkpointing\.py:\d+\] Saved a checkpoint at step (\d+)\.$", text, re.M)
    ]


def the_training_pid(job_id: str) -> int:
    """The one training process of a one-node job. Under RAY=1 it is a Ray actor's subprocess, found by its
    environment (JOB_ID, NODE_RANK); the driver (`jobkit ray-launch ... -- <python> jobkit launch ...`) carries
    the same command in its arguments and is not it."""
    pids = [
        p for p in training_pids(job_id, rank=0) if b"\0ray-launch\0" not in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(pids) == 1, pids
    return pids[0]


def test_ray_hang_of_a_one_node_job_is_requeued_on_the_other_node_and_resumes_from_its_checkpoint(
    local_cluster,  # noqa: F811
    tmp_path,
):
    """RAY=1, MAX_RETRIES=1, checkpointing: the training of a 1-node job is frozen (SIGSTOP) after a checkpoint.
    The watchdog takes its stacks (state T), the hang is blamed on that node, and the job is requeued without
    it: the next attempt runs on the cluster's other node, restores the checkpoint and finishes. (A 2-node job
    cannot be requeued without a node on this 2-node cluster: the two-node hang test proves the exclusion by
    sbatch's refusal; this one proves a requeued attempt elsewhere resumes and passes.)"""
    # ~0.05 s a step (a save each 10 adds ~0.3 s): 20 s or more to freeze it after step 10's checkpoint
    steps, period = 400, 10
    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    # A 30 s floor: under a loaded CI machine a 5 s one saw a healthy step gap as a hang before the freeze.
    env.update(HANG_TIMEOUT="30", HANG_STEP_FACTOR="5", MAX_RETRIES="1", RAY="1", TENSORBOARD="0")
    job_id, log = submit_job(
        env, "tiny:rq:", "-N", "1", "--", f"steps={steps}", f"checkpoint_period={period}", *CHECKPOINTING
    )
    second, frozen = None, None
    try:
        node = wait_for(lambda: header(read(log)).get("NODELIST_EXPANDED"), 240, "the first attempt's header")
        other = ({"node1", "node2"} - {node}).pop()
        wait_for(
            lambda: period in saved_steps(read(log)) or step_or_early_end(log, steps), 300, f"step {period} saved", 0.05
        )
        assert period in saved_steps(read(log)), "the run ended before its checkpoint was seen"
        frozen = the_training_pid(job_id)
        os.kill(frozen, signal.SIGSTOP)
        second, second_log = next_attempt(log, 300)
        wait_for(lambda: re.search(r"^ *Status: ", read(second_log), re.M), 300, "the second attempt's end")
    finally:
        local_cluster.run(["scancel", job_id, *([second] if second else [])], check=False)
        for pid in live_processes_of(job_id, TRAINING_CMDLINE) + (
            live_processes_of(second, TRAINING_CMDLINE) if second else []
        ):
            os.kill(pid, signal.SIGKILL)
    first_text, second_text = log.read_text(), second_log.read_text()
    # The first attempt: the watchdog fired on NODE and took its stacks: training stopped (T).
    assert re.search(r"^0: == HANG detected \(phase training, last step \d+, \d+ s since\) ==$", first_text, re.M), (
        first_text[-4000:]
    )
    assert re.search(r"Status: HANG \(exit \d+\) — phase training", first_text), first_text[-3000:]
    hang = log.with_suffix("") / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == [f"{node}.txt"]
    stacks = (hang / f"{node}.txt").read_text()
    assert f"pid {frozen}, state T (stopped)" in stacks, stacks[:2000]
    # Requeued without NODE: the line, the record and the next attempt's header say so.
    assert re.search(
        rf"^== REQUEUED as job {second} \(attempt 2 of 2\): hang.*; excluding {node} "
        r"\[catalogue entry [\w-]+: retry-without-node(; advice: .*)?\] ==$",
        first_text,
        re.M,
    ), first_text[-3000:]
    record = json.loads((log.with_suffix("") / "requeue.json").read_text())
    assert record["decision"]["exclude"] == [node] and record["decision"]["why"].startswith("hang"), record
    why = subprocess.run([JOBKIT, "why", "--json", str(log)], capture_output=True, text=True, timeout=60, env=env)
    verdict = json.loads(why.stdout)
    assert (verdict["class"], verdict["host"], verdict["retry"]) == ("hang", node, "retry-without-node"), verdict
    assert verdict["blamed_because"].startswith(f"stacks: {node}'s training (rank 0, pid {frozen}) is stopped (T)")
    # The job's own TSDB (RAY=1) was read around the stall: the metrics line names the frozen node with its numbers
    # (the exporter's network bytes and Ray's CPU; no GPU here, so it decides nothing next to the stacks' blame).
    assert re.match(r"\d+ s from the last progress to the HANG: ", verdict["metrics"] or ""), verdict
    assert f"{node} " in verdict["metrics"] and "net " in verdict["metrics"], verdict["metrics"]
    # The second attempt ran on the other node, restored the last checkpoint the first one saved, and finished.
    head = header(second_text)
    assert (head["ATTEMPT"], head["RETRY_OF"], head["REQUEUE_EXCLUDE"]) == ("2", job_id, node), head
    assert head["NODELIST_EXPANDED"] == other, head
    saved = max(saved_steps(first_text))
    assert saved >= period
    assert f"restoring from this run's directory step {saved}" in second_text, second_text[-3000:]
    resumed = rank0_steps(second_text)
    assert saved <= resumed[0] <= saved + 1 and resumed[-1] == steps - 1, (saved, resumed[:3], resumed[-3:])
    assert re.search(r"^ *Status: SUCCESS \(exit 0\)", second_text, re.M), second_text[-3000:]
    wait_for(lambda: not live_processes_of(job_id) and not live_processes_of(second), 60, "both attempts gone")


def node_state(cluster, node: str) -> str:
    return cluster.run(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout.strip()


def test_a_node_that_fails_mid_job_is_excluded_from_the_requeued_attempt(local_cluster, tmp_path):  # noqa: F811
    from node_faults import slurmd_pid

    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    env.update(MAX_RETRIES="1")
    job_id, log = submit_job(env, "tiny", "-N", "2", "--", "steps=100000")
    slurmd = slurmd_pid("node2", local_cluster.state_dir)
    try:
        wait_for(lambda: re.search(r"^1: .*completed step: 2,", read(log), re.M), 300, "node2's step 2")
        # node2's slurmd stops answering (its job step goes on): after SlurmdTimeout Slurm declares a node failure.
        os.kill(slurmd, signal.SIGSTOP)
        ended = wait_for(
            lambda: re.search(r"^== (REQUEUED|REQUEUE FAILED|not requeued).*==$", read(log), re.M), 240, "the requeue"
        )
    finally:
        os.kill(slurmd, signal.SIGCONT)
        local_cluster.run(["scancel", job_id], check=False)
        for pid in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(pid, signal.SIGKILL)
        # The node comes back by itself (ReturnToService=2); resume it in case it has not yet.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and node_state(local_cluster, "node2") != "idle":
            local_cluster.run(["scontrol", "update", "nodename=node2", "state=resume"], check=False)
            time.sleep(2)
    text = log.read_text()
    assert re.search(r"^srun: error: Node failure on node2$", text, re.M), text[-3000:]
    assert "Status: CANCELLED (exit 143) — cancelled by Slurm: node failure" in text
    # This cluster has two nodes: without node2 a 2-node job cannot be placed, and sbatch says so at once. That
    # refusal is the proof that the next attempt excluded node2 (on a bigger cluster it runs on the others).
    assert ended.group(0) == (
        "== REQUEUE FAILED: submit.sh failed (exit 1): submit.sh: sbatch refused the job: sbatch: error: Batch job "
        "submission failed: Requested node configuration is not available; fix the sbatch arguments before '--' "
        "(too few nodes left once node2 is excluded; resubmit when it is back, or with fewer nodes) =="
    ), ended.group(0)
    # sbatch never took it, so the claim was given back (a later requeue, with node2 back, may try again)
    assert not (log.with_suffix("") / "requeue.json").exists()
    record = json.loads((log.with_suffix("") / "requeue.failed.json").read_text())
    assert record["decision"]["exclude"] == ["node2"] and record["decision"]["why"].startswith("node-fail")
    assert node_state(local_cluster, "node2") == "idle"


def test_a_nodelist_slurm_would_refuse_costs_only_the_blamed_host(tmp_path):
    """A log whose JOB_NODELIST cannot be expanded (why8's `node[a-b]`) is still classified; it excludes no host."""
    text = job_log("srun: error: Node failure on node2\n", "CANCELLED", 143).replace("node[1-2]", "node[a-b]", 1)
    log = tmp_path / "500-tiny.log"
    log.write_text(text)
    found = requeue.outcome(logparse.load(log), text, tmp_path / "500-tiny")
    assert found is not None and found.reason


def rank_training_pid(job_id: str, rank: int) -> int:
    """The training process of node RANK; under RAY=1 a Ray actor's subprocess, not the driver that carries the
    same command in its arguments (`jobkit ray-launch ... -- <python> jobkit launch ...`)."""
    pids = [p for p in training_pids(job_id, rank) if b"\0ray-launch\0" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(pids) == 1, pids
    return pids[0]


@pytest.mark.slow
def test_ray_hang_of_a_two_node_job_on_three_nodes_is_requeued_without_the_frozen_node_and_resumes(
    local_cluster_3nodes,  # noqa: F811
    tmp_path,
):
    """The issue's requeue proof at full size (tests/run.sh slow; a 3-node cluster, ~8-12 minutes): RAY=1,
    MAX_RETRIES=1, checkpointing; a 2-node job's rank 1 is frozen (SIGSTOP) after a checkpoint. The watchdog
    takes both nodes' stacks, the hang is blamed on rank 1's node from them (stopped, T), and the job is
    requeued without that node: the next attempt runs on the two others, restores the checkpoint and passes.
    HANG_TIMEOUT=30 as in the quick tests: the default 300 s floor has its own proof in test_hang_cause.py."""
    cluster = local_cluster_3nodes
    assert cluster.nodes == ("node1", "node2", "node3")
    steps, period = 300, 10
    env = job_env(cluster, tmp_path / "ws", tmp_path / "jax_cache")
    env.update(HANG_TIMEOUT="30", HANG_STEP_FACTOR="5", MAX_RETRIES="1", RAY="1", TENSORBOARD="0")
    job_id, log = submit_job(
        env, "tiny:rq3:", "-N", "2", "--", f"steps={steps}", f"checkpoint_period={period}", *CHECKPOINTING
    )
    second, frozen = None, None
    try:
        nodes = wait_for(lambda: header(read(log)).get("NODELIST_EXPANDED"), 240, "the first attempt's header")
        first_nodes = nodes.split(",")
        wait_for(
            lambda: period in saved_steps(read(log)) or step_or_early_end(log, steps), 400, f"step {period} saved", 0.05
        )
        assert period in saved_steps(read(log)), "the run ended before its checkpoint was seen"
        frozen = rank_training_pid(job_id, 1)
        os.kill(frozen, signal.SIGSTOP)
        second, second_log = next_attempt(log, 300)
        wait_for(lambda: re.search(r"^ *Status: ", read(second_log), re.M), 400, "the second attempt's end")
    finally:
        cluster.run(["scancel", job_id, *([second] if second else [])], check=False)
        for pid in live_processes_of(job_id, TRAINING_CMDLINE) + (
            live_processes_of(second, TRAINING_CMDLINE) if second else []
        ):
            os.kill(pid, signal.SIGKILL)
    first_text, second_text = log.read_text(), second_log.read_text()
    blamed = first_nodes[1]  # rank 1's node (node2 when Slurm gives the first two, as an idle cluster does)
    hang_line = re.search(r"^\d: == HANG detected \(phase training, last step \d+, \d+ s since\) ==$", first_text, re.M)
    assert hang_line, first_text[-4000:]
    print(hang_line.group(0))  # for the record (pytest -s)
    assert re.search(r"Status: HANG \(exit \d+\) — phase training", first_text), first_text[-3000:]
    hang = log.with_suffix("") / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == sorted(f"{n}.txt" for n in first_nodes), first_text[-3000:]
    for name in first_nodes:
        state = re.search(r"^pid \d+, state .*$", (hang / f"{name}.txt").read_text(), re.M)
        print(f"{name}.txt: {state.group(0) if state else (hang / f'{name}.txt').read_text()[:300]}")
    assert f"pid {frozen}, state T (stopped)" in (hang / f"{blamed}.txt").read_text()
    requeued = re.search(rf"^== REQUEUED as job {second} \(attempt 2 of 2\): hang.*==$", first_text, re.M)
    assert requeued and f"; excluding {blamed} [catalogue entry " in requeued.group(0), first_text[-3000:]
    print(requeued.group(0))
    record = json.loads((log.with_suffix("") / "requeue.json").read_text())
    assert record["decision"]["exclude"] == [blamed], record
    why = subprocess.run([JOBKIT, "why", str(log)], capture_output=True, text=True, timeout=60, env=env)
    print(why.stdout)
    assert "  host: " + blamed in why.stdout.splitlines(), why.stdout + why.stderr
    assert re.search(
        rf"^  blamed because: stacks: {blamed}'s training \(rank 1, pid {frozen}\) is stopped \(T\)", why.stdout, re.M
    )
    # The second attempt: on the two nodes left, from the first attempt's last checkpoint, to the end.
    head = header(second_text)
    assert (head["ATTEMPT"], head["RETRY_OF"], head["REQUEUE_EXCLUDE"]) == ("2", job_id, blamed), head
    second_nodes = head["NODELIST_EXPANDED"].split(",")
    assert blamed not in second_nodes and sorted(second_nodes) == sorted(set(cluster.nodes) - {blamed}), head
    # The last save of attempt 1, which may come after the HANG: the watchdog's stop sends TERM then CONT, and the
    # woken ranks can run on to their next checkpoint step and save it together before stopping (seen: step 20).
    saved = max(saved_steps(first_text))
    restore = re.search(rf"^.*restoring from this run's directory step {saved}.*$", second_text, re.M)
    assert restore, second_text[-3000:]
    print(f"attempt 2 on {head['NODELIST_EXPANDED']}: {restore.group(0)}")
    resumed = rank0_steps(second_text)
    assert saved <= resumed[0] <= saved + 1 and resumed[-1] == steps - 1, (saved, resumed[:3], resumed[-3:])
    success = re.search(r"^ *Status: SUCCESS \(exit 0\).*$", second_text, re.M)
    assert success, second_text[-3000:]
    print(success.group(0))
    wait_for(lambda: not live_processes_of(job_id) and not live_processes_of(second), 60, "both attempts gone")
