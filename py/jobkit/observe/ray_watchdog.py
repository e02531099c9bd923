"""KILL a command's process group when the Ray actor that started it dies: `python ray_watchdog.py PGID`.

stdin is a pipe whose only write end the actor (jobkit.observe.ray_actor) holds. The actor writes "done" and closes it
once its command has ended and been reaped; the pipe closing without "done" means the actor died (e.g. Ray
ended it after its driver died), and then process group PGID is KILLed. Popen children outlive their parent,
and PR_SET_PDEATHSIG would reach only the direct child, not the training process a launcher script started.

The watchdog must not stay the actor's child: when a worker exits, Ray KILLs the worker's direct children,
which would take the watchdog along before it can act. So it forks once and the first process exits at once;
the actor starts it in a process group of its own, out of reach of a KILL of the worker's group.

Run by file path with the node's interpreter, standard library only: a node needs no jobkit installed.
"""

import os
import signal
import sys


def watch(pgid: int) -> None:
    """Blocks until stdin closes; KILLs group PGID unless the last thing read was "done"."""
    if os.fork():
        os._exit(0)  # the starter: the actor waits for it, the watcher goes on as an orphan
    received = b""
    while chunk := os.read(0, 4096):
        received += chunk
    if received.strip() != b"done":
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:  # the group is already gone
            pass


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit(f"usage: {sys.argv[0]} PGID (stdin: the pipe the actor holds); see the module's docstring")
    watch(int(sys.argv[1]))
