"""Bad input to every sweep driver (issue 23): numbers that are not finite, too few steps, node pins outside
-w, damaged sweep dirs, binary catalogs and tables, --local for a node sweep, unknown tags, one commit twice.
Each is one line before anything is submitted or made; the fake runner of sweep_fakes stands in for Slurm."""

import json
import time

import pytest
from sweep_fakes import invoke, passing

from jobkit.sweep import common, state

CATALOG = "profiles:\n  fast:\n    xla_flags: [--xla_fast=true]\n    parallelism: [fsdp]\n  any:\n    xla_flags: [--xla_any=1]\n"


def ok(point, nodes, attempt):
    return passing(1000.0)


def sweeps(tmp_path):
    base = tmp_path / "ws" / "sweeps"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def refused(monkeypatch, tmp_path, args, exit_code=1):
    before = sweeps(tmp_path)
    result, runner = invoke(monkeypatch, tmp_path, args, ok)
    assert result.exit_code == exit_code, result.output
    assert runner.submitted == []
    assert sweeps(tmp_path) == before
    return result.output


def catalog(tmp_path, text=CATALOG):
    path = tmp_path / "cat.yml"
    path.write_text(text)
    return str(path)


# --- numbers: finite and in range (sb6, sb7, nw3, nw4) ---
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize(
    ("driver", "option"),
    [
        (["batch", "tiny", "--local"], "--device-memory"),
        (["batch", "tiny", "--local", "--device-memory", "2"], "--mem-fraction"),
        (["network", "tiny", "-w", "n[1-2]"], "--baseline"),
        (["network", "tiny", "-w", "n[1-2]", "--baseline", "5"], "--tolerance"),
        (["nodes", "tiny", "-w", "n1"], "--hang-after"),
        (["nodes", "tiny", "-w", "n1"], "--poll"),
    ],
)
def test_non_finite_numbers_are_usage_errors(monkeypatch, tmp_path, driver, option, value):
    output = refused(monkeypatch, tmp_path, [*driver, f"{option}={value}"], exit_code=2)
    assert f"Invalid value for '{option}'" in output


# --- steps below the steady window (sb8, sb9, xla8) ---
@pytest.mark.parametrize(
    "driver",
    [
        ["batch", "tiny", "-w", "n1", "--values", "1"],
        ["batch", "tiny", "--local", "--values", "1"],
        ["nodes", "tiny", "-w", "n1"],
        ["network", "tiny", "-w", "n[1-2]", "--baseline", "5"],
        ["models", "-w", "n[1-8]", "--only", "tiny"],
        ["xla", "tiny", "-w", "n1", "--catalog", "CAT"],
    ],
)
@pytest.mark.parametrize("steps", [["--steps", "3"], ["--steps", "14"], ["--", "steps=3"]])
def test_too_few_steps_for_a_steady_tgs_are_refused_naming_the_minimum(monkeypatch, tmp_path, driver, steps):
    args = [catalog(tmp_path) if a == "CAT" else a for a in driver] + steps
    output = refused(monkeypatch, tmp_path, args, exit_code=2 if steps[0] == "--steps" else 1)
    assert f"needs steps>={common.MIN_STEPS}" in output and common.MIN_STEPS == 15


def test_enough_steps_run(monkeypatch, tmp_path):
    result, runner = invoke(monkeypatch, tmp_path, ["nodes", "tiny", "-w", "n1", "--", "steps=15"], ok)
    assert result.exit_code == 0, result.output
    assert runner.submitted[0][0].args == ("steps=15",)


# --- node sweeps are Slurm's (sw8, sw9) ---
@pytest.mark.parametrize("nodes", [[], ["-w", "node1"]])
def test_a_node_sweep_refuses_local(monkeypatch, tmp_path, nodes):
    output = refused(monkeypatch, tmp_path, ["nodes", "tiny", "--local", *nodes])
    assert output.strip() == "jobkit sweep: a node sweep runs on Slurm nodes; --local cannot (drop it)"


def test_a_node_sweep_still_needs_w(monkeypatch, tmp_path):
    assert "with -w" in refused(monkeypatch, tmp_path, ["nodes", "tiny"])


# --- huge node lists (sw12) ---
def test_duplicate_check_is_linear_and_node_lists_are_capped(monkeypatch, tmp_path):
    many = f"n[1-{common.MAX_NODES}]"
    started = time.monotonic()
    assert len(common.parse_nodes(many)) == common.MAX_NODES
    assert time.monotonic() - started < 5, "10,000 nodes took 2 s with the quadratic check on an idle machine"
    with pytest.raises(state.SweepError, match="names n1 more than once"):
        common.parse_nodes(f"n[1-{common.MAX_NODES - 1}],n1")
    output = refused(monkeypatch, tmp_path, ["nodes", "tiny", "-w", f"n[1-{common.MAX_NODES + 1}]"])
    assert f"names 10,001 nodes; a sweep takes at most {common.MAX_NODES:,}" in output


# --- node pins in --sbatch-arg (sa6) ---
@pytest.mark.parametrize(
    "arg", ["-w node2", "-wnode2", "--nodelist=node2", "-N2", "--nodes=2", "-x node3", "--exclude=node3"]
)
def test_sbatch_args_cannot_move_the_jobs_off_their_nodes(monkeypatch, tmp_path, arg):
    output = refused(monkeypatch, tmp_path, ["batch", "tiny", "-w", "n1", "--values", "1", f"--sbatch-arg={arg}"])
    assert f"sbatch argument {arg!r} would move the sweep's jobs off the nodes it pins" in output
    assert len(output.strip().splitlines()) == 1


