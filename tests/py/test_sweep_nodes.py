"""`jobkit sweep nodes` and the engine rules it exercises, against recorded real job logs (no Slurm)."""

import json
from pathlib import Path

import pytest
from sweep_fakes import FakeJob, failing, hanging, invoke, passing

from jobkit.core.errors import EXIT_STOPPED
from jobkit.sweep import engine

TGS = {"n1": 1000.0, "n2": 990.0, "n3": 965.0, "n4": 900.0}


def by_node(point, nodes, attempt):
    return passing(TGS[point.key])


def sweep_dir(tmp_path, sweep_id):
    return tmp_path / "ws" / "sweeps" / sweep_id


def test_node_sweep_bands_each_node_against_the_upper_median(monkeypatch, tmp_path):
    result, runner = invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n[1-4]"], by_node)
    assert result.exit_code == 0, result.output
    rows = {line.split("|")[1].strip(): line for line in result.output.splitlines() if line.startswith("| n")}
    # upper median of 1000, 990, 965, 900 is 990
    assert "+1.0%" in rows["n1"] and "healthy" in rows["n1"]
    assert "+0.0%" in rows["n2"] and "healthy" in rows["n2"]
    assert "-2.5%" in rows["n3"] and "marginal" in rows["n3"]
    assert "-9.1%" in rows["n4"] and "DEGRADED" in rows["n4"]
    assert "Recommended nodelist (healthy): n1,n2" in result.output
    assert "Exclude: n4" in result.output
    # every job pinned to its own node, tagged with the sweep, 15 steps by default
    assert [(p.nodes, p.args) for p, _ in runner.submitted] == [((n,), ("steps=15",)) for n in TGS]
    assert all(spec == f"tiny:s1-{p.key}" for p, spec in runner.submitted)


def test_each_result_is_printed_as_it_lands_then_the_table(monkeypatch, tmp_path):
    result, _ = invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n1,n2"], by_node)
    lines = result.output.splitlines()
    landed = [i for i, line in enumerate(lines) if line.startswith("[n1]") or line.startswith("[n2]")]
    table = next(i for i, line in enumerate(lines) if line.startswith("| Node"))
    assert len(landed) == 2 and max(landed) < table
    assert "tiny 1N (job 1001): 1,000 TGS/device — PASS" in lines[landed[0]]


def test_state_on_disk_has_plan_points_and_summary(monkeypatch, tmp_path):
    invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n1,n2"], by_node)
    d = sweep_dir(tmp_path, "s1")
    plan = json.loads((d / "plan.json").read_text())
    assert plan["driver"] == "nodes" and plan["state"] == "finished" and plan["params"]["nodelist"] == "n1,n2"
    done = [json.loads(x) for x in (d / "points.jsonl").read_text().splitlines() if '"done"' in x]
    assert {(e["key"], e["outcome"]["tgs"]) for e in done} == {("n1", 1000.0), ("n2", 990.0)}
    assert "| n2 " in (d / "summary.md").read_text()


def test_a_failed_or_hung_node_is_unhealthy_and_a_hang_is_retried_once(monkeypatch, tmp_path):
    def script(point, nodes, attempt):
        return {"n1": passing(1000), "n2": failing("tiny-config-error.log"), "n3": hanging("training")}[point.key]

    result, runner = invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n[1-3]"], script)
    assert result.exit_code == 0, result.output
    assert runner.keys.count("n3") == 2  # a mid-training hang: one retry, then it is a result
    assert runner.keys.count("n2") == 1  # a config error is not retried
    assert "UNHEALTHY: FAIL (config-error)" in result.output
    assert "UNHEALTHY: HANG (training)" in result.output
    assert "HANG during training" in result.output
    assert sorted(runner.cancelled) == sorted(
        j for (p, _), j in zip(runner.submitted, ["1001", "1002", "1003", "1004"], strict=True) if p.key == "n3"
    )


def test_a_hang_while_compiling_is_not_retried(monkeypatch, tmp_path):
    result, runner = invoke(
        monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n1"], lambda p, n, a: hanging("compile")
    )
    assert runner.keys == ["n1"]
    assert "HANG (compile)" in result.output


