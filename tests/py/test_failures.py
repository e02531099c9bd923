"""Failure classification on recorded failing runs, and rule order."""

from pathlib import Path

import pytest
from conftest import JOBKIT_LOGS

from jobkit.core import failures


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


FAILURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"
NODES = ["node1", "node2"]


@pytest.mark.parametrize(
    ("name", "status", "exit_code", "reason", "host"),
    [
        ("rocm-queue-abort-hsa-exception.log", "FAILED", 134, "gpu-hardware", "node2"),
        ("rocm-memory-access-fault.log", "FAILED", 134, "gpu-hardware", "node1"),
        ("nvidia-xid-fallen-off-the-bus.log", "FAILED", 1, "gpu-hardware", "node2"),
        ("cuda-uncorrectable-ecc.log", "FAILED", 1, "gpu-hardware", "node1"),
        ("slurm-node-failure.log", "CANCELLED", 143, "node-fail", "node2"),
        ("slurm-preemption.log", "CANCELLED", 143, "preempted", ""),
        ("nccl-ib-completion-error.log", "FAILED", 1, "collective-error", "node2"),
        ("nccl-ib-completion-error-old-format.log", "FAILED", 1, "collective-error", "node1"),
        ("disk-full.log", "FAILED", 1, "disk-full", "node1"),
        ("maxtext-ici-parallelism-mismatch.log", "FAILED", 1, "config-error", ""),
        ("maxtext-parallelism-no-traceback.log", "FAILED", 1, "config-error", "node2"),
        ("jax-heartbeat-unhealthy-task.log", "FAILED", 1, "distributed-timeout", "node2"),
        ("python-segfault-core-dump.log", "FAILED", 139, "killed-by-signal", "vm"),  # the tier names its host
    ],
)
def test_recorded_cluster_failures_are_classed_with_the_host_they_blame(name, status, exit_code, reason, host):
    text = (FAILURES / name).read_text()
    found = failures.classify(text, status, exit_code, nodes=NODES)
    assert (found.reason, found.host) == (reason, host), found
    # The evidence is the deciding line itself (cut with "..." when long).
    assert found.evidence.strip(".")[:60] in text, found.evidence


def test_every_failure_fixture_is_in_the_table():
    listed = {
        line.split("`")[1] for line in (FAILURES / "README.md").read_text().splitlines() if line.startswith("| `")
    }
    on_disk = {p.name for p in FAILURES.glob("*.log")}
    assert listed == on_disk


def test_a_scheduler_ending_wins_over_the_cancelled_status_but_a_plain_cancel_stays_cancelled():
    text = (FAILURES / "slurm-preemption.log").read_text()
    assert failures.classify(text, "CANCELLED", 143).reason == "preempted"
    plain = "slurmstepd: error: *** JOB 4244 ON node1 CANCELLED AT 2026-11-24T03:12:45 ***\n"
    assert failures.classify(plain, "CANCELLED", 143).reason == "cancelled"


