"""The after-the-job half of the TensorBoard bridge: every scalar of every step into the job's TSDB.

Run as ``jobkit tb-bridge backfill`` by utils/lib/observability.sh once the job's Prometheus has stopped.

It reads every scalar event of every event file under LOGDIR (or the one file LOGDIR names) and adds them all
to the TSDB as one block, so the TSDB holds every step although the live scrapes only saw the newest step each
time. The block is written by jobkit.observe.tsdb_block from the numpy columns; with TB_BACKFILL_WRITER=promtool,
or for data that writer refuses, by ``promtool tsdb create-blocks-from openmetrics`` from OpenMetrics text. Labels: the bridge's own ``host`` label (--host, default
the value of ``--label host``, else this machine's short name) plus the --label ones, which stand for the labels
Prometheus attached when scraping (job, instance and the file_sd entry's labels). The exporters' scrape job
honours the samples' own labels, so the bridge's ``host`` wins over the file_sd one and the series are
``{host, instance, job}``, here as in the scraped data. Duplicates of scraped samples (same labels, same ms) are
merged away by Prometheus at query time.

Before it adds blocks, it persists the TSDB's WAL (the job's head data, every metric) as a block: Prometheus
drops WAL samples older than the newest block's end when it next opens the TSDB, so adding a block that ends at
the last training step would silently delete all other metrics recorded up to then. It does so with a
throwaway Prometheus on the TSDB (jobkit.observe.promserver, admin API behind a random password) and its snapshot API: the head block of the
snapshot is moved into the TSDB. That Prometheus refuses to start while another one holds the TSDB, so a
backfill into a live TSDB fails cleanly. --dry-run prints the OpenMetrics text instead of touching the TSDB.
"""

import bisect
import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from jobkit.core import procfs
from jobkit.core.files import write_atomic
from jobkit.observe import promserver
from jobkit.observe.tb_events import EVENT_PREFIX, STEP_METRIC, CorruptRecord, Fold, ScalarReader, find_event_files
from jobkit.observe.tb_serve import STEP_HELP, scalar_help

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NO_PROMTOOL = "promtool not found (PATH, /usr/bin); install Prometheus's promtool or pass --promtool"
# Samples per promtool run (whole series each): a few runs overlap with rendering, not so many small blocks.
CHUNK_SAMPLES = 150_000


class BackfillError(Exception):
    """A one-line, user-facing error."""


def parse_labels(pairs):
    labels = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise BackfillError(f"--label {pair!r}: expected NAME=VALUE with a Prometheus label name")
        labels[name] = value
    return labels


def scrape_labels(host, target_labels):
    """The labels a scraped bridge sample ends up with: the exporters' scrape job honours the samples' own
    labels (honor_labels, see utils/lib/prometheus.sh), so our host label wins over the target's."""
    return {**target_labels, "host": host}


def collect_series(files, log=None):
    """{metric name: (tag, [(ms, value), ...] ascending, one per ms)} over the files, and the Fold used
    (collect_columns, as lists)."""
    columns, fold = collect_columns(files, log)
    return _as_lists(columns), fold


def collect_columns(files, log=None):
    """{metric name: (tag, ms int64 array ascending, float64 values, one per ms)} over the files, and the Fold used.

    Each file is read as columns (jobkit.observe.tb_columns) and folded with numpy, by the same rules as
    Fold.collect (names first come first served, a tb_step sample where the step changes, the later of two
    samples at one ms wins); a file the column reader declines is read and folded record by record."""
    import numpy as np

    from jobkit.observe import tb_columns

    chunks, fold = {}, Fold(log)  # metric name -> [(ms array, value array)] in file order
    for path in files:
        fold.step = None  # a new file starts a new run
        columns = tb_columns.read_columns(path)
        if columns is not None:
            _fold_columns(fold, columns, chunks)
            continue
        points = {}
        try:
            fold.collect(ScalarReader(path).read_tuples(), points)
        except CorruptRecord as e:
            if log:
                log(f"{e}: using the steps before it")
        for name, by_ms in points.items():
            chunks.setdefault(name, []).append(
                (np.fromiter(by_ms.keys(), np.int64, len(by_ms)), np.fromiter(by_ms.values(), np.float64, len(by_ms)))
            )
    tags = {name: tag for tag, name in fold.names.items() if name}
    series = {}
    for name, parts in chunks.items():
        ms, values = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        if not len(ms):
            continue
        if len(parts) > 1 or (len(ms) > 1 and not (ms[1:] > ms[:-1]).all()):
            order = np.argsort(ms, kind="stable")  # equal ms keep file order: the last one wins
            ms, values = ms[order], values[order]
            last = np.append(ms[1:] != ms[:-1], True)
            ms, values = ms[last], values[last]
        series[name] = (tags.get(name), ms, values)
    return series, fold


