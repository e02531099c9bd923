"""End to end on a real Slurm cluster: submit.sh -> sbatch -> _job.sbatch -> srun on every node -> MaxText.

The cluster is utils/local_cluster.sh: real slurmctld/slurmd daemons, each node in its own network
namespace with its own hostname and 10.77.0.x address. It comes up once per session (slurm_cluster.py).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from job_observation import TRAINING_CMDLINE, header, live_processes_of
from prom_query import View, free_port
from slurm_cluster import job_env, local_cluster  # noqa: F401  (local_cluster: the session fixture)

from jobkit.cli import main as jobkit_main
from jobkit.core import logparse

REPO = Path(__file__).resolve().parents[2]
STEP_RE = re.compile(r"^(\d+): .*completed step: (\d+), .*?loss: ([\d.]+)", re.M)
ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"  # what run_stage stamps on a stage's lines
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="session")
def jax_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("slurm_jax_cache")


@pytest.fixture
def slurm_env(local_cluster, tmp_path, jax_cache):  # noqa: F811
    return job_env(local_cluster, tmp_path / "ws", jax_cache)


def submit(env, *args, repo=REPO, extra_env=None):
    full_env = dict(env, **(extra_env or {}))
    result = subprocess.run([str(repo / "submit.sh"), *args], env=full_env, capture_output=True, text=True, timeout=120)
    return result


def job_id_of(result):
    m = re.search(r"Submitted job (\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    return m.group(1)


def job_state(env, job_id):
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def wait_for_end(env, job_id, log, timeout=300):
    """Wait until the job has left the queue (or reached a terminal state) and its log has a verdict line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(env, job_id)
        text = log.read_text() if log.exists() else ""
        if (state in TERMINAL or state == "GONE") and "JOB SUMMARY" in text and re.search(r" — (PASS|FAIL)", text):
            return state, text
        time.sleep(1)
    pytest.fail(f"job {job_id} did not finish in {timeout}s; state {job_state(env, job_id)}")


def log_of(result):
    """The log path submit.sh announced (it exists only once the job starts)."""
    m = re.search(r"^  log: +(\S+)$", result.stdout, re.M)
    assert m, result.stdout
    return Path(m.group(1))


def test_one_node_job_runs_every_stage_and_succeeds(slurm_env):
    result = submit(slurm_env, "tiny", "-N", "1", "--", "steps=15")
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    log = log_of(result)
    state, text = wait_for_end(slurm_env, job_id, log)

    head = header(text)
    assert head["JOB_ID"] == job_id and head["NNODES"] == "1" and head["MODEL_NAME"] == "tiny"
    for stage in ("Preflight", "ECC check", "Training"):
        assert re.search(rf"^== {stage} BEGIN ", text, re.M), stage
        assert re.search(rf"^== {stage} END \(\d+s\) {ISO_TIME} ==$", text, re.M), stage
    assert "== Image pull SKIPPED (native runtime) ==" in text
    assert len(set(m.group(2) for m in STEP_RE.finditer(text))) == 15
    assert "Status: SUCCESS (exit 0)" in text
    assert re.search(rf"^tiny 1N \(job {job_id}\): [\d,]+ TGS/device — PASS$", text, re.M)

    job_dir = Path(slurm_env["JOB_WORKSPACE"]) / log.name.removesuffix(".log")
    assert (job_dir / "log").resolve() == log.resolve()
    artifact = (job_dir / "artifact").resolve()
    assert artifact.parent.parent.name == ".artifacts" and artifact.parent.stat().st_mode & 0o777 == 0o700
    assert "submit.sh tiny -N 1 -- steps=15" in (artifact / "submit_cmd.txt").read_text()
    assert "== COMMIT ==" in (artifact / "git_summary.txt").read_text()