def test_why_prints_the_blamed_host(tmp_path):
    from click.testing import CliRunner

    from jobkit.cli import main

    log = tmp_path / "job.log"
    header = "JOB_ID=7\nJOB_NAME=JAX-tiny\nNNODES=2\nJOB_NODELIST=gpu[07-08]\nMODEL_NAME=tiny\n"
    log.write_text(header + (FAILURES / "rocm-queue-abort-hsa-exception.log").read_text())
    result = CliRunner().invoke(main, ["why", str(log), "--status", "FAILED", "--exit-code", "134"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "gpu-hardware"
    assert "HSA_STATUS_ERROR_EXCEPTION" in lines[1]
    assert lines[2] == "  host: gpu08"


# ------------------------------------------------------------------------------------- core dumps (COREDUMP=1)

SEGFAULT = (FAILURES / "python-segfault-core-dump.log").read_text()
LOGGED_CORE = "/tmp/cdt/ws/local_20261124_073219_6b48-JAX-tiny-steps_100000/cores/core.vm.jobkit.20669"
JOB_HEADER = "JOB_ID=local_1\nJOB_NAME=JAX-tiny\nNNODES=1\nJOB_NODELIST=vm\nMODEL_NAME=tiny\n"


def why(log, *args):
    from click.testing import CliRunner

    from jobkit.cli import main

    result = CliRunner().invoke(main, ["why", str(log), *args])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_the_signal_comes_from_the_message_or_the_training_tier_line_when_the_exit_code_does_not_say():
    assert failures.classify(SEGFAULT, "FAILED", 1).detail == "SIGSEGV"  # faulthandler's words
    tier_only = "3: [coredump] training killed by SIGBUS (exit 135) on node4\n"
    found = failures.classify(tier_only, "FAILED", 1, nodes=["n1", "n2", "n3", "node4"])
    assert (found.reason, found.detail, found.host) == ("killed-by-signal", "SIGBUS", "node4")
    assert failures.classify("Fatal Python error: Aborted\n", "FAILED", 1).detail == "SIGABRT"


def test_why_names_the_signal_and_the_core_the_log_names_with_the_commands_to_open_it(tmp_path):
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER + SEGFAULT.replace("/tmp/cdt/ws/", f"{tmp_path}/gone/"))
    core = LOGGED_CORE.replace("/tmp/cdt/ws/", f"{tmp_path}/gone/")
    lines = why(log)  # no --exit-code: the JOB SUMMARY's exit 139 and the message say SIGSEGV
    assert lines[0] == "killed-by-signal: SIGSEGV"
    assert lines[1] == "  evidence: Fatal Python error: Segmentation fault"
    assert lines[2:4] == ["  host: vm", "  blamed because: the training tier names it"]
    advice = next(s.advice for s in failures.load_catalogue().signatures if s.id == "killed-by-signal")
    assert lines[4:6] == ["  retry: retry", f"  advice: {advice}"]
    assert lines[6].startswith("  signature: killed-by-signal (cpython ")
    gdb = "gdb -batch -ex 'thread apply all bt' /work/main/.venv/bin/python3"
    assert lines[7:] == [
        f"  core: {core} (667MiB) (not on this machine)",
        f"    native stacks: {gdb} {core}",
        f"    python stacks: py-spy dump --core {core}",
    ]


def test_why_finds_the_core_in_the_job_dir_by_its_name_when_the_logged_path_is_elsewhere(tmp_path):
    # A container logs /outputs/...; the job dir beside the log holds the same file.
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER + SEGFAULT.replace("/tmp/cdt/ws/", "/outputs/"))
    cores = tmp_path / "local_1-JAX-tiny" / "cores"
    cores.mkdir(parents=True)
    (cores / "core.vm.jobkit.20669").write_bytes(b"\0" * 2048)
    (cores / "core.vm.python3.777").write_bytes(b"\0" * 10)  # another core no line names: listed too
    lines = why(log)
    assert f"  core: {cores}/core.vm.jobkit.20669 (667MiB)" in lines
    assert f"    python stacks: py-spy dump --core {cores}/core.vm.python3.777" in lines
    assert f"  core: {cores}/core.vm.python3.777 (10B)" in lines


def test_why_without_a_core_says_where_the_node_sends_cores(tmp_path):
    log = tmp_path / "local_2-JAX-tiny.log"
    text = SEGFAULT.replace(
        f"== CORE DUMP {LOGGED_CORE} (667MiB) ==",
        "== NO CORE DUMP (SIGSEGV) on vm: cores go to systemd-coredump on vm: coredumpctl list; "
        "coredumpctl info 20669; coredumpctl debug 20669; core limit unlimited ==",
    )
    log.write_text(JOB_HEADER + text)
    lines = why(log)
    assert lines[0] == "killed-by-signal: SIGSEGV"
    assert lines[-1] == (
        "  core: none found; cores go to systemd-coredump on vm: coredumpctl list; coredumpctl info 20669; "
        "coredumpctl debug 20669"
    )