def _fold_columns(fold, columns, chunks):
    """Fold.collect over one file's columns (tb_columns.read_columns), into CHUNKS."""
    import numpy as np

    tags, tag_index, step, wall, value = columns
    if not len(tag_index):
        return
    # names are claimed in the order the tags first appear, as the record-by-record fold does
    firsts = np.unique(tag_index, return_index=True)[1]
    names = {int(tag_index[i]): fold.name(tags[int(tag_index[i])]) for i in sorted(firsts.tolist())}
    named = np.array([names.get(i) is not None for i in range(len(tags))], dtype=bool)
    keep = named[tag_index]
    tag_index, step, wall, value = tag_index[keep], step[keep], wall[keep], value[keep]
    if not len(tag_index):
        return
    ms = np.rint(wall * 1000).astype(np.int64)  # int(round(x)): both round half to even
    change = np.empty(len(step), dtype=bool)
    change[0] = True
    np.not_equal(step[1:], step[:-1], out=change[1:])
    chunks.setdefault(STEP_METRIC, []).append((ms[change], step[change].astype(np.float64)))
    fold.step = int(step[-1])
    if len(names) <= 64:  # a mask per tag is cheaper than sorting by tag
        groups = (np.flatnonzero(tag_index == t) for t in sorted(names) if names[t] is not None)
    else:
        order = np.argsort(tag_index, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(tag_index[order])) + 1)
    for group in groups:
        if len(group):
            chunks.setdefault(names[int(tag_index[group[0]])], []).append((ms[group], value[group]))


def _help(name, tag):
    return STEP_HELP if name == STEP_METRIC else scalar_help(tag)


def ms_to_seconds_text(ms):
    """ms as the exact decimal seconds OpenMetrics wants ("1795412855.815"); parses back to the same ms."""
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    return f"{sign}{ms // 1000}.{ms % 1000:03d}"


def _family_headers(series, labels):
    """(HELP/TYPE text per family, the escaped {labels} text), both rendered by prometheus_client."""
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.openmetrics.exposition import generate_latest

    class Families:
        def collect(self):
            probe = GaugeMetricFamily("label_probe", "", labels=sorted(labels))
            probe.add_metric([labels[k] for k in sorted(labels)], 0)
            yield probe
            for name in sorted(series):
                yield GaugeMetricFamily(name, _help(name, series[name][0]))

    text = generate_latest(Families()).decode()
    probe_line = next(ln for ln in text.splitlines() if ln.startswith("label_probe{"))
    label_text = probe_line[len("label_probe") : probe_line.rindex("}") + 1]
    headers, current = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP "):
            current = line.split(" ", 3)[2]
        if current in series and line.startswith(("# HELP ", "# TYPE ")):
            headers[current] = headers.get(current, "") + line
    return headers, label_text


def _sample_lines(prefix, points):
    """One OpenMetrics sample line per (ms, value): PREFIX value seconds.mmm."""
    values = [v for _, v in points]
    if all(map(math.isfinite, values)):
        texts = map(repr, values)  # what floatToGoString gives a finite float, or the same number spelled out
    else:
        from prometheus_client.utils import floatToGoString

        texts = map(floatToGoString, values)
    return [
        f"{prefix}{text} {ms // 1000}.{ms % 1000:03d}\n" if ms >= 1000 else f"{prefix}{text} {ms_to_seconds_text(ms)}\n"
        for text, (ms, _) in zip(texts, points, strict=True)
    ]


def openmetrics_chunks(series, labels, chunk_samples=None):
    """OpenMetrics texts of SERIES (gauges, one sample per point with its timestamp), all with LABELS; each text
    holds whole series, about CHUNK_SAMPLES samples (None: everything in one text), and ends with # EOF.

    HELP/TYPE lines and label escaping come from prometheus_client; the sample lines are written here. Measured
    on the project's 2-core test machine (CPU time, 100,000 samples): the library's OpenMetrics rendering takes
    22.6 us a sample (a Sample tuple, the labels escaped again for every sample, a Timestamp object), these lines
    3.0 us: 12.4 s against 1.7 s for the 550,000 samples of 50,000 steps x 10 scalars.
    """
    if not series:
        yield "# EOF\n"
        return
    headers, label_text = _family_headers(series, labels)
    out, size = [], 0
    for name in sorted(series):
        out.append(headers[name])
        out.extend(_sample_lines(f"{name}{label_text} ", series[name][1]))
        size += len(series[name][1])
        if chunk_samples and size >= chunk_samples:
            out.append("# EOF\n")
            yield "".join(out)
            out, size = [], 0
    if out:
        out.append("# EOF\n")
        yield "".join(out)


