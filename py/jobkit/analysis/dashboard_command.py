"""`jobkit dashboard [--serve]`: the command line over the page builder (dashboard) and its server (dashboard_serve).

The server knows nothing of how the page is made: it is handed a `rebuild` callable, so neither of the two
modules imports the other.
"""

from pathlib import Path

import click
from click.core import ParameterSource

from jobkit.analysis import dashboard as page
from jobkit.analysis.dashboard_serve import serve_page
from jobkit.core import paths
from jobkit.core.errors import JobkitError
from jobkit.ops import jobs


def _rebuilder(ws: Path, out: Path):
    """A callable that rebuilds the page at OUT and returns None, or a line saying why it could not."""
    cache: dict = {}

    def rebuild() -> str | None:
        try:
            page.build(ws, out, cache)
        except (page.DashboardError, jobs.JobsError) as e:
            return str(e)
        return None

    return rebuild


@click.command("dashboard")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help=f"The page to write (default <workspace>/{page.PAGE_DIR}/{page.PAGE_NAME}).",
)
@click.option("--serve", is_flag=True, help="Serve the page on 127.0.0.1 until Ctrl-C, rebuilt on each load.")
@click.option(
    "-p",
    "--port",
    type=click.IntRange(1, 65535),
    default=page.DEFAULT_PORT,
    show_default=True,
    help="With --serve: the first port to try (the next free one is used when it is taken).",
)
def command(ws, output, serve, port):
    """A static page over every job in the workspace: a sortable, filterable table and TGS per model over
    time, linking each job's `jobkit analyze` report. Prints the page's path; --serve serves it."""
    if not serve and click.get_current_context().get_parameter_source("port") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--port is the port --serve listens on; add --serve, or drop --port")
    ws = paths.workspace(ws).resolve()
    out = Path(output).resolve() if output else ws / page.PAGE_DIR / page.PAGE_NAME
    try:
        rows = page.build(ws, out)
    except (page.DashboardError, jobs.JobsError) as e:
        raise JobkitError("dashboard", str(e)) from None
    for problem in dict.fromkeys(r.failure_detail for r in rows if r.failure == "?"):  # a bad catalogue: once
        click.echo(f"jobkit dashboard: {problem}; its failure says ?", err=True)
    unreadable = sum(r.status == "unreadable" for r in rows)
    dirs = sum(bool(r.dir_problem) for r in rows)  # the log was read, the job dir (its report) was not
    parts = ([f"{unreadable} unreadable"] if unreadable else []) + ([f"{dirs} job dir(s) unreadable"] if dirs else [])
    note = f" ({', '.join(parts)})" if parts else ""
    if not serve:
        click.echo(f"{len(rows)} jobs{note}: {out}")
        return
    if note:
        click.echo(f"jobkit dashboard: WARNING: {unreadable} job logs are unreadable; their rows say so", err=True)
    serve_page(ws, out, port, _rebuilder(ws, out))
