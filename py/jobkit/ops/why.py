"""`jobkit why LOGFILE`: why a run failed (its class, evidence, the host to blame and how, whether to retry, what
to do) and, after a crash, its core dump. `--json` for tools; `--all` lists every catalogue entry that matched."""

import json

import click

from jobkit.core import failures, logparse, metrics_state
from jobkit.core.commands import load_log
from jobkit.core.verdict import STATUSES, resolve_status
from jobkit.observe import hang_tsdb
from jobkit.ops import coredump

INCOMPLETE = "the log has no JOB SUMMARY: the job is still running, or it died without writing one"


def _lines(found: failures.Failure) -> list[str]:
    out = [found.label]
    if found.evidence:
        out.append(f"  evidence: {found.evidence}")
    if found.noticed:  # where a hang was noticed: the rank whose watchdog fired, not the one at fault
        out.append(f"  noticed: {found.noticed}")
    if found.host:
        out.append(f"  host: {found.host}")
        if found.process:  # several processes per node: which one of the host's
            out.append(f"  process: {found.process}")
        if found.blame_how:
            out.append(f"  blamed because: {found.blame_how}")
    elif found.blame_how:  # nobody blamed, and why (a hang whose stacks show no rank unlike the others)
        out.append(f"  blamed: {found.blame_how}")
    for waiting in found.waiting:
        out.append(f"  waiting: {waiting}")
    if found.metrics:  # a hang: each host's GPUs, network and CPU during the stall (RAY=1's TSDB, the log's GPU faults)
        out.append(f"  metrics: {found.metrics}")
    if found.followers:
        out.append(f"  followers: {', '.join(found.followers)} (failed or were stopped after it)")
    if found.retry:
        out.append(f"  retry: {found.retry}")
    if found.advice:
        out.append(f"  advice: {found.advice}")
    if found.signature:
        out.append(f"  signature: {found.signature} ({found.source})")
    return out


def _as_json(found: failures.Failure | None, outcome: str, matched: list | None) -> str:
    data: dict = {"outcome": outcome}
    if found is not None:
        data.update(
            {
                "class": found.reason, "detail": found.detail, "evidence": found.evidence, "host": found.host,
                "blamed_because": found.blame_how, "followers": list(found.followers),
                "retry": found.retry_decision, "advice": found.advice, "signature": found.signature,
                "source": found.source, "noticed": found.noticed, "waiting": list(found.waiting),
                "rank": found.rank, "process": found.process or None, "metrics": found.metrics or None,
            }
        )  # fmt: skip
    if matched is not None:
        data["matches"] = matched
    return json.dumps(data, indent=2)


@click.command("why")
@click.argument("logfile")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False), help="How the run ended.")
@click.option("--exit-code", type=click.IntRange(0, 255), help="The run's exit code (0-255).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (class, host, retry, advice, ...).")
@click.option("--all", "show_all", is_flag=True, help="Also list every signature that matched, in log order.")
def why_command(logfile, status, exit_code, as_json, show_all):
    """Classify why the run in LOGFILE failed; after a crash, where its core dump is and how to open it.
    How it ended comes from --status/--exit-code, else from the log's JOB SUMMARY. The classes, their
    patterns and advice are the catalogue configs/failure_signatures.yaml (plus a site-local file)."""
    log = load_log("why", logfile, first_steps=0)  # header, a first step and the end: a big log is not read whole
    nodes, nodes_note = logparse.header_nodes(log.header)
    if nodes_note:
        click.echo(f"jobkit why: {logfile}: {nodes_note}", err=True)
    if exit_code is None:
        exit_code = log.footer_exit  # the JOB SUMMARY's: a signal's exit code names the signal
    told = status is not None or exit_code is not None  # by the caller or by the JOB SUMMARY
    text = failures.read_tail(logfile)
    matched = None
    if show_all:
        matched = [
            {"class": sig.cls, "signature": sig.id, "line": line, "source": sig.source}
            for _, sig, line in failures.matches(text)
        ]
    resolved = resolve_status(status, exit_code, log)
    if resolved in ("SUCCESS", "STOPPED") and exit_code in (0, None):
        said = "succeeded" if resolved == "SUCCESS" else "stopped early"
        if as_json:
            click.echo(_as_json(None, "succeeded" if resolved == "SUCCESS" else "stopped-early", matched))
            return
        click.echo(f"{said}: nothing to classify")
        _echo_all(matched)
        return
    job_dir = coredump.job_dir_of(logfile)  # a hang's stacks are in <job dir>/hang/
    # The resolved status (--status, else the JOB SUMMARY's), as requeue and the report pass it: a CANCELLED job
    # is read for Slurm's own reasons only, whatever its tasks printed while they were being stopped.
    found = failures.classify(
        text, resolved, exit_code, has_steps=log.has_steps, nodes=nodes, job_dir=job_dir,
        procs=log.local_world_size, hang_window=hang_tsdb.read_window,
    )  # fmt: skip
    if not told and found.reason in ("unknown", "no-steps"):
        if as_json:
            click.echo(_as_json(None, "incomplete", matched))
            return
        click.echo(f"incomplete: {INCOMPLETE}")
        return
    if as_json:
        click.echo(_as_json(found, "failed" if told else "incomplete", matched))
        return
    for line in _lines(found):
        click.echo(line)
    if found.reason == "hang" and metrics_state.is_tsdb(str(job_dir / "prometheus")):
        click.echo(f"  more: every host's resources over the whole job: jobkit analyze {logfile}")
    if not told:
        click.echo(f"  note: {INCOMPLETE}")
    signal_name = found.detail if found.reason == "killed-by-signal" else None
    for line in coredump.report(text, logfile, signal_name):
        click.echo(line)
    _echo_all(matched)


def _echo_all(matched: list | None) -> None:
    if matched is None:
        return
    click.echo(f"all matching signatures, in log order ({len(matched)}):")
    for m in matched:
        click.echo(f"  {m['class']} [{m['signature']}]: {m['line']}")
