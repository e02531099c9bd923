"""Log parsing and TGS statistics on recorded MaxText logs."""

import functools
import json
import math
import operator
import random
import re
import statistics

import pytest
from conftest import FIXTURES, JOBKIT_LOGS

from jobkit.core import logparse, tgs
from jobkit.core.errors import EXIT_NOT_A_LOG

RAW_LOG = FIXTURES / "logs" / "maxtext-cpu-tiny-20steps.log"
MFU_LOG = JOBKIT_LOGS / "launch-tiny-20steps-mfu.log"
SHORT_LOG = JOBKIT_LOGS / "launch-tiny-3steps-mfu.log"
PROFILER_LOG = JOBKIT_LOGS / "maxtext-profiler-xplane-s5-p3.log"
TWO_NODE_LOG = JOBKIT_LOGS / "maxtext-2proc-srun-l.log"
HEADER = "JOB_ID=local_20261122_101010_ab12\nJOB_NAME=JAX-tiny\nNNODES=1\nMODEL_NAME=tiny\n"


def grep_values(path, field, steps, prefix=""):
    """Independent reading of a field from step lines, by plain regex."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.search(rf"^{prefix}.*completed step: (\d+),.*?{re.escape(field)}: ([0-9.]+)", line)
        if m and int(m.group(1)) in steps:
            out.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return out


# ---- step lines ----------------------------------------------------------------


def test_parse_real_step_line_without_mfu():
    line = next(l for l in RAW_LOG.read_text().splitlines() if "completed step: 5," in l)
    e = logparse.parse_step_line(line)
    assert e == logparse.StepEntry(5, None, 0.012, 0.014, None, 20959.555, 6.018)


def test_parse_real_step_line_with_mfu_and_srun_prefix():
    line = next(l for l in MFU_LOG.read_text().splitlines() if "completed step: 7," in l)
    e = logparse.parse_step_line("1: " + line)
    assert e.node == 1 and e.step == 7
    assert e.mfu == pytest.approx(e.tflops * 100, abs=0.006)  # HARDWARE_PEAK_TFLOPS=1


def test_loss_is_not_confused_with_lm_loss():
    e = logparse.parse_step_line("completed step: 3, seconds: 1.0, lm_loss: 9.000, loss: 2.500")
    assert e.loss == 2.5


def test_non_step_lines_are_ignored():
    assert logparse.parse_step_line("Per train step:") is None
    assert logparse.parse_step_line(" Total TFLOPs: 0.00 ") is None


def test_header_is_read_including_quoted_passthrough():
    log = logparse.parse_file(PROFILER_LOG)
    assert log.header["JOB_ID"] == "local_20261122_054555_0a0b"
    assert log.nnodes == 1
    assert log.passthrough_args() == ["profiler=xplane", "skip_first_n_steps_for_profiler=5", "profiler_steps=3"]


def test_legacy_slurm_node_count_header():
    log = logparse.parse_text("SLURM_JOB_NUM_NODES=4\n")
    assert log.nnodes == 4


def test_a_debug_logs_header_is_found_below_its_set_x_trace():
    """_DEBUG=1 traces the batch script before it prints the header: hundreds of "+ ..." lines come first."""
    trace = "".join(f"+ some traced command {i}\n++ nested {i}\n" for i in range(200))
    log = logparse.parse_text(trace + "JOB_ID=147\nNNODES=2\n")
    assert (log.header["JOB_ID"], log.nnodes) == ("147", 2)
    # The header is still looked for at the top only: KEY=VALUE lines far into the output are not it.
    late = "".join(f"line {i}\n" for i in range(60))
    assert logparse.parse_text(late + "NNODES=2\n").nnodes_header is None


def test_footer_status_with_ansi_colour():
    log = logparse.parse_text(HEADER + "==== JOB SUMMARY ====\n  Status: \x1b[31mFAILED (exit 137)\x1b[0m\n")
    assert (log.footer_status, log.footer_exit) == ("FAILED", 137)


# ---- windows and stats ----------------------------------------------------------


def test_steady_stats_match_an_independent_computation():
    s = tgs.summarize(logparse.parse_file(MFU_LOG))
    steady = range(5, 15)
    tgs_vals = [v[0] for _, v in sorted(grep_values(MFU_LOG, "Tokens/s/device", steady).items())]
    mfu_vals = [v[0] for _, v in sorted(grep_values(MFU_LOG, "MFU", steady).items())]
    assert len(tgs_vals) == 10
    st = s.windows["steady"].stats("tgs")
    assert st.mean == pytest.approx(statistics.fmean(tgs_vals))
    assert st.std == pytest.approx(statistics.pstdev(tgs_vals))
    assert s.mfu == pytest.approx(statistics.fmean(mfu_vals))
    assert s.final_loss == 5.965


def test_windows_cover_the_run():
    s = tgs.summarize(logparse.parse_file(MFU_LOG))
    assert s.windows["all"].span == (0, 19)
    assert s.windows["warmup"].steps == [0, 1, 2, 3, 4]
    assert s.windows["steady"].steps == list(range(5, 15))
    assert s.windows["tail"].steps == list(range(15, 20))
    assert not any("needs steps" in w for w in s.warnings)


def test_custom_steady_window():
    s = tgs.summarize(logparse.parse_file(MFU_LOG), steady=(2, 4))
    assert s.windows["steady"].steps == [2, 3, 4]
    assert s.windows["warmup"].steps == [0, 1]


def test_short_run_has_no_steady_tgs_and_warns():
    s = tgs.summarize(logparse.parse_file(SHORT_LOG))
    assert s.tgs is None
    assert any("needs steps>=15" in w for w in s.warnings)
    line = tgs.format_line(s, "PASS")
    assert (
        line
        == "tiny 1N (job local_20261122_054900_cd34): TGS n/a (steady window 5-14 needs steps>=15, run logged 3) — PASS"
    )


def test_partial_steady_window_is_flagged_in_the_line():
    log = logparse.parse_file(MFU_LOG)
    log.steps = {step: f for step, f in log.steps.items() if step < 10}
    line = tgs.format_line(tgs.summarize(log), "PASS")
    assert "TGS/device (5/10 steady steps)" in line


def test_profiler_window_from_passthrough_is_left_out():
    s = tgs.summarize(logparse.parse_file(PROFILER_LOG))
    assert s.excluded == (5, 8)
    assert s.windows["steady"].steps == [9, 10, 11, 12, 13, 14]
    # The dump step (S+P = 8) is the slow one in this real run: leaving it out matters.
    slow = max(s.windows["all"].points, key=lambda p: p.seconds if p.step > 1 else 0)
    assert slow.step == 8


def test_profiler_window_from_yml_and_config_param_precedence(tmp_path):
    yml = tmp_path / "m.yml"
    yml.write_text('profiler: "xplane"\nskip_first_n_steps_for_profiler: 3\nprofiler_steps: 2\n')
    log = logparse.parse_file(MFU_LOG)
    assert tgs.profiler_window(log, str(yml)) == (3, 5)
    # MaxText's own `Config param` lines (log_config=true) win over the yml.
    log.config_params = {"profiler_steps": "4"}
    assert tgs.profiler_window(log, str(yml)) == (3, 7)
    assert tgs.profiler_window(log, None) is None  # no profiler set anywhere


def test_profiler_defaults_are_maxtexts():
    log = logparse.parse_text(HEADER.replace("NNODES=1", 'NNODES=1\nPASSTHROUGH_ARGS="profiler=xplane"'))
    assert tgs.profiler_window(log) == (1, 6)


def test_srun_prefixed_copy_gives_the_same_numbers():
    lines = RAW_LOG.read_text().splitlines()
    plain = tgs.summarize(logparse.parse_text(HEADER + "\n".join(lines)))
    prefixed = tgs.summarize(logparse.parse_text(HEADER + "\n".join("0: " + l for l in lines)))
    assert prefixed.tgs == plain.tgs and plain.tgs is not None
    assert prefixed.log.prefixes() == ({0}, set())


def test_two_nodes_are_averaged_per_step():
    s = tgs.summarize(logparse.parse_file(TWO_NODE_LOG))
    assert s.log.nnodes == 2 and s.entries_per_step == 2
    per_node = grep_values(TWO_NODE_LOG, "Tokens/s/device", range(5, 15), prefix=r"[01]: ")
    assert all(len(v) == 2 for v in per_node.values())
    step7 = next(p for p in s.points if p.step == 7)
    assert step7.tgs == pytest.approx(statistics.fmean(per_node[7]))
    assert s.tgs == pytest.approx(statistics.fmean(statistics.fmean(v) for v in per_node.values()))
    assert s.loss_mismatch_steps == []
    assert not any("node" in w for w in s.warnings)


def test_loss_disagreement_between_nodes_is_reported():
    text = TWO_NODE_LOG.read_text()
    bad = re.sub(r"^(1: .*completed step: 12,.*? loss: )5\.\d+", r"\g<1>7.000", text, count=1, flags=re.M)
    assert bad != text
    s = tgs.summarize(logparse.parse_text(bad))
    assert s.loss_mismatch_steps == [12]
    assert any("loss differs between nodes at steps 12" in w for w in s.warnings)


def test_missing_node_is_reported():
    text = "\n".join(l for l in TWO_NODE_LOG.read_text().splitlines() if not l.startswith("1: "))
    s = tgs.summarize(logparse.parse_text(text))
    assert any("NNODES=2 but step lines came from 1" in w for w in s.warnings)


# ---- presentation ------------------------------------------------------------------


def test_line_format():
    s = tgs.summarize(logparse.parse_file(MFU_LOG))
    line = tgs.format_line(s, "PASS")
    assert re.fullmatch(
        r"tiny 1N \(job local_20261122_054800_ab12\): \d{1,3}(,\d{3})+ TGS/device, \d+\.\d% MFU — PASS", line
    )
    assert tgs.fmt_tgs(s.tgs) in line


def test_line_without_mfu_omits_it():
    line = tgs.format_line(tgs.summarize(logparse.parse_file(PROFILER_LOG)), "PASS")
    assert "MFU" not in line and "TGS/device" in line


def test_number_formats():
    assert tgs.fmt_tgs(12345.678) == "12,346"
    assert tgs.fmt_tgs(12.345) == "12.35"
    assert tgs.fmt_pct(1.234) == "1.2"
    assert tgs.fmt_pct(0.0456) == "0.05"


def test_table_has_all_windows_and_json_is_consistent():
    s = tgs.summarize(logparse.parse_file(MFU_LOG))
    table = tgs.format_table(s)
    for name, span in (("all", "0-19"), ("warmup", "0-4"), ("steady", "5-14"), ("tail", "15-19")):
        assert re.search(rf"^{name}\s+{span}\s", table, re.M), name
    d = tgs.to_dict(s)
    assert d["windows"]["steady"]["n"] == 10 and d["windows"]["steady"]["range"] == [5, 14]
    assert d["tgs"] == pytest.approx(s.tgs)
    assert len(d["per_step"]) == 20


def test_parse_steady():
    assert tgs.parse_steady("5:14") == (5, 14)
    for bad in ("5", "9:3", "a:b", "-1:4"):
        with pytest.raises(ValueError):
            tgs.parse_steady(bad)


# ---- non-finite values ------------------------------------------------------------


def with_tgs(values: dict[int, str], last_step: int = 20) -> str:
    """A 1-node log of steps 0..last_step, Tokens/s/device 1000 + step unless `values` says otherwise."""
    lines = [HEADER.rstrip("\n")]
    for step in range(last_step + 1):
        value = values.get(step, f"{1000 + step}.0")
        lines.append(
            f"completed step: {step}, seconds: 0.010, TFLOP/s/device: 0.010, Tokens/s/device: {value}, loss: 5.0"
        )
    return "\n".join(lines) + "\n"


def test_inf_steps_are_left_out_and_counted():
    s = tgs.summarize(logparse.parse_text(with_tgs({7: "inf", 9: "inf", 10: "nan"})))
    finite = [1000 + step for step in range(5, 15) if step not in (7, 9, 10)]
    assert s.tgs == pytest.approx(statistics.fmean(finite))
    assert s.windows["steady"].stats("tgs").std == pytest.approx(statistics.pstdev(finite))
    assert [p.step for p in s.windows["steady"].nonfinite("tgs")] == [7, 9, 10]
    warning = next(w for w in s.warnings if "non-finite" in w)
    assert warning == (
        "steady window 5-14: 3 step(s) logged non-finite Tokens/s/device (inf at 7,9, nan at 10); "
        "the steady mean uses the 7 finite one(s)"
    )
    assert not any("needs steps" in w for w in s.warnings)
    line = tgs.format_line(s, "PASS")
    assert line.endswith(f"{tgs.fmt_tgs(s.tgs)} TGS/device (7/10 steady steps, 3 non-finite) — PASS")
    table = tgs.format_table(s)
    assert re.search(r"^steady\s+5-14\s+10\s+[\d,]+ ±[\d.,]+ \+3 inf/nan", table, re.M), table
    assert "over 7 step(s) (3 non-finite step(s) left out)" in table
    d = tgs.to_dict(s)
    assert d["windows"]["steady"]["tgs"]["n"] == 7 and d["windows"]["steady"]["tgs"]["nonfinite"] == 3
    assert d["windows"]["steady"]["seconds"]["nonfinite"] == 0
    assert d["tgs_unavailable"] is None
    assert [p["tgs"] for p in d["per_step"] if p["step"] in (7, 10)] == [None, None]


def test_all_steady_steps_non_finite_say_so_instead_of_too_few_steps():
    s = tgs.summarize(logparse.parse_text(with_tgs({step: "nan" for step in range(5, 15)})))
    assert s.tgs is None
    reason = "all 10 logged steady step(s) 5-14 have non-finite Tokens/s/device (nan at 5-14)"
    assert tgs.format_line(s, "PASS").endswith(f"TGS n/a ({reason}) — PASS")
    assert f"TGS: n/a ({reason})" in tgs.format_table(s)
    assert "needs steps" not in tgs.format_table(s)
    d = tgs.to_dict(s)
    assert d["tgs"] is None and d["tgs_unavailable"] == reason
    assert d["windows"]["steady"]["tgs"] == {"n": 0, "mean": None, "std": None, "nonfinite": 10}
    assert any("no steady mean" in w for w in s.warnings)


def test_negative_inf_is_not_a_slow_step():
    s = tgs.summarize(logparse.parse_text(with_tgs({8: "-inf"})))
    assert s.tgs == pytest.approx(statistics.fmean(1000 + step for step in range(5, 15) if step != 8))
    assert not any("below" in w for w in s.warnings)
    assert any("-inf at 8" in w for w in s.warnings)


def test_bad_node_count_header_is_kept_for_the_message():
    log = logparse.parse_text(HEADER.replace("NNODES=1", "NNODES=abc"))
    assert log.nnodes is None and log.nnodes_header == ("NNODES", "abc")
    assert logparse.parse_text("JOB_ID=x\n").nnodes_header is None


def test_a_run_resumed_from_a_checkpoint_counts_its_steady_window_from_its_first_step():
    # Steps 100-104 are the resumed run's recompile (slow); 105-114 its steady state.
    lines = ["NNODES=1"]
    for step in range(100, 120):
        rate = 100.0 if step < 105 else 1000.0 + step
        lines.append(f"completed step: {step}, seconds: 1.0, Tokens/s/device: {rate}, loss: 5.0")
    summary = tgs.summarize(logparse.parse_text("\n".join(lines)))
    assert summary.steady_range == (105, 114)
    assert summary.tgs == pytest.approx(statistics.mean(1000.0 + s for s in range(105, 115)))


# ---- what is not a job log, and a --config that cannot be read (bad input round 2) ----------------------------

NOT_A_LOG = (
    "not a job log (no KEY=VALUE header with JOB_ID and NNODES); give a log written by submit.sh or run_local.sh"
)


def not_a_log_files(tmp_path):
    """Random bytes (NULs and invalid UTF-8 included), an empty file, and text with a header of other keys."""
    files = {
        "random.log": bytes(range(256)) * 16 + b"\nNNODES=\xff\x00\n",
        "empty.log": b"",
        "other.log": b"HOSTNAME=vm\nFOO=1\ncompleted step: 1, seconds: 1.0, Tokens/s/device: 5.0, loss: 1.0\n",
        "no-nnodes.log": b"JOB_ID=7\nJOB_NAME=x\n",  # a header, but not the launcher's
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return [tmp_path / name for name in files]


def test_a_file_that_is_not_a_job_log_is_refused_by_the_one_reader(tmp_path):
    for path in not_a_log_files(tmp_path):
        with pytest.raises(logparse.NotAJobLog) as err:
            logparse.load(str(path))
        assert str(err.value) == f"{path}: {NOT_A_LOG}"
    good = tmp_path / "good.log"
    good.write_text(HEADER)
    assert logparse.load(str(good)).is_job_log
    legacy = tmp_path / "legacy.log"  # logs from before NNODES was written carry Slurm's own count
    legacy.write_text("JOB_ID=9\nSLURM_JOB_NUM_NODES=2\n")
    assert logparse.load(str(legacy)).nnodes == 2


def test_tgs_refuses_a_file_that_is_not_a_job_log_in_one_line(tmp_path):
    from click.testing import CliRunner

    from jobkit.cli import main

    for path in not_a_log_files(tmp_path):
        r = CliRunner().invoke(main, ["tgs", str(path)])
        assert r.exit_code == EXIT_NOT_A_LOG, r.output  # tgs's documented code for "not a job log"
        assert r.stdout == "" and r.stderr == f"jobkit tgs: {path}: {NOT_A_LOG}\n"


def test_tgs_config_that_cannot_be_read_is_an_error_not_ignored(tmp_path):
    from click.testing import CliRunner

    from jobkit.cli import main

    (tmp_path / "binary.yml").write_bytes(b"\x00\xff\xfe" * 100)
    (tmp_path / "nul.yml").write_bytes(b"profiler: xplane\x00\n")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    (tmp_path / "bad.yml").write_text("profiler: [unclosed\n")
    (tmp_path / "adir.yml").mkdir()
    fix = "pass the MaxText yml the run used, or leave --config out for configs/<MODEL_NAME>.yml"
    cases = {
        "/nonexistent.yml": "cannot read it (No such file or directory)",
        str(tmp_path / "adir.yml"): "cannot read it (Is a directory)",
        str(tmp_path / "binary.yml"): "not a text file",
        str(tmp_path / "nul.yml"): "not a text file",
        str(tmp_path / "list.yml"): "not a yml of KEY: VALUE settings",
        str(tmp_path / "bad.yml"): "not valid YAML at line 2",
    }
    for path, why in cases.items():
        r = CliRunner().invoke(main, ["tgs", str(MFU_LOG), "--config", path])
        assert r.exit_code == 1, (path, r.output)
        assert r.stdout == "" and r.stderr == f"jobkit tgs: --config {path}: {why}; {fix}\n"
    good = tmp_path / "good.yml"
    good.write_text("profiler: ''\n")
    r = CliRunner().invoke(main, ["tgs", str(MFU_LOG), "--config", str(good)])
    assert r.exit_code == 0 and r.stdout.startswith("log:"), r.output


# ---- a resumed attempt's steady window, and what the table says (issue 23) ----------------------------------

# MaxText's real step line (the MFU fixture's), with the step, its seconds and Tokens/s/device filled in.
_STEP_LINE = next(l for l in MFU_LOG.read_text().splitlines() if "completed step: 5," in l)
_LOG_HEAD = MFU_LOG.read_text()[: MFU_LOG.read_text().index("completed step")].rpartition("\n")[0] + "\n"
JITTER = (0, 150, -120, 80, -60)  # a few % of step-to-step spread, as on a real host


def attempt_log(job_id: str, steps: range, rate, extra_header: str = "") -> str:
    """A real-shaped log of one attempt: the fixture's header and start-up, then STEPS at RATE(step) TGS."""
    head = _LOG_HEAD.replace("JOB_ID=local_20261122_054800_ab12", f"JOB_ID={job_id}{extra_header}", 1)
    lines = []
    for step in steps:
        value = rate(step)
        line = re.sub(r"completed step: \d+", f"completed step: {step}", _STEP_LINE)
        line = re.sub(r"seconds: [0-9.]+", f"seconds: {256 / value:.3f}", line)
        lines.append(re.sub(r"Tokens/s/device: [0-9.]+", f"Tokens/s/device: {value:.3f}", line))
    return head + "\n".join(lines) + "\n"


