"""Long-lived host of one Python exporter plugin (``*_metrics_plugin.py``), started by the exporter engine.

Run as ``python plugin_worker.py <plugin file>`` (by path, not as ``-m``: it imports nothing of jobkit, so it starts
in the time of a bare interpreter). It loads the plugin once, then answers one request per exporter cycle: a line
of JSON ``{"host": ..., "state": ...}`` on stdin, answered on stdout by ``<rc> <length>\\n`` and ``length`` bytes
of the plugin's output. rc is 0 when ``collect(host, state)`` returned its text, the code of a ``SystemExit`` it
raised (99 retires the plugin: the worker answers and exits), 1 for any other exception (its traceback goes to
stderr, the exporter's log). ``_PLUGIN_STATE`` is set in the environment as for a shell plugin. The worker exits at
end of input, so it dies with the engine. Timeouts are the engine's: it kills the worker's process group.
"""

import importlib.util
import json
import os
import sys
import traceback

DISABLE_RC = 99


def _write(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def main(argv):
    path = argv[1]
    # Answers go to a private copy of stdout; what the plugin (or a command it starts) prints goes to stderr, the
    # exporter's log, and cannot break an answer.
    answers = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spec = importlib.util.spec_from_file_location("exporter_plugin", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        collect = module.collect
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:
        traceback.print_exc()
        sys.stderr.write(f"plugin_worker: {path} could not be loaded (it must define collect(host, state))\n")
        return 1
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        request = json.loads(line)
        state = request.get("state")
        if state is None:
            os.environ.pop("_PLUGIN_STATE", None)
        else:
            os.environ["_PLUGIN_STATE"] = state
        try:
            text, rc = collect(request["host"], state), 0
        except SystemExit as e:
            text, rc = "", _exit_code(e)
        except BaseException:
            traceback.print_exc()
            text, rc = "", 1
        data = text.encode("utf-8", "replace") if rc == 0 else b""
        _write(answers, b"%d %d\n" % (rc, len(data)) + data)
        if rc == DISABLE_RC:
            return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