def test_why_without_coredump_lines_says_how_to_keep_a_core_and_stays_quiet_for_other_failures(tmp_path):
    log = tmp_path / "local_3-JAX-tiny.log"
    log.write_text(JOB_HEADER + "Fatal Python error: Aborted\n==== JOB SUMMARY ====\n  Status: FAILED (exit 134)\n")
    lines = why(log)
    assert lines[0] == "killed-by-signal: SIGABRT"
    assert (
        lines[-1]
        == f"  core: none kept (COREDUMP=0); run again with COREDUMP=1 to keep one in {tmp_path}/local_3-JAX-tiny/cores/"
    )
    log.write_text(JOB_HEADER + "Traceback (most recent call last):\nValueError: x\n")
    lines = why(log, "--exit-code", "1")
    assert lines[:2] == ["python-exception: ValueError", "  evidence: Traceback (most recent call last):"]
    assert not any(line.startswith("  core: ") for line in lines)  # quiet about cores for other failures


def test_why_lists_each_ranks_core_of_a_multi_node_job_and_blames_the_first_crash(tmp_path):
    log = tmp_path / "4242-JAX-tiny.log"
    header = "JOB_ID=4242\nJOB_NAME=JAX-tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\n"
    log.write_text(
        header + "0: [coredump] executable: /opt/venv/bin/python3\n"
        "1: [coredump] training killed by SIGABRT (exit 134) on node2\n"
        "1: == CORE DUMP /ws/4242-JAX-tiny/cores/core.node2.jobkit.11 (2.0GiB) ==\n"
        "0: [coredump] training killed by SIGABRT (exit 134) on node1\n"
        "0: == CORE DUMP /ws/4242-JAX-tiny/cores/core.node1.jobkit.10 (2.1GiB) ==\n"
    )
    lines = why(log, "--status", "FAILED", "--exit-code", "1")
    assert lines[:3] == [
        "killed-by-signal: SIGABRT",
        "  evidence: 1: [coredump] training killed by SIGABRT (exit 134) on node2",
        "  host: node2",
    ]
    assert lines[3] == "  blamed because: the training tier names it; the first of 2 hosts to report it (log order)"
    assert "  followers: node1 (failed or were stopped after it)" in lines
    assert [line for line in lines if line.startswith("  core: ")] == [
        "  core: /ws/4242-JAX-tiny/cores/core.node2.jobkit.11 (2.0GiB) (not on this machine)",
        "  core: /ws/4242-JAX-tiny/cores/core.node1.jobkit.10 (2.1GiB) (not on this machine)",
    ]
    native = lines.index("  core: /ws/4242-JAX-tiny/cores/core.node2.jobkit.11 (2.0GiB) (not on this machine)") + 1
    assert "    native stacks: gdb -batch -ex 'thread apply all bt' /opt/venv/bin/python3 " in lines[native]


# ------------------------------------------------------------------------------- bad input (round 2)


def why_result(*args):
    from click.testing import CliRunner

    from jobkit.cli import main

    return CliRunner().invoke(main, ["why", *map(str, args)])


SUCCESS_SUMMARY = "==== JOB SUMMARY ====\n  Status: SUCCESS (exit 0)\n=====================\n"
STEPS = "".join(
    f"I1124 07:31:0{n}.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, loss: 5.9\n" for n in range(3)
)


@pytest.mark.parametrize("data", [bytes(range(256)) * 16, b"", b"just some text\n"], ids=["random", "empty", "text"])
def test_why_refuses_a_file_that_is_not_a_job_log(tmp_path, data):
    log = tmp_path / "x.log"
    log.write_bytes(data)
    result = why_result(log)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"jobkit why: {log}: not a job log (no KEY=VALUE header with JOB_ID and NNODES); "
        "give a log written by submit.sh or run_local.sh\n"
    )


