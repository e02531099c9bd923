"""`jobkit` commands through click's CliRunner (and once for real, through the venv's console script)."""

import json
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS, REPO, TOOLS

from jobkit import cli
from jobkit.core import failures
from jobkit.core.errors import EXIT_NO_STEPS, EXIT_NOT_A_LOG
from jobkit.launch import peaks

MFU_LOG = str(JOBKIT_LOGS / "launch-tiny-20steps-mfu.log")
BAD_KEY_LOG = str(JOBKIT_LOGS / "launch-config-error-no_such_key.log")
LINE_RE = re.compile(r"tiny 1N \(job local_20261122_054800_ab12\): [\d,]+ TGS/device, [\d.]+% MFU — PASS\n")


def run(*args):
    return CliRunner().invoke(cli.main, list(args))


def test_line_pass():
    r = run("tgs", "--line", MFU_LOG, "--status", "SUCCESS", "--exit-code", "0")
    assert r.exit_code == 0
    assert LINE_RE.fullmatch(r.stdout), r.stdout


def test_line_failed_uses_classifier():
    r = run("tgs", "--line", BAD_KEY_LOG, "--status", "FAILED", "--exit-code", "1")
    assert r.exit_code == 0
    assert r.stdout == "tiny 1N (job local_20261122_055000_ef56): TGS n/a (no step lines) — FAIL (config-error)\n"


def test_line_cancelled():
    r = run("tgs", "--line", MFU_LOG, "--status", "cancelled")
    assert r.stdout.rstrip().endswith("— FAIL (cancelled)")


def test_line_stopped_early_is_never_pass(tmp_path):
    log = FIXTURES / "joblog" / "preempted-2node-sigterm.log"
    r = run("tgs", "--line", str(log), "--status", "STOPPED", "--exit-code", "0")
    assert r.exit_code == 0
    assert re.fullmatch(
        r"tiny 2N \(job 31\): [\d,]+ TGS/device(?: \(\d+/10 steady steps\))? — STOPPED early \(not a full run; see the JOB SUMMARY\)\n",
        r.stdout,
    )
    # The same from the footer the launcher writes.
    footer = tmp_path / "job.log"
    footer.write_text(
        log.read_text() + "==== JOB SUMMARY ====\n  Status: STOPPED (exit 0) — Job received termination signal\n"
    )
    assert "PASS" not in run("tgs", "--line", str(footer)).stdout


def test_line_status_from_exit_code_and_footer(tmp_path):
    assert run("tgs", "--line", MFU_LOG, "--exit-code", "0").stdout.rstrip().endswith("— PASS")
    assert run("tgs", "--line", MFU_LOG).stdout.rstrip().endswith("— status unknown")
    log = tmp_path / "with-footer.log"
    log.write_text(open(MFU_LOG).read() + "==== JOB SUMMARY ====\n  Status: FAILED (exit 137)\n=====\n")
    assert run("tgs", "--line", str(log)).stdout.rstrip().endswith("— FAIL (killed-by-signal)")


def test_table():
    r = run("tgs", MFU_LOG)
    assert r.exit_code == 0
    assert re.search(r"^steady\s+5-14\s+10\s", r.stdout, re.M)
    assert "TGS (steady mean):" in r.stdout


def test_json_and_custom_steady():
    r = run("tgs", MFU_LOG, "--json", "--steady", "10:19")
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["steady_window"] == [10, 19]
    assert d["windows"]["steady"]["range"] == [10, 19]
    assert d["windows"]["tail"]["n"] == 0
    assert d["nnodes"] == 1 and d["model"] == "tiny"


def test_missing_file():
    r = run("tgs", "/nonexistent/x.log")
    assert r.exit_code == 1
    assert r.stderr == "jobkit tgs: no such log file: /nonexistent/x.log\n"


def test_directory_says_what_to_pass(tmp_path):
    r = run("tgs", str(tmp_path))
    assert r.exit_code == 1
    assert r.stderr == f"jobkit tgs: {tmp_path} is a directory, not a log file; pass a job log, " + (
        "<JOB_WORKSPACE>/<JOB_ID>-<JOB_NAME>.log (or a job dir's log link)\n"
    )
    job_dir = tmp_path / "local_1-JAX-tiny"
    job_dir.mkdir()
    (tmp_path / "local_1-JAX-tiny.log").write_text(open(MFU_LOG).read())
    (job_dir / "log").symlink_to("../local_1-JAX-tiny.log")
    r = run("tgs", str(job_dir))
    assert (
        r.stderr
        == f"jobkit tgs: {job_dir} is a directory, not a log file; for this job dir pass its log: {job_dir}/log\n"
    )
    assert run("tgs", str(job_dir / "log")).exit_code == 0
    r = run("why", str(tmp_path))
    assert r.exit_code == 1
    assert r.stderr.startswith(f"jobkit why: {tmp_path} is a directory") and r.stderr.count("\n") == 1
    assert f"e.g. the newest: {tmp_path}/local_1-JAX-tiny.log" in r.stderr


