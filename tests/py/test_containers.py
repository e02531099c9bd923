"""End to end with a real container engine: Podman runs the CPU training image that utils/build_image.sh builds.

The image is built once per machine (the build is cached by requirements.lock's hash; a second call takes
seconds) and these tests start real containers through the launcher: run_local.sh (plain and RAY=1),
_container.sh's shell, preflight, and a 2-node submit.sh job on the local Slurm cluster. They skip, saying
why, only where Podman cannot run a container at all (not root, or the engine itself fails).
"""

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from job_observation import header, live_processes_of
from launch_env import launcher_env
from prom_query import View, free_port
from slurm_cluster import job_env, local_cluster, submit_job  # noqa: F401  (local_cluster: the session fixture)
from test_observability import event_losses

REPO = Path(__file__).resolve().parents[2]
STEP_RE = re.compile(r"completed step: (\d+), seconds: [\d.]+.*?loss: ([\d.]+)")
RANK_STEP_RE = re.compile(r"^(\d+): .*completed step: (\d+),", re.M)
LABEL = "maxtext-launcher"


def podman(*args, timeout=120, check=False):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="session")
def cpu_image():
    """The image reference utils/build_image.sh prints (building it the first time on this machine)."""
    if os.geteuid() != 0:
        pytest.skip("building the training image needs root (debootstrap, chroot)")
    built = subprocess.run(
        [str(REPO / "utils" / "build_image.sh")], capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL
    )
    assert built.returncode == 0, f"utils/build_image.sh failed:\n{built.stderr[-4000:]}"
    image = built.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"localhost/maxtext-cpu:[0-9a-f]{12}", image), built.stdout
    # Can this machine run a container at all? Asked with the most permissive settings known to work on
    # restricted hosts, so that a fault in the launcher's own settings fails the tests instead of skipping them.
    probe = podman(
        "run", "--rm", "--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", image, "true"
    )
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container on this machine: {probe.stderr.strip()[-300:]}")
    return image


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One workspace for the module: its jobs share the compile cache at <workspace>/.jax_cache (/outputs)."""
    return tmp_path_factory.mktemp("container_ws")


def container_env(workspace, image, **extra):
    return launcher_env(workspace, runtime="podman", **{"DOCKER_IMAGE": image, **extra})


def job_log(output):
    """The log path run_local.sh announced."""
    match = re.search(r"^\[run_local\] log: (\S+)$", output, re.M)
    assert match, output[-3000:]
    return Path(match.group(1))


def containers_of(job_id):
    """Names of every container (running or not) labelled with JOB_ID."""
    listed = podman("ps", "-a", "--filter", f"label={LABEL}.job={job_id}", "--format", "{{.Names}}", check=True)
    return listed.stdout.split()


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def test_auto_detect_picks_podman_for_a_present_image_and_tiny_trains_in_it(cpu_image, workspace):
    env = container_env(workspace, cpu_image)
    del env["CONTAINER_RUNTIME"]  # auto-detect: podman answers and has the image
    # An _env_ secret reaches training through run --env-file, not on the podman command line.
    secret = "hf_FAKEctr0000SECRET44"
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", f"_env_HF_TOKEN={secret}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = job_log(result.stdout)
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    assert "[_train] _env_ override: HF_TOKEN=***" in text
    head = header(text)
    assert head["CONTAINER_RUNTIME"] == "podman"
    job_id = head["JOB_ID"]
    assert f"[container] runtime: podman, image: {cpu_image}, container: maxtext-{job_id}-node0" in text
    assert sorted(int(s) for s, _ in STEP_RE.findall(text)) == list(range(20))
    assert re.search(rf"^tiny 1N \(job {job_id}\): [\d,]+ TGS/device — PASS$", text, re.M), text[-2000:]

    # It really ran in the image: the training environment it recorded is the container's.
    job_dir = log.with_suffix("")
    recorded = (job_dir / "environment.node0.txt").read_text().splitlines()
    assert "JOB_WORKSPACE=/outputs" in recorded
    assert f"JOB_WORKSPACE_HOST={workspace}" in recorded
    assert any(line.startswith("PATH=/opt/venv/bin:") for line in recorded), recorded
    # Outputs are on the workspace mount, owned by whoever ran the job.
    events = sorted(job_dir.rglob("events.out.tfevents.*"))
    assert events, sorted(p.name for p in job_dir.rglob("*"))
    for path in [job_dir, *events, job_dir / "environment.node0.txt"]:
        assert path.stat().st_uid == os.getuid(), path
    assert containers_of(job_id) == []


def test_two_processes_per_device_train_in_the_one_container(cpu_image, workspace):
    """Issue 25: LOCAL_WORLD_SIZE crosses into the container, whose `jobkit procs` runs two JAX processes."""
    env = container_env(workspace, cpu_image, LOCAL_WORLD_SIZE="2")
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=6"], env=env, capture_output=True, text=True, timeout=600
    )
    log = job_log(result.stdout)
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    head = header(text)
    assert head["CONTAINER_RUNTIME"] == "podman" and head["LOCAL_WORLD_SIZE"] == "2"
    job_id = head["JOB_ID"]
    assert f"[container] runtime: podman, image: {cpu_image}, container: maxtext-{job_id}-node0" in text
    assert re.search(r"^\[procs\] 2 processes on node 0 \(\S+\): global ranks 0-1 of NPROCS=2", text, re.M), text[
        -3000:
    ]
    for rank in (0, 1):
        steps = {int(m.group(1)) for m in re.finditer(rf"^\[rank{rank}\]: .*completed step: (\d+),", text, re.M)}
        assert sorted(steps) == list(range(6)), (rank, text[-3000:])
        assert f"[rank{rank}]: [launch] JAX distributed: process {rank} of 2 (local device {rank})" in text
    # Where the verdict counts devices (`1N×2 ... over 2 devices`), it counts both processes.
    verdict = re.search(
        rf"^tiny 1N(×2)? \(job {job_id}\): [\d,]+ TGS/device(?: over (\d) devices)? .*— PASS$", text, re.M
    )
    assert verdict, text[-2000:]
    assert verdict.group(2) in (None, "2")
    assert containers_of(job_id) == [] and live_processes_of(job_id) == []


def test_the_container_is_hardened_and_the_launcher_read_only(cpu_image, workspace):
    # Audit row C1, in a real container: what _container.sh's flags amount to inside.
    env = container_env(workspace, cpu_image, JOB_ID="hardening1", HANG_TIMEOUT="off")
    script = "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; touch /workspace/launcher/x; echo touch=$?\n"
    shell = subprocess.run(
        [str(REPO / "_container.sh")], env=env, input=script, capture_output=True, text=True, timeout=180
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    status = dict(line.split(":\t") for line in shell.stdout.splitlines() if ":\t" in line)
    assert status["NoNewPrivs"] == "1"
    # CHOWN, DAC_OVERRIDE, FOWNER and IPC_LOCK; no SYS_PTRACE with the hang watchdog off
    assert int(status["CapEff"], 16) == (1 << 0) | (1 << 1) | (1 << 3) | (1 << 14), status
    assert "touch=1" in shell.stdout and "Read-only file system" in shell.stderr
    assert not (REPO / "x").exists()


def allow_list():
    """The names in _container.sh's _CONTAINER_ENV_ALLOWLIST, comments dropped."""
    source = (REPO / "_container.sh").read_text()
    block = re.search(r"^_CONTAINER_ENV_ALLOWLIST=\((.*?)^\)", source, re.M | re.S).group(1)
    return [word for line in block.splitlines() for word in line.split("#", 1)[0].split()]


