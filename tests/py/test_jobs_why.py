"""`jobkit jobs`' WHY column (issue 22): each job that did not succeed gets `jobkit why`'s class and blamed host,
`--why` and `--json` its retry decision and advice; a success or an early stop is `-`, a log that cannot be read
or classified `?` while the other rows go on. The logs are the failure corpus' (tests/fixtures/failures/corpus,
real message texts) copied into a temporary workspace under job-log names."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS
from test_heartbeat_failures import ACCUSE, HEADER, OWN_NOTICE, STEP, TEARDOWN

from jobkit.cli import main
from jobkit.core import failures
from jobkit.ops import jobs

CORPUS = FIXTURES / "failures" / "corpus"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text())["cases"]
# A few of every kind: a host found by timestamp, a hang, a NIC fault, a Slurm node failure, a cancel, a success
# with scary warnings, an early stop, and a failure with nobody to blame.
SOME = [
    "device-oom-rank1-first-by-timestamp",
    "hang-watchdog",
    "nccl-ib-completion-error-rank2",
    "slurm-node-failure-4node",
    "cancelled-by-scancel",
    "success-with-scary-warnings",
    "stopped-early-sigterm",
    "maxtext-config-error",
]


def run(*args):
    return CliRunner().invoke(main, list(args))


def why_json(log: Path) -> dict:
    result = run("why", "--json", str(log))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def whys_word(got: dict) -> str:
    """What the WHY column must say for `jobkit why --json`'s answer GOT."""
    if got.get("class") is None:  # succeeded, stopped early, or incomplete with no cause named
        return "-"
    return f"{got['class']}@{got['host']}" if got["host"] else got["class"]


def corpus_workspace(ws: Path, cases: list[str]) -> dict[str, Path]:
    """CASES' logs in WS as `<job id>-<case>.log`, oldest first; case -> log."""
    logs = {}
    for i, case in enumerate(cases):
        logs[case] = ws / f"{9000 + i}-{case}.log"
        shutil.copyfile(CORPUS / f"{case}.log", logs[case])
        os.utime(logs[case], (1_800_000_000 + i, 1_800_000_000 + i))  # the table's order: CASES'
    return logs


def test_every_corpus_log_gets_the_class_and_host_jobkit_why_gives(tmp_path):
    logs = corpus_workspace(tmp_path, sorted(EXPECTED))
    for case, log in logs.items():
        job = jobs.read_job(log, why=True)
        got = why_json(log)
        assert job.why == whys_word(got), case
        if job.why != "-":
            assert (job.failure["class"], job.failure["host"]) == (EXPECTED[case]["class"], EXPECTED[case]["host"])
            assert (job.failure["retry"], job.failure["advice"]) == (got["retry"], got["advice"]), case
        else:
            assert job.failure is None and job.status in ("SUCCESS", "STOPPED"), case


def test_the_table_shows_why_for_failed_jobs_only_and_why_adds_the_advice(tmp_path):
    logs = corpus_workspace(tmp_path, SOME)
    result = run("jobs", "--workspace", str(tmp_path), "--why")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[-1] == "WHY"
    rows = dict(zip(SOME, (line.split() for line in lines[1 : 1 + len(SOME)]), strict=True))
    for case, row in rows.items():
        expected = EXPECTED[case]
        if row[3] in ("SUCCESS", "STOPPED"):
            assert row[-1] == "-", case
        else:
            word = f"{expected['class']}@{expected['host']}" if expected["host"] else expected["class"]
            assert row[-1] == word, case
    assert rows["device-oom-rank1-first-by-timestamp"][-1] == "oom@gpu02"
    assert (rows["success-with-scary-warnings"][-1], rows["stopped-early-sigterm"][-1]) == ("-", "-")
    advice = lines[1 + len(SOME) :]
    failed = [case for case in SOME if rows[case][-1] != "-"]
    assert len(advice) == len(failed) >= 5
    for case, line in zip(failed, advice, strict=True):
        got = why_json(logs[case])
        assert line == f"{rows[case][0]}  {whys_word(got)}  retry: {got['retry']}  advice: {got['advice']}"
    plain = run("jobs", "--workspace", str(tmp_path))
    assert plain.stdout.splitlines() == lines[: 1 + len(SOME)], "the advice with --why only"


