"""`jobkit compare JOB...` (or `--sweep ID`): jobs side by side, as a terminal table and an HTML page.

Each job is analysed in memory (jobkit.analysis.build; nothing is written into job dirs). The first job is
the baseline: every other column shows its change against it. Besides throughput and loss, the page lists
what differs between the jobs that could explain a gap: the header (model, nodes, passthrough args,
runtime, image) and training's environment (environment.node0.txt), less what always differs (ids, paths
that hold the job's own name, PIDs, timestamps).
"""

from __future__ import annotations

import html
import re
import shlex
import time
from pathlib import Path

import click

from jobkit.analysis import build as buildmod
from jobkit.analysis import plots
from jobkit.analysis.job import JobReadError, load
from jobkit.core import paths
from jobkit.core.errors import JobkitError
from jobkit.core.files import write_atomic
from jobkit.ops import jobs

# Header and environment keys that differ between any two jobs whatever they ran.
_NOISE = re.compile(
    r"^(JOB_ID|JOB_NAME|EXP_TAG|JOB_WORKSPACE|SLURM_.*|HOSTNAME|PWD|OLDPWD|SHLVL|_|RANDOM|.*_PID|.*PORT|"
    r"OUTPUT_PATH|RUN_NAME|JAX_COORDINATOR_IP|RAY_ADDRESS|TMPDIR|REQUEUE_.*|RETRY_OF|ATTEMPT|SUBMIT_ARGV|"
    r"NODELIST_EXPANDED|JOB_NODELIST|PASSTHROUGH_ARGS|SSH_.*|TERM|XDG_.*|INVOCATION_ID|JOURNAL_STREAM)$"
)
_ENV_LINE = re.compile(r"^(?:export |declare -x )?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class CompareError(Exception):
    """One line: what is wrong and what to do."""


def sweep_logs(ws: Path, sweep_id: str) -> list[Path]:
    """The logs of a sweep's points, in the order they were submitted (the last job of a retried point)."""
    from jobkit.sweep import state as sweep_state

    try:
        path = ws / "sweeps" / sweep_state.check_id(sweep_id)  # the --workspace given, like the job ids
    except sweep_state.SweepError as e:
        raise CompareError(str(e)) from None
    if not (path / "plan.json").is_file():
        raise CompareError(f"no sweep {sweep_id!r} in {ws / 'sweeps'}; `jobkit sweep list` shows them")
    sweep = sweep_state.Sweep(path)
    by_key: dict[str, str] = {}
    for event in sweep.events():
        key = event.get("key")
        if event.get("event") == "done" and event.get("log"):
            by_key[key] = event["log"]
        elif event.get("event") == "submitted" and event.get("job_id") and key not in by_key:
            try:
                by_key[key] = str(jobs.resolve(ws, str(event["job_id"])))
            except jobs.JobsError:
                continue
    if not by_key:
        raise CompareError(f"sweep {sweep_id} has no job with a log yet; see 'jobkit sweep status {sweep_id}'")
    return [Path(p) for p in by_key.values()]


def _header_args(header: dict[str, str]) -> dict[str, str]:
    """The header's keys that matter, with PASSTHROUGH_ARGS spread into `arg:key` entries."""
    out = {k: v for k, v in header.items() if not _NOISE.match(k) and k != "PASSTHROUGH_ARGS"}
    try:
        words = shlex.split(header.get("PASSTHROUGH_ARGS", ""))
    except ValueError:
        words = header.get("PASSTHROUGH_ARGS", "").split()
    for word in words:
        key, sep, value = word.partition("=")
        out[f"arg:{key}"] = value if sep else "(set)"
    return out


def _environment(job_dir: Path, own: tuple[str, ...]) -> dict[str, str]:
    env_file = job_dir / "environment.node0.txt"
    try:
        text = env_file.read_text(errors="replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = _ENV_LINE.match(line)
        if m and not _NOISE.match(m.group(1)) and not _names_the_job(m.group(2), own):
            out[f"env:{m.group(1)}"] = m.group(2).strip('"')
    return out


def _names_the_job(value: str, own: tuple[str, ...]) -> bool:
    """True when VALUE holds the job's id, name or dir (it differs between any two jobs by construction). A
    numeric id counts only as a whole number: job 5's CLOUD_SDK_VERSION=528.0.0 is not about job 5."""
    for o in own:
        if not o:
            continue
        if o.isdigit():
            if re.search(rf"(?<![0-9]){o}(?![0-9])", value):
                return True
        elif o in value:
            return True
    return False


def differences(analyses: list[buildmod.Analysis]) -> list[tuple[str, list[str]]]:
    """[(key, [value per job])] for the keys whose values are not all the same."""
    per_job = []
    for a in analyses:
        h = a.facts.header
        own = (h.get("JOB_ID", ""), h.get("JOB_NAME", ""), str(a.facts.job_dir))
        per_job.append({**_header_args(h), **_environment(a.facts.job_dir, own)})
    keys = sorted({k for d in per_job for k in d})
    return [
        (k, [d.get(k, "(unset)") for d in per_job]) for k in keys if len({d.get(k, "(unset)") for d in per_job}) > 1
    ]


def _mean(stat):
    return stat["mean"] if stat else None


def _delta(value, base) -> str:
    if value is None or base is None or base == 0:
        return ""
    return f" ({(value - base) / abs(base) * 100:+.1f}%)"


def _common_step_loss(analyses) -> tuple[int | None, list[float | None]]:
    """The last step every job logged, and each job's loss there."""
    sets = [{p["step"]: p["loss"] for p in a.doc["steps"]["per_step"]} for a in analyses]
    common = set.intersection(*(set(s) for s in sets)) if sets else set()
    if not common:
        return None, [None] * len(analyses)
    step = max(common)
    return step, [s[step] for s in sets]


def rows(analyses: list[buildmod.Analysis]) -> list[tuple[str, list[str]]]:
    """[(label, [cell per job])], the first job the baseline of the deltas."""
    docs = [a.doc for a in analyses]

    def metric(label, get, fmt):
        values = [get(d) for d in docs]
        base = values[0]
        cells = [("-" if v is None else fmt(v)) + (_delta(v, base) if i else "") for i, v in enumerate(values)]
        return label, cells

    def spread(d, key):
        stat = d["throughput"][key]
        if not stat or stat.get("cv_pct") is None:
            return "-"
        std = stat["std"]
        return (
            f"± {std:,.0f} (cv {stat['cv_pct']:.1f}%)"
            if abs(std) >= 1000
            else f"± {std:.3g} (cv {stat['cv_pct']:.1f}%)"
        )

    step, losses = _common_step_loss(analyses)
    out = [
        ("job", [d["job"]["id"] or "?" for d in docs]),
        ("model", [f"{d['model']['name']} x{d['job']['nnodes']}" for d in docs]),
        ("status", [d["job"]["status"] or "?" for d in docs]),
        ("failure", [d["failure"]["class"] if d["failure"] else "-" for d in docs]),
        metric("TGS (steady mean)", lambda d: _mean(d["throughput"]["tgs"]), lambda v: f"{v:,.1f}"),
        ("TGS spread", [spread(d, "tgs") for d in docs]),
        metric("step time s (steady)", lambda d: _mean(d["throughput"]["step_time_s"]), lambda v: f"{v:.4g}"),
        ("step time spread", [spread(d, "step_time_s") for d in docs]),
        metric("MFU %", lambda d: _mean(d["throughput"]["mfu_pct"]), lambda v: f"{v:.2f}"),
        ("steps logged", [str(d["steps"]["logged"]) for d in docs]),
        (
            f"loss at step {step}" if step is not None else "loss at a common step",
            [("-" if v is None else f"{v:.5g}") for v in losses],
        ),
        metric("final loss", lambda d: d["loss"]["final"] if d["loss"] else None, lambda v: f"{v:.5g}"),
        ("anomalies", [str(len(d["anomalies"])) for d in docs]),
    ]
    return out


def format_table(table: list[tuple[str, list[str]]]) -> str:
    width0 = max(len(label) for label, _ in table)
    widths = [max(len(cells[i]) for _, cells in table) for i in range(len(table[0][1]))]
    lines = []
    for label, cells in table:
        lines.append(f"{label:<{width0}}  " + "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def render(analyses, table, diffs) -> str:
    e = html.escape
    names = [a.doc["job"]["id"] or "?" for a in analyses]

    def overlay(title, key, ylabel):
        series = [
            plots.Series(name, [(p["step"], p[key]) for p in a.doc["steps"]["per_step"] if p.get(key) is not None])
            for name, a in zip(names, analyses, strict=True)
        ]
        return plots.svg(plots.Panel(title, ylabel, series))

    head = "".join(f"<th>{e(label)}</th>" if i == 0 else "" for i, label in enumerate(["metric"]))
    head += "".join(f"<th>{e(n)}</th>" for n in names)
    body = "".join(
        f"<tr><td>{e(label)}</td>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>" for label, cells in table[1:]
    )
    diff_rows = "".join(
        f"<tr><td><code>{e(k)}</code></td>" + "".join(f"<td><code>{e(v[:200])}</code></td>" for v in vals) + "</tr>"
        for k, vals in diffs
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>jobkit compare: "
        f"{e(', '.join(names))}</title><style>"
        "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .5em;font-size:13px;text-align:left}"
        "th{background:#f5f5f5}svg.plot{max-width:100%;height:auto}</style></head><body>"
        f"<h1>Comparison of {len(names)} jobs</h1><p>Baseline: {e(names[0])}; percentages are against it.</p>"
        f"<table id='compare'><tr>{head}</tr>{body}</table>"
        "<h2>Curves</h2>"
        + overlay("loss per step", "loss", "loss")
        + overlay("step time per step", "seconds", "seconds")
        + overlay("TGS per step", "tgs", "tokens/s/device")
        + "<h2>What differs</h2>"
        + (
            f"<table id='differences'><tr><th>key</th>{''.join(f'<th>{e(n)}</th>' for n in names)}</tr>{diff_rows}</table>"
            if diffs
            else "<p id='no-differences'>No difference in the header or environment.</p>"
        )
        + f"<p>Written by <code>jobkit compare</code> at {e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p></body></html>"
    )


@click.command("compare")
@click.argument("jobs_given", metavar="JOB...", nargs=-1)
@click.option("--sweep", "sweep_id", help="Compare this sweep's jobs (its id, as `jobkit sweep` names it).")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False),
    help="Write the page here (default <workspace>/.compare/<first job>+N.html).",
)
def command(jobs_given, sweep_id, ws, html_out):
    """Compare jobs side by side: TGS, MFU and step time with spread, loss at the last common step, and the
    header and environment differences that could explain a gap. The first job is the baseline."""
    workspace = paths.workspace(ws)
    if bool(jobs_given) == bool(sweep_id):
        raise JobkitError("compare", "give two or more jobs, or --sweep ID (not both)")
    try:
        logs = sweep_logs(workspace, sweep_id) if sweep_id else [Path(jobs.resolve(workspace, j)) for j in jobs_given]
    except (jobs.JobsError, CompareError) as e:
        raise JobkitError("compare", str(e)) from None
    if len(logs) < 2:
        raise JobkitError("compare", f"only {len(logs)} job to compare; give at least two")
    analyses = []
    for log in logs:
        try:
            analyses.append(buildmod.build(load(log)))
        except JobReadError as e:
            raise JobkitError("compare", str(e)) from None
    table = rows(analyses)
    diffs = differences(analyses)
    click.echo(format_table(table))
    if diffs:
        click.echo("\ndiffers:")
        for key, values in diffs[:40]:
            click.echo(f"  {key}: " + " | ".join(v[:60] for v in values))
    target = Path(html_out) if html_out else workspace / ".compare" / f"{table[0][1][0]}+{len(logs) - 1}.html"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, render(analyses, table, diffs))
    except OSError as e:
        raise JobkitError("compare", f"cannot write {target}: {e.strerror}; pass --html FILE") from None
    click.echo(f"\npage: {target}")