def test_why_classifies_a_log_whose_nodelist_it_cannot_expand_and_says_so(tmp_path):
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER.replace("JOB_NODELIST=vm", "JOB_NODELIST=node[a-b]") + SEGFAULT)
    result = why_result(log)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "killed-by-signal: SIGSEGV"
    assert result.stderr.startswith(f"jobkit why: {log}: JOB_NODELIST=node[a-b] cannot be expanded (")
    assert result.stderr.endswith("); no host is named by rank\n") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("code", ["99999999999999999999", "-9", "256"])
def test_why_exit_code_must_be_0_to_255(tmp_path, code):
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER + SEGFAULT)
    result = why_result(log, "--exit-code", code)
    assert result.exit_code == 2
    assert "Invalid value for '--exit-code'" in result.stderr and "0<=x<=255" in result.stderr
    assert result.stdout == ""


def test_why_on_a_successful_run_says_there_is_nothing_to_classify(tmp_path):
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER + STEPS + SUCCESS_SUMMARY)
    for args in ([], ["--status", "success"], ["--exit-code", "0"], ["--status", "SUCCESS", "--exit-code", "0"]):
        result = why_result(log, *args)
        assert (result.exit_code, result.output) == (0, "succeeded: nothing to classify\n"), args
    # The caller's word wins over the summary's: a run called failed is classified.
    result = why_result(log, "--status", "FAILED", "--exit-code", "1")
    assert result.exit_code == 0 and result.output == "unknown: exit 1\n  retry: never\n"


def test_why_on_a_log_without_a_job_summary_says_it_is_incomplete(tmp_path):
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(JOB_HEADER + STEPS + "I1124 07:31:04.000000 1 metric_logger.py:265] completed st")  # cut short
    incomplete = "the log has no JOB SUMMARY: the job is still running, or it died without writing one"
    result = why_result(log)
    assert (result.exit_code, result.output) == (0, f"incomplete: {incomplete}\n")
    # A cause in the log is still named, with the note.
    log.write_text(JOB_HEADER + STEPS + "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n")
    lines = why_result(log).output.splitlines()
    assert lines[0] == "oom" and lines[-1] == f"  note: {incomplete}"
    # Told how it ended, why classifies as before.
    assert why_result(log, "--exit-code", "1").output.splitlines()[0] == "oom"


def test_a_launcher_refusal_before_training_is_a_config_error_with_its_line(tmp_path):
    refusal = (
        "[train_env] ERROR: TUNE_PROFILE_FILE=nosuch.profile: no readable file at /ws/nosuch.profile; "
        "give an existing profile file (relative paths start at JOB_WORKSPACE)"
    )
    log = tmp_path / "local_1-JAX-tiny.log"
    log.write_text(
        JOB_HEADER + "== Training BEGIN ==\n" + refusal + "\n== Training FAILED (exit=1, 0s) ==\n"
        "==== JOB SUMMARY ====\n  Status: FAILED (exit 1)\n=====================\n"
    )
    result = why_result(log)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:2] == ["config-error", f"  evidence: {refusal}"]
    die = "_train.sh: no config for model 'nosuch' (/repo/configs/nosuch.yml); pick one of configs/*.yml"
    assert failures.classify(f"0: {die}\n", "FAILED", 2).reason == "config-error"
    # Only at the start of a line: a quoted mention elsewhere is not the launcher refusing.
    assert failures.classify("echo '[train_env] ERROR: x'\n", "FAILED", 1).reason != "config-error"


# ------------------------------------------------------------------------ the catalogue (configs/failure_signatures.yaml)

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_failure_class_table_is_the_catalogue():
    """The table lives on the diagnosis page (it moved there from the README when the docs were split)."""
    page = (REPO / "docs" / "diagnosis.md").read_text()
    table = failures.markdown_table()
    assert table in page, "docs/diagnosis.md's failure-class table differs from the catalogue; paste:\n" + table


