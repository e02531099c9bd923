"""How much of a swept parameter should fit on a device: the batch sweep's memory estimate.

The estimate only places the first probe; the jobs decide. It follows the batch-sweep seed's recipe:

    pool        = device memory x memory fraction
    param mem   = parameters x bytes per weight / sharding
    available   = pool - param mem
    per unit    = max_target_length x emb x layers x 12 bytes   (one sequence's activations)
    max batch   = available / per unit

Choices made here (all of them rough on purpose, and said in the sweep's summary):
  1. The model config is MaxText's base defaults (the few keys used here), then MaxText's
     models/<model_name>.yml when our config names one and the MaxText package is installed, then
     configs/<model>.yml, then the sweep's `key=value` overrides.
  2. Parameters: embedding (+ the output projection unless logits_via_embedding), attention (GQA from
     heads/kv heads/head_dim, or MLA from the *_lora_rank / *_head_dim keys), MLP (gated when
     mlp_activations has two entries), MoE experts (+ shared experts and router) on every layer from
     first_num_dense_layers on, norms. Optimizer state is left out, as in the seed's recipe.
  3. Sharding: the product of every mesh axis above 1 except data (and diloco), which replicate weights
     (MaxText shards the embed dimension over fsdp, sequence, context and expert). A -1 axis takes the
     devices the others leave: per node 8 on GPU (or the product of the ici axes when none is -1),
     CPU_DEVICES_PER_NODE (default 1, as train_env.sh) on CPU; across nodes the node count. CPU means
     --local on a host with no GPU, or `_env_JAX_PLATFORMS=cpu` after -- (CPU nodes under Slurm).
  4. Memory fraction: --mem-fraction, else `_env_XLA_PYTHON_CLIENT_MEM_FRACTION` after --, else
     `_env_TUNE_PROFILE=mem95` (0.95), else 0.93: train_env.sh exports .93 for every job (JAX's own
     default of .75 never applies to our jobs). On CPU the whole --device-memory (1.0).
  5. GB means 2**30 bytes (what nvidia-smi / amd-smi show as GiB).
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from jobkit.core.config import load_yaml_keys, parse_overrides
from jobkit.launch import gpu

GIB = 2**30
ACTIVATION_BYTES = 12  # per token, per emb unit, per layer (the seed's rule of thumb)
GPU_DEVICES_PER_NODE = 8
TRAIN_ENV_MEM_FRACTION = 0.93  # train_env.sh: XLA_PYTHON_CLIENT_MEM_FRACTION=${...:-.93}
MEM95_FRACTION = 0.95

# The MaxText base.yml defaults of the keys read here (so an inline config needs only what it changes).
MAXTEXT_DEFAULTS: dict = {
    "weight_dtype": "float32",
    "mlp_activations": ["silu", "linear"],
    "logits_via_embedding": False,
    "num_experts": 1,
    "shared_experts": 0,
    "first_num_dense_layers": 0,
    "base_moe_mlp_dim": -1,
    "attention_type": "global",
    "q_lora_rank": 0,
    "per_device_batch_size": 12,
    "max_target_length": 2048,
    "dcn_data_parallelism": -1,
    "ici_fsdp_parallelism": -1,
}

# Device memory per JAX device in GiB, by jobkit.launch.peaks model name (a GCD for MI250/MI250X).
DEVICE_MEMORY_GIB: dict[str, float] = {
    "MI355X": 288,
    "MI350X": 288,
    "MI325X": 256,
    "MI300X": 192,
    "MI300A": 128,
    "MI250X": 64,
    "MI250": 64,
    "MI210": 64,
    "MI100": 32,
    "B300": 288,
    "B200": 180,
    "H200": 141,
    "H200 NVL": 141,
    "H100": 80,
    "H100 NVL": 94,
    "H100 PCIe": 80,
    "H800": 80,
    "L40S": 48,
    "A100": 80,
    "A800": 80,
}

_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "float": 4, "fp8": 1}
_NOT_SHARDING = ("data", "diloco")
_AXIS = re.compile(r"^(ici|dcn)_(\w+)_parallelism$")


class EstimateError(Exception):
    """The config does not say enough for an estimate; the message says what is missing."""


# --- the model config ---
def _typed(value: str):
    """A command-line override as YAML would read it (8 -> int, 0.9 -> float, [a] -> list)."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def maxtext_models_dir() -> Path | None:
    """MaxText's configs/models directory in this interpreter, without importing MaxText."""
    for name, sub in (("maxtext", "configs/models"), ("MaxText", "configs/models")):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            found = Path(location) / sub
            if found.is_dir():
                return found
    return None


