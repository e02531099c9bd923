"""`jobkit sweep nodes MODEL -w NODES`: one 1-node job per node, each node's TGS against the others'.

The reference is the upper median of the passing nodes' TGS (for an even count, the higher middle value),
so a slow node never drags the yardstick down: with two nodes the healthy one is the reference. Bands, as
the seeds set them: within 2 % below (or anything above) healthy, 2-5 % below marginal (usable, watch it),
more than 5 % below degraded (keep it out of multi-node jobs), failed or hung unhealthy.
"""

from __future__ import annotations

import click

from jobkit.core.errors import JobkitError
from jobkit.sweep import common
from jobkit.sweep.jobs import Outcome, Point

MARGINAL, DEGRADED = -2.0, -5.0  # percent vs the reference


def reference(values: list[float]) -> float | None:
    """The upper median: the middle value, or the higher of the two middle ones."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def health(outcome: Outcome, ref: float | None) -> tuple[float | None, str]:
    """(percent vs reference, status word)."""
    if not outcome.passed or outcome.tgs is None or ref is None:
        return None, "UNHEALTHY"
    delta = (outcome.tgs - ref) / ref * 100
    if delta < DEGRADED:
        return delta, "DEGRADED"
    if delta < MARGINAL:
        return delta, "marginal"
    return delta, "healthy"


def points(model: str, nodes: tuple[str, ...], args: tuple[str, ...]) -> list[Point]:
    return [Point(key=node, model=model, num_nodes=1, nodes=(node,), args=args, label=node) for node in nodes]


def report(model: str, nodes: tuple[str, ...], outcomes: list[Outcome]) -> str:
    ref = reference([o.tgs for o in outcomes if o.passed and o.tgs is not None])
    rows, verdicts = [], {}
    for node, outcome in zip(nodes, outcomes, strict=True):
        delta, word = health(outcome, ref)
        verdicts[node] = word
        shown = word if outcome.passed else f"{word}: {common.fmt_status(outcome)}"
        rows.append([node, outcome.job_id or "—", common.fmt_tgs(outcome.tgs), common.fmt_pct(delta, True), shown])
    good = [n for n in nodes if verdicts[n] == "healthy"]
    marginal = [n for n in nodes if verdicts[n] == "marginal"]
    bad = [n for n in nodes if verdicts[n] in ("DEGRADED", "UNHEALTHY")]
    lines = [
        f"## Node sweep: {model}, 1 node per job\n",
        common.table(["Node", "Job", "TGS/device", "vs. median", "Status"], rows),
        f"Reference (upper median of passing nodes): {common.fmt_tgs(ref)} TGS/device.",
        f"Recommended nodelist (healthy): {','.join(good) or 'none'}",
    ]
    if marginal:
        lines.append(f"Marginal (usable, watch): {','.join(marginal)}")
    if bad:
        lines.append(f"Exclude: {','.join(bad)}")
    return "\n".join(lines) + "\n"


@common.driver_command("nodes")
@click.argument("model")
@click.option("-w", "--nodelist", "nodelist", help="Nodes to test, e.g. 'node[1-4]' (required).")
@common.steps_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(model, nodelist, steps, extra, **params):
    """One 1-node job of MODEL per node; TGS vs the median; the healthy nodelist.

    EXTRA (after --) are MaxText key=value and _env_KEY=VALUE settings for every job.
    """
    try:
        if params.get("local"):
            # Its jobs would run here, and the report would call -w's nodes healthy (audit sw8/sw9).
            raise common.state.SweepError("a node sweep runs on Slurm nodes; --local cannot (drop it)")
        model = common.resolve_model(model)
        nodes = common.parse_nodes(nodelist)
    except common.state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    todo = points(model, nodes, common.with_steps(tuple(extra), steps))
    common.execute("nodes", model, lambda engine: report(model, nodes, engine.run(todo)))
