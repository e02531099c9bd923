"""`jobkit ray-start [ray start args...]`: Ray's own `ray start`, without the CLI groups it never needs, a head
whose dashboard starts only the modules a job uses, and a raylet with a Python worker ready for the actor.

Ray's CLI module imports the command groups of `ray serve`, `ray job` and `ray list/get/logs/summary` only to
offer them; each import sits inside try/except ImportError. Marking those modules as absent (None in
sys.modules) makes the CLI skip them: 0.7 s instead of 2 s of imports on the critical path of every node's start.
utils/lib/ray_cluster.sh runs this with the interpreter of the `ray` console script it found, so it is the same
Ray; a `ray` that is not Ray's Python console script is run as it is there.

The head's `ray start` waits for the dashboard to publish its address before it starts the raylet, and Ray 2.60's
dashboard starts one Python process per module first: nine, each importing its own dependencies, on the
critical path of every RAY=1 job. The Data, Jobs (job submission), Serve and Train modules serve nothing a
launcher job has (its training is one actor per node, submitted by `jobkit ray-launch`, not the Jobs API), so the
dashboard is started with --modules-to-load naming every other module (found by reading the source of
ray.dashboard.modules, not by importing it, which would cost the seconds saved). A dashboard that Ray starts in
its minimal mode (no ray[default]), or a Ray whose modules this does not recognise, is left as Ray starts it.
RAY_DASHBOARD_ALL_MODULES=1 keeps every module.

When the head starts its dashboard is RAY_DASHBOARD_ORDER (Ray waits ~5-10 s for the dashboard before it
starts the raylet and its two agents, which take as long again):
- first: Ray's own order. The agents start with the CPU to themselves, but the dashboard's imports and
  module processes (~11 s on a busy 2-core node) sit on the critical path of every RAY=1 job.
- beside (also RAY_DASHBOARD_FIRST=0): the raylet and its agents start right after the GCS, the dashboard right
  after the raylet, beside the agents. Started side by side on a saturated 2-core machine (load ~10), the
  dashboard agent once missed the 15 s in which the raylet waits for its port file, and the raylet aborted (the
  job trained without Ray).
- last (default): the raylet and its agents start right after the GCS, and the dashboard only once the raylet has
  registered with the GCS, which it does only after both agents have written their port files: the head is up
  (what utils/lib/ray_cluster.sh waits for) before the dashboard takes any CPU, so it cannot slow the agents.
In both later orders the dashboard starts at JOBKIT_RAY_SPAWN_NICE (below), and `ray start` still returns only
once it is up, or fails as before when it or the raylet does not (a raylet that dies or never registers is
left to Ray's own 30 s wait, and the dashboard is started anyway). Nothing the raylet or its agents do needs the
dashboard (Ray 2.60's source): the agents register with the GCS and publish their ports in its key-value
store, where a dashboard started later finds them; the raylet is told the dashboard's address from
--dashboard-host/--dashboard-port (the one Ray then publishes, as the port is checked free first), and passes it
to workers only for display; a driver that connects before the dashboard has published its address
(webui:url) only logs no dashboard URL.

The actor's worker is started with the raylet rather than when the driver asks for the actor: Ray prestarts as
many Python workers as the node has CPUs, none on a launcher's node (--num-cpus=0), and only once a driver
connects. Here the raylet prestarts RAY_PRESTART_WORKERS (default 1: one actor per node) as it starts
(RAY_enable_worker_prestart=1), with Ray's idle-worker soft limit raised to that number, which is otherwise the
number of CPUs and would kill the idle worker within a second. A worker started before any job takes the job's
first actor, so its `import ray` (~4-6 s on a busy 2-core node) overlaps the driver's own `import ray` and
connect instead of following them. RAY_PRESTART_WORKERS=0 keeps Ray's behaviour; RAY_enable_worker_prestart or
RAY_num_workers_soft_limit set by the caller stay as set. Every node's `ray start` gets this, workers' too.

With JOBKIT_RAY_SPAWN_NICE=N (utils/lib/ray_cluster.sh sets it from RAY_SERVICES_NICE) the head's dashboard
starts at niceness N when it starts after the raylet (beside or last), where nothing waits for it. In
Ray's order nothing else is niced from its spawn: the raylet starts only once the dashboard is up, and it waits
for its two agents' port files (15 s, then it aborts), so all three are on the critical path: niced, they can
only come up later, and an agent that misses the 15 s aborts the raylet. (Tried: starting all three niced gave
no gain that three interleaved rounds at a load of 8-9 could tell from the noise.) They are reniced once
`ray start` has ended (RAY_SERVICES_NICE).

No Ray Client server (ray://) on the head: `jobkit ray-launch` connects to the GCS, and the client server
(which `ray start --head` always starts; its port cannot be 0) is one more listening port and ~3 s of CPU
for its imports on the head's start. RAY_CLIENT_SERVER=1 starts it.
"""