def test_json_carries_the_verdict_whole(tmp_path):
    logs = corpus_workspace(tmp_path, SOME)
    result = run("jobs", "--workspace", str(tmp_path), "--json")
    records = {r["log"]: r for r in map(json.loads, result.stdout.splitlines())}
    for case, log in logs.items():
        record, got = records[str(log)], why_json(log)
        if record["why"] == "-":
            assert record["failure"] is None and got["outcome"] in ("succeeded", "stopped-early"), case
            continue
        assert record["why"] == whys_word(got)
        for key in ("class", "detail", "host", "blamed_because", "retry", "advice", "evidence"):
            assert record["failure"][key] == got[key], (case, key)


def steps(first: int, count: int, ranks=(0, 1)) -> str:
    return "".join(STEP.format(r=r, s=n % 60, n=n) for n in range(first, first + count) for r in ranks)


@pytest.mark.parametrize(
    ("ranks_after", "own", "expected"),
    [
        ((0, 1), "", ("heartbeat-false-positive", "node2")),  # the accused rank 1 went on stepping: alive
        ((0,), "", ("task-died", "node2")),  # only rank 0 stepped: rank 1 was silent
        ((0,), OWN_NOTICE, ("heartbeat-false-positive", "node2")),
    ],
    ids=["accused-steps-after", "only-the-accuser-steps", "accused-own-notice"],
)
def test_thinning_the_steps_of_a_big_tail_keeps_whys_verdict(tmp_path, ranks_after, own, expected):
    # A big log's tail is mostly step lines; those between JAX's accusation and the teardown decide whether the
    # accused task was alive (a false positive) or silent (it died).
    text = (
        HEADER + steps(0, 6000) + ACCUSE + steps(6000, 300, ranks_after) + own + TEARDOWN
        + "srun: error: node2: task 1: Aborted (core dumped)\n"
        + "==== JOB SUMMARY ====\n  Status: FAILED (exit 134)\n=====================\n"
    )  # fmt: skip
    log = tmp_path / "500-tiny.log"
    log.write_text(text)
    assert len(text) > 1 << 20
    job = jobs.read_job(log, why=True)
    got = why_json(log)
    assert (got["class"], got["host"]) == expected, "the unthinned tail's verdict"
    assert job.why == f"{expected[0]}@{expected[1]}"
    assert job.failure["blamed_because"] == got["blamed_because"]
    thinned = jobs._thin_steps(failures.read_tail(str(log)))
    assert len(thinned) < len(text) // 50, "the step lines were cut"


def test_thinning_keeps_each_ranks_first_and_last_step_and_every_other_line():
    lines = ["a", "0: completed step: 1", "1: completed step: 1", "0: completed step: 2", "1: completed step: 2",
             "0: completed step: 3", "b", "completed step: 9", "completed step: 10", "completed step: 11"]  # fmt: skip
    assert jobs._thin_steps("\n".join(lines)).split("\n") == [
        "a", "0: completed step: 1", "1: completed step: 1", "1: completed step: 2", "0: completed step: 3", "b",
        "completed step: 9", "completed step: 11",
    ]  # fmt: skip


def test_no_catalogue_pattern_reads_a_step_line():
    # _thin_steps drops step lines: it is right only while no entry's pattern, `unless` or detail matches one.
    step_lines = [
        line
        for source in (JOBKIT_LOGS / "launch-tiny-20steps-mfu.log", JOBKIT_LOGS / "maxtext-2proc-srun-l.log")
        for line in source.read_text().splitlines()
        if "completed step:" in line
    ]
    assert len(step_lines) > 20
    text = "\n".join(step_lines) + "\n" + steps(0, 3)
    for sig in failures.load_catalogue().signatures:
        for pattern in (*sig.patterns, *sig.unless, *([sig.detail] if sig.detail else [])):
            assert not pattern.search(text), (sig.id, pattern.pattern)