def test_credentials_stay_out_of_squeue_and_the_log_and_pass_env_delivers_them(slurm_env):
    """Issue 21, S1/S4: the job name every user sees in squeue carries no _env_ value; a PASS_ENV variable
    reaches training (recorded as ***) with its value on no command line, even under _DEBUG."""
    env_secret, arg_secret = "FAKEenvhf0000SECRET1", "FAKEpassthru0000SECRET32"
    result = submit(
        slurm_env,
        "tiny:sec",
        "-N",
        "1",
        "--",
        "steps=3",
        f"_env_WANDB_API_KEY={arg_secret}",
        extra_env={"HF_TOKEN": env_secret, "PASS_ENV": "HF_TOKEN", "_DEBUG": "1"},
    )
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    names = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%j"], env=slurm_env, capture_output=True, text=True
    ).stdout.strip()
    assert names == "JAX-tiny-sec-steps_3-_env_WANDB_API_KEY"
    log = log_of(result)
    state, text = wait_for_end(slurm_env, job_id, log)
    assert "Status: SUCCESS (exit 0)" in text, text[-3000:]  # under _DEBUG too (its trace is not read as the log)
    assert env_secret not in text  # the _DEBUG trace of the batch script and of training
    # jobkit's own reading of the header (a _DEBUG log has its set -x trace, continuation lines too, above it).
    assert logparse.parse_text(text).header["PASSTHROUGH_ARGS"] == "steps=3 _env_WANDB_API_KEY=***"
    assert "[_train] PASS_ENV: HF_TOKEN (from the submitting environment; values not shown)" in text
    record = (log.with_suffix("") / "environment.node0.txt").read_text().splitlines()
    assert "HF_TOKEN=***" in record and "PASS_ENV=HF_TOKEN" in record
    assert not list(Path(slurm_env["JOB_WORKSPACE"]).glob("*0000SECRET*"))


def test_two_nodes_train_one_jax_job_with_agreeing_losses(slurm_env):
    result = submit(slurm_env, "tiny", "-N", "2", "--", "steps=15")
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    state, text = wait_for_end(slurm_env, job_id, log_of(result), timeout=420)
    assert "Status: SUCCESS (exit 0)" in text, text[-3000:]

    head = header(text)
    assert head["NNODES"] == "2"
    assert head["NODELIST_EXPANDED"] == "node1,node2"
    assert re.fullmatch(r"10\.77\.0\.\d+", head["JAX_COORDINATOR_IP"])
    losses = {}
    for m in STEP_RE.finditer(text):
        losses.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3)
    assert sorted(losses) == list(range(15))
    assert all(set(per_rank) == {"0", "1"} for per_rank in losses.values()), "both ranks log every step"
    assert all(len(set(per_rank.values())) == 1 for per_rank in losses.values()), "ranks agree on the loss"
    assert re.search(rf"^tiny 2N \(job {job_id}\): [\d,]+ TGS/device — PASS$", text, re.M)