def test_node_count_that_is_not_a_number(tmp_path):
    log = tmp_path / "bad.log"
    log.write_text(open(MFU_LOG).read().replace("NNODES=1\n", "NNODES=abc\n"))
    r = run("tgs", str(log))
    assert r.exit_code == EXIT_NOT_A_LOG
    assert "header line NNODES='abc' is not a number of nodes" in r.stderr and r.stderr.count("\n") == 1
    assert "no NNODES= header" not in r.stderr


def test_non_finite_steps_are_reported_not_a_traceback(tmp_path):
    text = open(MFU_LOG).read()
    text = re.sub(r"(completed step: 7,.*?Tokens/s/device: )[\d.]+", r"\g<1>inf", text)
    text = re.sub(r"(completed step: 9,.*?Tokens/s/device: )[\d.]+", r"\g<1>nan", text)
    log = tmp_path / "inf.log"
    log.write_text(text)
    r = run("tgs", str(log))
    assert r.exit_code == 0, r.output
    assert "(inf at 7, nan at 9); the steady mean uses the 8 finite one(s)" in r.stdout
    d = json.loads(run("tgs", "--json", str(log)).stdout)
    assert d["windows"]["steady"]["tgs"]["nonfinite"] == 2 and d["tgs"] is not None
    line = run("tgs", "--line", str(log), "--status", "SUCCESS").stdout
    assert "TGS/device (8/10 steady steps, 2 non-finite)" in line and line.endswith("— PASS\n")


def test_no_nnodes_header():
    r = run("tgs", str(FIXTURES / "logs" / "maxtext-cpu-tiny-20steps.log"))
    assert r.exit_code == EXIT_NOT_A_LOG  # tgs's own code for a file that is not a job log (its --help)
    assert "not a job log (no KEY=VALUE header with JOB_ID and NNODES)" in r.stderr and r.stderr.count("\n") == 1


def test_no_step_lines():
    r = run("tgs", BAD_KEY_LOG)
    assert r.exit_code == EXIT_NO_STEPS
    assert "no 'completed step' lines" in r.stderr and r.stderr.count("\n") == 1


def test_bad_steady_spec():
    r = run("tgs", MFU_LOG, "--steady", "14:5")
    assert r.exit_code != 0 and "FIRST <= LAST" in r.stderr


def test_mfu_detected(tool_path):
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-h100.txt")
    r = run("mfu")
    assert r.exit_code == 0
    assert "detected: NVIDIA H100 80GB HBM3 (via nvidia-smi) -> H100" in r.stdout
    assert "bf16=989.4" in r.stdout and "known accelerators" not in r.stdout


def test_mfu_nothing_detected_lists_table(tool_path, clean_env):
    r = run("mfu")
    assert r.exit_code == 0
    assert "no known accelerator detected" in r.stdout
    for model in peaks.PEAK_TFLOPS:
        assert re.search(rf"^  {re.escape(model)}\s+bf16=", r.stdout, re.M), model


def test_why():
    r = run("why", str(JOBKIT_LOGS / "maxtext-rank0-deadline-exceeded.log"), "--exit-code", "134")
    assert r.stdout.splitlines()[0] == "distributed-timeout"
    assert "Coordination service agent failed to register" in r.stdout


def test_console_script_entry_point():
    # The venv's `jobkit` (what the launchers run at the end of a job), installed next to this interpreter.
    jobkit = Path(sys.executable).parent / "jobkit"
    done = subprocess.run(
        [str(jobkit), "tgs", "--line", MFU_LOG, "--status", "SUCCESS"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert LINE_RE.fullmatch(done.stdout)


def test_triage_skill_names_every_failure_class_and_runs_jobkit_from_the_venv():
    text = (REPO / "skills" / "run-and-triage" / "SKILL.md").read_text()
    table = {
        name.strip().strip("`") for row in re.findall(r"^\| ([a-z][a-z, -]*) \|", text, re.M) for name in row.split(",")
    }
    classes = {reason for reason, _ in failures.RULES} | {"cancelled", "no-steps", "unknown"}
    assert classes - table == set(), "failure classes missing from the skill's table"
    # Every command line that runs jobkit runs the venv's console script, with nothing in front of it.
    runs = [line for line in text.splitlines() if "jobkit " in line and not line.startswith(("|", "`"))]
    assert runs and all(line.startswith(".venv/bin/jobkit ") for line in runs), runs
    used = set(re.findall(r"\.venv/bin/jobkit ([a-z][a-z-]*)", text))
    assert used and used <= set(cli.main.list_commands(None))