def test_a_log_that_cannot_be_classified_says_so_once_and_the_others_go_on(tmp_path, monkeypatch):
    logs = corpus_workspace(tmp_path, SOME[:3])
    real = jobs.classify_job

    def classify_job(path, parsed, tail):
        if path == logs["hang-watchdog"]:
            raise OSError(errno.EIO, "Input/output error")
        return real(path, parsed, tail)

    monkeypatch.setattr(jobs, "classify_job", classify_job)
    result = run("jobs", "--workspace", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"jobkit jobs: cannot classify {logs['hang-watchdog']}: Input/output error; "
        f"jobkit why {logs['hang-watchdog']}; its WHY says ?\n"
    )
    whys = [line.split()[-1] for line in result.stdout.splitlines()[1:]]
    assert whys == ["oom@gpu02", "?", "collective-error@gpu03"]


def test_a_damaged_log_is_listed_with_what_why_says_of_it(tmp_path):
    logs = corpus_workspace(tmp_path, SOME[:1])
    damaged = tmp_path / "9100-damaged.log"  # a header, then binary garbage, then a FAILED summary
    damaged.write_bytes(
        b"JOB_ID=9100\nNNODES=2\n" + bytes(range(256)) * 400 + b"\x00" * 5000
        + b"\n==== JOB SUMMARY ====\n  Status: FAILED (exit 1)\n=====================\n"
    )  # fmt: skip
    result = run("jobs", "--workspace", str(tmp_path))
    assert result.exit_code == 0, result.output
    rows = {row[0]: row for row in (line.split() for line in result.stdout.splitlines()[1:])}
    assert rows[jobs.read_job(logs[SOME[0]]).job_id][-1] == "oom@gpu02"
    assert rows["9100"][-1] == whys_word(why_json(damaged)) != "-"


def test_a_bad_catalogue_is_one_line_and_the_table_goes_on(tmp_path, monkeypatch):
    corpus_workspace(tmp_path, SOME)
    local = tmp_path / "site.yaml"
    local.write_text("signatures: [\n")
    monkeypatch.setenv(failures.LOCAL_SETTING, str(local))
    result = run("jobs", "--workspace", str(tmp_path))
    assert result.exit_code == 0, result.output
    problems = result.stderr.splitlines()
    assert len(problems) == 1 and problems[0].startswith(f"jobkit jobs: {local}: ") and "?" in problems[0]
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert {r[3]: r[-1] for r in rows if r[3] in ("SUCCESS", "STOPPED")} == {"SUCCESS": "-", "STOPPED": "-"}
    assert {r[-1] for r in rows if r[3] not in ("SUCCESS", "STOPPED")} == {"?"}


def test_a_job_with_no_summary_is_classified_only_on_a_concrete_cause(tmp_path):
    running = tmp_path / "9200-running.log"
    running.write_text(HEADER.replace("JOB_ID=500", "JOB_ID=9200") + STEP.format(r=0, s=1, n=1))
    dead = tmp_path / "9201-dead.log"  # died without a summary: its NIC's error is in the log
    dead.write_text((CORPUS / "nccl-ib-completion-error-rank2.log").read_text().split("==== JOB SUMMARY")[0])
    records = [json.loads(line) for line in run("jobs", "--workspace", str(tmp_path), "--json").stdout.splitlines()]
    by_log = {r["log"]: r for r in records}
    assert by_log[str(running)]["status"] == "no summary" and by_log[str(running)]["why"] == "-"
    assert by_log[str(dead)]["why"] == "collective-error@gpu03" == whys_word(why_json(dead))
