"""`jobkit sweep batch`: the probe strategy, the memory estimate, --values, --apply, bad input and resume,
against recorded real job logs (tiny-pass.log rescaled to a scripted TGS; tiny-oom.log is a real
RESOURCE_EXHAUSTED of tiny under `prlimit --as`), no Slurm."""

import json
import os
import shutil
from pathlib import Path

import pytest
from sweep_fakes import failing, hanging, invoke, oom, passing

from jobkit.core.errors import EXIT_STOPPED
from jobkit.launch import gpu
from jobkit.sweep import batch, common, config_edit, memory

REPO = Path(__file__).resolve().parents[2]
PARAM = "per_device_batch_size"

# tiny by hand: embedding + output projection 2*256*64; per layer q,k,v,o 4*64*64 and a gated MLP 3*64*128
# and two norms 2*64; a final norm 64. weight_dtype is MaxText's default float32 (4 B).
TINY_PARAMS = 2 * 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
TINY_PER_SEQUENCE = 128 * 64 * 2 * 12  # max_target_length x emb x layers x 12 B
REAL_TINY = (REPO / "configs" / "tiny.yml").read_text()


@pytest.fixture(autouse=True)
def configs(monkeypatch, tmp_path):
    """A private copy of configs/tiny.yml (the real configs/ is never written) and no GPU on this host."""
    copy = tmp_path / "configs"
    copy.mkdir()
    shutil.copy(REPO / "configs" / "tiny.yml", copy / "tiny.yml")
    monkeypatch.setattr(batch, "CONFIGS_DIR", copy)
    monkeypatch.setattr(gpu, "detect", lambda: None)
    return copy


def value_of(point):
    """The value a point runs (its repeat number, `#2`, left off)."""
    return point.key.split("=", 1)[1].split("#")[0]


def curve(tgs_by_value: dict, oom_from: float | None = None, hang_from: float | None = None):
    """A script: a value at or above OOM_FROM dies of a real OOM; above HANG_FROM hangs compiling; else TGS."""

    def script(point, nodes, attempt):
        value = float(value_of(point))
        if oom_from is not None and value >= oom_from:
            return oom()
        if hang_from is not None and value >= hang_from:
            return hanging("compile")
        return passing(tgs_by_value[value] if isinstance(tgs_by_value, dict) else tgs_by_value(value))

    return script


def unimodal(b):  # peaks at 20
    return 1000 + 100 * b - 2.5 * b * b


def tried(runner):
    """The values submitted, each once, in the order first submitted (repeats are the same value)."""
    return list(dict.fromkeys(value_of(p) for p, _ in runner.submitted))


def sweep_dir(tmp_path, sweep_id):
    return tmp_path / "ws" / "sweeps" / sweep_id


HEADERS = ["Value", "Runs", "Job", "TGS/device", "Spread", "Δ vs best", "MFU", "Status"]