def test_a_queued_job_runs_the_code_it_was_submitted_with(slurm_env, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(
        REPO, repo, ignore=shutil.ignore_patterns(".venv", "outputs", ".cache", "__pycache__"), symlinks=True
    )
    result = submit(slurm_env, "tiny", "-N", "1", "--hold", "--", "steps=6", repo=repo)
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    # Edit the repo while the job waits: the job must not see it.
    config = repo / "configs" / "tiny.yml"
    config.write_text(
        config.read_text().replace("base_num_decoder_layers: 2", "base_num_decoder_layers: 2\nno_such_key: 1")
    )
    subprocess.run(["scontrol", "release", job_id], env=slurm_env, check=True)
    state, text = wait_for_end(slurm_env, job_id, log_of(result))
    assert "Status: SUCCESS (exit 0)" in text, text[-3000:]
    assert len(set(m.group(2) for m in STEP_RE.finditer(text))) == 6


def test_scancel_mid_training_is_cancelled_and_leaves_no_training_process(slurm_env):
    result = submit(slurm_env, "tiny", "-N", "2", "--", "steps=100000")
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    log = log_of(result)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(r"^0: .*completed step: 2,", text, re.M) and re.search(r"^1: .*completed step: 2,", text, re.M):
            break
        time.sleep(1)
    else:
        pytest.fail("training never reached step 2 on both nodes")
    assert live_processes_of(job_id, TRAINING_CMDLINE), "training should be running on the nodes"

    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    state, text = wait_for_end(slurm_env, job_id, log, timeout=90)
    assert "Status: CANCELLED (exit 143)" in text
    assert re.search(r"FAIL \(cancelled\)$", text, re.M)
    time.sleep(1)
    assert live_processes_of(job_id, TRAINING_CMDLINE) == []


def test_stage_timeout_stops_training_with_a_hint(slurm_env):
    result = submit(slurm_env, "tiny", "-N", "1", "--", "steps=100000", extra_env={"STAGE_TIMEOUTS": "train:3"})
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    state, text = wait_for_end(slurm_env, job_id, log_of(result), timeout=180)
    assert re.search(rf"^== Training TIMEOUT \(\d+s/3s\) {ISO_TIME} ==$", text, re.M)
    assert 'STAGE_TIMEOUTS="train:<seconds>"' in text
    assert re.search(r"Status: FAILED \(exit 124\) — Training TIMEOUT", text)
    assert live_processes_of(job_id, TRAINING_CMDLINE) == []


def test_sbatch_rejecting_an_argument_shows_its_message_and_leaves_nothing(slurm_env):
    result = submit(slurm_env, "tiny", "--no-such-sbatch-flag", "--", "steps=3")
    assert result.returncode != 0
    assert "sbatch refused the job" in result.stderr and "no-such-sbatch-flag" in result.stderr
    workspace = Path(slurm_env["JOB_WORKSPACE"])
    assert not (workspace / ".artifacts").exists() or not any((workspace / ".artifacts").iterdir())
    assert not list(workspace.glob("*-JAX-*"))


def test_a_snapshot_swapped_while_queued_is_refused_before_any_of_it_runs(slurm_env, tmp_path):
    # Audit row F2: a teammate renames a queued job's snapshot and puts a copy with a payload in its place.
    result = submit(
        slurm_env, "tiny", "-N", "1", "--hold", "--", "steps=3", extra_env={"EARLY_DEATH_CHECK_SECONDS": "0"}
    )
    assert result.returncode == 0, result.stderr
    job_id, log = job_id_of(result), log_of(result)
    job_dir = Path(slurm_env["JOB_WORKSPACE"]) / log.name.removesuffix(".log")
    snap = (job_dir / "artifact").resolve()
    canary = tmp_path / "payload-ran"
    snap.rename(snap.with_name(snap.name + ".orig"))
    shutil.copytree(snap.with_name(snap.name + ".orig"), snap, symlinks=True)
    lib = snap / "utils" / "lib" / "job_log.sh"
    lib.chmod(0o600)
    lib.write_text(lib.read_text() + f"\ntouch {canary}\n")
    subprocess.run(["scontrol", "release", job_id], env=slurm_env, check=True, timeout=30)
    deadline = time.monotonic() + 120
    while job_state(slurm_env, job_id) not in TERMINAL | {"GONE"} and time.monotonic() < deadline:
        time.sleep(1)
    text = log.read_text()
    assert re.fullmatch(
        rf"_job.sbatch: refusing to run: the code snapshot {re.escape(str(snap))} changed after submit "
        r"\(sha256 [0-9a-f]{64}, submitted [0-9a-f]{64}\); resubmit with submit.sh\n",
        text,
    ), text
    assert job_state(slurm_env, job_id) in {"FAILED", "GONE"}
    assert not canary.exists()


def run_ray_job(env, nodes, steps):
    """A RAY=1 job of the tiny model on NODES nodes, run to its end: (job id, log path, log text)."""
    result = submit(
        env,
        "tiny",
        "-N",
        str(nodes),
        "--",
        f"steps={steps}",
        extra_env={"RAY": "1", "EXPORTER_INTERVAL": "2", "TENSORBOARD": "0"},
    )
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    log = log_of(result)
    _, text = wait_for_end(env, job_id, log, timeout=480)
    return job_id, log, text


def test_one_node_ray_job_trains_under_ray_and_succeeds(slurm_env):
    """RAY=1 on one Slurm node used to crash in MaxText (exit 139): the batch script exported the coordinator's
    address without a port, and MaxText started a distributed service on "<ip>:None". Its Ray and exporter
    bound the node's cluster address too, where loopback is all one node needs."""
    steps = 8
    _, _, text = run_ray_job(slurm_env, 1, steps)
    assert "Status: SUCCESS (exit 0)" in text, text[-4000:]
    head = header(text)
    assert head["RAY"] == "1" and head["NNODES"] == "1"
    assert not head.get("JAX_COORDINATOR_IP") and not head.get("JAX_COORDINATOR_PORT"), head
    # Nothing outside one node needs its Ray or exporter, so they bind loopback though the node has 10.77.0.x.
    assert re.search(r"\[ray_launch\] node 127\.0\.0\.1 rank 0: started pid", text), text[-4000:]
    assert "one node: Ray and the exporter bind 127.0.0.1" in text
    assert "training without Ray" not in text
    assert sorted({int(m.group(2)) for m in STEP_RE.finditer(text)}) == list(range(steps))


def test_two_node_ray_job_lands_both_hosts_in_one_tsdb(slurm_env):
    """RAY=1 on two Slurm nodes: one Ray cluster, both exporters scraped by rank 0's Prometheus, every step."""
    steps = 10
    job_id, log, text = run_ray_job(slurm_env, 2, steps)
    assert "Status: SUCCESS (exit 0)" in text, text[-4000:]
    assert header(text)["RAY"] == "1"
    assert re.search(r"\[ray_launch\] node 10\.77\.0\.\d+ rank 1: started pid", text), text[-4000:]
    assert "training without Ray" not in text
    assert sorted({int(m.group(2)) for m in STEP_RE.finditer(text)}) == list(range(steps))

    job_dir = Path(slurm_env["JOB_WORKSPACE"]) / log.name.removesuffix(".log")
    for host in ("node1", "node2"):
        assert any((job_dir / "ray_logs" / host).rglob("raylet.out")), host
        assert (job_dir / "metrics_exporter" / f"{host}.log").stat().st_size > 0, host
    deadline = time.monotonic() + 30
    while live_processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not live_processes_of(job_id)

    with View(job_dir, free_port()) as view:
        at = log.stat().st_mtime + 30
        up = view.query('max_over_time(up{job="exporters"}[1h])', at)
        assert {s["metric"]["host"]: s["value"][1] for s in up} == {"node1": "1", "node2": "1"}, up
        procs = view.query("count by (host) (count_over_time(hw_procs_running[1h]))", at)
        assert {s["metric"]["host"] for s in procs} == {"node1", "node2"}, procs
        ray_nodes = view.query("count by (host) (count_over_time(ray_node_cpu_count[1h]))", at)
        assert {s["metric"]["host"] for s in ray_nodes} == {"node1", "node2"}, ray_nodes
        loss = view.query("count_over_time(tb_learning_loss[1h])", at)
        assert [(s["metric"]["host"], s["value"][1]) for s in loss] == [("node1", str(steps))], loss

    # `jobkit analyze` of the same job: both hosts in the per-host sections, the job's stages, every step once.
    result = CliRunner().invoke(jobkit_main, ["analyze", str(log)])
    assert result.exit_code == 0, result.output
    doc = json.loads((job_dir / "analysis" / "analysis.json").read_text())
    assert doc["hosts"]["names"] == ["node1", "node2"]
    for key in ("cpu", "memory", "net"):
        assert sorted(doc["hosts"]["resources"][key]["per_host"]) == ["node1", "node2"], key
    assert {"Preflight", "Training"} <= {stage["name"] for stage in doc["stages"]}, doc["stages"]
    assert doc["steps"]["logged"] == steps and doc["steps"]["entries_per_step"] == 2
    assert doc["job"]["nodelist"] == ["node1", "node2"] and doc["job"]["status"] == "SUCCESS"
    tgs = json.loads(CliRunner().invoke(jobkit_main, ["tgs", "--json", str(log)]).output)["tgs"]
    assert doc["throughput"]["tgs"]["mean"] == pytest.approx(tgs, rel=1e-6)


def test_scancel_of_a_two_node_ray_job_loses_no_step_from_its_tsdb(slurm_env):
    """scancel mid-run: every step the log shows reaches the TSDB, by the teardown within Slurm's KillWait or,
    when that ran out, by the first reader of the TSDB (the pending backfill the job recorded)."""
    result = submit(
        slurm_env,
        "tiny",
        "-N",
        "2",
        "--",
        "steps=100000",
        extra_env={"RAY": "1", "EXPORTER_INTERVAL": "2", "TENSORBOARD": "0"},
    )
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result)
    log = log_of(result)
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(r"^0: .*completed step: 60,", text, re.M):
            break
        time.sleep(1)
    else:
        pytest.fail("rank 0 never reached step 60")
    subprocess.run(["scancel", job_id], env=slurm_env, check=True)
    state, text = wait_for_end(slurm_env, job_id, log, timeout=120)
    assert "Status: CANCELLED (exit 143)" in text
    deadline = time.monotonic() + 30
    while live_processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    logged = sorted({int(m.group(2)) for m in STEP_RE.finditer(text) if m.group(1) == "0"})
    assert len(logged) > 60

    job_dir = Path(slurm_env["JOB_WORKSPACE"]) / log.name.removesuffix(".log")
    view = View(job_dir, free_port())
    try:
        counted = view.query("count_over_time(tb_learning_loss[2h])", log.stat().st_mtime + 60)
        newest = view.query("max_over_time(tb_step[2h])", log.stat().st_mtime + 60)
    finally:
        _, err = view.stop()
    assert (job_dir / "prometheus" / "tb_backfill.done.json").exists(), err
    assert [s["value"][1] for s in newest] == [str(logged[-1])], (newest, logged[-5:], err)
    assert [s["value"][1] for s in counted] == [str(len(logged))], (counted, len(logged), err)