import os
import re
import shutil
import sys
import time

import click

# The CLI groups `ray start` does not need, by the module that defines each.
UNNEEDED_CLI_MODULES = ("ray.serve.scripts", "ray.dashboard.modules.job.cli", "ray.util.state.state_cli")
# Dashboard modules (class names) a launcher job does not use; each is a process of its own.
UNNEEDED_DASHBOARD_MODULES = frozenset(("DataHead", "JobHead", "ServeHead", "TrainHead"))
# When the head starts its dashboard: before the raylet (Ray), right after it, or once it has registered (default).
DASHBOARD_ORDERS = ("first", "beside", "last")
_MODULE_CLASS = re.compile(
    r"^class (\w+)\(\s*(?:SubprocessModule|(?:dashboard_utils\.)?DashboardHeadModule)\b", re.MULTILINE
)


def slim_ray_cli() -> click.Group:
    """Ray's top-level click group, imported without the unneeded groups."""
    for name in UNNEEDED_CLI_MODULES:
        sys.modules.setdefault(name, None)  # an import already done (by whoever) stays usable
    from ray.scripts.scripts import cli

    return cli


def dashboard_modules(modules_dir: str) -> set[str]:
    """The dashboard module classes defined under MODULES_DIR (ray/dashboard/modules), read from the source."""
    found = set()
    for dirpath, _dirs, files in os.walk(modules_dir):
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                try:
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        found.update(_MODULE_CLASS.findall(f.read()))
                except (OSError, UnicodeDecodeError):
                    continue
    return found


def modules_to_load(modules_dir: str) -> str | None:
    """The --modules-to-load value for the dashboard, or None to leave it as Ray starts it (every module)."""
    found = dashboard_modules(modules_dir)
    if not UNNEEDED_DASHBOARD_MODULES <= found:  # a Ray we do not know: its module names may differ
        return None
    return ",".join(sorted(found - UNNEEDED_DASHBOARD_MODULES))


def spawn_nice() -> int:
    """The niceness a head's deferred dashboard starts with (JOBKIT_RAY_SPAWN_NICE; 0: as Ray starts it)."""
    value = os.environ.get("JOBKIT_RAY_SPAWN_NICE", "")
    return int(value) if value.isdigit() else 0


def prestart_workers() -> int:
    """How many Python workers the raylet starts before any task asks (RAY_PRESTART_WORKERS, default 1)."""
    value = os.environ.get("RAY_PRESTART_WORKERS", "1")
    return int(value) if value.isdigit() else 1


def prestart_config(prestart: int) -> dict[str, str]:
    """The raylet's settings that make its PRESTART workers start with it and wait for the actor (each one the
    caller's environment sets stays as set)."""
    config = {
        # Off by default: the raylet then starts its first worker only when the first driver connects.
        "RAY_enable_worker_prestart": "1",
        # The soft limit is the number of CPUs (0 on a launcher's node): an idle worker above it is killed
        # within about a second, before the actor it was started for takes it.
        "RAY_num_workers_soft_limit": str(prestart),
    }
    return {key: value for key, value in config.items() if key not in os.environ}


def niced(command: list[str], nice: int) -> list[str]:
    """COMMAND run at niceness NICE (unchanged for 0 or one already under nice)."""
    if nice <= 0 or (command and os.path.basename(command[0]) == "nice"):
        return command
    return [shutil.which("nice") or "nice", "-n", str(nice), *command]


def raylet_command(command: list[str], prestart: int) -> list[str]:
    """The raylet's COMMAND with PRESTART Python workers started with it (Ray passes its number of CPUs, 0 on a
    launcher's node)."""
    out = []
    for word in command:
        key, sep, value = word.partition("=")
        if sep and key == "--num_prestart_python_workers" and value.isdigit():
            word = f"{key}={max(int(value), prestart)}"
        out.append(word)
    return out


