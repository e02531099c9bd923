"""`jobkit sweep xla`: catalog checks, waves, noise band, verdicts, stop rules, report and resume, against
recorded real job logs (no Slurm)."""

import json
import re
from pathlib import Path

import pytest
from sweep_fakes import FIXTURES, FakeJob, failing, invoke, oom, passing

from jobkit.core.errors import EXIT_STOPPED
from jobkit.sweep import xla_catalog

CATALOG = """
profiles:
  good:
    description: faster
    xla_flags: [--xla_good=true, --xla_good_too=1]
    env: {NCCL_GOOD_KNOB: 8}
  neutral:
    xla_flags: [--xla_neutral=1]
  bad:
    description: slower on purpose
    xla_flags: [--xla_bad=0]
"""


def write(tmp_path, text=CATALOG, name="cat.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def by_profile(tgs: dict[str, list[float]]):
    """A script: each profile's runs get the TGS listed for it, run 1 the first value, run 2 the second..."""

    def script(point, nodes, attempt):
        name, repeat = point.key.rsplit("#", 1)
        values = tgs[name]
        return passing(values[(int(repeat) - 1) % len(values)])

    return script


def sweep_dir(tmp_path, sweep_id) -> Path:
    return tmp_path / "ws" / "sweeps" / sweep_id


def rows(output: str) -> dict[str, list[str]]:
    """The leaderboard's rows by profile: [runs, tgs, step time, delta, verdict]."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("Profile",) and not cells[0].startswith("-"):
            out[cells[0]] = cells[1:]
    return out


def pct(value, ref):
    return f"{(value - ref) / ref * 100:+.1f}%"


TGS = {
    "baseline-deployed": [1000.0, 1010.0],  # spread 10 / 1005 = 1.0 %: the band
    "baseline-no-env": [1002.0, 1004.0],
    "good": [1035.0, 1045.0],  # +3.5 %: a win, below the +5 % stop rule
    "neutral": [1003.0, 1011.0],  # +0.2 %: within noise
    "bad": [800.0, 810.0],  # -19.9 %: a loss
}


def test_leaderboard_ranks_by_tgs_with_deltas_verdicts_and_the_winner(monkeypatch, tmp_path):
    cat = write(tmp_path)
    args = ["xla", "--id", "x1", "tiny", "-N", "1", "-w", "n1", "--catalog", str(cat)]
    result, runner = invoke(monkeypatch, tmp_path, args, by_profile(TGS))
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    ref = sum(TGS["baseline-deployed"]) / 2
    assert list(table) == ["good", "neutral", "baseline-deployed", "baseline-no-env", "bad"]  # by mean TGS
    assert table["good"][3] == pct(1040, ref) and table["good"][4] == "win ← winner"
    assert table["neutral"][3] == pct(1007, ref) and table["neutral"][4] == "within noise"
    assert table["bad"][3] == pct(805, ref) and table["bad"][4] == "loss"
    assert table["baseline-no-env"][4] == "within noise"
    assert table["baseline-deployed"][1:] == ["1,005", table["baseline-deployed"][2], "—", "reference"]
    assert all(r[0] == "2/2" for r in table.values())
    assert "Noise band: ±1.0%" in result.output
    assert "Winner: good (+3.5%)" in result.output
    # both baselines and every profile twice; repeats interleaved
    keys = runner.keys
    assert keys[:4] == ["baseline-deployed#1", "baseline-no-env#1", "baseline-deployed#2", "baseline-no-env#2"]
    assert keys[4:] == ["good#1", "neutral#1", "bad#1", "good#2", "neutral#2", "bad#2"]
    assert (sweep_dir(tmp_path, "x1") / "summary.md").read_text().count("← winner") == 1


def test_every_job_is_synthetic_pinned_and_profiles_reach_it_as_a_file(monkeypatch, tmp_path):
    cat = write(tmp_path)
    args = ["xla", "--id", "x1", "tiny", "-N", "2", "-w", "n[1-2]", "--catalog", str(cat), "--steps", "20"]
    result, runner = invoke(monkeypatch, tmp_path, [*args, "--", "per_device_batch_size=4"], by_profile(TGS))
    assert result.exit_code == 0, result.output
    common_args = ("per_device_batch_size=4", "dataset_type=synthetic", "steps=20")
    by_key = {p.key: p for p, _ in runner.submitted}
    assert all(p.nodes == ("n1", "n2") and p.num_nodes == 2 for p in by_key.values())
    assert by_key["baseline-deployed#1"].args == common_args
    assert by_key["baseline-no-env#2"].args == (*common_args, "_env_TUNE_PROFILE=restore_default")
    assert by_key["good#1"].args == (*common_args, "_env_TUNE_PROFILE_FILE=sweeps/x1/profiles/good.profile")
    files = sweep_dir(tmp_path, "x1") / "profiles"
    lines = [ln for ln in (files / "good.profile").read_text().splitlines() if not ln.startswith("#")]
    assert lines == ["--xla_good=true", "--xla_good_too=1", "NCCL_GOOD_KNOB=8"]
    assert "# faster" in (files / "good.profile").read_text()
    assert sorted(p.name for p in files.iterdir()) == ["bad.profile", "good.profile", "neutral.profile"]


def test_profile_files_pass_train_env_sh(monkeypatch, tmp_path):
    """What the driver writes is what the shell reader accepts: the same flag and name rules."""
    text = CATALOG + "  knobs:\n    env: {NCCL_A_B: 'x y', NCCL_SWITCH: true, NCCL_N: 0.5}\n"
    profiles = xla_catalog.load_catalog(write(tmp_path, text))
    knobs = next(p for p in profiles if p.name == "knobs")
    assert knobs.lines() == ["NCCL_A_B=x y", "NCCL_SWITCH=true", "NCCL_N=0.5"]
    for line in (ln for p in profiles for ln in p.lines()):
        assert re.fullmatch(r"--[A-Za-z0-9_]+(=\S*)?|[A-Za-z_][A-Za-z0-9_]*=.*", line)


def test_noise_band_has_a_floor_and_is_unknown_with_one_run(monkeypatch, tmp_path):
    cat = write(tmp_path)
    steady = {**TGS, "baseline-deployed": [1000.0, 1001.0]}  # 0.1 % spread: the 0.5 % floor applies
    result, _ = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "a", "tiny", "-w", "n1", "--catalog", str(cat)], by_profile(steady)
    )
    assert "Noise band: ±0.5%" in result.output
    result, runner = invoke(
        monkeypatch,
        tmp_path,
        ["xla", "--id", "b", "tiny", "-w", "n1", "--catalog", str(cat), "--repeats", "1"],
        by_profile(TGS),
    )
    assert result.exit_code == 0, result.output
    assert len(runner.keys) == 5
    assert "Noise band: unknown" in result.output and "--repeats 2" in result.output
    assert all(r[0] == "1/1" for r in rows(result.output).values())


def test_a_wide_band_turns_a_gain_into_noise(monkeypatch, tmp_path):
    cat = write(tmp_path)
    noisy = {**TGS, "baseline-deployed": [960.0, 1050.0]}  # spread 90 / 1005 = 9.0 %
    result, _ = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "a", "tiny", "-w", "n1", "--catalog", str(cat)], by_profile(noisy)
    )
    table = rows(result.output)
    assert "Noise band: ±9.0%" in result.output
    assert table["good"][4] == "within noise" and "Winner: none." in result.output
    assert table["bad"][4] == "loss"


def test_a_win_of_five_percent_ends_the_search(monkeypatch, tmp_path):
    text = "profiles:\n" + "".join(f"  p{i}:\n    xla_flags: [--xla_p{i}=1]\n" for i in range(1, 6))
    cat = write(tmp_path, text)
    tgs = {"baseline-deployed": [1000.0, 1002.0], "baseline-no-env": [1000.0], "p1": [990.0], "p2": [999.0]}
    tgs |= {"p3": [1070.0, 1064.0], "p4": [1200.0], "p5": [1300.0]}
    args = ["xla", "--id", "e", "tiny", "-w", "n1", "--catalog", str(cat), "--wave-size", "2"]
    result, runner = invoke(monkeypatch, tmp_path, args, by_profile(tgs))
    assert result.exit_code == 0, result.output
    # wave 1 (p1, p2) has no win; wave 2 (p3, p4) has p4 at +19.8 %: p5 never runs
    assert not any(k.startswith("p5") for k in runner.keys)
    assert "Not run (the +5% stop rule ended the search): p5." in result.output
    assert rows(result.output)["p4"][4] == "win ← winner"
    report = (sweep_dir(tmp_path, "e") / "tiny-tuning.md").read_text()
    assert "ended early" in report and "| p5 " in report and "not run (stop rule)" in report


def test_a_gain_under_five_percent_does_not_stop_the_search(monkeypatch, tmp_path):
    text = "profiles:\n" + "".join(f"  p{i}:\n    xla_flags: [--xla_p{i}=1]\n" for i in range(1, 4))
    cat = write(tmp_path, text)
    tgs = {"baseline-deployed": [1000.0, 1002.0], "baseline-no-env": [1000.0], "p1": [1040.0], "p2": [990.0]}
    tgs["p3"] = [995.0]
    args = ["xla", "--id", "e", "tiny", "-w", "n1", "--catalog", str(cat), "--wave-size", "1"]
    result, runner = invoke(monkeypatch, tmp_path, args, by_profile(tgs))
    assert {k.split("#")[0] for k in runner.keys} >= {"p1", "p2", "p3"}
    assert "Not run" not in result.output and "Winner: p1" in result.output


def test_failing_profiles_are_listed_never_retried_and_never_win(monkeypatch, tmp_path):
    cat = write(tmp_path)

    def script(point, nodes, attempt):
        name = point.key.split("#")[0]
        if name == "good":
            return failing("tiny-config-error.log")
        if name == "neutral" and point.key.endswith("#2"):
            return failing("tiny-config-error.log")
        return by_profile(TGS)(point, nodes, attempt)

    result, runner = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "f", "tiny", "-w", "n1", "--catalog", str(cat)], script
    )
    assert result.exit_code == 0, result.output
    assert runner.keys.count("good#1") == 1 and runner.keys.count("good#2") == 1  # not retried
    table = rows(result.output)
    assert table["good"][:2] == ["0/2", "—"] and table["good"][4] == "FAIL (config-error)"
    assert table["neutral"][0] == "1/2" and table["neutral"][4] == "FAIL (config-error) in 1/2"
    assert list(table)[-2:] == ["neutral", "good"]  # failures sink to the bottom
    assert "Winner: none." in result.output
    report = (sweep_dir(tmp_path, "f") / "tiny-tuning.md").read_text()
    negatives = report.split("## Negative findings")[1].split("## Profiles")[0]
    assert "| good " in negatives and "| neutral " in negatives and "| bad " in negatives
    assert "`--xla_bad=0`" in negatives


@pytest.mark.skipif(not (FIXTURES / "tiny-unknown-flag.log").exists(), reason="no recorded unknown-flag log")
def test_an_unknown_flag_is_classified_and_not_retried(monkeypatch, tmp_path):
    cat = write(tmp_path)

    def script(point, nodes, attempt):
        if point.key.startswith("bad"):
            return failing("tiny-unknown-flag.log")
        return by_profile(TGS)(point, nodes, attempt)

    result, runner = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "u", "tiny", "-w", "n1", "--catalog", str(cat)], script
    )
    assert result.exit_code == 0, result.output
    assert rows(result.output)["bad"][4] == "FAIL (unknown-xla-flag)"
    assert [k for k in runner.keys if k.startswith("bad")] == ["bad#1", "bad#2"]


@pytest.mark.skipif(not (FIXTURES / "tiny-oom.log").exists(), reason="no recorded out-of-memory log")
def test_an_oom_profile_is_listed_and_not_retried(monkeypatch, tmp_path):
    cat = write(tmp_path)

    def script(point, nodes, attempt):
        return oom() if point.key.startswith("good") else by_profile(TGS)(point, nodes, attempt)

    result, runner = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "o", "tiny", "-w", "n1", "--catalog", str(cat)], script
    )
    assert result.exit_code == 0, result.output
    assert rows(result.output)["good"][4] == "FAIL (oom)"
    assert [k for k in runner.keys if k.startswith("good")] == ["good#1", "good#2"]
    assert "Winner: none." in result.output


def test_baseline_failing_everywhere_stops_the_sweep(monkeypatch, tmp_path):
    cat = write(tmp_path)

    def script(point, nodes, attempt):
        if point.key.startswith("baseline-deployed"):
            return failing("tiny-config-error.log")
        return by_profile(TGS)(point, nodes, attempt)

    result, runner = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "s", "tiny", "-w", "n1", "--catalog", str(cat)], script
    )
    assert result.exit_code == EXIT_STOPPED
    assert "nothing to rank against" in result.output
    assert not any(k.startswith(("good", "neutral", "bad")) for k in runner.keys)
    assert json.loads((sweep_dir(tmp_path, "s") / "plan.json").read_text())["state"] == "stopped"


def test_structurally_bounded_after_25_profiles_without_a_gain(monkeypatch, tmp_path):
    text = "profiles:\n" + "".join(f"  p{i:02d}:\n    xla_flags: [--xla_p{i}=1]\n" for i in range(25))
    cat = write(tmp_path, text)

    def script(point, nodes, attempt):
        name = point.key.split("#")[0]
        return passing(1000.0 + (15.0 if name == "p07" else 0.0))  # +1.5 %: outside the band, under +2 %

    args = ["xla", "--id", "b", "tiny", "-w", "n1", "--catalog", str(cat), "--repeats", "1", "--wave-size", "10"]
    result, runner = invoke(monkeypatch, tmp_path, args, script)
    assert result.exit_code == 0, result.output
    report = (sweep_dir(tmp_path, "b") / "tiny-tuning.md").read_text()
    assert "Structurally bounded" in report and "25 profiles tried" in report
    assert len(runner.keys) == 27


def test_the_report_has_inventory_recipe_and_jobs(monkeypatch, tmp_path):
    cat = write(tmp_path)
    result, _ = invoke(
        monkeypatch,
        tmp_path,
        ["xla", "--id", "r", "tiny", "-w", "n1", "--catalog", str(cat), "--", "per_device_batch_size=3"],
        by_profile(TGS),
    )
    assert result.exit_code == 0, result.output
    report = (sweep_dir(tmp_path, "r") / "tiny-tuning.md").read_text()
    assert "`ici_fsdp_parallelism=-1`" in report and "`per_device_batch_size=3`" in report
    # the recorded log's own line: [_train] XLA_FLAGS=--xla_force_host_platform_device_count=1
    assert "Deployed XLA_FLAGS (baseline-deployed's log): `--xla_force_host_platform_device_count=1`" in report
    recipe = report.split("## Deployment recipe")[1].split("## Negative findings")[0]
    assert "append_xla_flags --xla_good=true --xla_good_too=1" in recipe and "export NCCL_GOOD_KNOB=8" in recipe
    assert "_env_TUNE_PROFILE_FILE=sweeps/r/profiles/good.profile" in recipe
    assert "within noise" in report.split("## Effect of the deployed settings")[1].split("##")[0]
    assert report.count("| baseline-deployed#") == 2 and report.count("| good#") == 2


def test_profiles_and_parallelism_select_a_subset(monkeypatch, tmp_path):
    text = CATALOG + "  pp_only:\n    xla_flags: [--xla_pp=1]\n    parallelism: [pp]\n"
    cat = write(tmp_path, text)
    tgs = {**TGS, "pp_only": [1000.0]}
    args = ["xla", "--id", "p", "tiny", "-w", "n1", "--catalog", str(cat), "--repeats", "1", "--profiles", "bad,good"]
    _, runner = invoke(monkeypatch, tmp_path, args, by_profile(tgs))
    assert [k for k in runner.keys if not k.startswith("baseline")] == ["bad#1", "good#1"]
    args = ["xla", "--id", "q", "tiny", "-w", "n1", "--catalog", str(cat), "--repeats", "1", "--parallelism", "fsdp"]
    _, runner = invoke(monkeypatch, tmp_path, args, by_profile(tgs))
    assert "pp_only#1" not in runner.keys and "good#1" in runner.keys


def test_resume_reruns_nothing_and_keeps_the_catalog_it_started_with(monkeypatch, tmp_path):
    cat = write(tmp_path)

    def first(point, nodes, attempt):
        if point.key == "neutral#1":
            return RuntimeError(
                "sbatch: error: Batch job submission failed: Requested node configuration is not available"
            )
        return by_profile(TGS)(point, nodes, attempt)

    args = ["xla", "--id", "z", "tiny", "-w", "n1", "--catalog", str(cat), "--serial"]
    result, _ = invoke(monkeypatch, tmp_path, args, first)
    assert result.exit_code == EXIT_STOPPED and "not available" in result.output
    cat.write_text(CATALOG.replace("neutral", "renamed"))  # edited after the start: the sweep keeps its copy
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "z"], by_profile(TGS))
    assert result.exit_code == 0, result.output
    assert runner.keys == ["neutral#1", "bad#1", "good#2", "neutral#2", "bad#2"]
    assert "[good#1] (recorded)" in result.output
    assert "Winner: good" in result.output


def test_a_broken_catalog_is_one_line_and_leaves_nothing(monkeypatch, tmp_path):
    cases = [
        ("profiles: [unclosed", "not valid YAML at line 1"),
        ("- just\n- a list\n", "not a mapping"),
        ("profiles:\n  a:\n    xla_flag: [--x=1]\n", "profiles.a: unknown key 'xla_flag'"),
        ("profiles:\n  a: {}\n", "profiles.a: empty profile"),
        ("profiles:\n  a:\n    description: nothing else\n", "profiles.a: empty profile"),
        ("profiles:\n  a:\n    xla_flags: [xla_x=1]\n", "profiles.a.xla_flags: 'xla_x=1' is not a flag"),
        ("profiles:\n  a:\n    xla_flags: ['--x=1 --y=2']\n", "is not a flag"),
        ("profiles:\n  a:\n    env: {1BAD: x}\n", "profiles.a.env: '1BAD' is not an environment variable name"),
        ("profiles:\n  a:\n    env: {XLA_FLAGS: --x=1}\n", "profiles.a.env.XLA_FLAGS"),
        ("profiles:\n  a:\n    env: {ON: 1}\n", "quote the name"),
        ("profiles:\n  a:\n    env: {NCCL_A: [1]}\n", "profiles.a.env.NCCL_A: the value must be one line"),
        ("profiles:\n  a:\n    env: {LD_PRELOAD: /x.so}\n", "profiles.a.env.LD_PRELOAD: not a tuning variable"),
        ("profiles:\n  a:\n    env: {A: 1}\n  a:\n    env: {B: 1}\n", "key 'a' appears twice"),
        ("profiles:\n  baseline-deployed:\n    env: {A: 1}\n", "reserved"),
        ("profiles:\n  a b:\n    env: {A: 1}\n", "the name must be"),
        ("profile:\n  a:\n    env: {A: 1}\n", "unknown top-level key 'profile'"),
        ("profiles: {}\n", "non-empty mapping"),
    ]
    for i, (text, needle) in enumerate(cases):
        cat = write(tmp_path, text, f"c{i}.yml")
        result, runner = invoke(
            monkeypatch, tmp_path, ["xla", "tiny", "-w", "n1", "--catalog", str(cat)], by_profile(TGS)
        )
        assert result.exit_code == 1, (text, result.output)
        assert needle in result.output, (text, result.output)
        assert str(cat) in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert runner.submitted == []
    assert not (tmp_path / "ws" / "sweeps").exists()


def test_bad_arguments_are_one_line_and_leave_nothing(monkeypatch, tmp_path):
    cat = str(write(tmp_path))
    cases = [
        (["tiny", "-N", "1", "-w", "n[1-2]", "--catalog", cat], "name exactly 1"),
        (["tiny", "-N", "2", "-w", "n1", "--catalog", cat], "has 1 node(s) but -N is 2"),
        (["tiny", "--local", "-N", "2", "--catalog", cat], "--local runs one node"),
        (["tiny", "-w", "n1", "--catalog", str(tmp_path / "nope.yml")], "cannot read it"),
        (["tiny", "-w", "n1", "--catalog", cat, "--profiles", "good,nope"], "'nope' is not in catalog"),
        (["tiny", "-w", "n1", "--catalog", cat, "--", "dataset_type=grain"], "synthetic"),
        (["tiny", "-w", "n1", "--catalog", cat, "--", "_env_XLA_FLAGS=--x=1"], "_env_XLA_FLAGS would override"),
        (["tiny", "-w", "n1", "--catalog", cat, "--", "_env_NCCL_GOOD_KNOB=1"], "profile good sets NCCL_GOOD_KNOB"),
        (["no-such-model-xyz", "-w", "n1", "--catalog", cat], "no-such-model-xyz"),
    ]
    for args, needle in cases:
        result, runner = invoke(monkeypatch, tmp_path, ["xla", *args], by_profile(TGS))
        assert result.exit_code != 0, (args, result.output)
        assert needle in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert runner.submitted == []
    assert not (tmp_path / "ws" / "sweeps").exists()


def test_local_runs_without_nodes(monkeypatch, tmp_path):
    cat = write(tmp_path)
    result, runner = invoke(
        monkeypatch, tmp_path, ["xla", "--id", "l", "tiny", "--local", "--catalog", str(cat)], by_profile(TGS)
    )
    assert result.exit_code == 0, result.output
    assert all(p.nodes == () and p.num_nodes == 1 for p, _ in runner.submitted)
    assert "this machine (--local)" in (sweep_dir(tmp_path, "l") / "tiny-tuning.md").read_text()


def test_shipped_catalogs_load(monkeypatch, tmp_path):
    root = Path(__file__).resolve().parents[2] / "configs" / "xla_catalogs"
    cpu = xla_catalog.load_catalog(root / "cpu.yml")
    gpu = xla_catalog.load_catalog(root / "gpu.yml")
    assert any("HARMFUL" in p.description for p in cpu)
    assert all(f.startswith("--xla_") for p in cpu + gpu for f in p.xla_flags)
    assert any(p.env for p in gpu) and any(p.parallelism for p in gpu)


def test_a_job_with_no_log_is_a_failure_not_a_crash(monkeypatch, tmp_path):
    cat = write(tmp_path, "profiles:\n  only:\n    xla_flags: [--xla_x=1]\n")

    def script(point, nodes, attempt):
        if point.key.startswith("only"):
            return FakeJob(None, scheduler_state="FAILED")
        return by_profile(TGS)(point, nodes, attempt)

    result, _ = invoke(monkeypatch, tmp_path, ["xla", "--id", "n", "tiny", "-w", "n1", "--catalog", str(cat)], script)
    assert result.exit_code == 0, result.output
    assert rows(result.output)["only"][4].startswith("FAIL (no-log)")


def test_two_wins_within_the_band_of_each_other_are_reported_as_a_tie(monkeypatch, tmp_path):
    cat = write(tmp_path)
    tgs = dict(TGS, neutral=[1030.0, 1036.0])  # +3.0 % vs the winner's +3.5 %: both win, 0.5 % apart
    args = ["xla", "--id", "x1", "tiny", "-N", "1", "-w", "n1", "--catalog", str(cat)]
    result, _ = invoke(monkeypatch, tmp_path, args, by_profile(tgs))
    assert result.exit_code == 0, result.output
    assert rows(result.output)["neutral"][4] == "win"
    assert "Winner: good (+3.5%)" in result.output
    assert "Within the ±1.0% band of the winner (a tie as far as the runs tell" in result.output
    assert "before choosing): neutral." in result.output
    # one winner clear of the rest says nothing of the kind
    result, _ = invoke(monkeypatch, tmp_path, [*args[:2], "x2", *args[3:]], by_profile(TGS))
    assert "band of the winner" not in result.output
