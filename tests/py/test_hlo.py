"""`jobkit hlo JOB`: collectives and fusions per module of a job's XLA dump.

The real dump comes from one tiny job on two emulated CPU devices (profile_job.py), and its numbers are checked
against grep over the same files; exact byte counts come from synthetic HLO written here.
"""

import json
import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from conftest import NEEDS_ROOT, jobkit_without_root_powers
from profile_job import fake_job, profiled_job, someone_elses  # noqa: F401 - a fixture

from jobkit.analysis import hlo
from jobkit.cli import main


def run(*args):
    result = CliRunner().invoke(main, ["hlo", *args])
    return result.exit_code, result.stdout, result.stderr


def grep_count(pattern: str, path) -> int:
    out = subprocess.run(["grep", "-cE", pattern, str(path)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


# --- the real dump ---


def test_real_dump_counts_match_grep_and_leave_the_job_dir_alone(profiled_job):  # noqa: F811
    before = profiled_job.snapshot()
    code, out, err = run(str(profiled_job.job_dir), "--json", "--workspace", str(profiled_job.workspace))
    assert code == 0, err
    data = json.loads(out)
    files = sorted((profiled_job.job_dir / "xla_dump").glob("*after_optimizations.txt"))
    assert files and len(data["modules"]) == len(files)
    assert [m["file"] for m in data["modules"]] == [f.name for f in files]
    for module, path in zip(data["modules"], files, strict=True):
        assert module["module"] == "jit_train_step"
        assert module["fusions"] == grep_count(r"^\s*(ROOT )?%?[^ ]+ = .* fusion\(", path) > 0
        for kind in hlo.COLLECTIVES:
            assert module["collectives"][kind]["count"] == grep_count(rf" {kind}(-done)?\(", path), kind
        # Two devices in one data-parallel program: the gradients are all-reduced, FSDP params all-gathered.
        assert module["collective_count"] > 0 and module["collective_bytes"] > 0
        assert module["collective_bytes"] == sum(k["bytes"] for k in module["collectives"].values())
    assert profiled_job.snapshot() == before


def test_real_dump_table_names_the_source_and_each_module(profiled_job):  # noqa: F811
    code, out, err = run("latest", "--workspace", str(profiled_job.workspace))
    assert code == 0, err
    assert "*after_optimizations.txt" in out.splitlines()[0]
    assert "jit_train_step" in out and "ALL-REDUCE" in out and "FUSIONS" in out


# --- exact counts from synthetic HLO ---

SYNTHETIC = """HloModule jit_step, entry_computation_layout={(f32[1024]{0})->f32[1024]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%async_rs (p: f32[64]) -> f32[16] {
  %p = f32[64]{0} parameter(0)
  ROOT %rs.2 = f32[16]{0} reduce-scatter(f32[64]{0} %p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}

%fused_computation (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  ROOT %m = f32[1024]{0} multiply(f32[1024]{0} %a, f32[1024]{0} %a)
}

ENTRY %main.1 (Arg_0.1: f32[1024]) -> f32[1024] {
  %Arg_0.1 = f32[1024]{0} parameter(0)
  %all-reduce.1 = f32[1024]{0} all-reduce(f32[1024]{0} %Arg_0.1), replica_groups={}, to_apply=%add
  %all-gather.3 = (f32[16]{0}, bf16[8,4]{1,0}) all-gather(f32[4]{0} %x1, bf16[2,4]{1,0} %x2), dimensions={0}
  %ags = (f32[4]{0}, f32[16]{0}) all-gather-start(f32[4]{0} %x1), dimensions={0}
  %agd = f32[16]{0} all-gather-done((f32[4]{0}, f32[16]{0}) %ags)
  %rs-start = ((f32[64]{0}), f32[16]{0}) async-start(f32[64]{0} %y), calls=%async_rs
  %rs-done = f32[16]{0} async-done(((f32[64]{0}), f32[16]{0}) %rs-start)
  %a2a = (s8[8,2]{1,0}, s8[8,2]{1,0}) all-to-all(s8[8,2]{1,0} %u, s8[8,2]{1,0} %v), replica_groups={{0,1}}
  %cps = (bf16[2,8]{1,0}, bf16[2,8]{1,0}, u32[], u32[]) collective-permute-start(bf16[2,8]{1,0} %w), source_target_pairs={{0,1}}
  %cpd = bf16[2,8]{1,0} collective-permute-done((bf16[2,8]{1,0}, bf16[2,8]{1,0}, u32[], u32[]) %cps)
  %fusion.1 = f32[1024]{0} fusion(f32[1024]{0} %all-reduce.1), kind=kLoop, calls=%fused_computation
  ROOT %fusion.2 = f32[1024]{0} fusion(f32[1024]{0} %fusion.1), kind=kLoop, calls=%fused_computation
}
"""


def test_synthetic_collectives_exact_bytes():
    s = hlo.summarize(hlo.parse_module(SYNTHETIC))
    c = s["collectives"]
    assert c["all-reduce"] == {"count": 1, "bytes": 4096}  # f32[1024]
    # the tuple all-gather: f32[16] + bf16[8,4] = 64 + 64; the async pair counts once, at its -done: f32[16] = 64
    assert c["all-gather"] == {"count": 2, "bytes": 128 + 64}
    assert c["reduce-scatter"] == {"count": 1, "bytes": 64}  # inside the async computation, f32[16]
    assert c["all-to-all"] == {"count": 1, "bytes": 32}  # two s8[8,2]
    assert c["collective-permute"] == {"count": 1, "bytes": 32}  # the -done's bf16[2,8]
    assert s["collective_count"] == 6 and s["collective_bytes"] == 4096 + 192 + 64 + 32 + 32
    assert s["fusions"] == 2 and s["module"] == "jit_step"


@pytest.mark.parametrize(
    "shape, size",
    [
        ("f32[1024]{0}", 4096),
        ("f32[]", 4),
        ("bf16[8,128]{1,0}", 2048),
        ("(f32[8]{0}, bf16[4,4]{1,0})", 64),
        ("(f32[2]{0}, /*index=1*/(s32[], pred[3]{0}))", 8 + 4 + 3),
        ("s4[16]{0}", 8),
        ("f8e4m3fn[10,10]{1,0}", 100),
        ("f32[<=10,4]{1,0}", 160),
        ("bf16[8,128]{1,0:T(8,128)(2,1)}", 2048),
        ("token[]", 0),
    ],
)
def test_shape_bytes(shape, size):
    assert hlo.shape_bytes(shape) == size


def test_synthetic_dump_through_the_cli(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    (job_dir / "xla_dump").mkdir()
    (job_dir / "xla_dump" / "module_0007.jit_step.gpu_after_optimizations.txt").write_text(SYNTHETIC)
    (job_dir / "xla_dump" / "module_0007.jit_step.before_optimizations.txt").write_text("HloModule ignored\n")
    code, out, err = run("latest", "--workspace", str(tmp_path / "ws"), "--json")
    assert code == 0, err
    (module,) = json.loads(out)["modules"]
    assert module["id"] == "0007" and module["collectives"]["all-reduce"]["bytes"] == 4096
    code, out, _ = run("latest", "--workspace", str(tmp_path / "ws"))
    assert "1 / 4.0 KiB" in out and "0007 jit_step" in out


# --- bad input: one line, exit 1, no traceback, nothing written ---


def _bad(args, *needles):
    code, out, err = run(*args)
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobkit hlo: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_no_dump_says_enable_xla_dump(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "no HLO dump", "_env_ENABLE_XLA_DUMP=1")
    assert list(job_dir.iterdir()) == []


def test_empty_dump_mentions_the_jax_cache(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    (job_dir / "xla_dump").mkdir()
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "after_optimizations", "ENABLE_XLA_DUMP=1", "cache")


def test_unreadable_and_damaged_dumps(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    dump = job_dir / "xla_dump"
    dump.mkdir()
    (dump / "module_0001.x.cpu_after_optimizations.txt").mkdir()  # a directory where a file should be
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "cannot read", "module_0001")
    (dump / "module_0001.x.cpu_after_optimizations.txt").rmdir()
    (dump / "module_0001.x.cpu_after_optimizations.txt").write_bytes(b"\x00\xffnot hlo at all\n")
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "not readable HLO", "rerun")
    (dump / "module_0001.x.cpu_after_optimizations.txt").unlink()
    dump.rmdir()
    dump.write_text("a file, not a dir")
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "not a directory")


def test_missing_job_and_log_only_job(tmp_path):
    _bad(["nope", "--workspace", str(tmp_path / "missing")], "does not exist")
    job_dir = fake_job(tmp_path / "ws")
    job_dir.rmdir()
    _bad(["latest", "--workspace", str(tmp_path / "ws")], "does not exist (log only)")
    _bad(["no-such-job", "--workspace", str(tmp_path / "ws")], "no job matching")


@NEEDS_ROOT
def test_a_job_dir_it_may_not_read_is_one_line_not_a_traceback(tmp_path):
    job_dir = fake_job(tmp_path / "ws")
    (job_dir / "xla_dump").mkdir()
    someone_elses(job_dir)
    result = jobkit_without_root_powers("hlo", "latest", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"jobkit hlo: cannot read {job_dir}: permission denied; ask its owner for read access\n"
    os.chown(job_dir, 0, 0)  # the job dir readable, its dump not
    os.chown(job_dir / "xla_dump", 65534, 65534)
    (job_dir / "xla_dump").chmod(0o700)
    result = jobkit_without_root_powers("hlo", "latest", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1
    assert (
        result.stderr
        == f"jobkit hlo: cannot read {job_dir}/xla_dump: permission denied; ask its owner for read access\n"
    )
