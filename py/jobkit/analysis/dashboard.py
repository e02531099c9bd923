"""`jobkit dashboard [--serve]`: one static page over every job in the workspace.

The page is a table (date, job, model, nodes, tag, status, attempt, TGS, MFU, failure@host, report) that sorts
by a click on a header and filters as you type, and a plot of each model's steady-state TGS over time. It is
one self-contained HTML file (inline CSS, JavaScript and SVG; no CDN), written to
`$JOB_WORKSPACE/.dashboard/index.html`, so it opens from a login node's disk as well as over HTTP.

What a row shows comes from the job's log the way `jobkit jobs` (status, nodes, TGS, attempt), `jobkit tgs`
(MFU) and `jobkit tag` (the `-tgs<N>` tag) read it, in one read of the log's ends (jobs.read_job_and_log). Its
failure is `jobkit jobs`' WHY, `class@host` (jobs.classify_job: `jobkit why`'s verdict, with the job dir's
hang stacks and, for a hang with a TSDB, its metrics), so the page and `why` never blame different nodes.
When `jobkit analyze` has written `<job dir>/analysis/analysis.json`, its numbers win (they are the same
steady window, plus what the log alone cannot tell), and the row links that job's report.html; its failure
section does not (a snapshot of an older verdict). A log that cannot be read is a row that says so; the
other rows still render.

`--serve` serves the page on 127.0.0.1 (jobkit.analysis.dashboard_serve).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from jobkit.analysis import plots
from jobkit.core import tgs
from jobkit.core.files import write_atomic
from jobkit.ops import jobs, jobtag

DEFAULT_PORT = 8390
PAGE_DIR = ".dashboard"
PAGE_NAME = "index.html"


class DashboardError(Exception):
    """One line: what is wrong and what to do instead."""


@dataclass
class Row:
    job_id: str
    stem: str  # the log's name without .log: the job dir's name too
    start: float | None  # Unix seconds
    date_from: str  # "job id" or "log mtime": how `start` was found
    model: str = "?"
    alias: str = ""
    nodes: str = "?"
    tag: str = ""
    status: str = "?"
    attempt: str = "-"
    tgs: float | None = None
    mfu: float | None = None
    failure: str = ""  # `jobkit jobs`' WHY: class@host (`hang@node2`), `?` when it cannot be said, "" none
    failure_detail: str = ""  # the verdict in words (the cell's tooltip): detail, blame and how, retry, advice
    report: str | None = None  # link relative to the page
    log_link: str = ""
    source: str = "log"  # "analysis" when analysis.json gave the numbers
    problem: str = ""  # why the log could not be read
    dir_problem: str = ""  # why the job dir could not be read (its log could)


def _finite(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _start(job_id: str, log: Path) -> tuple[float | None, str]:
    # Local job ids carry their start time; a Slurm id does not, and the log's mtime (its last write) is the
    # nearest thing the workspace records.
    start = jobs.local_start(job_id)
    if start is not None:
        return start, "job id"
    try:
        return log.stat().st_mtime, "log mtime"
    except OSError:
        return None, "unknown"


def _dig(doc, *keys):
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _analysis(job_dir: Path) -> dict | None:
    path = job_dir / "analysis" / "analysis.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable, or written by an older/newer jobkit: use the log
        return None
    return doc if isinstance(doc, dict) else None


def _link(target: Path, page_dir: Path) -> str:
    return quote(os.path.relpath(target, page_dir).replace(os.sep, "/"))


def read_row(log: Path, ws: Path, page_dir: Path) -> Row:
    stem = log.name.removesuffix(".log")
    job_id = jobs.JOB_LOG.match(log.name).group("id")
    start, date_from = _start(job_id, log)
    row = Row(job_id, stem, start, date_from, log_link=_link(log, page_dir))
    tagged = jobtag.TAGGED.search(stem)
    row.tag = tagged.group(0).lstrip("-") if tagged else ""
    try:
        job, parsed = jobs.read_job_and_log(log, why=True)  # the log's ends once, the verdict `jobkit jobs` gives
    except OSError as e:  # permission denied, vanished since listed, an I/O error: this row only
        row.status, row.problem = "unreadable", f"{log.name}: {e.strerror or e}"
        return row
    row.job_id, row.model, row.nodes, row.status = job.job_id, job.model, job.nodes, job.status
    if job.job_id != job_id:  # the header's JOB_ID is the job's own; the file name may have been renamed
        row.start, row.date_from = _start(job.job_id, log)
    row.alias = parsed.header.get("MODEL_NAME_ALIAS", "")
    row.attempt, row.tgs = job.tries, job.tgs
    if parsed.has_steps:
        row.mfu = _finite(tgs.summarize(parsed).mfu)
    if job.why != "-":  # `-`: succeeded, stopped early, or still running with no cause named yet
        row.failure, row.failure_detail = job.why, verdict_text(job.failure)
    job_dir = ws / stem
    doc = _analysis(job_dir)
    if doc is not None:
        row.source = "analysis"
        row.tgs = _finite(_dig(doc, "throughput", "tgs", "mean")) or row.tgs
        mfu = _finite(_dig(doc, "throughput", "mfu_pct", "mean"))
        row.mfu = mfu if mfu is not None else row.mfu
    report = job_dir / "analysis" / "report.html"
    try:
        if report.is_file():
            row.report = _link(report, page_dir)
    except OSError as e:  # a job dir this user may not enter (someone else's, mode 700): the log's row stays
        row.dir_problem = f"{stem}/: {(e.strerror or str(e)).lower()}"
    return row


def verdict_text(verdict: dict | None) -> str:
    """The failure cell's tooltip: `jobkit why`'s verdict in a line (jobs.classify_job's dict), or its error."""
    if not verdict:
        return ""
    if "error" in verdict:
        return verdict["error"]
    parts = [f"{verdict['class']}: {verdict['detail']}" if verdict.get("detail") else verdict["class"]]
    if verdict.get("host"):
        how = verdict.get("blamed_because")
        parts.append(f"host {verdict['host']}" + (f" ({how})" if how else ""))
    parts += [f"{key}: {verdict[key]}" for key in ("retry", "advice") if verdict.get(key)]
    return "; ".join(parts)


def collect(ws: Path, page_dir: Path, cache: dict | None = None) -> list[Row]:
    """One row per job log, oldest first. CACHE (path -> (stamp, row)) spares --serve re-reading old logs."""
    logs = jobs.job_logs(ws)
    if not logs:
        raise jobs.JobsError(f"no job logs in {ws}; run a job first, or pass --workspace")
    rows = []
    for log in logs:
        stamp = _stamp(log, ws)
        if cache is not None and log in cache and cache[log][0] == stamp:
            rows.append(cache[log][1])
            continue
        row = read_row(log, ws, page_dir)
        if cache is not None:
            cache[log] = (stamp, row)
        rows.append(row)
    return rows


def _stamp(log: Path, ws: Path):
    """What changes when a row would: the log, the analysis, the hang marker (the stacks come with it), the
    report."""
    out = []
    job_dir = ws / log.name.removesuffix(".log")
    for p in (log, job_dir / "analysis" / "analysis.json", job_dir / "hang" / "HANG"):
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    try:
        out.append((job_dir / "analysis" / "report.html").is_file())
    except OSError:  # a job dir it may not enter: read_row marks the row
        out.append(None)
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------
# The page


def _date_text(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts is not None else "-"


def tgs_history(rows: list[Row]) -> str:
    """TGS/device of each model's jobs against their start time, one series per model (inline SVG)."""
    dated = [r for r in rows if r.start is not None and r.tgs is not None]
    models = sorted({r.model for r in dated})
    origin = min((r.start for r in dated), default=0.0)
    span_h = (max((r.start for r in dated), default=0.0) - origin) / 3600
    # Hours over a day or two of runs, days over a longer history: the axis reads in a unit that fits.
    unit, div = ("hours", 3600) if span_h <= 48 else ("days", 86400)
    panel = plots.Panel(
        "Steady-state TGS/device per model",
        "Tokens/s/device",
        [
            plots.Series(m, [((r.start - origin) / div, r.tgs) for r in dated if r.model == m], style="o-")
            for m in models
        ],
        xlabel=f"{unit} since {_date_text(origin)}",
    )
    return plots.svg(panel, width=9.0, height=3.0)


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def _cell(text: str, sort=None, cls: str = "", title: str = "", inner: str | None = None) -> str:
    attrs = f' data-sort="{html.escape(str(sort if sort is not None else ""), quote=True)}"'
    if cls:
        attrs += f' class="{cls}"'
    if title:
        attrs += f' title="{html.escape(title, quote=True)}"'
    return f"<td{attrs}>{inner if inner is not None else html.escape(text)}</td>"


def _row_html(r: Row) -> str:
    status_cls = "st-" + re.sub(r"[^a-z]+", "-", r.status.split()[0].lower()) if r.status else ""
    job = f'<a href="{r.log_link}" title="{html.escape(r.stem, quote=True)}">{html.escape(r.job_id)}</a>'
    if r.report:
        report = f'<a class="report" href="{r.report}">report</a>'
    elif r.problem:
        report = "-"
    elif r.dir_problem:
        report = f'<span class="no-report" title="{html.escape(r.dir_problem, quote=True)}">job dir unreadable</span>'
    else:
        report = f'<span class="no-report">no report — jobkit analyze {html.escape(r.job_id)}</span>'
    cells = [
        _cell(_date_text(r.start), r.start, title=f"from the {r.date_from}"),
        _cell(r.job_id, r.job_id, inner=job),
        _cell(r.model, r.model, title=f"alias {r.alias}" if r.alias else ""),
        _cell(r.nodes, int(r.nodes) if r.nodes.isdigit() else None, "num"),
        _cell(r.tag or "-", r.tag),
        _cell(r.status, r.status, status_cls, title=r.problem),
        _cell(r.attempt, r.attempt),
        _cell(_fmt(r.tgs, ",.0f"), r.tgs, "num", title=f"from {r.source}" if r.tgs is not None else ""),
        _cell(_fmt(r.mfu, ".1f") + ("%" if r.mfu is not None else ""), r.mfu, "num"),
        _cell(r.failure or "-", r.failure, "failure", title=r.failure_detail),
        _cell("", "1" if r.report else "", inner=report),
    ]
    attrs = f'data-job-id="{html.escape(r.job_id, quote=True)}" data-model="{html.escape(r.model, quote=True)}"'
    attrs += f' data-status="{html.escape(r.status, quote=True)}"'
    return f"<tr {attrs}>{''.join(cells)}</tr>"


COLUMNS = [  # (key, header, numeric)
    ("date", "date", True),
    ("job", "job", False),
    ("model", "model", False),
    ("nodes", "nodes", True),
    ("tag", "tag", False),
    ("status", "status", False),
    ("attempt", "attempt", False),
    ("tgs", "TGS/device", True),
    ("mfu", "MFU", True),
    ("failure", "failure@host", False),
    ("report", "report", False),
]

_CSS = """
body { font: 13px system-ui, sans-serif; margin: 1.2em 2em; color: #222; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; } .meta { color: #666; margin-bottom: 1em; }
#filter { width: 28em; padding: 4px 6px; font-size: 13px; } #shown { color: #666; margin-left: 1em; }
table { border-collapse: collapse; margin-top: 0.8em; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e3e3e3; text-align: left; white-space: nowrap; }
th { cursor: pointer; user-select: none; background: #f4f4f4; position: sticky; top: 0; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:hover td { background: #f8f8ff; }
.st-success { color: #1a7f37; } .st-failed, .st-hang, .st-unreadable { color: #c62828; font-weight: 600; }
.st-cancelled, .st-stopped, .st-no-summary { color: #9a6700; }
.no-report { color: #888; font-size: 0.9em; } svg.plot { max-width: 100%; height: auto; }
"""

# Plain JavaScript, no library: the page opens offline. The filter is a list of words that must all appear
# in a row's text (case-insensitive); the state lives in the URL hash (#filter=tiny&sort=tgs&dir=desc), so a
# filtered, sorted view can be bookmarked or handed to someone.
_JS = """
(function () {
  const table = document.getElementById('jobs');
  const body = table.tBodies[0];
  const box = document.getElementById('filter');
  const shown = document.getElementById('shown');
  const heads = Array.from(table.tHead.rows[0].cells);
  const state = { filter: '', sort: '', dir: 'asc' };

  function readHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ''));
    state.filter = p.get('filter') || '';
    state.sort = p.get('sort') || '';
    state.dir = p.get('dir') === 'desc' ? 'desc' : 'asc';
  }
  function writeHash() {
    const p = new URLSearchParams();
    if (state.filter) p.set('filter', state.filter);
    if (state.sort) { p.set('sort', state.sort); p.set('dir', state.dir); }
    const h = p.toString();
    history.replaceState(null, '', h ? '#' + h : location.pathname + location.search);
  }
  function applyFilter() {
    const words = state.filter.toLowerCase().split(/\\s+/).filter(Boolean);
    let n = 0;
    for (const row of body.rows) {
      const text = row.textContent.toLowerCase();
      const ok = words.every(w => text.includes(w));
      row.hidden = !ok;
      if (ok) n++;
    }
    shown.textContent = n + ' of ' + body.rows.length + ' jobs';
  }
  function applySort() {
    heads.forEach(h => h.removeAttribute('aria-sort'));
    const i = heads.findIndex(h => h.dataset.key === state.sort);
    if (i < 0) return;
    const head = heads[i];
    head.setAttribute('aria-sort', state.dir === 'desc' ? 'descending' : 'ascending');
    const numeric = head.dataset.numeric === '1';
    const sign = state.dir === 'desc' ? -1 : 1;
    const key = row => row.cells[i].dataset.sort;
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === '' || y === '') return (x === '') - (y === '');  // empty cells last either way
      const c = numeric ? Number(x) - Number(y) : x.localeCompare(y, undefined, { numeric: true });
      return sign * c;
    });
    rows.forEach(r => body.appendChild(r));
  }
  heads.forEach(h => h.addEventListener('click', () => {
    state.dir = state.sort === h.dataset.key && state.dir === 'asc' ? 'desc' : 'asc';
    state.sort = h.dataset.key;
    applySort(); writeHash();
  }));
  box.addEventListener('input', () => { state.filter = box.value; applyFilter(); writeHash(); });
  window.addEventListener('hashchange', () => { readHash(); box.value = state.filter; applyFilter(); applySort(); });
  readHash(); box.value = state.filter; applyFilter(); applySort();
})();
"""


def render(ws: Path, rows: list[Row]) -> str:
    head = "".join(
        f'<th data-key="{key}" data-numeric="{1 if num else 0}" title="click to sort">{label}</th>'
        for key, label, num in COLUMNS
    )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    built = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    # Newest first until a header is clicked; a job with no date at the bottom.
    newest = sorted(rows, key=lambda r: r.start if r.start is not None else -math.inf, reverse=True)
    body_rows = "\n".join(_row_html(r) for r in newest)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<link rel="icon" href="data:,">
<title>jobkit dashboard — {html.escape(str(ws))}</title>
<style>{_CSS}</style></head>
<body>
<h1>Jobs in {html.escape(str(ws))}</h1>
<div class="meta">{len(rows)} jobs ({html.escape(summary)}); built {built} by <code>jobkit dashboard</code>.
TGS/device and MFU are the steady-state means (steps {tgs.DEFAULT_STEADY[0]}-{tgs.DEFAULT_STEADY[1]}), from
<code>jobkit analyze</code>'s analysis.json when there is one, else from the log.</div>
<section id="history"><h2>TGS history</h2>
{tgs_history(rows)}
</section>
<section id="table"><h2>Jobs</h2>
<input id="filter" type="search" placeholder="filter: words that must all appear (model, status, class, id ...)"
 autocomplete="off"><span id="shown"></span>
<table id="jobs"><thead><tr>{head}</tr></thead>
<tbody>
{body_rows}
</tbody></table></section>
<script>{_JS}</script>
</body></html>
"""


def build(ws: Path, output: Path, cache: dict | None = None) -> list[Row]:
    """Read every job and write the page; DashboardError / JobsError when there is nothing to show or no room."""
    rows = collect(ws, output.parent, cache)
    text = render(ws, rows)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(output, text)
    except OSError as e:
        raise DashboardError(f"cannot write {output}: {(e.strerror or str(e)).lower()}; pass --output FILE") from None
    return rows