def test_every_entry_names_its_source_retry_policy_and_advice():
    catalogue = failures.load_catalogue(local=None)
    assert len(catalogue.signatures) >= 40
    for sig in catalogue.signatures:
        assert sig.source and sig.advice and sig.retry in failures.RETRY_POLICIES, sig.id
    # The seeds' xla-tuning failure table: each row has an entry (its signature text classifies).
    rows = {
        "0: jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: GetKeyValue() timed out with key: x\n": "distributed-timeout",
        "0: F1124 parse_flags_from_env.cc:234] Unknown flags in XLA_FLAGS: --xla_foo\n": "unknown-xla-flag",
        "0: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 GiB\n": "oom",
        "srun: error: Node failure on node2\n": "node-fail",
        "1: ionic_comp_msn cqe with error\n": "collective-error",
        "1: HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception.\n": "gpu-hardware",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM Killed.\n": "oom",
        "_container.sh: DOCKER_IMAGE=/x.tar is not a file; point it at an image tarball or set an image name\n": "image-pull",
        "srun: error: Unable to confirm allocation for job 7: Unable to contact slurm controller (connect failure)\n": (
            "controller-down"
        ),
        "fatal: unable to access 'https://github.com/x/y.git/': The requested URL returned error: 500\n": "source-checkout",
    }
    for line, cls in rows.items():
        assert failures.classify(line, "FAILED", 1).reason == cls, line


@pytest.mark.parametrize(
    ("cls", "policy"),
    [
        ("gpu-hardware", "retry-without-node"),
        ("node-fail", "retry-without-node"),
        ("no-gpu", "retry-without-node"),  # its first entry; a CPU-only jaxlib's entry is never
        ("preflight-failed", "retry-without-node"),
        ("distributed-timeout", "retry-without-node"),  # the heartbeat entry comes first
        ("hang", "retry"),
        ("time-limit", "retry"),
        ("preempted", "retry"),
        ("stage-timeout", "retry"),
        ("image-pull", "retry"),
        ("source-checkout", "retry"),
        ("controller-down", "retry"),
        ("killed-by-signal", "retry"),
        ("oom", "never"),
        ("config-error", "never"),
        ("unknown-xla-flag", "never"),
        ("python-exception", "never"),
        ("cleanup-after-success", "never"),
        ("step-refused", "never"),
        ("cancelled", "never"),
        ("unknown", "never"),
        ("no-such-class", "never"),
    ],
)
def test_retry_policy_of_a_class_comes_from_its_first_catalogue_entry(cls, policy):
    """What requeue and sweeps use where only the class is known."""
    assert failures.retry_policy(cls) == policy


def test_a_config_error_is_never_retried_by_any_entry():
    """Another attempt with the same settings fails the same way, whatever entry matched."""
    for sig in failures.load_catalogue().signatures:
        if sig.cls in ("config-error", "unknown-xla-flag", "oom", "step-refused", "cleanup-after-success"):
            assert sig.retry == "never", sig.id


def _die_messages() -> list[str]:
    """Every `_die "..."` message of our tiers, as its program prints it (variables filled with a word)."""
    import re

    out = []
    for name in ("_job.sbatch", "_container.sh", "_train.sh"):
        text = (REPO / name).read_text()
        for msg in re.findall(r'_die "((?:[^"\\]|\\.)*)"', text):
            msg = re.sub(r"\$\([^)]*\)|\$\{[^}]*\}|\$\w+", "x", msg)
            out.append(f"{name}: {msg}")
    return out


OUR_MARKERS = [
    "== Training TIMEOUT (3600s/3600s) 2026-11-25T21:21:26Z ==",
    "== Preflight FAILED (exit=1, 3s) 2026-11-25T21:21:26Z ==",
    "0: == HANG detected (phase training, last step 4, 9 s since) ==",
    "== TIME LIMIT near (Slurm's warning, 300s ahead): training stops after saving a checkpoint (120s allowed) ==",
    "1: == NO CORE DUMP (SIGSEGV) on node2: cores go to systemd-coredump on node2: coredumpctl list; core limit 0 ==",
    "[job] oom-kill: the kernel's OOM killer ended 1 process(es) of this job (memory cgroup limit reached)",
    "1: [preflight node2] FATAL: JOB_WORKSPACE=/ws is not writable",
    "_job.sbatch: refusing to run: the snapshot changed",
]


