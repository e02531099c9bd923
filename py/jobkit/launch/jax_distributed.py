"""JAX's distributed runtime, started by `jobkit launch` before MaxText for a multi-node run.

Why: MaxText 0.2.5 calls jax.distributed.initialize without `heartbeat_timeout_seconds` (and has no config
key for it), so JAX's coordination service declares a rank dead after 100 s without a heartbeat and aborts
every rank: a stopped rank is killed before the hang watchdog can take its stacks, and a healthy rank that
is slow to answer (a long checkpoint save) is killed too. Here the runtime is started with the heartbeat
timeout of JAX_HEARTBEAT_TIMEOUT (core/hang_settings.py: by default longer than the watchdog's allowances),
and MaxText is told `skip_jax_distributed_system=true` (its max_utils.maybe_initialize_jax_distributed_system
also returns early when jax.distributed.is_initialized(); the key says it outright).

The other arguments are the ones MaxText's own GPU path (max_utils.initialize_jax_for_gpu) would pass, from
what the tiers export: coordinator JAX_COORDINATOR_IP:JAX_COORDINATOR_PORT (_job.sbatch, multi-node only;
JAX reads JAX_COORDINATOR_BIND_ADDRESS itself), NNODES processes, process id NODE_RANK, local devices from
CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS (else every device), and the config's
`jax_distributed_initialization_timeout` (a key=value override, else the config file's top-level key, else
MaxText's default, 300 s). A one-node run (NNODES=1, no coordinator) is left to MaxText, unchanged, and so is
a run that sets skip_jax_distributed_system itself.

With a process per device (LOCAL_WORLD_SIZE > 1, started by `jobkit procs`, launch/procs.py), the runtime is
always started here, on one node too: NPROCS processes, process id GLOBAL_RANK, and `local_device_ids=[LOCAL_RANK]`:
JAX uses that one device, while the device variables stay as they are, so the node's other GPUs remain visible to
the libraries that copy peer to peer between them (expert-parallel dispatch).

jax is imported only when a runtime is started (the module must import without it).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.core import hang_settings

SKIP_KEY = "skip_jax_distributed_system"
INIT_TIMEOUT_KEY = "jax_distributed_initialization_timeout"
DEFAULT_INIT_TIMEOUT = 300  # MaxText's base.yml (and jax.distributed.initialize's own default)
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS")  # MaxText's order


class SetupError(ValueError):
    """A setting the runtime cannot start with; the message names it and the fix (one line)."""


@dataclass(frozen=True)
class Plan:
    """What jax.distributed.initialize is called with, and what is said about it."""

    kwargs: dict = field(default_factory=dict)
    all_devices: bool = False  # no device variable: JAX sees every local GPU (jax_{cuda,rocm}_visible_devices=all)
    heartbeat_set: bool = False  # JAX_HEARTBEAT_TIMEOUT gave the heartbeat (else the default rule)
    allowance: int = 0  # the watchdog's allowance the default outlasts

    def _device(self) -> str:
        ids = self.kwargs.get("local_device_ids")
        return f" (local device {ids[0]})" if ids and len(ids) == 1 else ""

    def line(self) -> str:
        k = self.kwargs
        heartbeat = k["heartbeat_timeout_seconds"]
        if not self.heartbeat_set:
            why = f"default: the hang watchdog's {self.allowance} s + {hang_settings.HEARTBEAT_MARGIN} s"
        elif heartbeat <= self.allowance:
            why = (
                f"{hang_settings.HEARTBEAT_SETTING}; not above the hang watchdog's {self.allowance} s: a stalled rank"
                " is killed by JAX before the watchdog takes its stacks"
            )
        else:
            why = hang_settings.HEARTBEAT_SETTING
        return (
            f"[launch] JAX distributed: process {k['process_id']} of {k['num_processes']}{self._device()}, coordinator"
            f" {k['coordinator_address']}, init timeout {k['initialization_timeout']} s, heartbeat timeout"
            f" {heartbeat} s ({why}); MaxText: {SKIP_KEY}=true"
        )


def _key_value(overrides: Sequence[str], key: str) -> str | None:
    found = None
    for arg in overrides:
        name, sep, value = arg.partition("=")
        if sep and name.strip() == key:
            found = value.strip()  # the last one wins, as in MaxText
    return found


def init_timeout(config: str | Path, overrides: Sequence[str]) -> int:
    """MaxText's jax_distributed_initialization_timeout for this run: the override, the config's own line, 300."""
    raw, where = _key_value(overrides, INIT_TIMEOUT_KEY), "on the command line"
    if raw is None:
        try:
            text = Path(config).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""  # MaxText reports an unreadable config itself
        m = re.search(rf"^{INIT_TIMEOUT_KEY}\s*:\s*([^#\s]+)", text, re.M)
        raw, where = (m.group(1), f"in {config}") if m else (str(DEFAULT_INIT_TIMEOUT), "")
    if not (raw.isascii() and raw.isdigit() and int(raw) > 0):
        raise SetupError(f"{INIT_TIMEOUT_KEY}={raw} {where} is not a whole number of seconds above 0; e.g. 300")
    return int(raw)


def local_devices(env: Mapping[str, str]) -> tuple[list[int] | None, bool]:
    """(local_device_ids, all_devices) as MaxText's initialize_jax_for_gpu derives them: the first of
    CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS that is set (a list that does not parse gives None); when neither is
    set, every device (all_devices)."""
    for name in DEVICE_VARIABLES:
        value = env.get(name)
        if value is not None:
            try:
                return [int(x) for x in value.split(",")], False
            except ValueError:
                return None, False
    return None, True


def process_per_device(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(NPROCS, GLOBAL_RANK, LOCAL_RANK) of a process that `jobkit procs` started (LOCAL_WORLD_SIZE > 1), else
    None. SetupError when they do not fit together."""
    per_node = env.get("LOCAL_WORLD_SIZE", "").strip()
    if per_node in ("", "1"):
        return None
    values = []
    for name in ("NPROCS", "GLOBAL_RANK", "LOCAL_RANK"):
        raw = env.get(name, "").strip()
        if not (raw.isascii() and raw.isdigit()):
            raise SetupError(f"{name}={raw} is not set to a whole number; start training through `jobkit procs`")
        values.append(int(raw))
    nprocs, global_rank, local_rank = values
    if not (per_node.isascii() and per_node.isdigit()) or not (local_rank < int(per_node) and global_rank < nprocs):
        raise SetupError(
            f"LOCAL_RANK={local_rank}, GLOBAL_RANK={global_rank} do not fit LOCAL_WORLD_SIZE={per_node},"
            f" NPROCS={nprocs}; start training through `jobkit procs`"
        )
    return nprocs, global_rank, local_rank