def rows(output):
    """Table rows by value: {value: {header: cell}}; row[-1] is the status."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == len(HEADERS) and cells[0] != "Value":
            out[cells[0]] = Row(zip(HEADERS, cells, strict=True))
    return out


class Row(dict):
    def __getitem__(self, key):
        return list(self.values())[key] if isinstance(key, int) else super().__getitem__(key)


# --- the memory estimate ---
def test_tiny_parameters_and_estimate_follow_the_recipe():
    cfg = memory.model_config(REPO / "configs" / "tiny.yml", [])
    assert memory.count_params(cfg) == TINY_PARAMS
    est = memory.estimate(PARAM, cfg, 0.005, 1.0, "test", 1, 1)
    assert est.shards == 1 and est.weight_bytes == 4
    assert est.per_unit == TINY_PER_SEQUENCE
    assert est.max_value == pytest.approx((0.005 * 2**30 - TINY_PARAMS * 4) / TINY_PER_SEQUENCE)
    # overrides after -- change the config the estimate reads
    longer = memory.model_config(REPO / "configs" / "tiny.yml", ["max_target_length=256", "weight_dtype=bfloat16"])
    est2 = memory.estimate(PARAM, longer, 0.005, 1.0, "test", 1, 1)
    assert est2.per_unit == 2 * TINY_PER_SEQUENCE and est2.weight_bytes == 2


def test_sharding_resolves_minus_one_and_leaves_data_axes_out():
    cfg = {"ici_fsdp_parallelism": -1, "ici_tensor_parallelism": 2, "dcn_data_parallelism": -1}
    axes = memory.mesh(cfg, num_nodes=4, devices_per_node=None)  # GPU: 8 per node
    assert axes == {"ici_fsdp_parallelism": 4, "ici_tensor_parallelism": 2, "dcn_data_parallelism": 4}
    assert memory.sharding(axes) == 8  # data replicas hold whole copies
    cfg = {"ici_expert_parallelism": 8, "ici_fsdp_parallelism": 1, "dcn_fsdp_parallelism": -1}
    assert memory.sharding(memory.mesh(cfg, 4, None)) == 32


@pytest.mark.skipif(memory.maxtext_models_dir() is None, reason="MaxText is not installed in this interpreter")
def test_model_name_configs_take_the_architecture_from_maxtext():
    cfg = memory.model_config(REPO / "configs" / "llama2-70b.yml", [])
    assert memory.count_params(cfg) == pytest.approx(69e9, rel=0.01)
    assert memory.bytes_per_weight(cfg) == 2


def test_a_model_name_without_maxtext_cannot_be_counted(tmp_path):
    cfg = memory.model_config(REPO / "configs" / "llama2-70b.yml", [], models_dir=tmp_path)
    with pytest.raises(memory.EstimateError, match="models/llama2-70b.yml"):
        memory.count_params(cfg)


def test_device_memory_and_fraction_sources(monkeypatch):
    monkeypatch.setattr(gpu, "detect", lambda: gpu.Accelerator("H100", "NVIDIA H100 80GB HBM3", "nvidia-smi"))
    assert memory.detected_device_memory()[0] == 80
    monkeypatch.setattr(gpu, "detect", lambda: gpu.Accelerator("MI300X", "AMD Instinct MI300X", "rocminfo"))
    assert memory.detected_device_memory()[0] == 192
    monkeypatch.setattr(gpu, "detect", lambda: gpu.Accelerator(None, "Mystery GPU", "nvidia-smi"))
    assert memory.detected_device_memory()[0] is None
    env = ["_env_XLA_PYTHON_CLIENT_MEM_FRACTION=.8"]
    assert memory.mem_fraction(0.5, env, cpu=False)[0] == 0.5
    assert memory.mem_fraction(None, env, cpu=False)[0] == 0.8
    assert memory.mem_fraction(None, ["_env_TUNE_PROFILE=mem95"], cpu=False)[0] == 0.95
    assert memory.mem_fraction(None, [], cpu=False)[0] == memory.TRAIN_ENV_MEM_FRACTION
    assert memory.mem_fraction(None, [], cpu=True)[0] == 1.0


# --- the probe strategy ---
def test_probes_from_the_estimate_find_a_unimodal_optimum_in_four_runs(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "--local", "tiny", "--device-memory", "0.005"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(unimodal, oom_from=24))
    assert result.exit_code == 0, result.output
    estimated = (0.005 * 2**30 - TINY_PARAMS * 4) / TINY_PER_SEQUENCE
    assert batch.nice_floor(estimated * 0.75, batch.KNOWN[PARAM]) == 16  # 75 % of it, down to a round number
    # 16 runs; the ceiling 24 (1.5x) is out of memory; midpoint 20 is faster, and 24 is within 25 % of it
    assert tried(runner) == ["16", "24", "20"]
    table = rows(result.output)
    assert table["20"][-1] == "PASS ← optimal"
    assert table["24"]["TGS/device"] == "OOM" and table["24"][-1] == "OOM"
    assert "Optimal: per_device_batch_size=20 (2,000 TGS/device; +2.0% over the runner-up 16, outside the ±1.0%" in (
        result.output
    )
    assert (
        "Runs: 3 value(s) of at most 6, 2 job(s) each. Stopped: converged: per_device_batch_size=20 runs, 24 does not"
        in result.output
    )
    assert f"params: {TINY_PARAMS:,} x 4 B / 1 shard(s)" in result.output
    assert "estimated max per_device_batch_size: 25.0" in result.output
    # each probe pinned nothing locally, set the value after the extra args, and ran 15 steps
    assert runner.submitted[0][0].args == ("per_device_batch_size=16", "steps=15")
    assert runner.submitted[0][1] == "tiny:b1"  # the job name names the value already (passthrough suffix)


def test_out_of_memory_first_probes_down_and_never_reruns_a_value(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "16", "--max-runs", "6"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b, oom_from=11))
    assert result.exit_code == 0, result.output
    # 16 OOM -> 8 runs -> 12 OOM -> 10 runs (faster) -> 12 is within 25 % of 10: converged
    assert tried(runner) == ["16", "8", "12", "10"]
    assert len(set(tried(runner))) == len(tried(runner))  # an OOM is never retried, a value never rerun
    assert "converged: per_device_batch_size=10 runs, 12 does not (within 25 %)" in result.output
    assert rows(result.output)["10"][-1] == "PASS ← optimal"
    assert all(p.nodes == ("n1",) for p, _ in runner.submitted)


def test_a_compile_hang_is_an_upper_bound_like_an_oom(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "8"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b, hang_from=12))
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["8", "12", "10"]  # 12 hung compiling: not retried, probed below
    assert rows(result.output)["12"][-1] == "HANG (compile)"
    assert rows(result.output)["10"][-1] == "PASS ← optimal"


def test_a_slower_higher_value_stops_the_sweep_and_the_optimum_is_the_fastest(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "16"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve({16: 1400.0, 24: 1371.0}))
    assert tried(runner) == ["16", "24"]
    assert rows(result.output)["16"][-1] == "PASS ← optimal"
    assert rows(result.output)["24"][-1] == "PASS, slower (beyond noise)"  # -2.1 %, the band is the 1 % floor
    assert rows(result.output)["24"]["Δ vs best"] == "-2.1%"
    assert "past the sweet spot" in result.output


def test_flat_within_the_band_stops_and_the_tie_goes_to_the_smaller_value(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "16"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve({16: 1000.0, 24: 1005.0}))
    assert tried(runner) == ["16", "24"]
    assert rows(result.output)["16"][-1] == "PASS ← optimal (tie: the smaller)"
    assert rows(result.output)["24"][-1] == "PASS, within noise"
    assert "Optimal: per_device_batch_size=16 (1,000 TGS/device), a tie: 24 within the ±1.0% noise band" in (
        result.output
    )
    assert "chosen: 16, the smaller (tie rule" in result.output


def test_growth_continues_while_faster_until_max_runs(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "4", "--max-runs", "3"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b))
    assert tried(runner) == ["4", "6", "9"]
    assert "Runs: 3 value(s) of at most 3, 2 job(s) each. Stopped: --max-runs 3 reached" in result.output


def test_a_failure_that_is_not_memory_stops_probing(monkeypatch, tmp_path):
    def script(point, nodes, attempt):
        return passing(500) if value_of(point) == "4" else failing("tiny-config-error.log")

    result, runner = invoke(monkeypatch, tmp_path, ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "4"], script)
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["4", "6"]
    assert "failed for a reason other than memory (FAIL (config-error))" in result.output


def test_the_recorded_oom_is_classified_as_oom():
    from jobkit.core import failures

    text = (Path(__file__).parent / "fixtures" / "sweep" / "tiny-oom.log").read_text()
    assert "Status: FAILED (exit 1)" in text and "completed step:" not in text
    assert failures.classify(text, exit_code=1).reason == "oom"


# --- --values, categorical and environment parameters ---
def test_values_run_exactly_those_without_an_estimate(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "12,4,8"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve({4: 900.0, 8: 1200.0, 12: 1100.0}))
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["12", "4", "8"]
    assert rows(result.output)["8"][-1] == "PASS ← optimal"
    assert "Every given value ran." in result.output
    assert "Estimate:" not in result.output  # no device memory given: none needed, none shown


def test_a_categorical_parameter_runs_each_choice(monkeypatch, tmp_path):
    tgs = {"full": 800.0, "minimal": 950.0, "save_dot_except_mlp": 900.0}

    def script(point, nodes, attempt):
        return passing(tgs[value_of(point)])

    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--param", "remat_policy", "--values", ",".join(tgs)]
    result, runner = invoke(monkeypatch, tmp_path, args, script)
    assert result.exit_code == 0, result.output
    assert tried(runner) == list(tgs)
    assert [list(rows(result.output))] == [list(tgs)]  # in the given order
    assert rows(result.output)["minimal"][-1] == "PASS ← optimal"


def test_an_env_parameter_is_passed_as_env_and_capped(monkeypatch, tmp_path):
    param = "_env_XLA_PYTHON_CLIENT_MEM_FRACTION"
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--param", param, "--", f"{param}=.9", "steps=20"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve({0.9: 1000.0, 0.98: 1050.0}))
    assert result.exit_code == 0, result.output
    # first: the fraction the jobs run with now (.9 after --); then 1.5x, capped at 0.98; the .9 is replaced
    assert tried(runner) == ["0.9", "0.98"]
    assert runner.submitted[2][0].args == ("steps=20", f"{param}=0.98")
    assert "reached its largest allowed value (0.98)" in result.output
    assert "environment setting" in result.output


# --- --apply ---
def test_apply_with_yes_writes_the_winner_into_the_config_copy(monkeypatch, tmp_path, configs):
    before = (configs / "tiny.yml").read_text()
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,8", "--apply", "--yes"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve({2: 500.0, 8: 900.0}))
    assert result.exit_code == 0, result.output
    after = (configs / "tiny.yml").read_text()
    assert "-per_device_batch_size: 2\n+per_device_batch_size: 8" in result.output
    assert after == before.replace("per_device_batch_size: 2\n", "per_device_batch_size: 8\n")
    assert "[apply] wrote per_device_batch_size: 8" in result.output
    assert (REPO / "configs" / "tiny.yml").read_text() == REAL_TINY  # the real config is untouched


def test_apply_asks_and_a_no_writes_nothing(monkeypatch, tmp_path, configs):
    from click.testing import CliRunner

    before = (configs / "tiny.yml").read_text()
    monkeypatch.setattr(CliRunner, "invoke", _with_input(CliRunner.invoke, "n\n"))
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,8", "--apply"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve({2: 500.0, 8: 900.0}))
    assert "Write per_device_batch_size: 8 into" in result.output
    assert "not written" in result.output
    assert (configs / "tiny.yml").read_text() == before


def _with_input(original, text):
    def invoke(self, *args, **kwargs):
        kwargs.setdefault("input", text)
        return original(self, *args, **kwargs)

    return invoke


def test_without_apply_nothing_is_written(monkeypatch, tmp_path, configs):
    before = (configs / "tiny.yml").read_text()
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,8"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve({2: 500.0, 8: 900.0}))
    assert result.exit_code == 0, result.output
    assert (configs / "tiny.yml").read_text() == before
    assert "Config: configs/tiny.yml has per_device_batch_size: 2; the best so far (not converged) is 8" in (
        result.output
    )
    assert "+++ b/" not in result.output and "[apply]" not in result.output  # no diff shown


def test_with_key_keeps_the_comment_column_and_adds_missing_keys_near_their_kin():
    text = "max_target_length: 4096   # context\nper_device_batch_size: 4           # 16k tokens\nx: 1\n"
    out = config_edit.with_key(text, "per_device_batch_size", 12)
    assert out.splitlines()[1] == "per_device_batch_size: 12          # 16k tokens"
    assert out.splitlines()[1].index("#") == text.splitlines()[1].index("#")
    added = config_edit.with_key("max_target_length: 128\nsteps: 3\n", "per_device_batch_size", 8)
    assert added == "max_target_length: 128\nper_device_batch_size: 8\nsteps: 3\n"
    assert config_edit.with_key("a: 1", "remat_policy", "full") == "a: 1\nremat_policy: full\n"
    assert config_edit.with_key("a: 1\n", "quantization", "true") == 'a: 1\nquantization: "true"\n'


# --- bad input ---
@pytest.mark.parametrize(
    "args,needle",
    [
        (["no-such-model-xyz", "-w", "n1", "--start", "4"], "no-such-model-xyz"),
        (["tiny", "-N", "3", "-w", "n1,n2", "--start", "4"], "has 2 node(s) but -N is 3"),
        (["tiny", "--local"], "--device-memory"),
        (["tiny", "-w", "n1"], "--device-memory"),
        (["tiny", "-w", "n1", "--values", "4,x"], "'x' is not one"),
        (["tiny", "-w", "n1", "--values", "4,0"], "out of range"),
        (["tiny", "-w", "n1", "--values", "4,8,4"], "more than once"),
        (["tiny", "-w", "n1", "--values", "4,8", "--start", "4"], "exclude each other"),
        (["tiny", "-w", "n1", "--param", "remat_policy"], "categorical"),
        (["tiny", "-w", "n1", "--param", "no_such_knob"], "give --start"),
        (["tiny", "--local", "-N", "2", "--start", "4"], "--local runs one node"),
        (["tiny", "-w", "n1", "--param", "_env_XLA_PYTHON_CLIENT_MEM_FRACTION", "--apply"], "environment setting"),
        (["tiny", "-w", "n1", "--device-memory", "0.00001"], "no memory for activations"),
        (
            ["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=--output=/home/a/victim"],
            "sbatch argument '--output=/home/a/victim' is not one a sweep passes on; use only -p/--partition,",
        ),
        (["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=--export=ALL,LD_PRELOAD=/x.so"], "'--export=ALL,"),
        (["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=-Jname"], "'-Jname' is not one"),
        (["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=--out=/x"], "'--out=/x' is not one"),  # a getopt prefix
        # A stray word after a flag would be sbatch's batch script: run as the owner.
        (
            ["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=--exclusive", "--sbatch-arg=/tmp/evil.sh"],
            "'/tmp/evil.sh'",
        ),
        (
            ["tiny", "-w", "n1", "--start", "4", "--sbatch-arg=-p", "--sbatch-arg=--"],
            "'-p' needs a value (as --partition=VALUE)",
        ),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(monkeypatch, tmp_path, args, needle):
    result, runner = invoke(monkeypatch, tmp_path, ["batch", *args], curve(unimodal))
    assert result.exit_code == 1, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert runner.submitted == []
    assert not (tmp_path / "ws" / "sweeps").exists() or not any((tmp_path / "ws" / "sweeps").iterdir())


# --- resume ---
def test_resume_replays_the_probes_and_reruns_nothing_finished(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "--local", "tiny", "--device-memory", "0.005"]
    fine = curve(unimodal, oom_from=24)

    def refuse_20(point, nodes, attempt):
        if value_of(point) == "20":
            return RuntimeError("run_local.sh: another job is using this machine")
        return fine(point, nodes, attempt)

    result, runner = invoke(monkeypatch, tmp_path, args, refuse_20)
    assert result.exit_code == EXIT_STOPPED, result.output
    assert tried(runner) == ["16", "24"]
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1"], fine)
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["20"]  # 16 and 24 are answered from the record
    assert "[per_device_batch_size=16] (recorded)" in result.output
    assert "[per_device_batch_size=24] (recorded)" in result.output
    assert rows(result.output)["20"][-1] == "PASS ← optimal"
    plan = json.loads((sweep_dir(tmp_path, "b1") / "plan.json").read_text())
    assert plan["state"] == "finished" and plan["driver"] == "batch"
    assert "← optimal" in (sweep_dir(tmp_path, "b1") / "summary.md").read_text()


def test_allowed_sbatch_arguments_in_every_form_sbatch_reads():
    common.check_sbatch_args(["-p", "gpu", "--time=30:00", "-t", "1:00", "--exclusive", "--qos", "high"])
    common.check_sbatch_args(["--gres=gpu:8", "--exclusive=user", "--mem=0", "-A", "proj"])


def interrupted_sweep(monkeypatch, tmp_path, sweep_id="b1"):
    """A sweep whose point 20 could not run: resumable."""
    fine = curve(unimodal, oom_from=24)

    def refuse_20(point, nodes, attempt):
        if value_of(point) == "20":
            return RuntimeError("run_local.sh: another job is using this machine")
        return fine(point, nodes, attempt)

    args = ["batch", "--id", sweep_id, "--local", "tiny", "--device-memory", "0.005"]
    result, _ = invoke(monkeypatch, tmp_path, args, refuse_20)
    assert result.exit_code == EXIT_STOPPED, result.output
    return sweep_dir(tmp_path, sweep_id) / "plan.json", fine


def test_resume_refuses_a_plan_with_sbatch_options_it_may_not_replay(monkeypatch, tmp_path):
    plan_file, fine = interrupted_sweep(monkeypatch, tmp_path)
    plan = json.loads(plan_file.read_text())
    plan["params"]["sbatch_args"] = ["--output=/home/alice/victim_sweep.txt"]
    plan_file.write_text(json.dumps(plan))
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1"], fine)
    assert result.exit_code == 1 and runner.submitted == []
    assert result.output.startswith("jobkit sweep: sbatch argument '--output=/home/alice/victim_sweep.txt' is not one")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a teammate's file needs root (chown)")
@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda f: os.chown(f, 65534, 65534), "belongs to uid 65534, not to this user (uid 0)"),
        (lambda f: f.chmod(0o664), "is writable by group or others (mode 664)"),
    ],
)
def test_resume_refuses_a_plan_others_can_write(monkeypatch, tmp_path, change, why):
    plan_file, fine = interrupted_sweep(monkeypatch, tmp_path)
    change(plan_file)
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1"], fine)
    assert result.exit_code == 1 and runner.submitted == []
    assert result.output.strip() == (
        f"jobkit sweep: sweep b1: not replaying {plan_file} {why}; a plan others can change decides what resume"
        " submits: start the sweep again under a new --id"
    )


def test_apply_refuses_when_the_config_changed_during_the_sweep(monkeypatch, tmp_path, configs):
    config = configs / "tiny.yml"
    fine = curve({2: 500.0, 8: 900.0})

    def edit_meanwhile(point, nodes, attempt):
        config.write_text(config.read_text() + "# an edit made while the sweep ran\n")
        return fine(point, nodes, attempt)

    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,8", "--apply", "--yes"]
    result, _ = invoke(monkeypatch, tmp_path, args, edit_meanwhile)
    assert result.exit_code == 1
    assert "changed while the sweep ran; not writing it: set per_device_batch_size: 8 by hand" in result.output
    assert config.read_text().endswith("# an edit made while the sweep ran\n# an edit made while the sweep ran\n")
    assert "per_device_batch_size: 2\n" in config.read_text()


def test_apply_keeps_uncommitted_edits_and_says_so(monkeypatch, tmp_path, configs):
    import subprocess

    git = ["git", "-C", str(configs), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "tiny.yml"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    config = configs / "tiny.yml"
    config.write_text(config.read_text().replace("steps: 20", "steps: 25  # mine"))
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,8", "--apply", "--yes"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve({2: 500.0, 8: 900.0}))
    assert result.exit_code == 0, result.output
    assert "has uncommitted changes; they are kept" in result.output
    text = config.read_text()
    assert "steps: 25  # mine" in text and "per_device_batch_size: 8\n" in text


def test_between_never_lands_on_a_bound_from_an_off_grid_start():
    seq = batch.KNOWN["max_target_length"]
    for low in range(900, 1100, 7):
        for high in range(low + 1, low + 400, 13):
            value = batch.between(low, high, seq)
            assert value is None or low < value < high


def test_max_target_length_probes_on_a_grid_of_128_from_its_own_estimate(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "--local", "tiny", "--param", "max_target_length", "--device-memory", "0.005"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda s: s / 10, oom_from=1408))
    assert result.exit_code == 0, result.output
    per_token = 2 * 64 * 2 * 12  # per_device_batch_size 2 x emb x layers x 12 B
    estimated = (0.005 * 2**30 - TINY_PARAMS * 4) / per_token
    assert 1024 <= estimated * 0.75 < 1536  # round number below it: 8 x 128
    assert tried(runner) == ["1024", "1536", "1280"]
    assert "converged: max_target_length=1280 runs, 1536 does not (within 25 %)" in result.output
    assert "(per_device_batch_size=2)" in result.output


def test_an_unknown_numeric_parameter_needs_a_start_and_keeps_its_type(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--param", "num_vocab_tiling", "--start", "2", "--max-runs", "2"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda v: 100.0 * v))
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["2", "3"]


# --- issue 23: convergence, noise, CPU, cost ---
def by_run(tgs_by_key: dict):
    """A script from the point's key (`per_device_batch_size=72#2` -> "72#2", or "72" for the first run)."""

    def script(point, nodes, attempt):
        return passing(tgs_by_key[point.key.split("=", 1)[1]])

    return script