def test_resume_reruns_nothing_that_finished(monkeypatch, tmp_path):
    calls = []

    def first(point, nodes, attempt):
        calls.append(point.key)
        if point.key == "n3":
            return RuntimeError("sbatch: error: Batch job submission failed: Invalid node name specified")
        return passing(TGS[point.key])

    result, _ = invoke(monkeypatch, tmp_path, ["nodes", "--serial", "--id", "s1", "tiny", "-w", "n[1-4]"], first)
    assert result.exit_code == EXIT_STOPPED
    assert "Invalid node name specified" in result.output
    plan = json.loads((sweep_dir(tmp_path, "s1") / "plan.json").read_text())
    assert plan["state"] == "stopped"
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node)
    assert result.exit_code == 0, result.output
    assert runner.keys == ["n3", "n4"]
    assert "[n1] (recorded)" in result.output
    assert json.loads((sweep_dir(tmp_path, "s1") / "plan.json").read_text())["state"] == "finished"
    result, _ = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node)
    assert result.exit_code == 1 and "already finished" in result.output


def test_bad_input_is_one_line_and_leaves_nothing(monkeypatch, tmp_path):
    cases = [
        (["nodes", "no-such-model-xyz", "-w", "n1"], "no-such-model-xyz"),
        (["nodes", "tiny", "-w", "n1,n1"], "more than once"),
        (["nodes", "--id", "../x", "tiny", "-w", "n1"], "not usable"),
        (["resume", "nope"], "no sweep 'nope'"),
    ]
    for args, needle in cases:
        result, runner = invoke(monkeypatch, tmp_path, args, by_node)
        assert result.exit_code == 1, (args, result.output)
        assert needle in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert runner.submitted == []
    assert not (tmp_path / "ws" / "sweeps").exists() or not any((tmp_path / "ws" / "sweeps").iterdir())


def test_rerunning_an_id_with_other_settings_is_refused(monkeypatch, tmp_path):
    invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n1"], by_node)
    result, runner = invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n2"], by_node)
    assert result.exit_code == 1 and "other settings" in result.output and runner.submitted == []


def test_a_job_that_dies_before_its_log_is_retried_then_reported(monkeypatch, tmp_path):
    result, runner = invoke(
        monkeypatch,
        tmp_path,
        ["nodes", "--id", "s1", "tiny", "-w", "n1"],
        lambda p, n, a: FakeJob(None, scheduler_state="NODE_FAIL"),
    )
    assert runner.keys == ["n1"] * 3  # transient: 1 + max-retries (2)
    assert "ended without a job log (NODE_FAIL)" in result.output


@pytest.mark.parametrize(
    ("reason", "policy"),
    [
        ("no-log", "retry"),  # the sweep's own outcomes
        ("stopped-early", "retry"),
        ("collective-error", "retry-without-node"),  # its first entry, a NIC error
        ("stage-timeout", "retry"),  # the old TRANSIENT set did not retry these
        ("image-pull", "retry"),
        ("gpu-hardware", "retry-without-node"),
        ("no-gpu", "retry-without-node"),
        ("preflight-failed", "retry-without-node"),
        ("oom", "never"),  # a result in a sweep: the point does not fit
        ("data-missing", "never"),
        ("config-error", "never"),
        ("cleanup-after-success", "never"),
    ],
)
def test_a_sweep_retries_by_the_catalogue_policy(reason, policy):
    assert engine.retry_policy(reason) == policy


def test_the_config_classes_that_stop_a_sweep_are_never_retried():
    assert all(engine.retry_policy(cls) == "never" for cls in engine.CONFIG)


def test_a_stage_timeout_is_retried_by_its_catalogue_policy_and_a_missing_dataset_is_not(monkeypatch, tmp_path):
    corpus = Path(__file__).resolve().parents[1] / "fixtures" / "failures" / "corpus"
    logs = {"n1": "training-stage-timeout.log", "n2": "dataset-missing.log"}
    result, runner = invoke(
        monkeypatch,
        tmp_path,
        ["nodes", "--id", "s1", "tiny", "-w", "n[1-2]"],
        lambda p, n, a: FakeJob((corpus / logs[p.key]).read_text()),
    )
    assert runner.keys.count("n1") == 3, result.output  # stage-timeout: retry (the old TRANSIENT set: never)
    assert runner.keys.count("n2") == 1, result.output  # data-missing: never
