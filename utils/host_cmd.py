#!/usr/bin/env python3
"""Usage: utils/host_cmd.py [--timeout S] [--cwd DIR] [--json] [--async] [--node NODE] 'COMMAND'
       utils/host_cmd.py --ping [--node NODE]
       utils/host_cmd.py --result ID [--json] [--node NODE]
Summary: Run a cluster command on the host from inside a container, through the bridge (`jobkit bridge serve`)

The host's bridge server runs COMMAND (one command line: programs, arguments, pipes, &&, ;) if its policy
allows it, and this prints the command's stdout and stderr and exits with its exit code. Needs only python3:
copy or mount this file into any container that sees the bridge directory.

  --ping        prints ALIVE when a server answers (exit 0); else says none does (exit 69)
  --timeout S   seconds the command may run before the host kills it with its process group (default 300)
  --cwd DIR     where it runs (default: here); must be under the repository or the workspace
  --json        print the whole result as JSON (exit code, stdout, stderr, times, the refusal's rule)
  --async       print the request id and return at once; fetch it later with --result ID
  --result ID   the result of an --async request (exit 75 while it still runs)
  --node NODE   the server of that node (default: HOST_CMD_NODE, else the only server there is)
  --dir DIR     the bridge directory (default: HOST_CMD_DIR, else $JOB_WORKSPACE/.bridge, else
                <this repository>/outputs/.bridge)

Exit codes: the command's own; 124 it ran past --timeout (killed); 125 lost (the server stopped while it
ran; it was not run again); 126 refused by the policy (the message names the rule and what to ask the
person for); 69 no server answers (ask the person to start `jobkit bridge serve`); 75 --result: not done
yet; 2 bad usage. Never start the server yourself: it is the person's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import time
from typing import NoReturn

ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
EXIT_TIMEOUT, EXIT_LOST, EXIT_REFUSED, EXIT_NO_SERVER, EXIT_PENDING, EXIT_USAGE = 124, 125, 126, 69, 75, 2
PING_WAIT_S = 5.0
GRACE_S = 30.0  # beyond --timeout: the host's kill and the result's writing


def fail(message: str, code: int) -> NoReturn:
    print(f"host_cmd: {message}", file=sys.stderr)
    sys.exit(code)


def bridge_root(given: str | None) -> str:
    if given or os.environ.get("HOST_CMD_DIR"):
        return given or os.environ["HOST_CMD_DIR"]
    workspace = os.environ.get("JOB_WORKSPACE") or os.path.join(REPO, "outputs")
    return os.path.join(workspace, ".bridge")


def node_dir(root: str, node: str | None) -> str:
    node = node or os.environ.get("HOST_CMD_NODE")
    start = "ask the person to start `jobkit bridge serve` on the host"
    if node:
        if not ID.fullmatch(node):
            fail(f"--node {node!r} is not a node name ([A-Za-z0-9_-])", EXIT_USAGE)
        if not os.path.isdir(os.path.join(root, node, "requests")):
            fail(f"no bridge server for node {node} under {root}; {start}", EXIT_NO_SERVER)
        return os.path.join(root, node)
    try:
        nodes = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n, "requests")))
    except OSError:
        nodes = []
    if not nodes:
        fail(f"no bridge server under {root}; {start} (or pass --dir)", EXIT_NO_SERVER)
    if len(nodes) > 1:
        fail(f"servers for several nodes under {root}; pass --node (one of: {', '.join(nodes)})", EXIT_USAGE)
    return os.path.join(root, nodes[0])


def send(where: str, request: dict) -> None:
    """The request file, whole or not at all: a private temp name, then a rename into requests/."""
    tmp = os.path.join(where, "requests", f".{request['id']}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(request, fh)
    os.rename(tmp, os.path.join(where, "requests", f"{request['id']}.json"))


def take_result(where: str, rid: str) -> dict | None:
    path = os.path.join(where, "results", f"{rid}.json")
    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
    except FileNotFoundError:
        return None
    os.unlink(path)
    return result


def wait(where: str, rid: str, seconds: float) -> dict | None:
    end, pause = time.monotonic() + seconds, 0.005
    while True:
        result = take_result(where, rid)
        if result is not None or time.monotonic() > end:
            return result
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)


def show(result: dict, as_json: bool) -> int:
    status = result.get("status")
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(result.get("stdout") or "")
        sys.stderr.write(result.get("stderr") or "")
        for stream in ("stdout", "stderr"):
            if result.get(f"{stream}_cut"):
                print(f"host_cmd: {stream} cut: {result[f'{stream}_cut']} more bytes not kept", file=sys.stderr)
    if status == "refused":
        if not as_json:
            print(f"host_cmd: refused (rule {result.get('rule')}): {result.get('reason')}", file=sys.stderr)
            if result.get("ask"):
                print(f"host_cmd: {result['ask']}", file=sys.stderr)
        return EXIT_REFUSED
    if status == "lost":
        if not as_json:
            print(f"host_cmd: lost: {result.get('reason')}", file=sys.stderr)
        return EXIT_LOST
    if status == "timeout":
        if not as_json:
            print(f"host_cmd: killed after --timeout {result.get('timeout')} s", file=sys.stderr)
        return EXIT_TIMEOUT
    return int(result.get("exit_code") or 0)


def fetch(where: str, rid: str, as_json: bool) -> int:
    """--result ID: the result of an --async request, once."""
    if not ID.fullmatch(rid):
        fail(f"--result {rid!r} is not a request id", EXIT_USAGE)
    result = take_result(where, rid)
    if result is None:
        for state in ("requests", "taken"):
            if os.path.exists(os.path.join(where, state, f"{rid}.json")):
                fail(f"request {rid} is not done yet; ask again later", EXIT_PENDING)
        fail(f"no result for {rid} (fetched already, or removed after its age)", 1)
    return show(result, as_json)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="host_cmd.py", add_help=False)
    parser.add_argument("command", nargs="?")
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--ping", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--cwd")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--result")
    parser.add_argument("--node")
    parser.add_argument("--dir")
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        sys.exit(EXIT_USAGE)
    if args.help:
        print(__doc__.strip())
        sys.exit(0)
    if not (0 < args.timeout < 1e9):
        fail(f"--timeout {args.timeout:g}: give a number of seconds above 0", EXIT_USAGE)
    if sum(bool(x) for x in (args.ping, args.result, args.command)) != 1:
        fail("give one of: 'COMMAND', --ping, --result ID (see --help)", EXIT_USAGE)
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    root = bridge_root(args.dir)
    where = node_dir(root, args.node)
    if args.result:
        return fetch(where, args.result, args.json)
    rid = f"{int(time.time())}-{secrets.token_hex(8)}"
    workspace = os.environ.get("JOB_WORKSPACE") or os.path.dirname(os.path.abspath(root))
    request = {"version": 1, "id": rid, "roots": {"repo": REPO, "workspace": workspace}}
    if args.ping:
        request["ping"] = True
    else:
        request.update(command=args.command, cwd=os.path.abspath(args.cwd or os.getcwd()), timeout=args.timeout)
    try:
        send(where, request)
    except OSError as exc:
        fail(f"cannot write a request under {where} ({exc.strerror}): the bridge dir must be yours", EXIT_NO_SERVER)
    if args.asynchronous:
        print(rid)
        return 0
    result = wait(where, rid, PING_WAIT_S if args.ping else args.timeout + GRACE_S)
    if result is None:
        pending = os.path.join(where, "requests", f"{rid}.json")
        if os.path.exists(pending):
            os.unlink(pending)
            fail(f"no bridge server answers for {os.path.basename(where)}; ask the person to start `jobkit bridge serve`",
                 EXIT_NO_SERVER)  # fmt: skip
        fail(f"no result after {args.timeout:g} s (+{GRACE_S:g}); it may still run: --result {rid}", EXIT_TIMEOUT)
    if args.ping:
        print("ALIVE")
        return 0
    return show(result, args.json)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
