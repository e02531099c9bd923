"""Training entry: `jobkit launch <config.yml> [key=value ...]` (or `python -m jobkit.launch ...`).

Its arguments are parsed by hand, not by click: everything after the config goes to MaxText untouched, and
MaxText's own keys may look like options to a parser.

Steps: check the settings (jax_distributed.plan); decide MFU and say so in one line; on global rank 0, wrap
stdout/stderr to keep the job's step summary (core.step_summary); wrap them for MFU; import MaxText's train
module (PyPI `maxtext` or a source tree's `MaxText`); keep secret config keys out of its TensorBoard text
summaries (tb_redact); for a multi-node run, start JAX's distributed runtime
with JAX_HEARTBEAT_TIMEOUT's heartbeat and tell MaxText to skip its own (jax_distributed); run its `main`
through absl like MaxText's own `__main__` does; then leave with os._exit so atexit handlers (JAX
distributed shutdown and friends, seen to hang for minutes) cannot keep a finished job alive.
MAXTEXT_FAST_EXIT=0 opts out.
"""

import importlib
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from jobkit.core import step_summary
from jobkit.core.errors import EXIT_SETTINGS, EXIT_SETUP, EXIT_USAGE
from jobkit.core.hang_settings import SettingsError
from jobkit.launch import jax_distributed, mfu, mfu_stream, tb_redact

# Newest layout first: PyPI maxtext >= 0.2, then source-tree images.
TRAIN_MODULES = ("maxtext.trainers.pre_train.train", "MaxText.train")
USAGE = "usage: jobkit launch <config.yml> [key=value ...]"


class LaunchError(Exception):
    """No usable MaxText train module, found before training starts (EXIT_SETUP, one line)."""


def _spec_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package raises here
        return False


def find_train_module(candidates: Sequence[str] | None = None):
    """Import the first train module that exists; LaunchError if none does."""
    candidates = TRAIN_MODULES if candidates is None else candidates
    for name in candidates:
        if not _spec_exists(name):
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # present but broken: say which and why
            raise LaunchError(f"{name} exists but failed to import: {type(exc).__name__}: {exc}") from exc
        if not callable(getattr(module, "main", None)):
            raise LaunchError(f"{name} has no main(argv)")
        return module
    raise LaunchError(
        f"no MaxText train module found (tried {', '.join(candidates)}); install maxtext or use its image"
    )


def exit_code(code: object) -> int:
    """Map a SystemExit code the way the interpreter does: None -> 0, int -> int, else 1."""
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message
    return 1


def run_train(module, config: str, overrides: Sequence[str]) -> int:
    """Run module.main via absl.app.run and return a process exit code."""
    argv = [getattr(module, "__file__", None) or module.__name__, config, *overrides]
    try:
        # absl.app.run parses absl flags from argv (leaving config and
        # key=value as positionals for main) and sets up absl logging, as
        # MaxText's own `if __name__ == "__main__": app.run(main)` does.
        from absl import app

        app.run(module.main, argv=argv)
        return 0
    except SystemExit as exc:  # app.run always ends in sys.exit
        return exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1


def fast_exit_enabled(env=None) -> bool:
    value = (os.environ if env is None else env).get("MAXTEXT_FAST_EXIT", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def _flush_everything() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if isinstance(stream, mfu_stream.MfuStream):
                stream.drain()
            else:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except (OSError, ValueError):
            pass
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def finish(rc: int):
    """Leave with `rc`: os._exit unless MAXTEXT_FAST_EXIT opts out."""
    _flush_everything()
    if fast_exit_enabled():
        os._exit(rc if 0 <= rc <= 255 else 1)
    sys.exit(rc)


def _point_absl_at(stream) -> None:
    # absl's handler keeps the stream it was created with; if absl was
    # imported before the wrapper went in, point it at the wrapper.
    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is None:
        return
    handler = absl_logging.get_absl_handler().python_handler
    inner = stream
    while isinstance(inner, (mfu_stream.MfuStream, step_summary.StepTap)):
        inner = inner.wrapped
        if handler.stream is inner:
            handler.stream = stream
            return


def main(argv: Sequence[str] | None = None) -> int:
    """Run a training; returns the exit code (finish() does the exiting): before training starts EXIT_USAGE (no
    config), EXIT_SETTINGS (a setting refused), EXIT_SETUP (no MaxText), after it training's own."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    config, overrides = args[0], args[1:]

    # Settings first: a bad one is one line before anything starts.
    try:
        runtime = jax_distributed.plan(os.environ, config, overrides)
    except (jax_distributed.SetupError, SettingsError) as exc:
        print(f"jobkit.launch: {exc}", file=sys.stderr)
        return EXIT_SETTINGS

    setup = mfu.decide(overrides, config)
    print(setup.banner(), flush=True)
    # Global rank 0 keeps the job's step summary (core.step_summary); the MFU wrapper goes outside it, so the
    # summary sees the lines as the log does, MFU field included.
    summary = step_summary.open_summary(os.environ)
    if summary is not None:
        sys.stdout = step_summary.StepTap(sys.stdout, summary)
        sys.stderr = step_summary.StepTap(sys.stderr, summary)
    if setup.peak is not None:
        mfu_stream.install(setup.peak)

    try:
        module = find_train_module()
    except LaunchError as exc:
        print(f"jobkit.launch: {exc}", file=sys.stderr)
        return EXIT_SETUP
    # The train module imported MaxText's TensorBoard text sink: wrap it before any config reaches it.
    if not tb_redact.install() and module.__name__ in TRAIN_MODULES:
        print(
            "jobkit.launch: warning: MaxText's add_text_to_summary_writer was not found, so secret config keys"
            " (hf_access_token) may reach TensorBoard; set enable_tensorboard=false to be sure",
            file=sys.stderr,
        )
    _point_absl_at(sys.stderr)
    if runtime is not None:
        # After the import (which starts no JAX backend), before MaxText's config does.
        try:
            overrides = [*overrides, *jax_distributed.start(runtime)]
        except Exception:  # a coordinator that never answers: the traceback is the evidence
            traceback.print_exc()
            return 1
    return run_train(module, config, overrides)


if __name__ == "__main__":
    finish(main())