def test_max_runs_on_a_rising_curve_is_not_converged_and_says_how_to_go_on(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n[1]", "--start", "4", "--max-runs", "3", "--", "steps=20"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b))
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["4", "6", "9"]
    assert "Optimal:" not in result.output and "← optimal" not in result.output
    assert rows(result.output)["9"][-1] == "PASS ← best so far (not converged)"
    assert (
        "Best so far: per_device_batch_size=9 (900 TGS/device). Not converged: --max-runs 3 stopped the probe"
        " while TGS was still rising." in result.output
    )
    # the command that goes on: this sweep, resumed with a larger --max-runs; it runs only new values
    go_on = "Go on with: `jobkit sweep resume b1 --max-runs 6` (it probes on from where it stopped"
    assert go_on in result.output
    more, runner = invoke(monkeypatch, tmp_path, ["resume", "b1", "--max-runs", "6"], curve(lambda b: 100.0 * b))
    assert more.exit_code == 0, more.output
    param = batch.param_for("per_device_batch_size", None, None)
    beyond = [batch.grow(9, param)]
    while len(beyond) < 3:
        beyond.append(batch.grow(beyond[-1], param))
    assert tried(runner) == [str(v) for v in beyond] and "best so far (not converged)" in more.output


def test_the_largest_of_values_being_fastest_is_not_converged(monkeypatch, tmp_path):
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "2,4,8"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve({2: 500.0, 4: 900.0, 8: 1200.0}))
    assert result.exit_code == 0, result.output
    assert "Not converged: 8 is the largest value given and the fastest: TGS may rise above it" in result.output
    assert "Go on with: `jobkit sweep batch tiny -N 1 -w n1 --repeats 2 --values 8,12,18`" in result.output
    assert "the best so far (not converged) is 8" in result.output


