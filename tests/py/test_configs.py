"""Model configs (configs/*.yml) and the alias table (configs/aliases).

Every config is put through MaxText's own loader, `maxtext.configs.pyconfig.initialize`, the same
call `train` makes before it builds anything, so a key MaxText does not know, a bad value, or a
combination its validators reject fails here instead of minutes into a cluster job.

The loader runs in one child process for all configs (MaxText's import costs ~2 s, each config
~0.3 s), with JAX on the CPU and 8 emulated devices, i.e. one 8-GPU node. That child also builds
each config's device mesh on those 8 devices, which proves the ICI (inside-a-node) axes multiply
out to 8, and resolves the DCN (between-node) axes for several node counts. `hardware: gpu` stays
as written, so GPU-only validation (TE attention with packing needs max_segments_per_seq) runs too;
`skip_jax_distributed_system=true` on the check's command line stops the loader from looking for a
coordinator, and no other key is overridden.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
ALIASES = CONFIGS / "aliases"
CONFIG_NAMES = sorted(p.stem for p in CONFIGS.glob("*.yml"))
DEVICES_PER_NODE = 8
NODE_COUNTS = (1, 2, 4, 8, 16)

# What each model name must turn into once MaxText has merged in its models/<name>.yml: catches a
# config pointing at the wrong architecture, and the inline Grok-1 architecture drifting.
EXPECTED = {
    "tiny": dict(model_name="default", emb_dim=64, num_decoder_layers=2, vocab_size=256),
    "llama2-70b": dict(model_name="llama2-70b", emb_dim=8192, num_decoder_layers=80, vocab_size=32000),
    "llama3-70b": dict(model_name="llama3-70b", emb_dim=8192, num_decoder_layers=80, vocab_size=128256),
    "llama3.1-8b": dict(model_name="llama3.1-8b", emb_dim=4096, num_decoder_layers=32, vocab_size=128256),
    "llama3.1-70b": dict(model_name="llama3.1-70b", emb_dim=8192, num_decoder_layers=80, vocab_size=128256),
    "llama3.1-405b": dict(model_name="llama3.1-405b", emb_dim=16384, num_decoder_layers=126, vocab_size=128256),
    "mixtral-8x22b": dict(model_name="mixtral-8x22b", emb_dim=6144, num_experts=8, num_experts_per_tok=2),
    "grok-1": dict(
        model_name="default",
        decoder_block="mixtral",
        emb_dim=6144,
        num_query_heads=48,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=32768,
        num_decoder_layers=64,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=131072,
    ),
    "deepseek3-671b": dict(model_name="deepseek3-671b", decoder_block="deepseek", emb_dim=7168, num_experts=256),
    "kimi-k2-1t": dict(model_name="kimi-k2-1t", decoder_block="deepseek", emb_dim=7168, num_experts=384),
    "qwen3-30b-a3b": dict(model_name="qwen3-30b-a3b", decoder_block="qwen3_moe", emb_dim=2048, num_experts=128),
    "qwen3-480b-a35b": dict(model_name="qwen3-480b-a35b", decoder_block="qwen3_moe", emb_dim=6144, num_experts=160),
}

# Runs in the child process. argv[1]: JSON list of [label, yml path]. Prints one JSON line per config.
_LOADER = r"""
import enum, json, sys
import jax
import numpy as np
from maxtext.configs import pyconfig
from maxtext.utils import max_utils, maxtext_utils

DERIVED = ("emb_dim", "num_query_heads", "num_kv_heads", "head_dim", "mlp_dim", "num_decoder_layers",
           "num_experts", "num_experts_per_tok", "vocab_size", "decoder_block", "model_name",
           "num_target_devices", "global_batch_size_to_train_on")

def plain(v):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)  # jnp dtypes and the like

requests, out_dir, node_counts = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
for label, path in requests:
    argv = ["", path, "skip_jax_distributed_system=true", f"base_output_directory={out_dir}", "log_config=false"]
    result = {"label": label}
    try:
        cfg = pyconfig.initialize(argv)
    except BaseException as e:  # the loader sys.exit(2)s outside pytest; the real error is its context
        err = e.__context__ if isinstance(e, SystemExit) and e.__context__ is not None else e
        result["error"] = f"{type(err).__name__}: {err}"
        print(json.dumps(result), flush=True)
        continue
    keys = cfg.get_keys()
    result["keys"] = {k: plain(v) for k, v in keys.items() if k.endswith("_parallelism") or k in DERIVED}
    result["values"] = {k: plain(keys[k]) for k in keys}
    result["bad_activations"] = [a for a in cfg.mlp_activations if a != "linear" and not hasattr(jax.nn, a)]
    try:
        result["mesh_shape"] = dict(zip(cfg.mesh_axes, np.shape(maxtext_utils.create_device_mesh(cfg))))
    except BaseException as e:
        result["mesh_error"] = f"{type(e).__name__}: {e}"
    result["dcn_by_nodes"] = {}
    for n in node_counts:
        try:
            result["dcn_by_nodes"][str(n)] = max_utils.fill_unspecified_mesh_axes(list(cfg.dcn_parallelism), n, "DCN")
        except BaseException as e:
            result["dcn_by_nodes"][str(n)] = f"{type(e).__name__}: {e}"
    print(json.dumps(result, default=str), flush=True)
