"""Failure classification on recorded failing runs, and rule order."""

import pytest
from conftest import JOBKIT_LOGS

from jobkit import failures


def classify_file(name, **kw):
    return failures.classify(failures.read_tail(JOBKIT_LOGS / name), **kw)


def test_real_config_error():
    found = classify_file("launch-config-error-no_such_key.log", exit_code=1)
    assert found.reason == "config-error"
    assert "MAXTEXT CONFIG ERROR: 'no_such_key' not in" in found.evidence


def test_real_coordination_deadline_beats_the_abort_it_causes():
    found = classify_file("maxtext-rank0-deadline-exceeded.log", exit_code=134)
    assert found.reason == "distributed-timeout"


def test_real_unknown_xla_flag():
    found = classify_file("maxtext-xla-unknown-flag.log", exit_code=1)
    assert found.reason == "unknown-xla-flag"
    assert "--xla_no_such_flag" in found.evidence


def test_killed_run_with_steps_uses_the_exit_code():
    found = classify_file("launch-tiny-3steps-mfu.log", status="FAILED", exit_code=137)
    assert (found.reason, found.detail) == ("killed-by-signal", "SIGKILL")


@pytest.mark.parametrize(
    "kw", [{"status": "CANCELLED"}, {"status": "cancelled", "exit_code": 0}, {"exit_code": 130}, {"exit_code": 143}]
)
def test_cancelled(kw):
    assert classify_file("launch-tiny-20steps-mfu.log", **kw).reason == "cancelled"


def test_slurm_time_limit_and_scancel_lines():
    t = "slurmstepd: error: *** JOB 4242 ON node01 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n"
    assert failures.classify(t).reason == "time-limit"
    t = "slurmstepd: error: *** STEP 4242.0 ON node01 CANCELLED AT 2026-01-01T00:00:00 ***\n"
    assert failures.classify(t).reason == "cancelled"


def test_oom_inside_a_traceback_is_oom():
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 1, in <module>\n'
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 25769803776 bytes.\n"
    )
    assert failures.classify(text).reason == "oom"


def test_collective_error():
    text = "0: jaxlib.xla_extension.XlaRuntimeError: INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:297: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled system error\n"
    assert failures.classify(text).reason == "collective-error"
    assert failures.classify("RCCL error: remote process exited\n").reason == "collective-error"


def test_python_exception_names_the_type():
    text = "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    f()\nKeyError: 'tokens'\n"
    found = failures.classify(text, exit_code=1)
    assert found.label == "python-exception: KeyError"


def test_no_steps_and_unknown():
    assert failures.classify("JOB_ID=x\nNNODES=1\n", exit_code=1).reason == "no-steps"
    assert failures.classify("completed step: 3, seconds: 1\n", exit_code=1).label == "unknown: exit 1"


def test_rule_order_is_the_table_order():
    reasons = [r for r, _ in failures.RULES]
    assert reasons.index("oom") < reasons.index("python-exception")
    assert reasons.index("distributed-timeout") < reasons.index("killed-by-signal")
    assert reasons.index("config-error") < reasons.index("python-exception")


def test_read_tail_is_bounded(tmp_path):
    big = tmp_path / "big.log"
    big.write_text("x" * 1000 + "END")
    assert failures.read_tail(big, 10) == "xxxxxxxEND"