def test_repeats_give_mean_and_spread_and_a_gap_inside_the_band_is_a_tie_to_the_smaller(monkeypatch, tmp_path):
    # the case: 72 and 108 about 1.4 % apart, runs 3 % apart: noise, not an optimum
    tgs = {"72": 4300.0, "72#2": 4430.0, "72#3": 4365.0, "108": 4380.0, "108#2": 4460.0, "108#3": 4420.0}
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "72,108", "--repeats", "3"]
    result, runner = invoke(monkeypatch, tmp_path, args, by_run(tgs))
    assert result.exit_code == 0, result.output
    assert len(runner.submitted) == 6
    table = rows(result.output)
    assert table["72"]["Runs"] == "3/3" and table["72"]["TGS/device"] == "4,365"
    assert table["72"]["Spread"] == "3.0%"  # (4430 - 4300) / 4365
    assert table["108"]["TGS/device"] == "4,420" and table["108"]["Spread"] == "1.8%"
    assert table["72"][-1] == "PASS ← optimal (tie: the smaller)"
    assert table["108"][-1] == "PASS, within noise"
    assert "Noise band: ±3.0%" in result.output
    assert "a tie: 108 within the ±3.0% noise band of the best (108 has the highest mean); chosen: 72" in result.output
    assert "Config: configs/tiny.yml has per_device_batch_size: 2; the optimum is 72" in result.output


