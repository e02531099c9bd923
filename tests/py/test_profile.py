"""`jobkit profile JOB [--compare JOB2]`: a real captured profile read with xprof's converters.

The profile comes from one tiny job on two emulated CPU devices (profile_job.py: profiler steps 5-7); its
summary is checked against what is in the job dir (the step count MaxText was asked for, op names that exist in
the job's own HLO dump, categories that add up). The categorisation rules and the self-time arithmetic are
checked on synthetic HLO and trace events.
"""

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from conftest import NEEDS_ROOT, jobkit_without_root_powers
from profile_job import (  # noqa: F401 - profiled_job is a fixture
    PROFILER_STEPS,
    SKIP_STEPS,
    fake_job,
    profiled_job,
    someone_elses,
)

from jobkit.analysis import hlo, profile
from jobkit.cli import main


def run(*args):
    result = CliRunner().invoke(main, ["profile", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def summary(profiled_job):  # noqa: F811
    before = profiled_job.snapshot()
    code, out, err = run(str(profiled_job.job_dir), "--json", "--top", "15")
    assert code == 0, err
    assert profiled_job.snapshot() == before, "jobkit profile wrote into the job dir"
    return json.loads(out)


# --- the real profile ---


def test_captured_steps_are_the_ones_maxtext_was_asked_for(summary, profiled_job):  # noqa: F811
    sessions = list((profiled_job.job_dir / "tiny" / "tensorboard" / "plugins" / "profile").iterdir())
    assert len(sessions) == 1 and summary["session"] == sessions[0].name
    assert summary["xplanes"] == [str(p) for p in sorted(sessions[0].glob("*.xplane.pb"))]
    assert summary["steps_captured"] == PROFILER_STEPS
    assert [s["step"] for s in summary["steps"]] == [f"train {SKIP_STEPS + i}" for i in range(PROFILER_STEPS)]
    for step in summary["steps"]:  # the parts xprof splits a step into add up to the step
        parts = sum(step[p] for p in profile.STEP_PARTS.values())
        assert step["step_ms"] > 0 and parts == pytest.approx(step["step_ms"], rel=0.01, abs=0.005)


def test_categories_add_up_and_the_program_has_matmuls_and_collectives(summary):
    cats = summary["categories"]
    assert set(cats) == set(profile.CATEGORIES)
    assert sum(c["ms"] for c in cats.values()) == pytest.approx(summary["op_time_ms"], rel=1e-9)
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)
    assert summary["op_time_per_step_ms"] == pytest.approx(summary["op_time_ms"] / PROFILER_STEPS)
    assert summary["op_source"] == "trace_viewer"  # a CPU profile: xprof's hlo_stats has no device plane to read
    assert cats["matmul/convolution"]["ms"] > 0 and cats["collectives"]["ms"] > 0 and cats["fusions"]["ms"] > 0
    assert summary["modules_ms"]["jit_train_step"] > 0.5 * summary["op_time_ms"]


def test_top_ops_exist_in_the_jobs_own_hlo_dump_and_fit_in_their_categories(summary, profiled_job):  # noqa: F811
    (dump,) = (profiled_job.job_dir / "xla_dump").glob("*after_optimizations.txt")
    module = hlo.parse_module(dump.read_text())
    names = {i.name: i for instrs in module.computations.values() for i in instrs}
    top = summary["top_ops"]
    assert len(top) == 15 and top == sorted(top, key=lambda o: -o["ms"])
    for op in (o for o in top if o["module"] == "jit_train_step"):
        assert op["op"] in names, op
        assert op["category"] == profile.categorize(module, op["op"])
        # each op ran once per captured step on each of the two devices (or once per layer in the scan)
        assert op["occurrences"] % PROFILER_STEPS == 0
    # which kinds make the top 15 depends on the machine's load; that each category holds at least its top ops does not
    for cat in {o["category"] for o in top}:
        in_top = sum(o["ms"] for o in top if o["category"] == cat)
        assert summary["categories"][cat]["ms"] >= in_top * (1 - 1e-9), cat


def test_table_output(profiled_job):  # noqa: F811
    code, out, err = run("latest", "--workspace", str(profiled_job.workspace), "--top", "5")
    assert code == 0, err
    assert f"{PROFILER_STEPS} step(s) captured (train {SKIP_STEPS}," in out.splitlines()[0]
    for needle in ("Step time", "host compute", "matmul/convolution", "collectives", "Top 5 ops", "total"):
        assert needle in out
    assert err == ""  # xprof's C++ logging stays off the terminal


def test_compare_with_itself_has_zero_deltas(profiled_job):  # noqa: F811
    ws = str(profiled_job.workspace)
    code, out, err = run("latest", "--compare", str(profiled_job.log), "--workspace", ws, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data["delta_per_step_ms"]) == {*profile.CATEGORIES, "total"}
    assert all(v == pytest.approx(0) for v in data["delta_per_step_ms"].values())
    assert all(v == pytest.approx(0) for v in data["delta_step_mean_ms"].values())
    code, out, err = run("latest", "--compare", "latest", "--workspace", ws)
    assert code == 0, err
    assert out.startswith("A = ") and "B-A" in out and "+0.000" in out


# --- the rules, on synthetic input ---

HLO_TEXT = """HloModule m

fused_dot {
  p0 = bf16[8,16]{1,0} parameter(0)
  p1 = bf16[16,4]{1,0} parameter(1)
  ROOT dot.1 = bf16[8,4]{1,0} dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

fused_copy {
  p0 = f32[4,8]{1,0} parameter(0)
  t = f32[8,4]{0,1} transpose(p0), dimensions={1,0}
  ROOT c = f32[8,4]{1,0} copy(t)
}

fused_loop {
  p0 = f32[8]{0} parameter(0)
  ROOT e = f32[8]{0} exponential(p0)
}

async_ar {
  p0 = f32[8]{0} parameter(0)
  ROOT ar = f32[8]{0} all-reduce(p0), to_apply=add
}

ENTRY main {
  x = bf16[8,16]{1,0} parameter(0)
  gemm_fusion = bf16[8,4]{1,0} fusion(x, x), kind=kCustom, calls=fused_dot
  copy_fusion = f32[8,4]{1,0} fusion(x), kind=kLoop, calls=fused_copy
  loop_fusion = f32[8]{0} fusion(x), kind=kLoop, calls=fused_loop
  ars = f32[8]{0} all-reduce-start(x), to_apply=add
  ard = f32[8]{0} all-reduce-done(ars)
  as = ((f32[8]{0}), f32[8]{0}) async-start(x), calls=async_ar
  cublas = (bf16[8,4]{1,0}, s8[0]{0}) custom-call(x, x), custom_call_target="__cublas$gemm"
  cb = () custom-call(x), custom_call_target="xla_ffi_python_cpu_callback"
  of = token[] outfeed(x, tok)
  cp = f32[8]{0} copy(x)
  ROOT add.3 = f32[8]{0} add(x, x)
}
"""


@pytest.mark.parametrize(
    "op, category",
    [
        ("gemm_fusion", "matmul/convolution"),
        ("copy_fusion", "copies"),
        ("loop_fusion", "fusions"),
        ("ars", "collectives"),
        ("ard", "collectives"),
        ("as", "collectives"),
        ("cublas", "matmul/convolution"),
        ("cb", "host"),
        ("of", "host"),
        ("cp", "copies"),
        ("add.3", "other"),
        ("all-gather.9", "collectives"),  # not in the module: by its name
        ("fusion.77", "fusions"),
        ("mystery", "other"),
    ],
)
def test_categorize(op, category):
    assert profile.categorize(hlo.parse_module(HLO_TEXT), op) == category


def test_categorize_falls_back_to_the_xprof_category():
    assert profile.categorize(None, "custom-call.4", "convolution fusion") == "matmul/convolution"
    assert profile.categorize(None, "x.1", "data formatting") == "copies"


def test_trace_self_time_subtracts_nested_ops_on_the_same_thread_only():
    def ev(name, ts, dur, tid=1, op=True):
        args = {"hlo_op": name, "hlo_module": "m"} if op else {}
        return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": args}

    events = [
        ev("while.1", 0, 100),
        ev("fusion.1", 10, 30),
        ev("dot.1", 15, 10),  # nested in fusion.1 (a callee), itself nested in while.1
        ev("fusion.2", 50, 20),
        ev("end: fusion.2", 60, 1, op=False),  # runtime markers without hlo_op are not ops
        ev("fusion.3", 20, 40, tid=2),  # overlaps in time, other thread: not nested
    ]
    got = {name: t for _, name, t in profile.trace_ops(json.dumps({"traceEvents": events}))}
    assert got == {"while.1": 50, "fusion.1": 20, "dot.1": 10, "fusion.2": 20, "fusion.3": 40}
    assert sum(got.values()) == 100 + 40  # each thread's wall time, counted once


# --- bad input: one line, exit 1, no traceback, nothing written ---


def _bad(args, *needles):
    code, out, err = run(*args)
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobkit profile: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_no_profile_says_rerun_with_profiler_xplane(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    (job_dir / "tiny" / "tensorboard").mkdir(parents=True)
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "no profile captured", "profiler=xplane")
    assert [p.name for p in job_dir.rglob("*")] == ["tiny", "tensorboard"]


def test_damaged_profile_says_what_xprof_said(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    session = job_dir / "tiny" / "tensorboard" / "plugins" / "profile" / "2026_01_01_00_00_00"
    session.mkdir(parents=True)
    (session / "host.xplane.pb").write_bytes(b"\x0a\xff\xff\xff\x0fnot an xspace")
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "xprof could not read host.xplane.pb", "profiler=xplane")
    assert sorted(p.name for p in session.iterdir()) == ["host.xplane.pb"]
    _bad(["latest", "--workspace", str(tmp_path / "ws"), "--session", "nope"], "no profile session 'nope'")


def test_unreadable_profile_and_missing_jobs(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    session = job_dir / "run" / "tensorboard" / "plugins" / "profile" / "s1"
    (session / "host.xplane.pb").mkdir(parents=True)  # a directory where the file should be
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "cannot read", "host.xplane.pb")
    _bad(["nope", "--workspace", str(tmp_path / "missing")], "does not exist")
    _bad(["nope", "--workspace", str(tmp_path / "ws")], "no job matching 'nope'")
    _bad(["latest", "--compare", "nope", "--workspace", str(tmp_path / "ws")])


def test_log_only_job(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    job_dir.rmdir()
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "does not exist (log only)")


def test_hlo_stats_rows_are_read_by_column_id_and_idle_is_dropped():
    # The shape of xprof's hlo_stats table on a GPU profile (a DataTable: cols with ids, rows of {"v": ...}).
    cols = [{"id": i} for i in ("rank", "program_id", "category", "hlo_op_name", "occurrences", "total_self_time")]
    rows = [
        {"c": [{"v": 1}, {"v": "31"}, {"v": "convolution fusion"}, {"v": "gemm_fusion.3"}, {"v": 6}, {"v": 120.5}]},
        {"c": [{"v": 2}, {"v": "31"}, {"v": "all-reduce"}, {"v": "all-reduce-start.1"}, {"v": 3}, {"v": 40.0}]},
        {"c": [{"v": 3}, {"v": ""}, {"v": "IDLE"}, {"v": "IDLE"}, {"v": 1}, {"v": 999.0}]},
    ]
    got = profile.hlo_stats_ops(json.dumps({"cols": cols, "rows": rows}))
    assert got == [
        ("31", "gemm_fusion.3", "convolution fusion", 6, 120.5),
        ("31", "all-reduce-start.1", "all-reduce", 3, 40.0),
    ]
    assert [profile.categorize(None, name, cat) for _, name, cat, _, _ in got] == ["matmul/convolution", "collectives"]


@NEEDS_ROOT
def test_a_job_dir_it_may_not_read_says_permission_denied_not_rerun(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    (job_dir / "tiny" / "tensorboard" / "plugins" / "profile" / "s1").mkdir(parents=True)
    someone_elses(job_dir)
    result = jobkit_without_root_powers("profile", "latest", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"jobkit profile: cannot read {job_dir}: permission denied; ask its owner for read access\n"


def test_an_empty_xplane_is_refused_not_a_zero_report(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    session = job_dir / "tiny" / "tensorboard" / "plugins" / "profile" / "2026_01_01_00_00_00"
    session.mkdir(parents=True)
    (session / "vm.xplane.pb").write_bytes(b"")
    _bad(
        ["latest", "--workspace", str(tmp_path / "ws")], f"{session}/vm.xplane.pb is empty (0 bytes", "profiler=xplane"
    )
