"""jobkit.launch: module lookup, absl argv handling, exit codes, fast exit, and real CPU runs."""

import os
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from conftest import PY_DIR, REPO

from jobkit.core import failures, logparse, tgs, verdict
from jobkit.core.errors import EXIT_SETUP, EXIT_USAGE
from jobkit.launch import entry as launch
from jobkit.launch import tb_redact

# ---- real MaxText runs on CPU (started together: they share the 2 cores) ----

RUN_TIMEOUT_S = 240
FAKE_HF_TOKEN = "hf_FAKEtbredact0000SECRET42"


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Start a 3-step tiny training and a bogus-key run; wait for both."""
    tmp = tmp_path_factory.mktemp("launch")
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        HARDWARE_PEAK_TFLOPS="1",
        HF_TOKEN=FAKE_HF_TOKEN,  # MaxText copies it into its config as hf_access_token
    )
    env.pop("MAXTEXT_FAST_EXIT", None)
    # the command _train.sh runs
    common = [
        sys.executable,
        str(PY_DIR / "bin" / "jobkit"),
        "launch",
        "configs/tiny.yml",
        f"jax_cache_dir={tmp}/jax_cache",
    ]
    cmds = {
        "ok": common + ["steps=3", f"base_output_directory={tmp}/ok"],
        "bogus": common + ["steps=3", f"base_output_directory={tmp}/bogus", "no_such_key=1"],
    }
    procs, started = {}, {}
    for name, cmd in cmds.items():
        started[name] = time.monotonic()
        procs[name] = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            results[name] = {"rc": proc.returncode, "out": out, "err": err, "wall": time.monotonic() - started[name]}
            results[name]["dir"] = tmp / name
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_real_run_injects_mfu_and_exits_zero(real_runs):
    r = real_runs["ok"]
    assert r["rc"] == 0, r["err"][-2000:]
    assert (
        r["out"].splitlines()[0] == "[MFU] tracking: gpu=- dtype=bf16 peak=1 TFLOP/s (source=env HARDWARE_PEAK_TFLOPS)"
    )
    steps = [l for l in (r["out"] + r["err"]).splitlines() if "completed step:" in l]
    assert len(steps) == 3
    for line in steps:
        m = re.search(r"TFLOP/s/device: ([0-9.]+), MFU: ([0-9.]+)%, Tokens/s/device:", line)
        assert m, line
        assert float(m.group(2)) == pytest.approx(float(m.group(1)) * 100, abs=0.006)  # peak 1 TFLOP/s
    assert r["wall"] < 120  # prompt exit: nothing hangs after the last step


def test_real_run_keeps_hf_token_out_of_tensorboard(real_runs):
    r = real_runs["ok"]
    assert r["rc"] == 0, r["err"][-2000:]
    events = sorted(r["dir"].rglob("events.out.tfevents.*"))
    assert events, sorted(str(p) for p in r["dir"].rglob("*"))
    data = b"".join(p.read_bytes() for p in events)
    assert b"num_kv_heads/text_summary" in data, "the config still reaches TensorBoard"
    assert b"hf_access_token" not in data and FAKE_HF_TOKEN.encode() not in data


def test_step_lines_go_to_stderr(real_runs):
    # MaxText logs steps through absl -> stderr; the wrapper must sit there.
    r = real_runs["ok"]
    assert "completed step: 2," in r["err"]
    assert "completed step:" not in r["out"]


def test_real_run_end_of_run_line(real_runs, tmp_path):
    r = real_runs["ok"]
    log = tmp_path / "job.log"
    log.write_text(
        "JOB_ID=local_20261122_101010_ab12\nJOB_NAME=JAX-tiny\nNNODES=1\nMODEL_NAME=tiny\n" + r["out"] + r["err"]
    )
    line = tgs.format_line(
        tgs.summarize(logparse.parse_file(log)), verdict.verdict(logparse.parse_file(log), "SUCCESS", 0)
    )
    assert (
        line
        == "tiny 1N (job local_20261122_101010_ab12): TGS n/a (steady window 5-14 needs steps>=15, run logged 3) — PASS"
    )


def test_bogus_key_fails_as_config_error(real_runs):
    r = real_runs["bogus"]
    assert r["rc"] != 0
    assert "MAXTEXT CONFIG ERROR: 'no_such_key' not in" in r["err"]
    assert failures.classify(r["out"] + r["err"], exit_code=r["rc"]).reason == "config-error"


# ---- in-process pieces ----------------------------------------------------------


def _fake_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return launch.find_train_module(["no_such_pkg_jk.train", name])


def test_run_train_passes_config_and_overrides_as_positionals(tmp_path, monkeypatch):
    mod = _fake_module(
        tmp_path,
        monkeypatch,
        "fake_train_ok",
        """
        SEEN = []
        def main(argv):
            SEEN.append(list(argv))
        """,
    )
    assert launch.run_train(mod, "cfg.yml", ["steps=3", "dtype=bfloat16"]) == 0
    assert mod.SEEN[0][1:] == ["cfg.yml", "steps=3", "dtype=bfloat16"]


@pytest.mark.parametrize(
    "name, raise_stmt, rc, text",
    [
        ("fake_exit_int", "raise SystemExit(3)", 3, ""),
        ("fake_exit_str", "raise SystemExit('config broken')", 1, "config broken"),
        ("fake_value_error", "raise ValueError('boom')", 1, "ValueError: boom"),
        ("fake_ctrl_c", "raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
    ],
)
def test_run_train_exit_codes(tmp_path, monkeypatch, capsys, name, raise_stmt, rc, text):
    mod = _fake_module(tmp_path, monkeypatch, name, f"def main(argv):\n    {raise_stmt}\n")
    assert launch.run_train(mod, "cfg.yml", []) == rc
    assert text in capsys.readouterr().err


def test_missing_maxtext_is_one_clear_line(monkeypatch, capsys, clean_env):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(launch, "TRAIN_MODULES", ("no_such_pkg_jk.train", "NoSuchMaxText_jk.train"))
    assert launch.main(["configs/tiny.yml"]) == EXIT_SETUP
    out, err = capsys.readouterr()
    assert out.startswith("[MFU] not reported: CPU backend")
    assert err == (
        "jobkit.launch: no MaxText train module found (tried no_such_pkg_jk.train, NoSuchMaxText_jk.train); "
        "install maxtext or use its image\n"
    )


def test_broken_train_module_says_why(tmp_path, monkeypatch):
    (tmp_path / "broken_train_jk.py").write_text("import no_such_dependency_jk\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(launch.LaunchError, match="broken_train_jk exists but failed to import: ModuleNotFoundError"):
        launch.find_train_module(["broken_train_jk"])


def test_module_without_main_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "nomain_train_jk.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(launch.LaunchError, match="has no main"):
        launch.find_train_module(["nomain_train_jk"])


def test_usage(capsys):
    assert launch.main([]) == EXIT_USAGE
    assert "usage: jobkit launch <config.yml>" in capsys.readouterr().err


def test_launch_command_help_and_missing_config():
    from click.testing import CliRunner

    from jobkit.cli import main

    shown = CliRunner().invoke(main, ["launch", "--help"])
    assert shown.exit_code == 0
    assert shown.output.startswith("usage: jobkit launch <config.yml> [key=value ...]")
    assert "os._exit" in shown.output  # the docstring's description of the fast exit
    bare = CliRunner().invoke(main, ["launch"])
    assert bare.exit_code == EXIT_USAGE


def test_exit_code_mapping(capsys):
    assert launch.exit_code(None) == 0
    assert launch.exit_code(4) == 4
    assert launch.exit_code(True) == 1
    assert launch.exit_code("message") == 1
    assert "message" in capsys.readouterr().err


@pytest.mark.parametrize(
    "value, enabled", [(None, True), ("1", True), ("yes", True), ("0", False), ("false", False), ("no", False)]
)
def test_fast_exit_switch(value, enabled):
    env = {} if value is None else {"MAXTEXT_FAST_EXIT": value}
    assert launch.fast_exit_enabled(env) is enabled


@pytest.mark.parametrize("fast, atexit_runs", [("1", False), ("0", True)])
def test_finish_skips_atexit_only_when_fast(fast, atexit_runs):
    code = (
        "import atexit, sys\n"
        "from jobkit.launch.entry import finish\n"
        "atexit.register(lambda: print('ATEXIT-RAN'))\n"
        "print('before', end='')\n"  # unflushed partial line must still come out
        "finish(7)\n"
    )
    env = dict(os.environ, MAXTEXT_FAST_EXIT=fast)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 7
    assert done.stdout.startswith("before")
    assert ("ATEXIT-RAN" in done.stdout) is atexit_runs


def test_absl_handler_is_pointed_at_the_wrapper(monkeypatch):
    import io

    from absl import logging as absl_logging

    from jobkit.launch import mfu_stream

    handler = absl_logging.get_absl_handler().python_handler
    original = io.StringIO()
    monkeypatch.setattr(handler, "stream", original)
    wrapper = mfu_stream.MfuStream(original, 1.0)
    launch._point_absl_at(wrapper)
    assert handler.stream is wrapper


# ---- S2: secret config keys never reach TensorBoard ------------------------------


@pytest.mark.parametrize(
    "key",
    ["hf_access_token", "HF_TOKEN", "wandb_api_key", "aws_secret_access_key", "db_password", "client_secret_path"],
)
def test_secret_keys(key):
    assert tb_redact.is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    ["num_kv_heads", "key_proj", "gdn_key_head_dim", "gdn_num_key_heads", "num_moe_token_chunks", "tokenizer_path"],
)
def test_ordinary_keys_are_kept(key):
    assert not tb_redact.is_secret_key(key)


def test_of_maxtext_own_keys_only_hf_access_token_is_secret():
    import importlib.util

    spec = importlib.util.find_spec("maxtext")
    if spec is None:
        pytest.skip("maxtext is not installed")
    base = Path(spec.origin).parent / "configs" / "base.yml"
    keys = set(re.findall(r"^([a-z0-9_]+):", base.read_text(), re.M))
    assert len(keys) > 500 and {"base_num_kv_heads", "tokenizer_path", "key_proj"} <= keys
    assert sorted(k for k in keys if tb_redact.is_secret_key(k)) == ["hf_access_token"]


def test_install_wraps_every_loaded_max_utils_once(monkeypatch):
    written = []
    fake = types.ModuleType("fake.max_utils")
    fake.add_text_to_summary_writer = lambda key, value, writer: written.append((key, value))
    monkeypatch.setenv("HF_TOKEN", "hf_FAKEvalue0000SECRET")
    modules = {"fake.max_utils": fake, "fake.other": types.ModuleType("fake.other"), "gone": None}
    assert tb_redact.install(modules) == 1
    assert tb_redact.install(modules) == 1  # already wrapped: not wrapped twice
    fake.add_text_to_summary_writer("hf_access_token", "hf_FAKEvalue0000SECRET", None)
    fake.add_text_to_summary_writer("other_name", "prefix hf_FAKEvalue0000SECRET", None)
    fake.add_text_to_summary_writer("num_kv_heads", "4", None)
    assert written == [("num_kv_heads", "4")]


# Runs in a child (it imports JAX and MaxText): MaxText's own config-to-TensorBoard path, into DIR/before
# without the wrapper and DIR/after with it.
_TB_CHILD = r"""
import sys
from maxtext.common.gcloud_stub import writer
from maxtext.utils import maxtext_utils
from jobkit.launch import tb_redact

config = {"hf_access_token": sys.argv[2], "num_kv_heads": 4}
for name in ("before", "after"):
    if name == "after":
        assert tb_redact.install() >= 1
    w = writer.SummaryWriter(f"{sys.argv[1]}/{name}")
    maxtext_utils.add_config_to_summary_writer(config, w)
    w.close()
"""


def test_maxtext_config_summary_lacks_hf_access_token(tmp_path):
    pytest.importorskip("maxtext")
    secret = "hf_FAKEunit0000SECRET43"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", _TB_CHILD, str(tmp_path), secret],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    def event_bytes(name):
        files = sorted((tmp_path / name).glob("events.out.tfevents.*"))
        assert files, name
        return b"".join(f.read_bytes() for f in files)

    before, after = event_bytes("before"), event_bytes("after")
    assert secret.encode() in before, "control: MaxText alone writes the token"
    assert secret.encode() not in after and b"hf_access_token" not in after
    assert b"num_kv_heads/text_summary" in after