def model_config(config_file: Path, extra: Sequence[str], models_dir: Path | None = None) -> dict:
    """The keys the estimate reads: MaxText defaults < models/<model_name>.yml < config_file < EXTRA."""
    ours = load_yaml_keys(str(config_file))
    overrides = {k: _typed(v) for k, v in parse_overrides(extra).items() if not k.startswith("_env_")}
    merged = dict(MAXTEXT_DEFAULTS)
    name = overrides.get("model_name", ours.get("model_name"))
    if name:
        models_dir = models_dir if models_dir is not None else maxtext_models_dir()
        arch = load_yaml_keys(str(models_dir / f"{name}.yml")) if models_dir else {}
        merged.update(arch)
        merged["_architecture_from"] = str(models_dir / f"{name}.yml") if arch else None
    merged.update(ours)
    merged.update(overrides)
    return merged


# --- parameters ---
def _int(cfg: Mapping, key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise EstimateError(f"no {key}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise EstimateError(f"{key}={value!r} is not a number") from exc


def count_params(cfg: Mapping) -> int:
    """Total parameters (all experts) from the architecture keys; EstimateError names a missing one."""
    if cfg.get("model_name") and not cfg.get("_architecture_from") and "base_emb_dim" not in cfg:
        raise EstimateError(
            f"the architecture of model_name {cfg['model_name']} lives in MaxText's models/{cfg['model_name']}.yml, "
            "which this Python cannot find"
        )
    emb, layers, vocab = _int(cfg, "base_emb_dim"), _int(cfg, "base_num_decoder_layers"), _int(cfg, "vocab_size")
    mlp = _int(cfg, "base_mlp_dim")
    heads = _int(cfg, "base_num_query_heads")
    gated = isinstance(cfg.get("mlp_activations"), list) and len(cfg["mlp_activations"]) > 1
    mlp_mats = 3 if gated else 2

    if str(cfg.get("attention_type")) == "mla":
        nope, rope, v_dim = _int(cfg, "qk_nope_head_dim"), _int(cfg, "qk_rope_head_dim"), _int(cfg, "v_head_dim")
        q_rank, kv_rank = _int(cfg, "q_lora_rank", 0), _int(cfg, "kv_lora_rank")
        q = emb * q_rank + q_rank * heads * (nope + rope) if q_rank > 0 else emb * heads * (nope + rope)
        kv = emb * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
        attention = q + kv + heads * v_dim * emb
    else:
        kv_heads = _int(cfg, "base_num_kv_heads", heads)
        head_dim = _int(cfg, "head_dim", emb // heads)
        attention = emb * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v

    experts = _int(cfg, "num_experts", 1)
    dense_mlp = mlp_mats * emb * mlp
    if experts > 1:
        moe_dim = _int(cfg, "base_moe_mlp_dim", -1)
        moe_dim = moe_dim if moe_dim > 0 else mlp
        dense_layers = min(layers, _int(cfg, "first_num_dense_layers", 0))
        per_moe_layer = (experts + _int(cfg, "shared_experts", 0)) * mlp_mats * emb * moe_dim + emb * experts
        mlps = dense_layers * dense_mlp + (layers - dense_layers) * per_moe_layer
    else:
        mlps = layers * dense_mlp
    embeddings = vocab * emb * (1 if cfg.get("logits_via_embedding") else 2)
    norms = (2 * layers + 1) * emb
    return embeddings + layers * attention + mlps + norms


def bytes_per_weight(cfg: Mapping) -> int:
    dtype = str(cfg.get("weight_dtype") or "float32").strip().lower()
    if dtype not in _BYTES:
        raise EstimateError(f"weight_dtype={dtype!r} is not one of bfloat16/float16/float32")
    return _BYTES[dtype]


# --- sharding ---
def mesh(cfg: Mapping, num_nodes: int, devices_per_node: int | None) -> dict[str, int]:
    """Every ici_*/dcn_* axis with -1 resolved (devices_per_node None: 8 unless the ici axes fix it)."""
    axes = {m.string: _int(cfg, m.string) for m in map(_AXIS.match, cfg) if m}
    resolved = {}
    for tier, total in (("ici", devices_per_node), ("dcn", num_nodes)):
        mine = {k: v for k, v in axes.items() if k.startswith(tier + "_")}
        fixed = math.prod(v for v in mine.values() if v > 0)
        if total is None:  # GPU: a node's device count unless the ici axes pin it
            total = fixed if all(v > 0 for v in mine.values()) else GPU_DEVICES_PER_NODE
        for key, value in mine.items():
            resolved[key] = max(1, total // fixed) if value == -1 else value
    return resolved


def sharding(axes: Mapping[str, int]) -> int:
    """How many ways the weights are split: every axis above 1 that is not a data (replica) axis."""
    return math.prod(v for k, v in axes.items() if v > 1 and _AXIS.match(k).group(2) not in _NOT_SHARDING)


# --- device memory ---
def detected_device_memory() -> tuple[float | None, str]:
    """(GiB per device, the device's name) from the accelerator on this host; (None, why) when unknown."""
    found = gpu.detect()
    if found is None:
        return None, "no GPU on this host"
    size = re.search(r"(\d+)\s*GB", found.raw, re.I)
    if size:
        return float(size.group(1)), found.raw
    if found.model in DEVICE_MEMORY_GIB:
        return float(DEVICE_MEMORY_GIB[found.model]), found.raw
    return None, f"the memory of {found.raw} is not known here"


def mem_fraction(given: float | None, extra: Sequence[str], cpu: bool) -> tuple[float, str]:
    """(fraction, where it came from), by the order in the module docstring."""
    if given is not None:
        return given, "--mem-fraction"
    env = parse_overrides(extra)
    if "_env_XLA_PYTHON_CLIENT_MEM_FRACTION" in env:
        try:
            return float(env["_env_XLA_PYTHON_CLIENT_MEM_FRACTION"]), "_env_XLA_PYTHON_CLIENT_MEM_FRACTION"
        except ValueError:
            pass
    if cpu:
        return 1.0, "CPU: no preallocated pool"
    if env.get("_env_TUNE_PROFILE") == "mem95":
        return MEM95_FRACTION, "TUNE_PROFILE=mem95"
    return TRAIN_ENV_MEM_FRACTION, "train_env.sh default"


# --- the estimate ---
@dataclass
class Estimate:
    param: str
    device_gib: float
    fraction: float
    fraction_from: str
    params: int
    weight_bytes: int
    shards: int
    per_unit: float  # bytes of activations per unit of the swept parameter
    fixed: str  # what per_unit assumes (e.g. "max_target_length=2048")

    @property
    def pool(self) -> float:
        return self.device_gib * GIB * self.fraction

    @property
    def param_memory(self) -> float:
        return self.params * self.weight_bytes / self.shards

    @property
    def available(self) -> float:
        return self.pool - self.param_memory

    @property
    def max_value(self) -> float:
        return max(0.0, self.available / self.per_unit)

    def lines(self) -> list[str]:
        gib = _size
        return [
            f"- pool: {self.device_gib:g} GiB x {self.fraction:g} ({self.fraction_from}) = {gib(self.pool)}",
            f"- params: {self.params:,} x {self.weight_bytes} B / {self.shards} shard(s) = {gib(self.param_memory)}",
            f"- activations per unit of {self.param} ({self.fixed}): {gib(self.per_unit)}",
            f"- estimated max {self.param}: {self.max_value:,.1f} (available {gib(self.available)})",
        ]


def _size(count: float) -> str:
    """Bytes in the largest binary unit that keeps them above 1 (tiny models are KiB, not 0.000 GiB)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= scale:
            return f"{count / scale:,.{1 if abs(count) >= 10 * scale else 2}f} {unit}"
    return f"{count:,.0f} B"


ESTIMATED = ("per_device_batch_size", "max_target_length")


def estimate(
    param: str,
    cfg: Mapping,
    device_gib: float,
    fraction: float,
    fraction_from: str,
    num_nodes: int,
    devices_per_node: int | None,
) -> Estimate:
    """The memory estimate for sweeping PARAM (one of ESTIMATED); EstimateError when the config falls short."""
    params = count_params(cfg)
    shards = sharding(mesh(cfg, num_nodes, devices_per_node))
    emb, layers = _int(cfg, "base_emb_dim"), _int(cfg, "base_num_decoder_layers")
    per_token = emb * layers * ACTIVATION_BYTES
    if param == "per_device_batch_size":
        seq = _int(cfg, "max_target_length")
        per_unit, fixed = seq * per_token, f"max_target_length={seq}"
    else:
        batch = float(cfg.get("per_device_batch_size") or 1)
        per_unit, fixed = batch * per_token, f"per_device_batch_size={batch:g}"
    return Estimate(param, device_gib, fraction, fraction_from, params, bytes_per_weight(cfg), shards, per_unit, fixed)