@pytest.mark.parametrize("line", OUR_MARKERS + _die_messages())
def test_a_line_our_tiers_write_to_end_a_job_is_never_unknown(line):
    found = failures.classify(line + "\n", "FAILED", 1, has_steps=True, nodes=NODES)
    assert found.reason not in ("unknown", "no-steps"), found
    assert found.signature, found


def test_die_messages_were_found():
    assert len(_die_messages()) >= 15


def test_a_site_local_file_overrides_disables_and_adds_entries(tmp_path, monkeypatch):
    local = tmp_path / "site.yaml"
    local.write_text(
        "signatures:\n"
        "  - id: device-oom\n    advice: 'ask #gpu-help first'\n"
        "  - id: nccl-error\n    disabled: true\n"
        "  - id: site-fabric-down\n    class: fabric-down\n    patterns: ['FABRIC DOWN on (\\S+)']\n"
        "    source: 'site fabric manager'\n    retry: retry-without-node\n    blame: line\n"
        "    advice: 'call the fabric on-call'\n    before: nccl-ib-completion-error\n"
        "benign:\n  - pattern: 'harmless site warning'\n"
    )
    monkeypatch.setenv("FAILURE_SIGNATURES_FILE", str(local))
    found = failures.classify("0: RESOURCE_EXHAUSTED: Out of memory\n", "FAILED", 1, nodes=NODES)
    assert (found.reason, found.advice, found.host) == ("oom", "ask #gpu-help first", "node1")
    assert failures.classify("RCCL error: remote process exited\n", "FAILED", 1).reason != "collective-error"
    found = failures.classify("1: FABRIC DOWN on spine3\n", "FAILED", 1, nodes=NODES)
    assert (found.reason, found.retry, found.host) == ("fabric-down", "retry-without-node", "node2")
    ids = [s.id for s in failures.load_catalogue().signatures]
    assert ids.index("site-fabric-down") == ids.index("nccl-ib-completion-error") - 1
    assert failures.classify("0: harmless site warning: out of memory\n", "FAILED", 1).reason != "oom"
    # Without the setting, a configs/failure_signatures.local.yaml beside the catalogue is read.
    monkeypatch.delenv("FAILURE_SIGNATURES_FILE")
    monkeypatch.setattr(failures, "LOCAL_CATALOGUE", local)
    assert failures.load_catalogue().files[-1] == str(local)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("signatures: [\n", "not a YAML catalogue at line 2"),
        ("- just a list\n", "not a catalogue (a mapping with a 'signatures:' list)"),
        (
            "signatures:\n  - id: device-oom\n    retry: maybe\n",
            "signature 1 (device-oom): retry 'maybe' is not one of",
        ),
        (
            "signatures:\n  - id: x-new\n    class: oom\n",
            "signature 1 (x-new): 'patterns' is missing; every entry names it",
        ),
        (
            "signatures:\n  - id: device-oom\n    patterns: ['(unclosed']\n",
            "signature 1 (device-oom): pattern '(unclosed' is not a regex",
        ),
        ("signatures:\n  - id: device-oom\n    colour: red\n", "signature 1 (device-oom): unknown key 'colour'"),
        (
            "signatures:\n  - id: nosuch\n    disabled: true\n",
            "signature 1 (nosuch): disables an id the catalogue does not have",
        ),
        ("signatures:\n  - {class: oom}\n", "signature 1: id must be a lower-case name"),
    ],
)
def test_a_bad_catalogue_is_one_line_naming_the_file_the_entry_and_the_fix(tmp_path, monkeypatch, text, said):
    local = tmp_path / "site.yaml"
    local.write_text(text)
    monkeypatch.setenv("FAILURE_SIGNATURES_FILE", str(local))
    with pytest.raises(failures.CatalogueError) as err:
        failures.classify("x\n", "FAILED", 1)
    message = err.value.format_message()
    assert message.startswith(f"{local}: ") and said in message, message
    assert "\n" not in message
    # At the CLI's edge: that one line, and exit 1.
    log = tmp_path / "job.log"
    log.write_text(JOB_HEADER + "x\n==== JOB SUMMARY ====\n  Status: FAILED (exit 1)\n")
    result = why_result(log)
    assert result.exit_code == 1 and result.stderr == f"jobkit failures: {message}\n" and result.stdout == ""


