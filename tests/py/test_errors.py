"""jobkit's exit codes: one table (jobkit.core.errors), one meaning per code, the docs page's table equal to it,
the shell's copies of the codes equal to it, no module that exits behind the CLI's edge, and the edge itself
(an unexpected exception is one line, a private traceback file and EXIT_INTERNAL)."""

import ast
import os
import re
import stat
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS, REPO

from jobkit import cli
from jobkit.core import errors, tgs
from jobkit.core.errors import (
    EXIT_ANSWER_NO,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NO_STEPS,
    EXIT_NOT_A_LOG,
    EXIT_SETTINGS,
    EXIT_SETUP,
    EXIT_USAGE,
)

PKG = REPO / "py" / "jobkit"
MFU_LOG = str(JOBKIT_LOGS / "launch-tiny-20steps-mfu.log")
NO_STEPS_LOG = str(JOBKIT_LOGS / "launch-config-error-no_such_key.log")
INTERNAL_LINE = re.compile(
    r"jobkit (?P<command>[a-z -]+): internal error: (?P<said>.+) \(traceback in (?P<path>/\S+\.txt)\)\n"
)


def exit_names() -> dict[str, int]:
    return {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}


def test_every_code_has_one_name_and_one_meaning():
    names = exit_names()
    by_value: dict[int, list[str]] = {}
    for name, value in names.items():
        assert isinstance(value, int) and 0 <= value <= 255, name
        by_value.setdefault(value, []).append(name)
    shared = {value: group for value, group in by_value.items() if len(group) > 1}
    assert not shared, f"two names for one code (no alias is documented as the same meaning): {shared}"
    assert set(errors.MEANINGS) == set(by_value), "every code in MEANINGS, and only the codes that have a name"
    assert errors.SIGNAL_BASE + 2 == EXIT_INTERRUPTED  # Ctrl-C is SIGINT's 128+N
    assert all(value < errors.SIGNAL_BASE or value == EXIT_INTERRUPTED for value in by_value)