def first_attempt_rate(step: int) -> float:
    """Compile at step 0, warm-up to step 4, then ~7,229 (the issue's first attempt)."""
    return 300.0 if step == 0 else 6000.0 if step < 5 else 7229.0 + JITTER[step % 5]


def resumed_rate(step: int) -> float:
    """Restored at step 201 (compile and restore), slow after the restore to step 210, then ~7,000."""
    return 300.0 if step == 201 else 5000.0 if step <= 210 else 7000.0 + JITTER[step % 5]


RESUMED = attempt_log("32", range(201, 241), resumed_rate, "\nATTEMPT=2\nRETRY_OF=31\nMAX_RETRIES=2")


def test_a_resumed_attempts_steady_window_starts_after_its_own_warm_up():
    """The issue's case: steps 206-215 of a resumed attempt still held the restore's slow steps (5,419 against
    7,229): the window moves past them, to the first steps at the attempt's settled rate."""
    s = tgs.summarize(logparse.parse_text(RESUMED))
    assert (s.first_step, s.nominal_start) == (201, 206)
    assert s.steady_range == (211, 220)
    assert s.windows["steady"].steps == list(range(211, 221))
    assert s.windows["warmup"].steps == list(range(201, 211))
    assert s.tgs == pytest.approx(statistics.fmean(resumed_rate(step) for step in range(211, 221)))
    assert s.notes[0] == (
        "resumed at step 201: the steady window 211-220 counts from this attempt's first step; "
        "steps 206-210 were still slow after the restore, so they count as warm-up"
    )
    assert not any("resumed" in w for w in s.warnings), "it settled inside one window length"
    table = tgs.format_table(s)
    assert re.search(r"^steady\s+211-220\s+10\s", table, re.M), table
    assert f"note: {s.notes[0]}" in table
    d = tgs.to_dict(s)
    assert (d["first_step"], d["steady_moved_from"], d["steady_window"]) == (201, 206, [211, 220])