def test_only_allow_listed_variables_cross_into_a_real_container(cpu_image, workspace):
    names = allow_list()
    assert {"RAY", "RAY_PORT", "PROMETHEUS_PORT", "TUNE_PROFILE", "JOB_ID"} <= set(names)
    values = {name: f"v-{name.lower()} with space" for name in names}
    values.update(_DEBUG="", JOB_ID="envtest1", NODE_RANK="0")  # _DEBUG set but empty: present, no tracing
    if "PASS_ENV" in values:  # it holds names of variables that are set, not a free value
        values["PASS_ENV"] = "HOME"
    env = container_env(workspace, cpu_image, **values, NOT_ALLOW_LISTED="leak", SECRET_TOKEN="hunter2")
    # No arguments: an interactive bash in the container, reading its commands from stdin.
    shell = subprocess.run(
        [str(REPO / "_container.sh")], env=env, input="env -0\n", capture_output=True, text=True, timeout=180
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    inside = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
    missing = {name: inside.get(name) for name in names if inside.get(name) != values[name]}
    assert not missing, missing
    assert "NOT_ALLOW_LISTED" not in inside and "SECRET_TOKEN" not in inside
    assert inside["JOB_WORKSPACE"] == "/outputs"
    assert inside["VENV_DIR"] == "/opt/venv", "the image's own settings stay"
    assert containers_of("envtest1") == []


def test_sigterm_cancels_and_leaves_no_container_or_process(cpu_image, workspace):
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env=container_env(workspace, cpu_image),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("JOB_ID="), first
        job_id = first.strip().split("=", 1)[1]
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "completed step: 3," in line:
                break
        else:
            pytest.fail("training never reached step 3:\n" + "".join(seen[-40:]))
        assert containers_of(job_id) == [f"maxtext-{job_id}-node0"]
        assert live_processes_of(job_id, b"jobkit\0launch\0"), "training runs (in the container, seen from the host)"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        stopped_in = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, rest[-3000:]
    assert "Status: CANCELLED (exit 143)" in rest
    # The container's PID 1 passed TERM on: training stopped at once, not after stop's 10 s KILL.
    assert stopped_in < 8, f"took {stopped_in:.1f}s"
    assert containers_of(job_id) == []
    assert live_processes_of(job_id) == []
    text = job_log("".join(seen)).read_text()
    assert not re.search(r"forwarding signal|^Error:", text, re.M | re.I), text[-3000:]


def test_preflight_stops_our_leftover_container_and_leaves_others(cpu_image, local_cluster, tmp_path):  # noqa: F811
    ours = f"mx-test-leftover-{os.getpid()}"
    theirs = f"someone-elses-{os.getpid()}"
    try:
        # A container of ours left by job 999999 (Slurm knows no such job: it is over), and one without our label.
        podman(
            "run", "-d", "--rm", "--runtime", "runc", "--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024",
            "--name", ours, "--label", f"{LABEL}=1", "--label", f"{LABEL}.job=999999", cpu_image, "sleep", "600",
            check=True,
        )  # fmt: skip
        podman(
            "run", "-d", "--rm", "--runtime", "runc", "--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024",
            "--name", theirs, cpu_image, "sleep", "600", check=True,
        )  # fmt: skip
        env = {**os.environ, **local_cluster.env, "JOB_ID": "1000000", "JOB_WORKSPACE": str(tmp_path),
               "PREFLIGHT_KILL_WAIT": "2"}  # fmt: skip
        result = subprocess.run(
            [str(REPO / "utils" / "preflight.sh")], env=env, capture_output=True, text=True, timeout=180
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert re.search(rf"stopping podman container \w+ \(label {LABEL}=1, job 999999\)", result.stdout), (
            result.stdout
        )
        # Other containers may run on this host too: the count is not ours to know, only that theirs is named.
        others = re.search(
            r"podman: (\d+) other running container\(s\) not started by this launcher, left alone: (.*)", result.stdout
        )
        assert others and theirs in others.group(2).split(), result.stdout
        assert ours not in others.group(2).split()
        running = podman("ps", "--format", "{{.Names}}", check=True).stdout.split()
        assert ours not in running
        assert theirs in running
    finally:
        # --ignore: ours is usually gone already (--rm), and without it podman stops at the first missing name.
        podman("rm", "-f", "--ignore", "-t", "0", ours, theirs)


def test_ray_job_in_a_container_lands_every_step_in_its_tsdb(cpu_image, workspace):
    steps = 12
    env = container_env(
        workspace,
        cpu_image,
        RAY="1",
        EXPORTER_INTERVAL="2",
        PROMETHEUS_PORT=str(free_port()),
        RAY_DASHBOARD_PORT=str(free_port()),
        TENSORBOARD_PORT=str(free_port()),
    )
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", f"steps={steps}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = job_log(result.stdout)
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    job_id = header(text)["JOB_ID"]
    job_dir = log.with_suffix("")
    logged = {int(s): float(v) for s, v in STEP_RE.findall(text)}
    assert sorted(logged) == list(range(steps)), text[-3000:]
    # The hint is for the host, where the user runs it, not the container's /outputs.
    assert f"utils/prometheus.sh view {job_dir}" in text
    assert (job_dir / "metrics_exporter").is_dir() and any((job_dir / "ray_logs").rglob("raylet.out"))
    assert containers_of(job_id) == [] and live_processes_of(job_id) == []

    losses = event_losses(job_dir)
    assert sorted(losses) == list(range(steps))
    # Reading the TSDB afterwards happens on the host, with the host's Prometheus (installed when missing).
    subprocess.run([str(REPO / "utils" / "prometheus.sh"), "install"], check=True, capture_output=True, timeout=300)
    with View(job_dir, free_port()) as view:
        series = view.query("tb_learning_loss[2h]", at=log.stat().st_mtime + 60)
        assert len(series) == 1, series
        got = sorted(float(v) for _, v in series[0]["values"])
        assert len(got) == steps, got
        assert all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, sorted(losses.values()), strict=True))