def openmetrics_text(series, labels):
    """SERIES as one OpenMetrics text (see openmetrics_chunks)."""
    return next(openmetrics_chunks(series, labels))


def find_promtool(given=None):
    try:
        return promserver.find_tool("promtool", given)
    except promserver.PromServerError as e:
        raise BackfillError(str(e)) from None


def wal_has_data(tsdb):
    wal = os.path.join(tsdb, "wal")
    if not os.path.isdir(wal):
        return False
    for entry in os.scandir(wal):
        if entry.is_dir() or (entry.is_file() and entry.stat().st_size > 0):
            return True
    return False


def persist_head(tsdb, prometheus, log, ready_timeout=300):
    """Writes the TSDB's head (its WAL) as a block, through a throwaway Prometheus's snapshot API.

    Returns the number of blocks added to the TSDB.
    """
    try:
        server = promserver.start(tsdb, prometheus, tries=3, admin_api=True, ready_timeout=ready_timeout)
    except promserver.PromServerError as e:
        raise BackfillError(str(e)) from None
    try:
        if server.auth is None:
            log("[!] this system's libcrypt has no bcrypt: the throwaway Prometheus's admin API had no password")
        import urllib.request  # here, not at the top: only this rare path needs it (~15 ms of every start)

        with urllib.request.urlopen(
            server.request("/api/v1/admin/tsdb/snapshot?skip_head=false", "POST"), timeout=600
        ) as resp:
            name = json.loads(resp.read())["data"]["name"]
    finally:
        server.stop(grace=60)
    snapdir = os.path.join(tsdb, "snapshots", name)
    moved = 0
    for entry in sorted(os.listdir(snapdir)):
        if not os.path.exists(os.path.join(tsdb, entry)):  # the others are hard links of existing blocks
            os.rename(os.path.join(snapdir, entry), os.path.join(tsdb, entry))
            moved += 1
    shutil.rmtree(snapdir)
    try:
        os.rmdir(os.path.join(tsdb, "snapshots"))
    except OSError:
        pass
    log(f"persisted the TSDB head (WAL) as {moved} block(s) first, so that the new blocks drop no WAL data")
    return moved


# The backfill's bookkeeping in the TSDB dir. A RAY=1 job records what its teardown will backfill (PENDING) as
# soon as its Prometheus runs; a finished backfill writes DONE. A job killed before its teardown finished (a
# scancel past KillWait, a time limit, kill -9) leaves PENDING without DONE, and every later reader of the TSDB
# (`jobkit tsdb view`, `prometheus.sh list`, `jobkit tb-bridge complete`) completes the backfill first.
PENDING = "tb_backfill.pending.json"
DONE = "tb_backfill.done.json"


def _write_json(path, data):
    # A reader sees the old record or the new one, never half; no link planted beside it is followed.
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def record_pending(logdir, tsdb, label_pairs=(), host=None, job_log=None):
    """Remember what the teardown will backfill, so that a reader can do it if the teardown never runs."""
    if not os.path.isdir(tsdb):
        raise BackfillError(f"TSDB dir {tsdb} does not exist")
    record = {"logdir": os.path.abspath(logdir), "labels": list(label_pairs), "host": host, "recorded": time.time(),
              "job_log": os.path.abspath(job_log) if job_log else None}  # fmt: skip
    _write_json(os.path.join(tsdb, PENDING), record)