def _start_long_ray_job(env, steps_seen=5):
    """A 2-node RAY=1 job with steps to spare, once rank 0 has logged step STEPS_SEEN: (job id, log, job dir)."""
    result = submit(
        env,
        "tiny",
        "-N",
        "2",
        "--",
        "steps=100000",
        extra_env={"RAY": "1", "EXPORTER_INTERVAL": "2", "TENSORBOARD": "0"},
    )
    assert result.returncode == 0, result.stderr
    job_id, log = job_id_of(result), log_of(result)
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if re.search(rf"^0: .*completed step: {steps_seen},", text, re.M):
            return job_id, log, Path(env["JOB_WORKSPACE"]) / log.name.removesuffix(".log")
        assert "JOB SUMMARY" not in text, text[-4000:]
        time.sleep(1)
    pytest.fail(f"rank 0 of job {job_id} never reached step {steps_seen}")


def _cancel_and_wait(env, job_id, log):
    subprocess.run(["scancel", job_id], env=env, check=True)
    _, text = wait_for_end(env, job_id, log, timeout=120)
    deadline = time.monotonic() + 30
    while live_processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    return text


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("setpriv")), reason="needs curl and setpriv")
def test_another_user_on_the_cluster_network_cannot_drive_a_ray_jobs_cluster(slurm_env, tmp_path):
    """Security report N1/N2: during a RAY=1 job, another user (nobody) on the other node POSTed a shell command
    to the dashboard agent's job API on rank 0's cluster address, and on node 1's loopback to the dashboard's;
    a driver without credentials read the actor table through GCS and killed the actors. With the job's
    token required, every one of them is refused, the token is unreadable to that user, and training goes on."""
    job_id, log, job_dir = _start_long_ray_job(slurm_env)
    head = header(log.read_text())
    head_ip, ray_port = head["JAX_COORDINATOR_IP"], head["RAY_PORT"]
    dashboard = re.search(r"Ray dashboard http://localhost:(\d+)", log.read_text()).group(1)
    agent = None
    for pid in live_processes_of(job_id, f"--node-ip-address={head_ip}".encode()):
        found = re.search(rb"--listen-port=(\d+)", Path(f"/proc/{pid}/cmdline").read_bytes())
        agent = agent or (found and found.group(1).decode())
    assert agent, "no dashboard agent port on rank 0's raylet"
    canary = tmp_path / "ran_as_the_jobs_owner"
    body = json.dumps({"entrypoint": f"touch {canary}", "entrypoint_num_cpus": 0})
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

    def as_nobody_on(node, *argv):
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/mxlc-{node}", *nobody, *argv], capture_output=True, text=True, timeout=60
        )

    post = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "Content-Type: application/json"]
    try:
        agent_reply = as_nobody_on("node2", *post, "-d", body, f"http://{head_ip}:{agent}/api/job_agent/jobs/")
        dash_reply = as_nobody_on("node1", *post, "-d", body, f"http://127.0.0.1:{dashboard}/api/jobs/")
        token = job_dir / ".ray" / "auth" / "token"
        read = as_nobody_on("node1", "cat", str(token))
        # GCS: a driver that has no token (as root, so that only the token differs from the job's own driver).
        probe = (
            "import ray, sys\n"
            f"try:\n    ray.init(address='{head_ip}:{ray_port}', logging_level='ERROR')\n"
            "except Exception as exc:\n    sys.exit(f'refused: {type(exc).__name__}')\n"
            "print('connected', [a['class_name'] for a in ray.util.state.list_actors()])\n"
        )
        no_token = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        driver = subprocess.run(
            ["nsenter", "--net=/run/netns/mxlc-node2", str(REPO / ".venv" / "bin" / "python"), "-c", probe],
            env=dict(no_token, HOME=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=240,
        )
        steps_before = len(STEP_RE.findall(log.read_text()))
        time.sleep(3)  # training goes on: more steps than before the probes' last
        before_cancel = log.read_text()
        steps_after = len(STEP_RE.findall(before_cancel))
    finally:
        text = _cancel_and_wait(slurm_env, job_id, log)
    assert (agent_reply.stdout, dash_reply.stdout) == ("401", "401"), (agent_reply, dash_reply)
    assert read.returncode != 0 and "Permission denied" in read.stderr and read.stdout == ""
    assert driver.returncode != 0 and "connected" not in driver.stdout, driver.stdout + driver.stderr[-2000:]
    assert not canary.exists()
    assert steps_after > steps_before
    assert "its Ray actor died" not in before_cancel and "Status: CANCELLED (exit 143)" in text, text[-3000:]


def test_a_ray_head_whose_teardown_never_ran_ends_with_the_job(slurm_env):
    """Security report N3: rank 0's teardown cut short (here its training tier KILLed, so no trap runs) left the
    Ray head's GCS, raylet and dashboard running after the job, still answering on the node: `ray start`
    detaches them, and Slurm's proctrack/linuxproc finds a job's processes by their parents. Under `jobkit reap`
    they stay below the task, and nothing of the job outlives it."""
    job_id, log, _ = _start_long_ray_job(slurm_env)
    # Rank 0's training tier: `bash .../_train.sh` (its subshells share the command line: the topmost one).
    tier = {
        pid
        for pid in live_processes_of(job_id, b"/_train.sh\0")
        if b"NODE_RANK=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1].endswith(b"/_train.sh")
    }
    rank0 = [pid for pid in tier if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) not in tier]
    ray_daemons = live_processes_of(job_id, b"--temp-dir=/tmp/mxray.")
    assert rank0 and ray_daemons, (rank0, ray_daemons)
    for pid in rank0:
        os.kill(pid, signal.SIGKILL)
    _, text = wait_for_end(slurm_env, job_id, log, timeout=180)
    deadline = time.monotonic() + 30
    while live_processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in live_processes_of(job_id)}
    assert left == {}, left
    assert "Status: FAILED" in text, text[-3000:]
