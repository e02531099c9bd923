"""A JAX heartbeat kill told apart (issue 22 item 4): the accused task really died (it logged nothing after the
accusation: SIGKILL, frozen) or the accusation was a likely false positive (it logged its own coordination
error, or a step, before the job was torn down: it was alive); and a rank killed outright (SIGKILL) is
`task-died` on its node with the peers as followers. Logs in the shapes the real 2-node jobs print
(tests/py/test_failure_proofs.py makes them for real)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main
from jobkit.core import failures

HEADER = "JOB_ID=500\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\n"
STEP = "{r}: I1125 10:00:{s:02d}.000000 77 metric_logger.py:265] completed step: {n}, seconds: 0.1, loss: 5.9\n"
# JAX 0.12's own text (two local processes, rank 1 SIGSTOPped past a 10 s heartbeat): the coordination service
# on rank 0 propagates the error, then rank 0's client aborts; the accused task is the bare `1` on the next line.
TERMINATING = (
    "F1125 10:01:40.535807   30522 client.h:86] Terminating process because the JAX distributed service detected"
    " fatal errors. This most likely indicates that another task died; see the other task logs for more details."
    " Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status:"
    " UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n{r}: 1\n{r}: The tasks have"
    " crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug"
    " further.\n{r}: \n{r}: RPC: /xla.coordination.CoordinationService/PollForError"
    " [type.googleapis.com/tensorflow.CoordinationServiceError='']\n{r}: *** Check failure stack trace: ***\n"
)
ACCUSE = (
    "0: E1125 10:01:40.534589   30511 coordination_service.cc:1518] [6054702144334116172] Use error polling to"
    " propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending"
    " heartbeats):\n0: 1\n0: The tasks have crashed. Check the task logs for an earlier error, or scheduler events"
    " (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='']\n"
    "0: E1125 10:01:40.535652   30522 coordination_service_agent.cc:288] Polled an error from coordination service"
    " (this can be an error from this or another task).\n0: " + TERMINATING.format(r=0)
)
# What the accused task prints when it hears of the error (alive to hear it: late, or woken by a SIGCONT).
OWN_NOTICE = (
    "1: E1125 10:01:40.603727   30507 coordination_service_agent.cc:288] Polled an error from coordination service"
    " (this can be an error from this or another task).\n1: " + TERMINATING.format(r=1)
)
TEARDOWN = (
    "srun: error: node1: task 0: Aborted (core dumped)\nsrun: Terminating StepId=500.0\n"
    "slurmstepd: error: *** STEP 500.0 ON node1 CANCELLED AT 2026-11-25T10:01:41 ***\n"
)


def steps(upto: int) -> str:
    return "".join(STEP.format(r=r, s=n, n=n) for n in range(upto) for r in (0, 1))


def job_log(body: str, rc: int) -> str:
    return HEADER + steps(4) + body + f"==== JOB SUMMARY ====\n  Status: FAILED (exit {rc})\n=====================\n"


def why(tmp_path, text: str) -> dict:
    log = tmp_path / "500-tiny.log"
    log.write_text(text)
    result = CliRunner().invoke(main, ["why", "--json", str(log)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_accused_task_that_logged_nothing_after_died_and_is_blamed_with_its_peer_a_follower(tmp_path):
    # Rank 1 frozen (SIGSTOP): nothing from it after the accusation; Slurm then kills it.
    got = why(tmp_path, job_log(ACCUSE + TEARDOWN + "srun: error: node2: task 1: Killed\n", 134))
    assert (got["class"], got["signature"], got["host"]) == ("task-died", "jax-heartbeat-task-died", "node2")
    assert got["followers"] == ["node1"]
    assert got["retry"] == "retry-without-node"
    assert got["blamed_because"].startswith("the accused JAX task (a bare 1, 1 line(s) after the message)")
    assert "30511 coordination_service.cc:1518]" in got["evidence"]  # the coordinator's line, the first
    assert "stopped sending heartbeats" in got["evidence"]
    assert "died or froze" in got["advice"]


def test_what_a_frozen_task_logs_once_the_kill_wakes_it_does_not_make_it_alive(tmp_path):
    # Slurm's kill sends SIGCONT with the TERM: the woken rank may print its coordination error, after the teardown.
    got = why(tmp_path, job_log(ACCUSE + TEARDOWN + OWN_NOTICE + "srun: error: node2: task 1: Terminated\n", 134))
    assert (got["class"], got["host"]) == ("task-died", "node2")


@pytest.mark.parametrize(
    "alive",
    [OWN_NOTICE, STEP.format(r=1, s=41, n=7)],
    ids=["its-own-coordination-error", "a-step-after-the-accusation"],
)
def test_an_accused_task_that_was_still_alive_is_a_likely_false_positive(tmp_path, alive):
    got = why(tmp_path, job_log(ACCUSE + alive + TEARDOWN + "srun: error: node2: task 1: Aborted (core dumped)\n", 134))
    assert (got["class"], got["signature"]) == ("heartbeat-false-positive", "jax-heartbeat-false-positive")
    assert got["host"] == "node2"  # where it happened; the retry keeps the node
    assert got["retry"] == "retry"
    assert "JAX_HEARTBEAT_TIMEOUT" in got["advice"] and "was alive" in got["advice"]


def test_the_other_rank_logging_is_not_the_accused_one_alive(tmp_path):
    # Rank 0's own lines after its accusation (its abort) say nothing about task 1.
    text = steps(3) + ACCUSE + STEP.format(r=0, s=41, n=7) + TEARDOWN
    assert failures.classify(text, "FAILED", 134, nodes=["node1", "node2"]).reason == "task-died"


def test_without_rank_prefixes_or_a_task_number_alive_or_dead_cannot_be_told():
    bare = ACCUSE.replace("0: ", "")
    found = failures.classify(bare, "FAILED", 1, nodes=["node1", "node2"])
    assert (found.reason, found.signature) == ("distributed-timeout", "jax-heartbeat-unhealthy")
    pos = ACCUSE.index("stopped sending")
    assert failures.accused_state(ACCUSE + OWN_NOTICE, pos) == "alive"
    assert failures.accused_state(ACCUSE + TEARDOWN + OWN_NOTICE, pos) == "silent"
    assert failures.accused_state(bare, bare.index("stopped sending")) == ""


def test_a_rank_killed_outright_is_task_died_on_its_node_with_the_peer_a_follower(tmp_path):
    # The shape of a SIGKILLed rank 1 under our task wrapper: nothing from JAX, its NODE_EXIT and srun's lines.
    body = (
        "NODE_EXIT host=node2 exit=137\nsrun: error: node2: task 1: Exited with exit code 137\n"
        "srun: Terminating StepId=500.0\nslurmstepd: error: *** STEP 500.0 ON node1 CANCELLED AT 2026-11-25T10:01:41 ***\n"
        "srun: error: node1: task 0: Terminated\n== Training FAILED (exit=137, 95s) 2026-11-25T10:01:42Z ==\n"
    )
    got = why(tmp_path, job_log(body, 137))
    assert (got["class"], got["signature"], got["host"]) == ("task-died", "task-killed", "node2")
    assert got["followers"] == ["node1"]
    assert got["blamed_because"] == "the first task that failed by itself: NODE_EXIT host=node2 exit=137"
    assert "SIGKILL" in got["advice"]
    # A crash of its own (SIGSEGV) stays a signal of the process, not a kill from outside.
    crash = body.replace("exit=137", "exit=139").replace("exit code 137", "exit code 139")
    assert why(tmp_path, job_log(crash, 139))["class"] != "task-died"


def test_a_bad_accused_key_is_a_catalogue_error(tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text("version: 1\nsignatures:\n  - id: jax-heartbeat-task-died\n    accused: maybe\n")
    with pytest.raises(failures.CatalogueError, match=r"accused 'maybe' is not one of alive, silent; pick one"):
        failures.load_catalogue(local=local)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"


@pytest.mark.parametrize(
    "name, signature",
    [
        ("slurm-2node-rank1-sigkilled.log", "task-killed"),
        ("slurm-2node-rank1-frozen-past-heartbeat.log", "jax-heartbeat-task-died"),
    ],
)
def test_the_real_two_node_logs_are_task_died_on_node2(name, signature):
    # Both were taken from tests/py/test_failure_proofs.py's jobs. The first run of those proofs showed two
    # mistakes these logs now guard: the launch line's "heartbeat timeout 3730 s" read as a heartbeat kill, and
    # the frozen rank's own abort, printed after srun's teardown woke it, read as a sign it had been alive.
    # Their header's commit subject (the second run's) says 'heartbeat timeout N s' too: provenance is not evidence.
    assert "heartbeat timeout N s" in (FIXTURES / name).read_text().split("== STAGE TIMEOUTS")[0]
    got = CliRunner().invoke(main, ["why", "--json", str(FIXTURES / name)])
    assert got.exit_code == 0, got.output
    verdict = json.loads(got.stdout)
    assert (verdict["class"], verdict["signature"], verdict["host"]) == ("task-died", signature, "node2")
    assert verdict["followers"] == ["node1"]