"""


def _loader_env():
    env = dict(os.environ)
    # The child must not join a real job: no coordinator, no MaxText M_<KEY> overrides from the caller.
    for name in list(env):
        if name.startswith(("M_", "JAX_COORDINATOR", "CUDA_VISIBLE", "ROCR_VISIBLE", "HIP_VISIBLE")):
            del env[name]
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES_PER_NODE}",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def run_loader(requests, tmp_path):
    """Loads [(label, path)] with MaxText in one child process; returns {label: result}."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADER,
            json.dumps([[lbl, str(p)] for lbl, p in requests]),
            str(tmp_path),
            json.dumps(NODE_COUNTS),
        ],
        cwd=tmp_path,
        env=_loader_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith('{"label"'):
            r = json.loads(line)
            results[r["label"]] = r
    missing = [lbl for lbl, _ in requests if lbl not in results]
    assert not missing, (
        f"the MaxText loader ({sys.executable}) gave no result for {missing}; exit {proc.returncode}\n"
        f"{proc.stderr[-4000:]}"
    )
    return results


BOGUS_KEY = "definitely_not_a_maxtext_key"

# Free-form strings the loader passes through unchecked; a typo would only fail once the model is
# built on the cluster. These are the values MaxText 0.2.5's attention op and decoder act on.
ATTENTION_KERNELS = {"autoselected", "dot_product", "flash", "cudnn_flash_te", "cudnn_flash_jax"}
REMAT_POLICIES = {
    "full",
    "minimal",
    "minimal_with_context",
    "minimal_with_quantization",
    "minimal_with_context_and_quantization",
    "save_dot_with_context_except_mlp",
    "save_dot_except_mlpwi",
    "save_dot_except_mlp",
    "save_qkv_proj",
    "qkv_proj_offloaded",
    "minimal_offloaded",
    "custom",
    "save_out_proj",
}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Every config, plus a copy of tiny.yml with one unknown key, through one loader process."""
    tmp = tmp_path_factory.mktemp("configs")
    bogus = tmp / "bogus.yml"  # base_config: base.yml then resolves to MaxText's own base.yml
    bogus.write_text((CONFIGS / "tiny.yml").read_text() + f"\n{BOGUS_KEY}: 1\n")
    requests = [(name, CONFIGS / f"{name}.yml") for name in CONFIG_NAMES] + [("<bogus>", bogus)]
    return run_loader(requests, tmp)


def read_yml(name):
    return yaml.safe_load((CONFIGS / f"{name}.yml").read_text())


def test_expected_configs_exist():
    assert set(EXPECTED) == set(CONFIG_NAMES), "add every new config to EXPECTED (and every removed one out)"


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_maxtext_accepts_config(loaded, name):
    result = loaded[name]
    assert "error" not in result, f"MaxText rejected configs/{name}.yml: {result['error']}"
    got = result["keys"]
    for key, want in EXPECTED[name].items():
        assert got[key] == want, f"{name}: {key} is {got[key]!r}, expected {want!r}"
    values = result["values"]
    assert values["attention"] in ATTENTION_KERNELS, f"{name}: no attention kernel {values['attention']!r}"
    assert values["remat_policy"] in REMAT_POLICIES, f"{name}: no remat policy {values['remat_policy']!r}"
    assert not result["bad_activations"], f"{name}: not activations in jax.nn: {result['bad_activations']}"


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_key_in_the_file_takes_effect(loaded, name):
    """MaxText merges models/<model_name>.yml *over* the file given on the command line, so a key that
    file also sets would be silently replaced. Every value written in our file must survive as written."""
    result = loaded[name]
    assert "error" not in result, result.get("error")
    for key, want in read_yml(name).items():
        if key == "base_config":
            continue
        assert key in result["values"], f"{name}: {key} vanished from the loaded config"
        got = result["values"][key]
        if key.endswith("dtype"):
            got, want = str(got), str(want)
        assert got == want, f"{name}: {key}: file says {want!r}, MaxText ended up with {got!r}"


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_parallelism_fits_an_8_gpu_node_and_any_node_count(loaded, name):
    result = loaded[name]
    assert "error" not in result, result.get("error")
    par = {k: v for k, v in result["keys"].items() if k.endswith("_parallelism")}
    for group in ("dcn", "ici"):
        auto = sorted(k for k, v in par.items() if k.startswith(group + "_") and v == -1)
        assert len(auto) <= 1, f"{name}: more than one {group} axis is -1 (base.yml defaults count): {auto}"
    assert "mesh_error" not in result, f"{name}: no mesh on one {DEVICES_PER_NODE}-GPU node: {result['mesh_error']}"
    mesh = result["mesh_shape"]
    assert mesh and all(isinstance(v, int) for v in mesh.values())
    product = 1
    for size in mesh.values():
        product *= size
    assert product == DEVICES_PER_NODE, f"{name}: mesh {mesh}"
    for nodes, dcn in result["dcn_by_nodes"].items():
        assert isinstance(dcn, list), f"{name}: DCN axes do not resolve on {nodes} nodes: {dcn}"


def test_moe_settings_only_in_moe_configs():
    for name in CONFIG_NAMES:
        cfg = read_yml(name)
        moe = cfg.get("num_experts", 1) > 1 or EXPECTED[name].get("num_experts", 1) > 1
        for key in ("sparse_matmul", "megablox", "capacity_factor"):
            assert (key in cfg) == moe, (
                f"{name}: {key} {'missing from' if moe else 'set in'} a {'MoE' if moe else 'dense'} config"
            )
        if moe:
            assert cfg["megablox"] is False, f"{name}: megablox is a TPU Pallas kernel (interpreted on GPUs)"


def test_an_unknown_key_is_rejected(loaded):
    """The same loader and harness fail on a key MaxText does not know, so the checks above can fail."""
    result = loaded["<bogus>"]
    assert "error" in result, "MaxText accepted a config with an unknown key"
    assert BOGUS_KEY in result["error"]


# --- alias table ---


def read_aliases():
    """[(line number, alias, target)] from configs/aliases; `#` starts a comment anywhere on a line."""
    pairs = []
    for lineno, line in enumerate(ALIASES.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        assert len(fields) == 2, f"configs/aliases:{lineno}: want `alias model`, got {line!r}"
        pairs.append((lineno, *fields))
    return pairs


def test_alias_table_is_well_formed():
    pairs = read_aliases()
    assert pairs, "configs/aliases has no entries"
    seen = {}
    for lineno, alias, target in pairs:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", alias), f"line {lineno}: odd alias {alias!r}"
        assert target in CONFIG_NAMES, f"line {lineno}: {alias} -> {target}, which has no configs/{target}.yml"
        assert alias not in CONFIG_NAMES, f"line {lineno}: alias {alias!r} shadows configs/{alias}.yml"
        assert alias not in seen, f"line {lineno}: alias {alias!r} already defined on line {seen[alias]}"
        seen[alias] = lineno


def test_alias_table_has_the_documented_short_names():
    table = {alias: target for _, alias, target in read_aliases()}
    for alias, target in {
        "70b": "llama2-70b",
        "mixtral": "mixtral-8x22b",
        "grok": "grok-1",
        "405b": "llama3.1-405b",
        "8b": "llama3.1-8b",
        "deepseek": "deepseek3-671b",
        "671b": "deepseek3-671b",
        "kimi": "kimi-k2-1t",
        "30b": "qwen3-30b-a3b",
        "480b": "qwen3-480b-a35b",
    }.items():
        assert table.get(alias) == target, f"configs/aliases: {alias} should map to {target}"


# --- per-model runtime env ---


def source_env(model, passthrough, xla_flags="--from_the_image=1"):
    script = 'set -euo pipefail; source "$1" >/dev/null; printf %s "$XLA_FLAGS"'
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XLA_FLAGS": xla_flags, "PASSTHROUGH_ARGS": passthrough}
    proc = subprocess.run(
        ["bash", "-c", script, "_", str(CONFIGS / f"{model}.env.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return proc.stdout


def test_deepseek_env_appends_flags_for_the_layout_in_use():
    fsdp = source_env("deepseek3-671b", "steps=5")
    assert fsdp.startswith("--from_the_image=1 "), "XLA_FLAGS from the image must be kept"
    assert "--xla_gpu_all_gather_combine_threshold_bytes=1073741824" in fsdp
    assert "overlap_limit" not in fsdp

    pipelined = source_env("deepseek3-671b", "dcn_pipeline_parallelism=4 dcn_fsdp_parallelism=-1")
    assert pipelined.startswith("--from_the_image=1 ")
    assert "--xla_gpu_experimental_parallel_collective_overlap_limit=2" in pipelined
    assert "--xla_gpu_enable_highest_priority_async_stream=true" in pipelined  # sparse_matmul: true in the yml
    assert "all_gather_combine" not in pipelined

    dense_moe = source_env("deepseek3-671b", "ici_pipeline_parallelism=2 sparse_matmul=false")
    assert "overlap_limit=2" in dense_moe and "highest_priority" not in dense_moe

    assert source_env("deepseek3-671b", "", xla_flags="") == "--xla_gpu_all_gather_combine_threshold_bytes=1073741824"