def test_a_winner_must_beat_the_runner_up_beyond_the_band(monkeypatch, tmp_path):
    tgs = {"4": 1000.0, "4#2": 1010.0, "8": 1100.0, "8#2": 1105.0, "12": 1050.0, "12#2": 1052.0}
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--values", "4,8,12"]
    result, _ = invoke(monkeypatch, tmp_path, args, by_run(tgs))
    assert rows(result.output)["8"][-1] == "PASS ← optimal"
    assert rows(result.output)["4"][-1] == rows(result.output)["12"][-1] == "PASS, slower (beyond noise)"
    assert "Optimal: per_device_batch_size=8 (1,102 TGS/device; +4.9% over the runner-up 12, outside the ±1.0%" in (
        result.output
    )


def test_the_probe_stops_at_a_rise_inside_the_measured_band(monkeypatch, tmp_path):
    # 6 is 2 % above 4 on average, but 4's own runs are 5 % apart: past the sweet spot, a tie, 4 chosen
    tgs = {"4": 975.0, "4#2": 1025.0, "6": 1020.0, "6#2": 1020.0}
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "4"]
    result, runner = invoke(monkeypatch, tmp_path, args, by_run(tgs))
    assert tried(runner) == ["4", "6"]
    assert "not above it by more than the ±5.0 % noise band): past the sweet spot" in result.output
    assert rows(result.output)["4"][-1] == "PASS ← optimal (tie: the smaller)"


