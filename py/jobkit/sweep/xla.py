"""`jobkit sweep xla MODEL -N n -w NODES --catalog FILE`: rank XLA / collective tuning profiles by real TGS.

The xla-tuning seed's waves, as a driver:
  1. Check everything first (model, nodes, catalog, EXTRA): bad input is one line and leaves nothing.
  2. Wave 1, the baseline pair, each `--repeats` times and interleaved: `baseline-deployed` (nothing
     added: what production runs) and `baseline-no-env` (`TUNE_PROFILE=restore_default`: the image's
     own XLA_FLAGS, to show whether the deployed flags help on this cell).
  3. Waves of catalog profiles (`--wave-size` at a time, repeats interleaved). A profile reaches the
     training tier as a file of lines (`--flag`, `NAME=VALUE`) under the sweep dir, passed with
     `_env_TUNE_PROFILE_FILE=` (train_env.sh reads it; no code edit per profile). After each wave the
     seed's stop rule is checked: a profile at least +5 % over baseline-deployed, outside the noise
     band, ends the search and the remaining profiles are not run.
  4. The leaderboard (summary.md) and `<model>-tuning.md` in the sweep dir: inventory, leaderboard,
     noise band, winner with its deployment recipe, negative findings, every job.

Every job runs `dataset_type=synthetic` and `steps` on the same pinned nodelist (exactly -N nodes: a
different node would change the numbers more than a flag does). Repeats are points of their own
(`name#1`, `name#2`), so a resumed sweep reruns nothing that finished.

The concerns live apart: xla_catalog (the catalog, the profile files, the points), xla_report (ranking,
noise band, verdicts, leaderboard, `<model>-tuning.md`); this module runs the waves and holds the command.
"""

from __future__ import annotations

from pathlib import Path

import click

from jobkit.core.errors import JobkitError
from jobkit.sweep import common, state
from jobkit.sweep.engine import SweepStopped
from jobkit.sweep.jobs import Outcome
from jobkit.sweep.xla_catalog import (
    DEPLOYED,
    Plan,
    Profile,
    check_extra,
    load_catalog,
    resumed_copy,
    save_copy,
    select,
    write_profile_files,
)
from jobkit.sweep.xla_report import EARLY_WIN, Inventory, Ranking, early_win, failure_word, leaderboard, report


# --- the waves ---
def run_waves(engine, plan: Plan, profiles: list[Profile], wave_size: int) -> tuple[list[Outcome], list[str]]:
    """Every wave's outcomes and the profiles skipped by the stop rule."""
    echo = engine.echo
    outcomes = engine.run(plan.baseline_points())
    ranking = Ranking.of(outcomes)
    if ranking.reference is None:
        failed = ranking.results[DEPLOYED].failed[0]
        raise SweepStopped(
            f"{DEPLOYED} failed in all {plan.repeats} run(s) ({failure_word(failed)}: {failed.detail or failed.line});"
            " there is nothing to rank against: make the plain job pass, then start a new sweep"
        )
    band_text = f"±{ranking.band:.1f}%" if ranking.measured else "unknown (one run)"
    echo(f"[xla] baseline-deployed {common.fmt_tgs(ranking.reference)} TGS/device, noise band {band_text}")
    waves = [profiles[i : i + wave_size] for i in range(0, len(profiles), wave_size)]
    for number, wave in enumerate(waves, 1):
        outcomes += engine.run(plan.profile_points(wave))
        ranking = Ranking.of(outcomes)
        measured = [r for r in ranking.profiles if ranking.delta(r.name) is not None]
        best = max(measured, key=lambda r: ranking.delta(r.name), default=None)
        shown = f"{best.name} {common.fmt_pct(ranking.delta(best.name), True)}" if best else "none passed"
        echo(f"[xla] wave {number}/{len(waves)} done: best so far {shown}")
        won = early_win(ranking)
        if won and number < len(waves):
            skipped = [p.name for w in waves[number:] for p in w]
            echo(
                f"[xla] {won.name} is {common.fmt_pct(ranking.delta(won.name), True)} (>= +{EARLY_WIN:g}% and outside"
                f" the band): search ends; {len(skipped)} profile(s) not run"
            )
            return outcomes, skipped
    return outcomes, []


# --- the command ---
@common.driver_command("xla")
@click.argument("model")
@click.option("-N", "--nodes", "num_nodes", type=click.IntRange(1), default=1, show_default=True, help="Nodes per job.")
@click.option("-w", "--nodelist", "nodelist", help="Exactly -N nodes every job runs on, e.g. 'node[1-2]'.")
@click.option("--catalog", required=True, help="YAML catalog of profiles (configs/xla_catalogs/*.yml).")
@click.option("--repeats", type=click.IntRange(1, 10), default=2, show_default=True, help="Runs per profile.")
@click.option("--profiles", "profile_names", help="Only these catalog profiles, in this order (a,b,c).")
@click.option("--parallelism", help="Only profiles tagged with this parallelism (and untagged ones), e.g. fsdp.")
@click.option("--wave-size", type=click.IntRange(1, 50), default=5, show_default=True, help="Profiles per wave.")
@common.steps_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(
    model, num_nodes, nodelist, catalog, repeats, profile_names, parallelism, wave_size, steps, extra, **params
):
    """Rank the tuning profiles of a catalog for MODEL against the deployed baseline, by real TGS.

    The baseline pair (deployed, and restore_default) then every profile, each --repeats times, synthetic
    data, on the same nodes; a leaderboard with a measured noise band, and MODEL-tuning.md with the
    winner's deployment recipe in the sweep dir. EXTRA (after --) are MaxText key=value and _env_KEY=VALUE
    settings for every job.
    """
    catalog_path = Path(catalog).expanduser().resolve()
    try:
        model = common.resolve_model(model)
        nodes = common.parse_nodes(nodelist, num_nodes, params.get("local"))
        if params.get("local") and num_nodes != 1:
            raise state.SweepError("--local runs one node on this machine; drop -N or use -N 1")
        if len(nodes) > num_nodes:
            raise state.SweepError(
                f"-w names {len(nodes)} nodes but -N is {num_nodes}: every job of an XLA sweep runs on the same"
                f" nodes (others would change TGS more than a flag); name exactly {num_nodes}"
            )
        # A resumed sweep keeps the catalog it started with (a copy in its dir), whatever the file says now.
        copy = resumed_copy(params.get("sweep_id"))
        profiles = select(load_catalog(copy or catalog_path), profile_names, parallelism, str(catalog_path))
        check_extra(tuple(extra), profiles)
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    args = common.with_steps((*extra, "dataset_type=synthetic"), steps)

    def body(engine) -> str:
        sweep = engine.sweep
        save_copy(sweep.path, catalog_path)
        profile_dir = sweep.path / "profiles"
        write_profile_files(profile_dir, profiles, catalog_path)
        plan = Plan(model, num_nodes, nodes, args, repeats, str(profile_dir.relative_to(state.workspace())))
        outcomes, skipped = run_waves(engine, plan, profiles, wave_size)
        ranking = Ranking.of(outcomes)
        inventory = Inventory.of(model, num_nodes, nodes, tuple(extra), ranking)
        (sweep.path / f"{model}-tuning.md").write_text(
            report(sweep.id, catalog_path, plan, profiles, ranking, skipped, inventory)
        )
        return leaderboard(ranking, skipped) + f"\nFull report: {sweep.path / f'{model}-tuning.md'}\n"

    common.execute("xla", model, body)