def test_a_resumed_attempt_that_settled_in_its_warm_up_keeps_the_window_counted_from_its_first_step():
    quick = attempt_log("33", range(201, 241), lambda step: 300.0 if step == 201 else 7000.0 + JITTER[step % 5])
    s = tgs.summarize(logparse.parse_text(quick))
    assert (s.steady_range, s.nominal_start) == ((206, 215), None)
    assert s.notes == ["resumed at step 201: the steady window 206-215 counts from this attempt's first step"]
    # One noisy step at the window's start is not the restore: the window moves by that step only.
    noisy = attempt_log("34", range(201, 241), lambda step: 3000.0 if step == 206 else 7000.0 + JITTER[step % 5])
    assert tgs.summarize(logparse.parse_text(noisy)).steady_range == (207, 216)


def test_a_resumed_attempt_still_slow_a_window_later_is_warned_about_not_moved_further():
    slow = attempt_log("35", range(201, 241), lambda step: 5000.0 if step <= 216 else 7000.0 + JITTER[step % 5])
    s = tgs.summarize(logparse.parse_text(slow))
    assert s.steady_range == (216, 225) and not s.settled
    assert (
        "resumed at step 201: still below 80% of its settled TGS at step 216, one window past its warm-up; "
        "the steady window 216-225 may still hold the restore's slow steps"
    ) in s.warnings


