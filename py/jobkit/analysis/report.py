"""report.html: one self-contained page (inline CSS and SVG, no script, no network) from an Analysis.

Sections, top to bottom, in the order a person triages: the verdict (status, failure, TGS/MFU, partial or
missing data), anomalies with evidence, stages, per-step training curves (loss, learning rate, grad norm;
step time and TGS with the steady window shaded), then every host on one shared time axis (CPU, memory,
network, RDMA, GPU) with markers for the first step, the steady window, a hang and the end, and per-host tables.
"""

from __future__ import annotations

import html
import time

from jobkit.analysis import hosts as hostmod
from jobkit.analysis import plots
from jobkit.analysis.build import Analysis

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;border-bottom:1px solid #ddd;margin-top:1.6em}
.badge{display:inline-block;padding:.1em .6em;border-radius:.8em;color:#fff;font-weight:600}
.SUCCESS{background:#2e7d32}.FAILED,.HANG{background:#c62828}.CANCELLED,.STOPPED{background:#ef6c00}
.RUNNING,.unknown{background:#1565c0}
.cards{display:flex;flex-wrap:wrap;gap:.8em}.card{border:1px solid #ddd;border-radius:6px;padding:.5em .8em;min-width:11em}
.card b{display:block;font-size:1.25em}.muted{color:#666}.warn{background:#fff3e0;border-left:4px solid #ef6c00;padding:.4em .8em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;font-size:13px}
th{background:#f5f5f5}code{font-size:12px;background:#f5f5f5;padding:0 .2em}svg.plot{max-width:100%;height:auto}
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _num(value, digits=4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:.{digits}g}"
    return f"{value:,}"


def _stat_text(stat, unit="") -> str:
    if not stat:
        return "-"
    return (
        f"{_num(stat['mean'])}{unit} ± {_num(stat['std'], 2)} (cv {stat['cv_pct']}%)"
        if stat.get("cv_pct") is not None
        else _num(stat["mean"])
    )


def _table(headers, rows, cls="") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def _step_panels(a: Analysis) -> list[str]:
    per = a.doc["steps"]["per_step"]
    thr = a.doc["throughput"]
    window = thr["window"]
    spans = [(window[0], window[1], f"steady {window[0]}-{window[1]}")] if window and thr["steps"] else []
    spikes = [
        plots.Marker(x["step"], x["kind"]) for x in a.doc["anomalies"] if x["kind"] in ("loss-spike", "nonfinite-loss")
    ]
    slow = [
        plots.Marker(x["step"], "slow", "tab:orange") for x in a.doc["anomalies"] if x["kind"] == "step-time-outlier"
    ][:10]

    def series(key, label, style="-"):
        return plots.Series(label, [(p["step"], p[key]) for p in per if p.get(key) is not None], style)

    panels = [
        plots.Panel("loss per step", "loss", [series("loss", "loss")], markers=spikes),
        plots.Panel("learning rate per step", "learning rate", [series("learning_rate", "learning rate")]),
        plots.Panel(
            "gradient norm per step",
            "norm",
            [series("grad_norm", "grad norm"), series("raw_grad_norm", "raw grad norm", "--")],
        ),
        plots.Panel("step time", "seconds", [series("seconds", "step time")], markers=slow, spans=spans),
        plots.Panel("TGS (tokens/s/device)", "tokens/s/device", [series("tgs", "TGS")], spans=spans),
    ]
    if any(p.get("mfu") is not None for p in per):
        panels.append(plots.Panel("MFU", "%", [series("mfu", "MFU")], spans=spans))
    return [plots.svg(p) for p in panels]


def _time_markers(a: Analysis) -> list[plots.Marker]:
    doc, times = a.doc, a.facts.step_times
    marks = []
    if times:
        first, last = min(times), max(times)
        marks.append(plots.Marker(times[first], f"step {first}", "tab:green"))
        window = doc["throughput"]["window"]
        if window and window[0] in times and window[1] in times and doc["throughput"]["steps"]:
            marks.append(plots.Marker(times[window[0]], "steady start", "tab:olive"))
            marks.append(plots.Marker(times[window[1]], "steady end", "tab:olive"))
        marks.append(plots.Marker(times[last], f"step {last}", "tab:green"))
    slow = next((x for x in doc["anomalies"] if x["kind"] == "step-time-outlier" and x["time"]), None)
    if slow:
        marks.append(plots.Marker(slow["time"], f"slow step {slow['step']}", "tab:orange"))
    if doc["hang"] and doc["hang"]["time"]:
        marks.append(plots.Marker(doc["hang"]["time"], "HANG", "tab:red"))
    if doc["failure"] and doc["job"]["end"]:
        marks.append(plots.Marker(doc["job"]["end"], doc["failure"]["class"], "tab:red"))
    if doc["job"]["attempt"] > 1 and doc["job"]["start"]:
        marks.append(plots.Marker(doc["job"]["start"], f"restart (attempt {doc['job']['attempt']})", "tab:purple"))
    return marks


def _host_panels(a: Analysis) -> list[str]:
    if not a.lines:
        return []
    marks = _time_markers(a)
    starts = [p[0][0] for lines in a.lines.values() for p in lines.values() if p]
    origin = min([*starts, *(m.x for m in marks)]) if starts else None
    out = []
    for res in hostmod.RESOURCES:
        lines = a.lines.get(res.key) or {}
        if not lines:
            continue
        panel = plots.Panel(
            f"{res.title} per host",
            res.unit,
            [plots.Series(host, pts, "-" if len(pts) > 1 else "o") for host, pts in sorted(lines.items())],
            markers=marks,
            time_axis=True,
            x0=origin,
        )
        out.append(plots.svg(panel))
    return out


def _when(ts) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def render(a: Analysis) -> str:
    """The page, section by section from the top; each builder returns its HTML fragments, one a line."""
    d = a.doc
    sections = (
        _page_head(d),
        _verdict(d),
        _anomalies(d),
        _missing_panels(d),
        _stages(d),
        _training(a),
        _hosts(a),
        _page_foot(d),
    )
    return "\n".join(part for section in sections for part in section)


def _page_head(d: dict) -> list[str]:
    """The document's head, the title line with the status badge, and what ran: job, model, nodes, provenance."""
    job, prov = d["job"], d["provenance"]
    status = job["status"] or "unknown"
    return [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(job['id'])} {_e(job['name'])}: analysis</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(job['name'] or job['id'])} <span class='badge {_e(status)}' id='status'>{_e(status)}</span></h1>",
        f"<p class='muted'>job {_e(job['id'])} · model {_e(d['model']['name'])}"
        f"{' (' + _e(d['model']['alias']) + ')' if d['model']['alias'] else ''} · {_e(job['nnodes'])} node(s): "
        f"{_e(', '.join(job['nodelist']))} · started {_e(_when(job['start']))} · wall {_e(job['wall_s'])} s"
        f" · attempt {job['attempt']}{' of ' + str(1 + job['max_retries']) if job['max_retries'] else ''}</p>",
        f"<p class='muted'>args: <code>{_e(' '.join(d['model']['passthrough']) or '(none)')}</code> · commit "
        f"<code>{_e(prov['commit'] or 'unknown')}</code> {_e(prov['commit_subject'] or '')}"
        f"{' · snapshot <code>' + _e(prov['artifact']) + '</code>' if prov['artifact'] else ''}</p>",
    ]


def _verdict(d: dict) -> list[str]:
    """A partial analysis said first, then one card per headline number (and the failure, if any)."""
    parts = []
    if d["partial"]:
        parts.append(f"<p class='warn' id='partial'>Partial analysis: {_e(d['partial'])}.</p>")
    thr, failure = d["throughput"], d["failure"]
    cards = [
        ("TGS (steady)", _stat_text(thr["tgs"]), thr["unavailable"] or f"steps {thr['window']}"),
        ("step time (steady)", _stat_text(thr["step_time_s"], " s"), f"{thr['steps']} steady steps"),
        ("MFU", _stat_text(thr["mfu_pct"], " %") if thr["mfu_pct"] else "-", thr["mfu_note"] or ""),
        (
            "loss",
            f"{_num(d['loss']['first'])} → {_num(d['loss']['final'])}" if d["loss"] else "-",
            f"{d['steps']['logged']} steps logged",
        ),
    ]
    if failure:
        cards.append(
            (
                "failure",
                failure["class"],
                (failure["evidence"] or "")
                + (f" (host {failure['host']})" if failure["host"] else "")
                + (f"; noticed {failure['noticed']}" if failure.get("noticed") else "")
                + (f"; blamed because {failure['blamed_because']}" if failure.get("blamed_because") else ""),
            )
        )
    hang = d.get("hang") or {}
    if hang.get("hosts"):
        rows = "".join(f"<li>{_e(h)}: {_e(hostmod.hang_host_text(r))}</li>" for h, r in hang["hosts"].items())
        said = (failure or {}).get("metrics")  # the verdict's reading of these numbers (core.hang_metrics)
        reading = f"<p id='hang-reading'>Reads as: {_e(said)}</p>" if said else ""
        parts.append(f"<div id='hang-hosts'><p>During the hang's stall, per host:</p><ul>{rows}</ul>{reading}</div>")
    parts.append(
        "<div class='cards'>"
        + "".join(
            f"<div class='card'><span class='muted'>{_e(t)}</span><b>{_e(v)}</b><span class='muted'>{_e(n)}</span></div>"
            for t, v, n in cards
        )
        + "</div>"
    )
    return parts


def _anomalies(d: dict) -> list[str]:
    parts = ["<h2>Anomalies</h2>"]
    if d["anomalies"]:
        rows = [
            (_e(x["kind"]), _e(x["step"]), _e(x["host"] or ""), _e(x["message"]), f"<code>{_e(x['evidence'])}</code>")
            for x in d["anomalies"]
        ]
        parts.append(_table(("kind", "step", "host", "what", "evidence"), rows, "anomalies"))
        # Each kind is listed up to anomalies.LIST_LIMIT times: say how many there were where the list was cut.
        cut = {k: n for k, n in d["anomaly_counts"].items() if n > sum(1 for x in d["anomalies"] if x["kind"] == k)}
        if cut:
            parts.append(
                "<p class='muted'>Not all listed: " + _e(", ".join(f"{k} {n} in all" for k, n in cut.items())) + "</p>"
            )
    else:
        parts.append("<p id='no-anomalies'>None found (rules: see <code>jobkit analyze --help</code>).</p>")
    return parts


def _missing_panels(d: dict) -> list[str]:
    if not d["missing"]:
        return []
    return [
        "<h2>Missing panels</h2>"
        + _table(("panel", "why"), [(_e(m["panel"]), _e(m["why"])) for m in d["missing"]], "missing")
    ]


def _stages(d: dict) -> list[str]:
    return [
        "<h2>Stages</h2>",
        _table(
            ("stage", "seconds", "result"), [(_e(s["name"]), _e(s["seconds"]), _e(s["result"])) for s in d["stages"]]
        )
        if d["stages"]
        else "<p>No stage lines.</p>",
    ]


def _training(a: Analysis) -> list[str]:
    return ["<h2>Training</h2>", *(f"<div class='panel'>{svg}</div>" for svg in _step_panels(a))]


def _hosts(a: Analysis) -> list[str]:
    """Every host on one time axis, then a table per resource and the error counters that rose."""
    d = a.doc
    if not d["hosts"]["available"]:
        return ["<h2>Hosts</h2>", f"<p id='no-hosts'>No per-host metrics: {_e(d['hosts']['why_not'])}.</p>"]
    parts = [
        "<h2>Hosts</h2>",
        f"<p class='muted'>From the job's TSDB <code>{_e(d['hosts']['tsdb'])}</code>; time axis in minutes from the first sample or marker.</p>",
    ]
    parts += [f"<div class='panel'>{svg}</div>" for svg in _host_panels(a)]
    for key, res in d["hosts"]["resources"].items():
        rows = [
            (_e(h), _num(s["mean"]), _num(s["min"]), _num(s["max"]), _num(s["last"]), s["samples"])
            for h, s in res["per_host"].items()
        ]
        parts.append(
            f"<h3>{_e(res['title'])} ({_e(res['unit'])})</h3>"
            + _table(("host", "mean", "min", "max", "last", "samples"), rows, f"host-{key}")
        )
    if d["hosts"]["error_counters"]:
        rows = [
            (_e(e["host"]), _e(e["metric"]), _e(e["device"]), _num(e["increase"])) for e in d["hosts"]["error_counters"]
        ]
        parts.append(
            "<h3>Error counters that rose</h3>" + _table(("host", "counter", "device", "increase"), rows, "errors")
        )
    return parts


def _page_foot(d: dict) -> list[str]:
    return [
        f"<p class='muted'>Written by <code>jobkit analyze</code> at {_e(_when(d['generated_at']))}; the numbers are in "
        "<a href='analysis.json'>analysis.json</a>.</p></body></html>"
    ]