def pending(tsdb):
    """The recorded backfill that has not been done, or None."""
    if os.path.exists(os.path.join(tsdb, DONE)):
        return None
    try:
        with open(os.path.join(tsdb, PENDING)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def complete_pending(tsdb, promtool=None, prometheus=None, out=print):
    """Runs the recorded backfill when it is still pending; True when it ran."""
    todo = pending(tsdb)
    if todo is None:
        return False
    out(f"completing the TensorBoard backfill the job's teardown did not finish ({tsdb})", flush=True)
    logdir, job_log = todo["logdir"], todo.get("job_log")
    has_events = os.path.exists(logdir) and find_event_files(logdir, 0)
    if not has_events and not (job_log and os.path.exists(job_log)):
        out(f"no TensorBoard event file under {logdir} and no job log: nothing to backfill", flush=True)
        _mark_done(tsdb, samples=0, steps=0)
        return True
    backfill(logdir, tsdb, todo.get("labels", ()), todo.get("host"), 0, promtool, prometheus, out=out, job_log=job_log)
    return True


def _mark_done(tsdb, **facts):
    _write_json(os.path.join(tsdb, DONE), {"at": time.time(), **facts})
    try:
        os.unlink(os.path.join(tsdb, PENDING))
    except FileNotFoundError:
        pass


def last_step_by_metric(series) -> dict[str, int]:
    """{metric: the step of its newest sample}: the tb_step in force at that sample's time (tb_step gets a
    sample at the first scalar of each step, so the last one at or before a time is that time's step)."""
    steps = series.get(STEP_METRIC, (None, []))[1]
    if not steps:
        return {}
    times = [ms for ms, _ in steps]
    out = {}
    for name, (_tag, points) in series.items():
        if name == STEP_METRIC or not points:
            continue
        i = bisect.bisect_right(times, points[-1][0]) - 1
        if i >= 0:
            out[name] = int(steps[i][1])
    return out


def backfill(
    logdir,
    tsdb,
    label_pairs=(),
    host=None,
    since=0,
    promtool=None,
    prometheus=None,
    dry_run=False,
    out=print,
    job_log=None,
):
    """The whole backfill; OUT prints progress (and, with DRY_RUN, the OpenMetrics text). Returns 0.
    JOB_LOG adds the steps rank 0's log lines show after the event files' last one (jobkit.observe.log_steps)."""

    def log(msg):
        out(msg, flush=True)

    # 1. What to add: every scalar of the event files (and the job log's later steps), with their labels.
    writer = None if dry_run else block_writer()
    final = _final_labels(label_pairs, host)
    files = _event_files(logdir, since, job_log)
    columns, _fold = collect_columns(files, log=None if dry_run else log)
    if job_log or dry_run:
        series = _as_lists(columns)
        if job_log:
            series = _with_log_steps(series, job_log, log)
            columns = _as_columns(series)
        if dry_run:
            out(openmetrics_text(series, final), end="")
            return 0
    samples = sum(len(ms) for _, ms, _ in columns.values())
    # 2. Where to: a TSDB no Prometheus holds, and how to write the blocks.
    promtool = _check_target(tsdb, promtool)
    if writer == "promtool" and not promtool:
        raise BackfillError(_NO_PROMTOOL)
    if not columns:
        log(f"no scalar events in {len(files)} event file(s) under {logdir}: nothing to backfill")
        _mark_done(tsdb, samples=0, steps=0)
        return 0
    # 3. The WAL persisted as a block first (see the module docstring), then the new blocks, then DONE.
    if wal_has_data(tsdb):
        persist_head(tsdb, _find_prometheus(prometheus), log)
    _write_blocks(writer, promtool, columns, final, tsdb, log)
    steps = len(columns.get(STEP_METRIC, ("", []))[1])
    _mark_done(tsdb, samples=samples, steps=steps)
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(final.items()))
    log(
        f"backfilled {samples} samples in {len(columns)} series ({steps} steps) from {len(files)} event file(s) "
        f"into {tsdb}, labels {{{label_text}}}"
    )
    return 0


def block_writer():
    """$TB_BACKFILL_WRITER: "numpy" (the default: jobkit.observe.tsdb_block, promtool for what it does not
    write) or "promtool" (always promtool's create-blocks-from openmetrics)."""
    choice = os.environ.get("TB_BACKFILL_WRITER", "") or "numpy"
    if choice not in ("numpy", "promtool"):
        raise BackfillError(f"TB_BACKFILL_WRITER={choice}: expected numpy or promtool; fix or unset it")
    return choice


def _write_blocks(writer, promtool, columns, labels, tsdb, log):
    """COLUMNS with LABELS into TSDB as blocks: written by tsdb_block, else (WRITER promtool, or data it does not
    write) by promtool."""
    if writer == "numpy":
        from jobkit.observe import tsdb_block

        named = [({**labels, "__name__": name}, ms, values) for name, (_tag, ms, values) in columns.items()]
        try:
            tsdb_block.write_block(tsdb, named)
            return
        except tsdb_block.Unsupported as e:
            log(f"{e}: the blocks are written by promtool instead")
    if not promtool:
        raise BackfillError(_NO_PROMTOOL)
    _create_blocks(promtool, openmetrics_chunks(_as_lists(columns), labels, CHUNK_SAMPLES), tsdb)