def test_jobs_and_tgs_set_comparable_numbers_side_by_side_for_two_attempts(tmp_path):
    """`jobkit jobs` shows each attempt's steady TGS; the resumed one's is taken after its own warm-up."""
    from click.testing import CliRunner

    from jobkit.cli import main

    footer = "==== JOB SUMMARY ====\n  Wall:   1m\n  Status: {}\n=====================\n"
    first = tmp_path / "31-JAX-tiny.log"
    first.write_text(
        attempt_log("31", range(40), first_attempt_rate, "\nMAX_RETRIES=2") + footer.format("FAILED (exit 1)")
    )
    second = tmp_path / "32-JAX-tiny.log"
    second.write_text(RESUMED + footer.format("SUCCESS (exit 0)"))
    result = CliRunner().invoke(main, ["jobs", "--workspace", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    shown = {r["job_id"]: r["tgs"] for r in map(json.loads, result.output.splitlines())}
    expected_first = statistics.fmean(first_attempt_rate(step) for step in range(5, 15))
    expected_second = statistics.fmean(resumed_rate(step) for step in range(211, 221))
    assert shown == {"31": pytest.approx(expected_first), "32": pytest.approx(expected_second)}
    # Both are steady-state numbers: they differ by the attempts' real difference, not by the restore.
    assert abs(shown["32"] - shown["31"]) / shown["31"] < 0.05
    line = CliRunner().invoke(main, ["tgs", "--line", str(second)]).output
    assert f"{tgs.fmt_tgs(expected_second)} TGS/device" in line
    table = CliRunner().invoke(main, ["tgs", str(second)]).output
    assert re.search(r"^steady\s+211-220\s", table, re.M) and "note: resumed at step 201" in table


def test_the_low_steady_steps_warning_says_what_it_means_and_what_to_do():
    s = tgs.summarize(logparse.parse_file(MFU_LOG))
    steady = s.windows["steady"]
    low = [p.step for p in steady.points if p.tgs < tgs.LOW_SAMPLE_FRACTION * s.tgs]
    assert low, "the real CPU run is noisy"
    (warning,) = [w for w in s.warnings if "below 95%" in w]
    assert warning.startswith(f"{len(low)} of 10 steady steps ran below 95% of the steady mean (steps ")
    assert "shared host" in warning and "more steps" in warning and "jobkit analyze" in warning


def test_a_warm_up_faster_than_the_steady_window_is_explained_in_one_line():
    fast_warmup = with_tgs({step: "9000.0" for step in range(1, 5)})  # steady steps run at ~1,010
    s = tgs.summarize(logparse.parse_text(fast_warmup))
    assert s.windows["warmup"].stats("tgs").mean > s.tgs
    (note,) = [n for n in s.notes if "warm-up" in n]
    warm = tgs.fmt_tgs(s.windows["warmup"].stats("tgs").mean)
    assert note.startswith(
        f"the warm-up steps 0-4 averaged faster than the steady window ({warm} vs {tgs.fmt_tgs(s.tgs)})"
    )
    assert "\n" not in note and f"note: {note}" in tgs.format_table(s)
    # A warm-up slower than steady (the usual case) needs no word.
    assert not tgs.summarize(logparse.parse_file(MFU_LOG)).notes


def _big_log(path, ranks: int, steps: int, first: int = 0, status: str = "FAILED (exit 1)") -> None:
    """A multi-rank log whose last rank logs each step 3 steps late (lines of a step are not together)."""
    lines = [f"JOB_ID=77\nJOB_NAME=big\nNNODES={ranks}\nMODEL_NAME=big\nPASSTHROUGH_ARGS=steps={steps}"]
    late = []
    for step in range(first, first + steps):
        sec = 1.0 + 0.01 * (step % 7) + (5.0 if step == first else 0.0)
        for r in range(ranks):
            line = (
                f"{r}: I1124 16:18:29.991666 1405 metric_logger.py:265] completed step: {step}, seconds: {sec:.3f}, "
                f"TFLOP/s/device: {400 / sec:.3f}, MFU: {40 / sec:.2f}%, Tokens/s/device: {32768 / sec:.3f}, "
                f"total_weights: 262144, loss: {9 - step / steps:.3f}, lm_loss: 1, perplexity: 1"
            )
            (late if r == ranks - 1 else lines).append(line)
        if len(late) > 3:
            lines.append(late.pop(0))
    lines += late + ["==== JOB SUMMARY ====", f"  Status: {status}", "====================="]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("first", [0, 500])  # 500: a resumed attempt, whose window may settle later
def test_a_big_log_read_at_its_ends_gives_the_same_line_as_read_whole(tmp_path, monkeypatch, first):
    log_path = tmp_path / "77-big.log"
    _big_log(log_path, 4, 600, first)
    whole = logparse.parse_file(str(log_path))
    monkeypatch.setattr(logparse, "BIG_LOG", 0)
    monkeypatch.setattr(logparse, "END_BYTES", 20_000)
    ends = logparse.parse_ends(str(log_path), tgs.steps_needed())
    read = set(ends.steps)
    assert ends.partial and not whole.partial
    assert first + 300 not in read and first + 599 in read  # the middle was not read, the last step was
    assert all(f.lines == 4 for f in ends.steps.values())  # no step is half-read
    assert (ends.header, ends.footer_status, ends.footer_exit) == (whole.header, "FAILED", 1)
    a, b = tgs.summarize(whole), tgs.summarize(ends)
    assert (b.tgs, b.mfu, b.steady_range, b.final_loss) == (a.tgs, a.mfu, a.steady_range, a.final_loss)
    assert tgs.format_line(b, "PASS") == tgs.format_line(a, "PASS")


def test_a_log_under_big_log_is_read_whole_by_parse_ends():
    for path in (MFU_LOG, TWO_NODE_LOG, SHORT_LOG):
        ends = logparse.parse_ends(str(path), tgs.steps_needed())
        assert not ends.partial and ends == logparse.parse_file(str(path))


# ---- step lines folded per step while read (issue 24: memory O(steps), not O(steps x ranks)) ----


def _unfolded(entries):
    """The per-step points as they were before the fold: every line kept, grouped, statistics.fmean'd."""

    def mean(values):
        vals = [v for v in values if v is not None]
        return statistics.fmean(vals) if vals else None

    groups = {}
    for e in entries:
        groups.setdefault(e.step, []).append(e)
    out = []
    for step, group in sorted(groups.items()):
        losses = [e.loss for e in group if e.loss is not None]
        metrics = [mean(getattr(e, m) for e in group) for m in tgs.METRICS]
        spread = max(losses) - min(losses) if losses else None
        out.append((step, len(group), *metrics, mean(losses), spread))
    return out


def _same(a, b) -> bool:
    """Equal to the bit, nan equal to nan."""
    return len(a) == len(b) and all(
        x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b, strict=True)
    )


def _messy_log(nodes: int, procs: int, steps: int) -> str:
    """NODES x PROCS processes (`N: [rank<G>]: `); the last rank is slow (seconds x3) and logs each step 2 steps
    late; values have many digits (a plain float sum differs from fmean's); non-finite values at chosen steps."""
    rng = random.Random(7)
    ranks = nodes * procs
    lines = [f"JOB_ID=78\nJOB_NAME=messy\nNNODES={nodes}\nLOCAL_WORLD_SIZE={procs}\nMODEL_NAME=tiny"]
    late = []
    for step in range(steps):
        for g in range(ranks):
            sec = rng.uniform(0.9, 1.1) * (3 if g == ranks - 1 else 1)
            tgs_v = "inf" if (step, g) in ((6, 1), (9, 0)) else f"{rng.uniform(1e4, 2e4):.6f}"
            sec_v = "inf" if (step, g) == (11, 2) else f"{sec:.9f}"
            loss = f"{5 - step / 10 + rng.uniform(0, 1e-6):.9f}"
            if (step, g) == (7, 0):  # a nan first: max()/min() keep it, so no mismatch is counted
                loss = "nan"
            if (step, g) == (8, ranks - 1):  # a nan later: passed over
                loss = "nan"
            mfu = "" if g % 3 == 0 else f"MFU: {rng.uniform(30, 40):.7f}%, "
            line = (
                f"{g // procs}: [rank{g}]: I1124 16:18:29.991666 1405 metric_logger.py:265] completed step: {step}, "
                f"seconds: {sec_v}, TFLOP/s/device: {rng.uniform(100, 200):.8f}, {mfu}Tokens/s/device: {tgs_v}, "
                f"total_weights: 262144, loss: {loss}, lm_loss: 1"
            )
            (late if g == ranks - 1 else lines).append(line)
        if len(late) > 2:
            lines.append(late.pop(0))
    lines += late + ["==== JOB SUMMARY ====", "  Status: SUCCESS (exit 0)", "====================="]
    return "\n".join(lines) + "\n"


def test_a_log_folded_per_step_gives_what_its_lines_unfolded_give():
    text = _messy_log(3, 4, 40)
    lined = logparse.parse_text(text)
    kept = logparse.parse_lines(text.splitlines(), "<text>", keep_lines=True)
    assert not lined.entries and len(kept.entries) == 12 * 40  # folded: no line is kept unless asked
    assert len(lined.steps) == 40 and {f.lines for f in lined.steps.values()} == {12}
    folded = [
        (p.step, p.entries, p.tgs, p.tflops, p.mfu, p.seconds, p.loss, p.loss_spread) for p in tgs.points_of(lined)
    ]
    reference = _unfolded(kept.entries)
    assert len(folded) == len(reference) == 40
    for got, want in zip(folded, reference, strict=True):
        assert _same(got, want), (got, want)
    by_step = {p[0]: p for p in folded}
    assert by_step[6][2] == math.inf and math.isnan(by_step[7][6]) and math.isnan(by_step[8][6])  # a nan loss: nan mean
    assert math.isnan(by_step[7][7]) and math.isfinite(by_step[8][7])  # the spread: as max() - min() give it
    # the fold is exact: a running float sum (`+=`, not 3.12's compensated sum()) differs from fmean at some steps
    plain = [functools.reduce(operator.add, (e.tflops for e in kept.entries if e.step == s)) / 12 for s in range(40)]
    assert any(p != f[3] for p, f in zip(plain, folded, strict=True))
    # and the summary reads the same: windows, warnings (loss mismatch, non-finite), table, JSON
    a, b = tgs.summarize(lined), tgs.summarize(kept)
    assert a.loss_mismatch_steps and a.loss_mismatch_steps == [
        s for s, _, *_, spread in reference if spread is not None and spread > 1e-9
    ]
    assert 7 not in a.loss_mismatch_steps and 8 in a.loss_mismatch_steps
    assert any("non-finite Tokens/s/device (inf at 6,9)" in w for w in a.warnings), a.warnings
    assert json.dumps(tgs.to_dict(a)) == json.dumps(tgs.to_dict(b)) and tgs.format_table(a) == tgs.format_table(b)


def test_a_log_made_of_lines_is_folded_when_summarized():
    """A JobLog built from StepEntry lines (as the monitor builds one) folds them itself."""
    kept = logparse.parse_lines(_messy_log(2, 2, 20).splitlines(), "<text>", keep_lines=True)
    made = logparse.JobLog("<made>", header=kept.header, entries=kept.entries)
    assert made.has_steps and made.prefixes() == ({0, 1}, {0, 1, 2, 3})
    assert tgs.to_dict(tgs.summarize(made))["per_step"] == tgs.to_dict(tgs.summarize(kept))["per_step"]
    assert not logparse.JobLog("<empty>").has_steps
