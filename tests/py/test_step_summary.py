"""The job's step summary (core.step_summary): written by global rank 0's `jobkit launch`, read by `tgs`, `analyze`
and `compare` for a big log's middle steps, and left for the log whenever it cannot be trusted."""

import io
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.analysis import build
from jobkit.analysis import job as analysis_job
from jobkit.core import logparse, step_summary, tgs
from jobkit.core.commands import tgs_command

RANKS = 4
STEPS = 400


def step_line(rank: int, step: int) -> str:
    """Rank RANK's line for STEP: every rank's time differs a little, so the mean over ranks is not rank 0's."""
    sec = 1.0 + 0.001 * rank + 0.0001 * (step % 7)
    minute, second = divmod(step, 60)
    return (
        f"{rank}: I1124 05:{minute % 60:02d}:{second:02d}.{rank:06d} 1400 metric_logger.py:265] completed step: "
        f"{step}, seconds: {sec:.4f}, TFLOP/s/device: {400 / sec:.3f}, MFU: {40 / sec:.2f}%, "
        f"Tokens/s/device: {4096 / sec:.3f}, total_weights: 262144, loss: {2 + 1 / (step + 1) + rank * 1e-3:.4f}\n"
    )


def write_job(ws: Path, summary: str | None = "rank0", steps: int = STEPS) -> Path:
    """A job log of RANKS ranks x STEPS steps in WS, its job dir, and (SUMMARY) the job dir's steps.tsv as rank 0's
    launch writes it (None: none)."""
    log = ws / "900001-big.log"
    job_dir = ws / "900001-big"
    job_dir.mkdir(parents=True)
    head = "JOB_ID=900001\nJOB_NAME=big\nNNODES=4\nMODEL_NAME=llama2-7b\nRAY=0\n== Training BEGIN (no timeout) ==\n"
    body = "".join(step_line(r, s) for s in range(steps) for r in range(RANKS))
    middle = "0: I1124 05:03:00.000000 1400 checkpointing.py:1] saved a checkpoint in the middle\n"
    tail = "== Training END (400s) ==\n==== JOB SUMMARY ====\n  Status: SUCCESS (exit 0)\n=====================\n"
    half = len(body) // 2
    half = body.index("\n", half) + 1
    log.write_text(head + body[:half] + middle + body[half:] + tail)
    if summary == "rank0":
        lines = [step_summary.summary_line(step_line(0, s)[3:], now=1.8e9) for s in range(steps)]
        (job_dir / step_summary.NAME).write_text(step_summary.FIRST_LINE + "".join(lines))
    return log


@pytest.fixture
def big(monkeypatch):
    """Logs of a few hundred KB count as big, with a 16 KB end (~20 steps of 4 ranks)."""
    monkeypatch.setattr(logparse, "BIG_LOG", 64 << 10)
    monkeypatch.setattr(logparse, "END_BYTES", 16 << 10)


def rank0(step: int) -> float:
    return float(step_line(0, step).split("seconds: ")[1].split(",")[0])


def test_summary_line_keeps_the_fields_as_the_line_spells_them_and_skips_other_lines():
    line = step_line(0, 7)[3:]
    fields = step_summary.summary_line(line, now=1.8e9).rstrip("\n").split("\t")
    assert fields[0] == "7" and fields[1].isdigit()
    assert fields[2:] == ["1.0000", "400.000", "40.00", "4096.000", "2.1250"]
    assert step_summary.summary_line("I1124 05:00:00.000000 1 x.py:1] saved a checkpoint") is None
    no_mfu = line.replace(", MFU: 40.00%", "")
    assert step_summary.summary_line(no_mfu, now=1.8e9).split("\t")[4] == "-"