# --- xla --parallelism (xla2, xla10) and a binary catalog (cat4) ---
@pytest.mark.parametrize("tag", ["nosuch", "fsdpp"])
def test_an_unknown_parallelism_tag_is_refused_naming_the_tags(monkeypatch, tmp_path, tag):
    output = refused(
        monkeypatch, tmp_path, ["xla", "tiny", "-w", "n1", "--catalog", catalog(tmp_path), "--parallelism", tag]
    )
    assert f"--parallelism {tag!r} is not a parallelism tag" in output
    assert "tags: fsdp;" in output


def test_a_known_axis_no_profile_has_keeps_the_untagged_ones(monkeypatch, tmp_path):
    args = ["xla", "tiny", "-w", "n1", "--catalog", catalog(tmp_path), "--repeats", "1", "--parallelism", "pp"]
    result, runner = invoke(monkeypatch, tmp_path, args, ok)
    assert result.exit_code == 0, result.output
    assert "any#1" in runner.keys and "fast#1" not in runner.keys


def test_a_binary_catalog_is_one_line(monkeypatch, tmp_path):
    cat = tmp_path / "garbage.yml"
    cat.write_bytes(b"\x98\xff\x00garbage\xfe")
    output = refused(monkeypatch, tmp_path, ["xla", "tiny", "-w", "n1", "--catalog", str(cat)])
    assert output.strip() == f"jobkit sweep: catalog {cat}: cannot read it (not UTF-8 text); give a YAML file"


# --- models: a binary table (md2), one commit twice (md12) ---
def test_a_binary_model_table_is_one_line(monkeypatch, tmp_path):
    table = tmp_path / "garbage.yml"
    table.write_bytes(b"m\xff\x00\xfe")
    output = refused(monkeypatch, tmp_path, ["models", "-w", "n1", "--table", str(table)])
    assert (
        output.strip() == f"jobkit sweep: cannot read the model table {table} (not UTF-8 text); give one with --table"
    )


@pytest.mark.parametrize("commits", [["HEAD", "HEAD"], ["HEAD", "HEAD^{commit}"]])
def test_the_same_commit_twice_is_refused(monkeypatch, tmp_path, commits):
    output = refused(monkeypatch, tmp_path, ["models", "-w", "n[1-8]", "--only", "tiny", "--commits", *commits])
    assert "name the same commit" in output and len(output.strip().splitlines()) == 1


# --- damaged sweep dirs: list (sl2, sl3) and resume (sr3, sr4) ---
def damage(tmp_path):
    """A finished sweep 'good', and beside it a binary plan.json, an invalid one, and one that is not an object."""
    invoke(monkeypatch_free := pytest.MonkeyPatch(), tmp_path, ["nodes", "--id", "good", "tiny", "-w", "n1"], ok)
    monkeypatch_free.undo()
    base = tmp_path / "ws" / "sweeps"
    for name, data in {"binplan": b"\x00\x98\xff\xfe", "badplan": b"{not json", "listplan": b"[1, 2]"}.items():
        (base / name).mkdir()
        (base / name / "plan.json").write_bytes(data)
    (base / "emptydir").mkdir()
    return base


def test_list_marks_damaged_sweeps_and_shows_the_others(monkeypatch, tmp_path):
    damage(tmp_path)
    result, _ = invoke(monkeypatch, tmp_path, ["list"], ok)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert lines["good"][1:4] == ["nodes", "finished", "1"]
    for name in ("binplan", "badplan", "listplan"):
        assert lines[name][1:3] == ["?", "UNREADABLE"]
    assert "emptydir" not in lines
    assert "sweep binplan: cannot read" in result.stderr and "sweep listplan: cannot read" in result.stderr


def test_resume_speaks_only_of_the_sweep_asked_for(monkeypatch, tmp_path):
    damage(tmp_path)
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "emptydir"], ok)
    assert result.exit_code == 1
    assert result.output.startswith("jobkit sweep: no sweep 'emptydir' in "), result.output
    assert "binplan" not in result.output and "badplan" not in result.output
    result, _ = invoke(monkeypatch, tmp_path, ["resume", "badplan"], ok)
    assert result.exit_code == 1 and "sweep badplan: cannot read" in result.output
    result, _ = invoke(monkeypatch, tmp_path, ["resume", "listplan"], ok)
    assert (
        result.exit_code == 1
        and "sweep listplan: cannot read" in result.output
        and "not a JSON object" in result.output
    )
    assert runner.submitted == []


def test_a_damaged_points_line_is_skipped(tmp_path, monkeypatch):
    invoke(monkeypatch, tmp_path, ["nodes", "--id", "good", "tiny", "-w", "n1,n2"], ok)
    points = tmp_path / "ws" / "sweeps" / "good" / "points.jsonl"
    points.write_bytes(points.read_bytes() + b"\xff\xfe garbage\n")
    assert len(state.Sweep(points.parent).done()) == 2
    plan = json.loads((points.parent / "plan.json").read_text())
    assert plan["state"] == "finished"