def test_one_definition_of_spread_for_batch_and_xla():
    from jobkit.sweep import xla_report
    from jobkit.sweep.jobs import Outcome

    outcomes = [Outcome(key=f"p#{i}", status="PASS", tgs=t) for i, t in enumerate((98.0, 102.0), 1)]
    assert common.spread([98.0, 102.0]) == pytest.approx(4.0)
    assert xla_report.Result("p", outcomes).spread == batch.Runs(outcomes).spread == common.spread([98.0, 102.0])
    assert common.spread([100.0]) is None
    assert common.noise_band([[100.0], [98.0, 102.0]], 1.0) == (pytest.approx(4.0), True)
    assert common.noise_band([[100.0]], 1.0) == (1.0, False)


def test_on_cpu_probing_needs_device_memory_and_its_estimate_caps_the_probe(monkeypatch, tmp_path):
    result, runner = invoke(monkeypatch, tmp_path, ["batch", "tiny", "--local", "--start", "2"], curve(unimodal))
    assert result.exit_code == 1 and runner.submitted == []
    assert "on CPU no device runs out of memory, so nothing would stop the probe" in result.output
    assert "--device-memory GB, the host RAM one CPU device may use" in result.output
    assert len(result.output.strip().splitlines()) == 1
    # the same on Slurm CPU nodes; --values needs no bound
    cpu_nodes = ["batch", "tiny", "-w", "n1", "--start", "2", "--", "_env_JAX_PLATFORMS=cpu"]
    result, runner = invoke(monkeypatch, tmp_path, cpu_nodes, curve(unimodal))
    assert result.exit_code == 1 and "on CPU no device runs out of memory" in result.output
    # with it: TGS keeps rising, no OOM ever comes, and the estimate's maximum (25 for 0.005 GB) ends the probe
    args = ["batch", "--id", "b1", "--local", "tiny", "--start", "8", "--device-memory", "0.005", "--max-runs", "9"]
    result, runner = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b))
    assert result.exit_code == 0, result.output
    assert tried(runner) == ["8", "12", "18", "24"]  # 24: the estimate's 25.0 rounded down (24.97...)
    assert "reached the estimate's maximum for 0.005 GB of RAM per CPU device (24)" in result.output


def test_each_value_prints_what_it_took_and_what_the_next_should_take(monkeypatch, tmp_path):
    ticks = iter(range(0, 10_000, 60))  # every clock read is a minute later
    monkeypatch.setattr(batch, "CLOCK", lambda: next(ticks))
    args = ["batch", "--id", "b1", "tiny", "-w", "n1", "--start", "4", "--max-runs", "2"]
    result, _ = invoke(monkeypatch, tmp_path, args, curve(lambda b: 100.0 * b))
    assert "[batch] at most 2 value(s) x 2 run(s) = 4 job(s) of 15 steps on n1" in result.output
    assert "[batch] per_device_batch_size=4: 2 job(s) took 60 s; the next, 6, should take about 90 s" in result.output