def test_the_tap_passes_text_through_unchanged_and_appends_one_line_per_whole_step_line(tmp_path):
    out = io.StringIO()
    summary = step_summary.Summary(os.open(tmp_path / "s.tsv", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    tap = step_summary.StepTap(out, summary)
    text = "startup\n" + step_line(0, 1)[3:] + step_line(0, 2)[3:] + "done\n"
    tap.write("startup\n")  # a write that ends a line, then a step line in pieces (its absl prefix cut too)
    for s in (1, 2):
        line = step_line(0, s)[3:]
        for piece in (line[:4], line[4:30], line[30:77], line[77:]):
            tap.write(piece)
    tap.write("done\n")
    summary.close()
    assert out.getvalue() == text
    rows = [r.split("\t") for r in (tmp_path / "s.tsv").read_text().splitlines()]
    whole = [step_summary.summary_line(step_line(0, s)[3:]).rstrip("\n").split("\t") for s in (1, 2)]
    assert rows == whole and rows[0][1] != "-"


def test_only_global_rank_0_of_a_job_opens_the_summary_private_under_the_job_umask(tmp_path):
    (tmp_path / "1-j").mkdir()
    job = {"JOB_WORKSPACE": str(tmp_path), "JOB_DIR": "1-j"}
    assert step_summary.open_summary({**job, "GLOBAL_RANK": "1", "NODE_RANK": "0"}) is None
    assert step_summary.open_summary({**job, "NODE_RANK": "2"}) is None
    assert step_summary.open_summary({"NODE_RANK": "0"}) is None  # no job: a bare `jobkit launch`
    assert step_summary.open_summary({**job, "JOB_DIR": "absent"}) is None
    assert not (tmp_path / "1-j" / step_summary.NAME).exists()
    old = os.umask(0o077)
    try:
        summary = step_summary.open_summary({**job, "GLOBAL_RANK": "0", "NODE_RANK": "1"})
    finally:
        os.umask(old)
    summary.close()
    path = tmp_path / "1-j" / step_summary.NAME
    assert path.read_text() == step_summary.FIRST_LINE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_summary_that_cannot_be_written_stops_alone_and_training_output_goes_on(tmp_path):
    """A full disk (here: a descriptor of /dev/full) ends the summary for both streams' taps; their text still
    reaches the streams, and no tap writes to the closed descriptor's number again."""
    full = os.open("/dev/full", os.O_WRONLY)
    summary = step_summary.Summary(full)
    out, err = io.StringIO(), io.StringIO()
    taps = step_summary.StepTap(out, summary), step_summary.StepTap(err, summary)
    for tap in taps:
        tap.write(step_line(0, 1)[3:])
    assert summary.fd == -1
    with pytest.raises(OSError):
        os.fstat(full)  # closed, once
    taps[0].write(step_line(0, 2)[3:])
    assert out.getvalue() == step_line(0, 1)[3:] + step_line(0, 2)[3:] and err.getvalue() == step_line(0, 1)[3:]


def test_a_symlink_planted_at_the_summary_is_not_followed(tmp_path):
    (tmp_path / "1-j").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (tmp_path / "1-j" / step_summary.NAME).symlink_to(victim)
    assert step_summary.open_summary({"JOB_WORKSPACE": str(tmp_path), "JOB_DIR": "1-j"}) is None
    assert victim.read_text() == "mine\n"


def test_a_big_log_takes_its_middle_steps_from_the_summary_and_its_ends_from_every_rank(tmp_path, big):
    log = write_job(tmp_path)
    whole = logparse.load(str(log))
    used = step_summary.load(str(log))
    first, last = used.summarized
    assert 0 < first < 200 < last < STEPS - 1
    assert sorted(used.steps) == sorted(whole.steps) == list(range(STEPS))
    points = {p.step: p for p in tgs.points_of(used)}
    exact = {p.step: p for p in tgs.points_of(whole)}
    for s in (0, 5, first - 1, last + 1, STEPS - 1):  # the ends: the mean over the ranks, as before
        assert points[s] == exact[s]
    for s in (first, 200, last):  # between: rank 0's values, every rank counted, no loss spread
        assert points[s].seconds == rank0(s) != exact[s].seconds
        assert points[s].entries == RANKS and points[s].loss_spread is None
    expected_ms = int(step_summary.summary_line(step_line(0, 200)[3:], now=1.8e9).split("\t")[1])
    assert used.step_ms[200] == expected_ms and len(used.step_ms) == STEPS


def listing(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime) for p in sorted(root.rglob("*"))}


def test_tgs_table_and_json_say_which_steps_came_from_the_summary_and_write_nothing(tmp_path, big):
    log = write_job(tmp_path)
    before = listing(tmp_path)
    out = CliRunner().invoke(tgs_command, [str(log), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert any("global rank 0's values from the job's step summary" in n for n in data["notes"])
    assert data["entries_per_step"] == RANKS
    table = CliRunner().invoke(tgs_command, [str(log)])
    assert "note: steps " in table.output and "step summary (steps.tsv)" in table.output
    assert listing(tmp_path) == before  # a reader: the log, the job dir and its summary stay as they were


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda text: text.replace("\n200\t", "\n200\tx", 1), "damaged at line"),
        (lambda text: text.replace(step_summary.FIRST_LINE, "", 1), "does not start with its first line"),
        (lambda text: "".join(text.splitlines(keepends=True)[:300]), "ends at step 298"),
        (lambda text: text.replace(text.splitlines(keepends=True)[251], "", 1), "lacks step 250"),
        (
            lambda text: "".join(text.splitlines(keepends=True)[:1] + text.splitlines(keepends=True)[3:]),
            "starts at step 2",
        ),
    ],
    ids=["bad-field", "no-first-line", "ends-early", "a-step-missing", "another-run"],
)
def test_a_damaged_or_short_summary_is_left_for_the_whole_log_and_said(tmp_path, big, damage, why):
    log = write_job(tmp_path)
    path = log.with_suffix("") / step_summary.NAME
    path.write_text(damage(path.read_text()))
    used = step_summary.load(str(log))
    assert used.summarized is None and why in used.summary_note
    assert tgs.points_of(used) == tgs.points_of(logparse.load(str(log)))
    out = CliRunner().invoke(tgs_command, [str(log), "--json"])
    assert any(why in n for n in json.loads(out.output)["notes"])