def plan(env: Mapping[str, str], config: str | Path, overrides: Sequence[str]) -> Plan | None:
    """The runtime to start for this run, or None where MaxText keeps doing it (one node, no coordinator, or
    skip_jax_distributed_system given). SetupError / hang_settings.SettingsError for a bad setting."""
    nnodes, rank = env.get("NNODES", "1").strip() or "1", env.get("NODE_RANK", "0").strip() or "0"
    ip, port = env.get("JAX_COORDINATOR_IP", "").strip(), env.get("JAX_COORDINATOR_PORT", "").strip()
    if _key_value(overrides, SKIP_KEY) is not None:
        return None
    if not (nnodes.isascii() and nnodes.isdigit()) or int(nnodes) < 1:
        raise SetupError(f"NNODES={nnodes} is not a node count; start training through submit.sh or run_local.sh")
    per_device = process_per_device(env)
    if per_device is not None and not ip:
        raise SetupError("LOCAL_WORLD_SIZE > 1 with no JAX_COORDINATOR_IP; start training through `jobkit procs`")
    if (int(nnodes) == 1 and per_device is None) or not ip:
        return None
    if not (rank.isascii() and rank.isdigit() and int(rank) < int(nnodes)):
        raise SetupError(f"NODE_RANK={rank} is not a rank below NNODES={nnodes}; start training through submit.sh")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise SetupError(f"JAX_COORDINATOR_PORT={port} is not a port; submit.sh's batch script picks one, or unset it")
    heartbeat, heartbeat_set = hang_settings.heartbeat_timeout(dict(env))
    devices, all_devices = local_devices(env)
    processes, process_id = int(nnodes), int(rank)
    if per_device is not None:
        processes, process_id, local = per_device
        devices, all_devices = [local], False
    kwargs = {
        "coordinator_address": f"{ip}:{port}",
        "num_processes": processes,
        "process_id": process_id,
        "initialization_timeout": init_timeout(config, overrides),
        "heartbeat_timeout_seconds": heartbeat,
        "local_device_ids": devices,
    }
    allowance = hang_settings.watchdog_allowance(hang_settings.Settings.from_env(dict(env)))
    return Plan(kwargs, all_devices, heartbeat_set, allowance)


def start(the_plan: Plan) -> list[str]:
    """Start JAX's distributed runtime as THE_PLAN says; returns the MaxText overrides that follow from it."""
    import jax  # deferred: the training image has it; this module must import without it

    if the_plan.all_devices:
        jax.config.update("jax_cuda_visible_devices", "all")
        jax.config.update("jax_rocm_visible_devices", "all")
    kwargs = dict(the_plan.kwargs)
    print(the_plan.line(), flush=True)
    if "heartbeat_timeout_seconds" not in inspect.signature(jax.distributed.initialize).parameters:
        # An image with an older JAX: the runtime still starts here, with JAX's own heartbeat.
        print(
            f"[launch] warning: this JAX ({jax.__version__}) has no heartbeat_timeout_seconds; its default applies",
            flush=True,
        )
        del kwargs["heartbeat_timeout_seconds"]
    jax.distributed.initialize(**kwargs)
    return [f"{SKIP_KEY}=true"]