def test_a_duplicate_id_and_a_missing_setting_file_are_refused(tmp_path, monkeypatch):
    base = tmp_path / "base.yaml"
    entry = "  - {id: a, class: oom, patterns: [x], source: s, retry: never, blame: none, advice: a}\n"
    base.write_text("signatures:\n" + entry + entry)
    with pytest.raises(failures.CatalogueError, match=r"signature 2 \(a\): id used twice; rename one"):
        failures.load_catalogue(base, local=None)
    monkeypatch.setenv("FAILURE_SIGNATURES_FILE", str(tmp_path / "nope.yaml"))
    with pytest.raises(failures.CatalogueError, match="FAILURE_SIGNATURES_FILE=.*nope.yaml: no such file"):
        failures.load_catalogue()


def test_blame_goes_to_the_first_host_by_absl_time_and_the_others_are_followers():
    text = (
        "0: E1124 10:05:02.500000 1 c.cc:1] RESOURCE_EXHAUSTED: Out of memory\n"
        "1: E1124 10:05:01.100000 1 c.cc:1] RESOURCE_EXHAUSTED: Out of memory\n"
    )
    found = failures.classify(text, "FAILED", 1, nodes=NODES)
    assert (found.host, found.followers) == ("node2", ("node1",))
    assert "absl timestamps" in found.blame_how
    # Without timestamps on every line, log order decides.
    found = failures.classify(text.replace("1: E1124 10:05:01.100000 1 c.cc:1] ", "1: "), "FAILED", 1, nodes=NODES)
    assert found.host == "node1" and "log order" in found.blame_how


def test_srun_naming_the_node_blames_it_and_exit_143_of_the_peers_is_not_a_cancel():
    text = "srun: error: gpu03: task 2: Out Of Memory\nsrun: error: gpu01: task 0: Terminated\n"
    found = failures.classify(text, "FAILED", 143, nodes=["gpu01", "gpu02", "gpu03"])
    assert (found.reason, found.host, found.followers) == ("oom", "gpu03", ("gpu01",))
    assert found.blame_how == "srun names the node of task 2"
    step = "slurmstepd: error: *** STEP 7.0 ON gpu01 CANCELLED AT 2026-11-24T10:12:09 ***\n"
    found = failures.classify(step + "srun: error: gpu02: task 1: Exited with exit code 3\n", "FAILED", 143)
    assert found.reason != "cancelled" and found.host == "gpu02"
    assert failures.classify(step, "FAILED", 143).reason == "cancelled"  # no task failed first


def test_the_accused_task_is_read_in_each_format_and_never_the_reporter():
    head = "0: E1124 10:09:40.114211 1 coordination_service.cc:612] UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n"
    for accused in ("0: /job:jax_worker/replica:0/task:1\n", "0: 1\n"):
        assert failures.classify(head + accused, "FAILED", 1, nodes=NODES).host == "node2"
    # The next record (another rank's, or a new absl line) is not part of the message.
    assert failures.classify(head + "1: 0\n", "FAILED", 1, nodes=NODES).host == ""
    same_line = (
        "0: Task /job:jax_worker/replica:0/task:1 heartbeat timeout. This indicates that the remote task has failed\n"
    )
    assert failures.classify(same_line, "FAILED", 1, nodes=NODES).host == "node2"