def test_a_last_line_cut_short_is_left_out_not_called_damage(tmp_path, big):
    log = write_job(tmp_path)
    path = log.with_suffix("") / step_summary.NAME
    path.write_text(path.read_text() + "400\t17640")
    assert step_summary.load(str(log)).summarized is not None


def test_without_a_summary_or_under_big_log_the_log_is_read_whole_and_nothing_is_said(tmp_path, monkeypatch):
    log = write_job(tmp_path)  # ~250 KB: under the real BIG_LOG, the summary is not read
    used = step_summary.load(str(log))
    assert used.summarized is None and used.summary_note is None
    assert tgs.points_of(used) == tgs.points_of(logparse.load(str(log)))
    monkeypatch.setattr(logparse, "BIG_LOG", 64 << 10)
    (log.with_suffix("") / step_summary.NAME).unlink()
    used = step_summary.load(str(log))
    assert used.summarized is None and used.summary_note is None and len(used.steps) == STEPS


def test_analyze_of_a_big_log_reads_its_ends_and_takes_rank_0_times_from_the_summary(tmp_path, big, monkeypatch):
    log = write_job(tmp_path)
    monkeypatch.setattr(analysis_job, "TEXT_HEAD", 20_000)  # the head read whole: a tenth of this log
    monkeypatch.setattr(analysis_job, "series_after", lambda *a: pytest.fail("the log read again for step times"))
    facts = analysis_job.load(log)
    assert facts.log.summarized is not None and len(facts.step_times) == STEPS
    assert "saved a checkpoint in the middle" not in facts.text  # the middle of a big log is not scanned
    assert "JOB_ID=900001" in facts.text and "JOB SUMMARY" in facts.text
    assert facts.summary is not None and facts.summary.final_loss is not None
    steps = build._steps(facts)
    assert steps["from_step_summary"] == list(facts.log.summarized) and steps["logged"] == STEPS


def test_analyze_of_a_small_log_still_reads_every_line(tmp_path, monkeypatch):
    log = write_job(tmp_path)
    monkeypatch.setattr(analysis_job, "TEXT_HEAD", 20_000)
    facts = analysis_job.load(log)
    assert facts.log.summarized is None and "saved a checkpoint in the middle" in facts.text
    assert "from_step_summary" not in build._steps(facts) and "step_summary_note" not in build._steps(facts)