def verdict_written(log):
    """The log's text once it ends with a verdict line, else ''."""
    text = log.read_text()
    return text if re.search(r" — (PASS|FAIL)[^\n]*$", text.rstrip(), re.M) else ""


def test_two_node_slurm_job_trains_in_containers_and_scancel_ends_both(cpu_image, local_cluster, tmp_path):  # noqa: F811
    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    env.update(CONTAINER_RUNTIME="podman", DOCKER_IMAGE=cpu_image)
    job_id, log = submit_job(env, "tiny", "-N", "2", "--", "steps=100000")

    def both_ranks_train():
        text = log.read_text() if log.exists() else ""
        ranks = {rank for rank, step in RANK_STEP_RE.findall(text) if int(step) >= 2}
        return ranks == {"0", "1"} and text

    try:
        text = wait_until(both_ranks_train, 300, "both ranks past step 2")
        assert "0: [container] runtime: podman" in text and "1: [container] runtime: podman" in text
        assert sorted(containers_of(job_id)) == [f"maxtext-{job_id}-node0", f"maxtext-{job_id}-node1"]
        local_cluster.run(["scancel", job_id])
        text = wait_until(lambda: verdict_written(log), 120, "the verdict line")
    finally:
        local_cluster.run(["scancel", job_id], check=False)
    assert "Status: CANCELLED (exit 143)" in text
    assert "exit=137" not in text, "a task was KILLed before its container stopped"
    wait_until(lambda: containers_of(job_id) == [], 30, "both containers gone")
    wait_until(lambda: live_processes_of(job_id) == [], 30, "no process of the job left")


