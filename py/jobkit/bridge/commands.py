"""`jobkit bridge serve|stop|status|log|policy`: the command line of the host-command bridge (click only).

The server is the person's: started by hand on the host (login node), in the foreground or under tmux/nohup,
never by an agent (the policy refuses `jobkit bridge` through the bridge itself).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import click

from jobkit.core.errors import EXIT_ANSWER_NO, JobkitError, exit_with
from jobkit.core.paths import REPO_ROOT, workspace

WS_HELP = "The workspace (default $JOB_WORKSPACE, else <repo>/outputs); the bridge dir is <workspace>/.bridge."


def _where(ws: str | None, node: str | None) -> tuple[Path, str]:
    from jobkit.bridge import server

    try:
        name = node or server.node_name()
    except server.BridgeError as exc:
        raise JobkitError("bridge", str(exc)) from None
    if not server.ID.fullmatch(name):
        raise JobkitError("bridge", f"--node {name!r} is not [A-Za-z0-9_-]{{1,64}}")
    return server.bridge_root(workspace(ws)) / name, name


def _info(where: Path) -> dict | None:
    """server.json of the server that holds WHERE's lock now; None when none does."""
    import fcntl

    try:
        fd = os.open(where / "lock", os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None  # we got the lock: nobody serves
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        return json.loads((where / "server.json").read_text())
    except (OSError, ValueError):
        return {}


@click.group("bridge", context_settings={"help_option_names": ["-h", "--help"]})
def group():
    """Serve cluster commands to agents in containers, under a policy (serve, stop, status, log, policy)."""


@group.command("serve")
@click.option("--workspace", "ws", help=WS_HELP)
@click.option("--node", help="This server's node name (default BRIDGE_NODE, else the short hostname).")
@click.option(
    "--policy", "policy_file", type=click.Path(dir_okay=False), help="Policy file (default configs/bridge_policy.yaml)."
)
def serve_command(ws, node, policy_file):
    """Serve requests from utils/host_cmd.py in the foreground until stopped (Ctrl-C or `jobkit bridge stop`)."""
    from jobkit.bridge import policy, server

    where, name = _where(ws, node)
    try:
        pol = policy.load(Path(policy_file) if policy_file else None)
        srv = server.Server(where.parent, name, pol, REPO_ROOT, workspace(ws))
        srv.prepare()
    except (policy.PolicyError, server.BridgeError) as exc:
        raise JobkitError("bridge serve", str(exc)) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"bridge: serving {where} (node {name}, pid {os.getpid()}); policy {' + '.join(pol.files)}", err=True)
    click.echo(f"bridge: agents run: utils/host_cmd.py --ping ; audit log {where / 'audit.log'}", err=True)
    try:
        srv.serve(stop)
    except server.BridgeError as exc:
        raise JobkitError("bridge serve", str(exc)) from None
    click.echo("bridge: stopped", err=True)


@group.command("stop")
@click.option("--workspace", "ws", help=WS_HELP)
@click.option("--node", help="The server's node name (default BRIDGE_NODE, else the short hostname).")
def stop_command(ws, node):
    """Stop this user's bridge server (SIGTERM to the pid that holds its lock; it finishes running commands)."""
    where, _ = _where(ws, node)
    info = _info(where)
    if info is None:
        click.echo(f"no bridge server serves {where}")
        return
    pid = info.get("pid")
    if not isinstance(pid, int):
        raise JobkitError("bridge stop", f"{where}/server.json has no pid; stop the server by hand")
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if _info(where) is None:
            click.echo(f"stopped the bridge server (pid {pid})")
            return
        time.sleep(0.1)
    click.echo(f"sent SIGTERM to pid {pid}; it is still finishing running commands")


@group.command("status")
@click.option("--workspace", "ws", help=WS_HELP)
@click.option("--node", help="The server's node name (default BRIDGE_NODE, else the short hostname).")
def status_command(ws, node):
    """Whether a bridge server serves this node, since when, with which policy; exit 8 when none does."""
    where, _ = _where(ws, node)
    info = _info(where)
    if info is None:
        raise JobkitError(
            "bridge status", f"no bridge server serves {where}; start one with `jobkit bridge serve`", EXIT_ANSWER_NO
        )
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    running = len(os.listdir(where / "taken")) if (where / "taken").is_dir() else 0
    click.echo(
        f"serving {where}: pid {info.get('pid')} since {since}, {running} running; policy {' + '.join(info.get('policy', []))}"
    )


@group.command("log")
@click.option("--workspace", "ws", help=WS_HELP)
@click.option("--node", help="The server's node name (default BRIDGE_NODE, else the short hostname).")
@click.option("-n", "lines", type=click.IntRange(1, 100000), default=20, show_default=True, help="How many entries.")
def log_command(ws, node, lines):
    """The last entries of the audit log: time, verdict, rule, cwd, command."""
    where, _ = _where(ws, node)
    try:
        text = (where / "audit.log").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise JobkitError("bridge log", f"no audit log at {where / 'audit.log'}: the server never ran there") from None
    for raw in text.splitlines()[-lines:]:
        try:
            e = json.loads(raw)
            click.echo(
                f"{e['time']}  {e['verdict']:<8} {e['rule'] or '-':<16} {e['cwd'] or '-'}  {e['command'] or e['reason']}"
            )
        except (ValueError, KeyError, TypeError):
            click.echo(f"(damaged line) {raw[:200]}")


@group.command("policy")
@click.option(
    "--policy", "policy_file", type=click.Path(dir_okay=False), help="Policy file (default configs/bridge_policy.yaml)."
)
@click.option("--check", "line", help="Say what the policy decides for this command line (run nothing).")
@click.option("--cwd", default=".", show_default=True, help="With --check: the directory it would run in.")
@click.option("--workspace", "ws", help=WS_HELP)
def policy_command(policy_file, line, cwd, ws):
    """The policy in force (programs, why each, limits), or --check: what it decides for one command line."""
    from jobkit.bridge import policy

    try:
        pol = policy.load(Path(policy_file) if policy_file else None)
    except policy.PolicyError as exc:
        raise JobkitError("bridge policy", str(exc)) from None
    if line is None:
        click.echo(policy.describe(pol))
        return
    ctx = policy.Context(REPO_ROOT.resolve(), workspace(ws).resolve(), Path(cwd).resolve())
    try:
        plan = policy.decide(pol, line, ctx)
    except policy.Refused as exc:
        click.echo(f"refused (rule {exc.rule}): {exc}; {exc.ask}")
        exit_with(EXIT_ANSWER_NO)
    for sep, steps in plan.pipelines:
        click.echo(f"allowed{' after ' + sep if sep else ''}: " + " | ".join(json.dumps(s.argv) for s in steps))