def patch_spawns(head: bool) -> None:
    """Wraps Ray's start_ray_process: the head's dashboard with modules_to_load() (unless
    RAY_DASHBOARD_ALL_MODULES=1) and, when started after the raylet, at spawn_nice(); the raylet with
    prestart_workers() (see the module docstring)."""
    from ray._private import services

    start_process = getattr(services, "start_ray_process", None)
    if start_process is None:
        return
    modules = None
    if head and os.environ.get("RAY_DASHBOARD_ALL_MODULES", "0") in ("", "0"):
        import ray.dashboard

        modules = modules_to_load(os.path.join(os.path.dirname(ray.dashboard.__file__), "modules"))
    prestart = prestart_workers()
    # Niced from its spawn only where nothing waits for it: after the raylet (beside or last). In Ray's
    # order the raylet starts only once the dashboard is up, and the raylet waits for its agents' port files.
    nice = spawn_nice() if head and not dashboard_first() else 0

    def start_ray_process(command, process_type, *args, **kwargs):
        if process_type == "dashboard":
            if modules is not None and not any(
                word == "--minimal" or word.startswith("--modules-to-load") for word in command
            ):
                command = [*command, f"--modules-to-load={modules}"]
            command = niced(command, nice)
        elif process_type == "raylet":
            command = raylet_command(command, prestart)
            if prestart:
                kwargs["env_updates"] = {**prestart_config(prestart), **(kwargs.get("env_updates") or {})}
        return start_process(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process


def dashboard_order() -> str:
    """When the head starts its dashboard (see the module docstring): "first" (Ray's order), "beside" (right
    after the raylet) or "last" (once the raylet has registered; the default). RAY_DASHBOARD_ORDER, else the older
    RAY_DASHBOARD_FIRST: 0 for "beside", 1 for "first"."""
    order = os.environ.get("RAY_DASHBOARD_ORDER", "")
    if order in DASHBOARD_ORDERS:
        return order
    return {"0": "beside", "1": "first"}.get(os.environ.get("RAY_DASHBOARD_FIRST", ""), "last")


def dashboard_first() -> bool:
    """Whether the head starts its dashboard before its raylet, as Ray does."""
    return dashboard_order() == "first"


def wait_for_registration(node, timeout: float = 30) -> bool:
    """Waits until NODE's raylet has registered with the GCS (it does so only once both its agents have written
    their port files: the head is up); False when the raylet died or TIMEOUT seconds (Ray's own wait) ran out."""
    from ray._private import ray_constants, services

    raylet = (node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or [None])[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            services.get_node(node.gcs_address, node.node_id)
            return True
        except RuntimeError:  # not registered yet
            pass
        if raylet is not None and raylet.process.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def dashboard_after_raylet() -> None:
    """Makes the head start its dashboard after its raylet, right after it or once it has registered (see the
    module docstring); a Ray whose Node has not the two methods this relies on is left alone."""
    order = dashboard_order()
    if order == "first":
        return
    from ray._private.node import Node

    start_api_server = getattr(Node, "start_api_server", None)
    start_ray_processes = getattr(Node, "start_ray_processes", None)
    if start_api_server is None or start_ray_processes is None:
        return

    def deferred_api_server(self, **kwargs):
        if self.head and "jobkit_dashboard" not in self.__dict__:
            self.jobkit_dashboard = kwargs  # started by start_ray_processes below, after the raylet
            params = self._ray_params
            if params.dashboard_port:
                self._webui_url = f"{params.dashboard_host}:{params.dashboard_port}"
            return None
        return start_api_server(self, **kwargs)

    def ray_processes_then_dashboard(self):
        start_ray_processes(self)
        kwargs = self.__dict__.pop("jobkit_dashboard", None)
        if kwargs is not None:
            if order == "last":
                # A raylet that died or never registered: Ray's own wait after this reports it, and the
                # dashboard is started anyway so that `ray start` fails as it would without this order.
                wait_for_registration(self)
            start_api_server(self, **kwargs)

    Node.start_api_server = deferred_api_server
    Node.start_ray_processes = ray_processes_then_dashboard


def no_client_server() -> None:
    """Makes the head start no Ray Client server (see the module docstring)."""
    if os.environ.get("RAY_CLIENT_SERVER", "0") not in ("", "0"):
        return
    from ray._private.node import Node

    if hasattr(Node, "start_ray_client_server"):
        Node.start_ray_client_server = lambda self: None


@click.command(
    "ray-start",
    add_help_option=False,  # --help is `ray start --help`
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args):
    """Run `ray start ARGS...` with Ray's CLI minus its serve/job/state groups (faster to import)."""
    cli = slim_ray_cli()
    patch_spawns("--head" in args)
    if "--head" in args:
        dashboard_after_raylet()
        no_client_server()
    sys.exit(cli.main(["start", *args], prog_name="ray"))