def test_a_second_build_is_a_cache_hit_and_saves_a_tarball_that_loads(cpu_image, tmp_path):
    build = [str(REPO / "utils" / "build_image.sh")]
    tarball = tmp_path / "image.tar"
    try:
        again = subprocess.run([*build, "--save", str(tarball)], capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.strip().splitlines()[-1] == cpu_image
        assert "is up to date (requirements.lock unchanged); nothing to build" in again.stderr
        assert "debootstrap" not in again.stderr
        size = tarball.stat().st_size
        assert size > 500 * 2**20, size

        # The same call once more keeps the tarball; a file that is not this image is never overwritten.
        kept = subprocess.run([*build, "--save", str(tarball)], capture_output=True, text=True, timeout=600)
        assert kept.returncode == 0 and f"already holds {cpu_image}; kept as it is" in kept.stderr, kept.stderr
        other = tmp_path / "mine.tar"
        other.write_text("not an image")
        refused = subprocess.run([*build, "--save", str(other)], capture_output=True, text=True, timeout=600)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == (
            f"build_image.sh: {other} exists and does not hold {cpu_image}; choose another --save path"
            " (nothing was overwritten)"
        )
        assert other.read_text() == "not an image"

        # DOCKER_IMAGE=<tarball> loads it on a node (the Slurm job's pull stage does exactly this).
        env = {**os.environ, "CONTAINER_RUNTIME": "podman", "DOCKER_IMAGE": str(tarball)}
        pulled = subprocess.run(
            [str(REPO / "_container.sh"), "--pull"], env=env, capture_output=True, text=True, timeout=600
        )
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        assert pulled.stderr.strip().splitlines()[-1].endswith(f": {cpu_image}"), pulled.stderr[-2000:]
    finally:
        tarball.unlink(missing_ok=True)  # 2 GB: not left for pytest's kept temp dirs


def test_image_info_reads_the_built_image(cpu_image):
    import hashlib

    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "jobkit"), "image-info", "--json", cpu_image],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    pins = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line)
    host_python = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-V"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert info["image"] == cpu_image and info["engine"] == "podman"
    assert info["python"] == {"version": host_python, "executable": "/opt/venv/bin/python3"}
    assert {name: info["packages"][name] for name in ("jax", "jaxlib", "maxtext", "ray")} == {
        name: pins[name] for name in ("jax", "jaxlib", "maxtext", "ray")
    }
    assert info["maxtext"] == {"source": "pip package", "version": pins["maxtext"], "commit": None}
    lock_sha = hashlib.sha256((REPO / "requirements.lock").read_bytes()).hexdigest()
    assert info["labels"]["maxtext-launcher.lock-sha256"] == lock_sha
    assert info["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert info["rocm"] is None and info["cuda"] is None


def test_the_images_venv_holds_its_modules_compiled(cpu_image):
    # Each container starts from the image: modules compiled at build are not compiled again at every job start.
    check = (
        "import importlib.util as u, os, ray._private.worker, jax; "
        "print([m.__file__ for m in (ray._private.worker, jax) if not os.path.exists(u.cache_from_source(m.__file__))])"
    )
    # The limits _container.sh gives its containers (rootful podman's defaults exceed this host's hard limits).
    limits = subprocess.run(
        [
            "bash",
            "-c",
            "source utils/lib/container_runtime.sh && container_host_run_args podman && n=$(container_nofile) "
            '&& printf "%s\\n" --ulimit "nofile=$n:$n"',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    result = podman(
        "run", "--rm", "--network=none", *limits, cpu_image, "/opt/venv/bin/python", "-c", check, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_gpu_containerfile_builds_on_the_cpu_image(cpu_image):
    """Every step of configs/containers/Containerfile.gpu, run for real on a Debian base that has a venv
    (a vendor base needs a registry): its apt and pip steps, the lock's pins, its labels."""
    from jobkit.image.info import host_run_args

    tag = f"localhost/maxtext-gpu-check:{os.getpid()}"
    try:
        built = subprocess.run(
            ["podman", "build", "--format", "docker", "-f", str(REPO / "configs" / "containers" / "Containerfile.gpu"),
             "--build-arg", f"BASE_IMAGE={cpu_image}", *host_run_args("podman"), "-t", tag, str(REPO)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        assert "SHELL is not supported" not in built.stderr
        labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", tag, check=True).stdout)
        assert labels["maxtext-launcher.image"] == "gpu" and labels["maxtext-launcher.base"] == cpu_image
        tools = podman(
            "run", "--rm", *host_run_args("podman"), tag, "bash", "-c", "py-spy --version; prometheus --version"
        )
        assert tools.returncode == 0, tools.stderr
        assert "py-spy 0.4" in tools.stdout and "prometheus, version" in tools.stdout + tools.stderr
    finally:
        podman("rmi", "-f", tag)