def _as_lists(columns):
    """collect_columns' {name: (tag, ms, values)} as collect_series' {name: (tag, [(ms, value), ...])}."""
    return {
        name: (tag, list(zip(ms.tolist(), values.tolist(), strict=True))) for name, (tag, ms, values) in columns.items()
    }


def _as_columns(series):
    """collect_series' form back to collect_columns'."""
    import numpy as np

    return {
        name: (tag, np.array([ms for ms, _ in points], np.int64), np.array([v for _, v in points], np.float64))
        for name, (tag, points) in series.items()
    }


def _final_labels(label_pairs, host):
    """The labels every sample gets: --label's, with the bridge's host (--host, else --label host, else this
    machine's short name)."""
    labels = parse_labels(label_pairs)
    host = host or labels.get("host") or socket.gethostname().split(".", 1)[0]
    return scrape_labels(host, labels)


def _event_files(logdir, since, job_log):
    """The event files under LOGDIR; none is fine only when the job log can stand in for them."""
    if not os.path.exists(logdir) and not job_log:
        raise BackfillError(f"no such log dir: {logdir}")
    files = find_event_files(logdir, since) if os.path.exists(logdir) else []
    if not files and not job_log:
        raise BackfillError(f"no TensorBoard event file ({EVENT_PREFIX}*) under {logdir}")
    return files


def _with_log_steps(series, job_log, log):
    """SERIES plus the steps JOB_LOG shows after the event files' last one."""
    from jobkit.observe import log_steps  # here: only --job-log needs it (~13 ms of every start)

    known = [v for _, v in series.get(STEP_METRIC, (None, []))[1]]
    last = int(max(known)) if known else None
    extra = log_steps.series_after(job_log, last, last_step_by_metric(series))
    if extra:
        n = len(extra.get(STEP_METRIC, (None, []))[1])
        log(f"{n} step(s) after the event files' last ({last if last is not None else 'none'}) taken from {job_log}")
        series = log_steps.merge(series, extra)
    return series


def _check_target(tsdb, promtool):
    """The promtool to use (None when there is none: only the promtool writer needs it), once TSDB is there and
    no Prometheus holds it."""
    if not os.path.isdir(tsdb):
        raise BackfillError(f"TSDB dir {tsdb} does not exist")
    busy = promserver.serving_pid(tsdb)
    if busy:
        raise BackfillError(f"{tsdb} is in use by a running Prometheus (pid {busy}): stop it before the backfill")
    return find_promtool(promtool)


def _find_prometheus(given):
    """The prometheus binary persist_head needs."""
    try:
        binary = promserver.find_binary(given)
    except promserver.PromServerError as e:
        raise BackfillError(str(e)) from None
    if not binary:
        raise BackfillError(
            "prometheus not found (PROMETHEUS_BIN, PATH, /usr/bin): it is needed to persist the "
            "TSDB's WAL before adding blocks (else Prometheus would drop WAL data); pass --prometheus"
        )
    return binary


def _create_blocks(promtool, texts, tsdb):
    """Runs promtool on each OpenMetrics text as soon as it is written, while the next one is rendered.

    promtool parses ~2.7 us a sample, single-threaded: as long as rendering all the text. Started per chunk,
    the two overlap on a second core (the blocks of one time range then come in several pieces, with disjoint
    series; Prometheus merges them when it next opens the TSDB).
    """
    work = tempfile.mkdtemp(prefix="tb_backfill.")
    running = []
    try:
        for i, text in enumerate(texts):
            path = os.path.join(work, f"tensorboard.{i}.om")
            with open(path, "w") as f:
                f.write(text)
            command = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", path, tsdb]
            running.append(
                subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        failed = None
        for proc in running:
            output = proc.communicate()[0].decode(errors="replace").strip().splitlines()
            if proc.returncode != 0 and failed is None:
                failed = f"promtool create-blocks-from failed (exit {proc.returncode}): {output[-1] if output else 'no output'}"
        if failed:
            raise BackfillError(failed)
    finally:
        for proc in running:
            if proc.poll() is None:
                procfs.stop([proc.pid], 5)
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