def test_no_module_but_errors_names_an_exit_code():
    """One table: an `EXIT_X = <int>` elsewhere in the package is a second table that can drift."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path == PKG / "core" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if isinstance(node.value.value, int) and not isinstance(node.value.value, bool):
                    found += [
                        f"{path.relative_to(REPO)}:{node.lineno} {t.id}"
                        for t in node.targets
                        if isinstance(t, ast.Name) and t.id.startswith("EXIT_")
                    ]
    assert not found


def test_codes_are_given_by_name_never_as_a_number():
    """`ImageInfoError(..., 3)` hid a code of its own from the table: every code a command gives is an EXIT_* name."""
    takers = {"JobkitError", "ImageInfoError", "RequeueError", "WouldFail", "exit_with", "_Leave"}
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in takers:
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(isinstance(a, ast.Constant) and type(a.value) is int for a in args):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found


# Where a module may still end the process itself, and why: passing a child's status on, a process that is not a
# command (a worker, a script run by path, a daemon's fork), a signal handler's clean end.
EXITS_ALLOWED = {
    "launch/entry.py": 2,  # finish(): training's status, with os._exit past JAX's atexit handlers
    "observe/ray_driver.py": 2,  # os._exit with the command's status (Ray's threads would keep it alive)
    "observe/ray_start.py": 1,  # Ray's own CLI's status
    "observe/plugin_worker.py": 1,  # the exporter's worker process, not a command
    "observe/ray_watchdog.py": 2,  # a script the actor runs by path
    "ops/monitor.py": 3,  # daemonize()'s two forks; the SIGTERM handler's clean end (SystemExit, uncatchable)
}


def _exits(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            count += name in ("sys.exit", "os._exit", "ctx.exit", "exit", "quit")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            count += ast.unparse(node.exc).startswith("SystemExit")
    return count


def test_no_module_exits_behind_the_edge():
    """Commands raise JobkitError or end with errors.exit_with: the edge decides the message and the code."""
    counts = {str(p.relative_to(PKG)): _exits(ast.parse(p.read_text())) for p in sorted(PKG.rglob("*.py"))}
    assert {p: n for p, n in counts.items() if n} == EXITS_ALLOWED


def test_the_docs_table_is_the_table_in_errors():
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == "| code | name | meaning | given by |"
    shown = [tuple(cell.strip() for cell in row.strip("|").split(" | ")) for row in rows[1:]]
    assert shown == errors.table()
    assert errors.traceback_dir({"XDG_STATE_HOME": "/x"}) == Path("/x/jobkit/tracebacks")
    assert "`$XDG_STATE_HOME/jobkit/tracebacks/` (by default `~/.local/state/jobkit/tracebacks/`)" in section


def test_the_shell_copies_of_the_codes_are_the_table_s():
    def assigned(path, name):
        m = re.search(rf"^\s*{name} ?= ?(\d+)\b", (REPO / path).read_text(), re.M)
        assert m, f"{path} has no {name}="
        return int(m.group(1))

    assert assigned("utils/lib/launch_args.sh", "LAUNCH_SETTING_REFUSED_RC") == EXIT_SETTINGS
    assert assigned("utils/lib/observability.sh", "OBS_RAY_UNREACHABLE_RC") == errors.EXIT_UNREACHABLE
    assert assigned("py/bin/jobkit", "EXIT_SETUP") == EXIT_SETUP
    # The launchers test jobkit's codes by these names only, never by a number of their own.
    for script in ("_train.sh", "run_local.sh", "submit.sh"):
        text = (REPO / script).read_text()
        assert "check == LAUNCH_SETTING_REFUSED_RC" in text or "check != LAUNCH_SETTING_REFUSED_RC" in text, script
        assert not re.search(r"check [!=]= [1-9]", text), script


def test_help_texts_give_the_table_s_numbers():
    def help_of(*args):
        return CliRunner().invoke(cli.main, [*args, "--help"], terminal_width=400).output

    assert f"{EXIT_NO_STEPS} no step lines, {EXIT_NOT_A_LOG} not a job log" in " ".join(help_of("tgs").split())
    assert f"exit {EXIT_SETTINGS} when bad" in help_of("hang-watchdog")
    assert f"else exit {EXIT_ANSWER_NO}" in help_of("hang-watchdog")
    assert f"exit {EXIT_SETTINGS} if bad" in help_of("procs")
    assert f"exit {EXIT_ANSWER_NO} when none does" in help_of("bridge", "status")
    requeue_help = " ".join(help_of("requeue").split())
    assert f"{EXIT_ANSWER_NO}: not requeued" in requeue_help
    assert f"{errors.EXIT_ACTION_FAILED}: the submit failed" in requeue_help


def run(*args, **kwargs):
    return CliRunner().invoke(cli.main, list(args), **kwargs)


@pytest.mark.parametrize(
    ("args", "env", "code", "said"),
    [
        (["tgs", MFU_LOG], {}, 0, "TGS (steady mean):"),
        (["tgs", NO_STEPS_LOG], {}, EXIT_NO_STEPS, "no 'completed step' lines"),
        (["tgs", str(FIXTURES / "logs" / "maxtext-cpu-tiny-20steps.log")], {}, EXIT_NOT_A_LOG, "not a job log"),
        (["tgs", "/nonexistent/x.log"], {}, errors.EXIT_BAD_INPUT, "no such log file"),
        (["tgs", "--no-such-option", MFU_LOG], {}, EXIT_USAGE, "No such option"),
        (["tgs"], {}, EXIT_USAGE, "Missing argument"),
        (["no-such-command"], {}, EXIT_USAGE, "No such command"),
        (["hang-watchdog", "--check"], {"HANG_TIMEOUT": "abc"}, EXIT_SETTINGS, "HANG_TIMEOUT=abc"),
        (["hang-watchdog", "--check"], {"JAX_HEARTBEAT_TIMEOUT": "soon"}, EXIT_SETTINGS, "JAX_HEARTBEAT_TIMEOUT"),
        (["procs", "--check"], {"LOCAL_WORLD_SIZE": "abc"}, EXIT_SETTINGS, "LOCAL_WORLD_SIZE=abc"),
        (["procs"], {"LOCAL_WORLD_SIZE": "2"}, EXIT_USAGE, "no command given"),
        (["launch"], {}, EXIT_USAGE, "usage: jobkit launch"),
        (["notify", "hi"], {"JOBKIT_NOTIFY_URLS": "", "JOBKIT_NOTIFY_CONFIG": "/nonexistent"}, EXIT_SETTINGS, "no "),
        (["notify", "--url", "nota://url", "hi"], {}, EXIT_SETTINGS, "not a URL"),
    ],
)
def test_each_command_s_code(args, env, code, said):
    result = run(*args, env=env)
    assert result.exit_code == code, result.output
    assert said in result.output


def test_marker_and_bridge_status_say_no_with_their_own_code(tmp_path):
    job = tmp_path / "1-JAX-tiny"
    job.mkdir()
    marker = run("hang-watchdog", "--marker", "--job-dir", str(job), env={"JOB_ID": "1"})
    assert marker.exit_code == EXIT_ANSWER_NO and marker.output == ""
    status = run("bridge", "status", "--workspace", str(tmp_path), "--node", "n1")
    assert status.exit_code == EXIT_ANSWER_NO and "no bridge server serves" in status.output
    refused = run("bridge", "policy", "--check", "rm -rf /tmp/x", "--workspace", str(tmp_path))
    assert refused.exit_code == EXIT_ANSWER_NO and refused.output.startswith("refused (rule program): 'rm'")


def test_an_unexpected_exception_is_one_line_and_a_private_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def broken(*args, **kwargs):
        raise KeyError("tokens\nper device")

    monkeypatch.setattr(tgs, "summarize", broken)
    result = run("tgs", MFU_LOG)
    assert result.exit_code == EXIT_INTERNAL
    assert result.stdout == ""
    m = INTERNAL_LINE.fullmatch(result.stderr)
    assert m, result.stderr
    assert m["command"] == "tgs" and m["said"] == "KeyError: 'tokens\\nper device'"
    path = Path(m["path"])
    assert path.parent == tmp_path / "state" / "jobkit" / "tracebacks"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert text.startswith("jobkit tgs: internal error at ")
    assert "Traceback (most recent call last):" in text and "in broken" in text
    assert text.rstrip().endswith("KeyError: 'tokens\\nper device'")


def test_the_internal_error_names_a_subcommand_and_falls_back_to_the_temp_dir(tmp_path, monkeypatch):
    from jobkit.observe import tsdb_blocks

    (tmp_path / "state").write_text("a file, so no dir can be made under it\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(tsdb_blocks, "blocks", lambda tsdb: 1 / 0)
    result = run("tsdb", "blocks", str(tmp_path))
    assert result.exit_code == EXIT_INTERNAL
    m = INTERNAL_LINE.fullmatch(result.stderr)
    assert m and m["command"] == "tsdb blocks" and m["said"] == "ZeroDivisionError: division by zero", result.stderr
    path = Path(m["path"])
    assert path.parent == tmp_path and path.name.startswith("jobkit-") and "-tsdb-blocks-" in path.name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "ZeroDivisionError" in path.read_text()


def test_a_command_that_fails_to_load_is_named_too(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "broken", ("jobkit.no_such_module_jk:command", "A command whose module is gone."))
    result = run("broken", "x")
    m = INTERNAL_LINE.fullmatch(result.stderr)
    assert result.exit_code == EXIT_INTERNAL and m, result.stderr
    assert m["command"] == "broken" and m["said"] == "ModuleNotFoundError: No module named 'jobkit.no_such_module_jk'"
    assert Path(m["path"]).name.endswith(f"-broken-{os.getpid()}.txt")


def test_ctrl_c_a_closed_pipe_and_jobkit_s_own_errors_at_the_edge(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tgs, "summarize", interrupted)
    result = run("tgs", MFU_LOG)
    assert result.exit_code == EXIT_INTERRUPTED and "internal error" not in result.output
    assert "Aborted" not in result.output

    def reader_gone(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(tgs, "summarize", reader_gone)
    result = run("tgs", MFU_LOG)
    assert result.exit_code == errors.SIGNAL_BASE + 13 and result.output == ""  # SIGPIPE's, quietly

    def refused(*args, **kwargs):
        raise errors.JobkitError("tgs", "one line of ours", EXIT_SETUP)

    monkeypatch.setattr(tgs, "summarize", refused)
    result = run("tgs", MFU_LOG)
    assert result.exit_code == EXIT_SETUP and result.stderr == "jobkit tgs: one line of ours\n"

    def exits(*args, **kwargs):
        errors.exit_with(EXIT_ANSWER_NO)

    monkeypatch.setattr(tgs, "summarize", exits)
    assert run("tgs", MFU_LOG).exit_code == EXIT_ANSWER_NO
    assert not (tmp_path / "state").exists(), "none of these is a bug: no traceback file"


def test_the_console_script_s_internal_error_is_one_line(tmp_path):
    """For real, through the venv's python: the edge is the console script's too (not only CliRunner's)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from jobkit import cli\n"
        "from jobkit.core import tgs\n"
        "tgs.summarize = lambda *a, **k: {}['x']\n"
        "sys.argv = ['jobkit', 'tgs', sys.argv[1]]\n"
        "cli.main()\n"
    )
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code, MFU_LOG], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == EXIT_INTERNAL and done.stdout == ""
    m = INTERNAL_LINE.fullmatch(done.stderr)
    assert m and m["said"] == "KeyError: 'x'" and Path(m["path"]).is_file(), done.stderr


def test_exit_with_is_click_s_exit():
    with pytest.raises(click.exceptions.Exit) as raised:
        errors.exit_with(EXIT_ANSWER_NO)
    assert raised.value.exit_code == EXIT_ANSWER_NO
