"""jobkit.observe.log_steps: a killed job's last steps, taken from rank 0's log lines for the TSDB backfill."""

import time

from conftest import JOBKIT_LOGS

from jobkit.observe import log_steps
from jobkit.observe.tb_events import STEP_METRIC, metric_name


def test_rank_0_steps_after_a_given_step_with_their_values_and_times():
    log = JOBKIT_LOGS / "maxtext-2proc-srun-l.log"
    got = log_steps.series_after(str(log), 2)
    steps = [int(v) for _, v in got[STEP_METRIC][1]]
    text = log.read_text()
    rank0 = sorted({int(line.split("completed step: ")[1].split(",")[0]) for line in text.splitlines()
                    if line.startswith("0: ") and "completed step: " in line})  # fmt: skip
    assert steps == [s for s in rank0 if s > 2] and steps
    # The loss and the step time of the first of them, exactly as rank 0's line prints them.
    line = next(ln for ln in text.splitlines() if ln.startswith("0: ") and f"completed step: {steps[0]}," in ln)
    loss = float(line.split(" loss: ")[1].split(",")[0])
    seconds = float(line.split("seconds: ")[1].split(",")[0])
    assert got[metric_name("learning/loss")][1][0][1] == loss
    assert got[metric_name("perf/step_time_seconds")][1][0][1] == seconds
    # Timed by absl's prefix, in this year, close to when the file says it was written.
    ms = got[STEP_METRIC][1][0][0]
    stamp = line.split()[2]  # "0:", "I1122", "10:10:10.123456"
    assert time.strftime("%H:%M:%S", time.localtime(ms / 1000)) == stamp.split(".")[0]


def test_merge_keeps_the_event_files_points_and_adds_the_rest():
    events = {"tb_step": (None, [(1000, 0.0), (2000, 1.0)])}
    extra = {"tb_step": (None, [(2000, 9.0), (3000, 2.0)]), "tb_learning_loss": ("learning/loss", [(3000, 5.5)])}
    merged = log_steps.merge(events, extra)
    assert merged["tb_step"] == (None, [(1000, 0.0), (2000, 1.0), (3000, 2.0)])
    assert merged["tb_learning_loss"] == ("learning/loss", [(3000, 5.5)])


def test_a_missing_log_is_nothing():
    assert log_steps.series_after("/nonexistent/job.log", None) == {}


def test_a_metric_cut_short_in_the_event_file_is_filled_from_its_own_last_step():
    """An event file flushed in the middle of step 4 has step 4's tb_step but not its loss: the loss comes
    from the log from step 4 on, the step counter and the other metrics only after step 4."""
    log = JOBKIT_LOGS / "maxtext-2proc-srun-l.log"
    loss = metric_name("learning/loss")
    got = log_steps.series_after(str(log), 4, {loss: 3})
    everything = log_steps.series_after(str(log), None)
    step_at = dict(everything[STEP_METRIC][1])  # ms -> step, for every rank-0 line
    assert [int(step_at[ms]) for ms, _ in got[loss][1]] == [s for s in sorted(map(int, step_at.values())) if s > 3]
    assert [int(v) for _, v in got[STEP_METRIC][1]] == [s for s in sorted(map(int, step_at.values())) if s > 4]
    seconds = metric_name("perf/step_time_seconds")
    assert [int(step_at[ms]) for ms, _ in got[seconds][1]] == [int(v) for _, v in got[STEP_METRIC][1]]


def test_each_metric_s_last_step_is_the_step_in_force_at_its_newest_sample():
    from jobkit.observe.tb_backfill import last_step_by_metric

    series = {
        STEP_METRIC: (None, [(1000, 3.0), (2000, 4.0)]),
        "tb_learning_loss": ("learning/loss", [(1000, 5.0), (1500, 5.1)]),  # step 4's loss never flushed
        "tb_perf_step_time_seconds": ("perf/step_time_seconds", [(1000, 0.1), (2000, 0.1)]),
    }
    assert last_step_by_metric(series) == {"tb_learning_loss": 3, "tb_perf_step_time_seconds": 4}
    assert last_step_by_metric({"tb_learning_loss": ("learning/loss", [(1, 1.0)])}) == {}
