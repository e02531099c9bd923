"""The judging side of `jobkit sweep xla`: from outcomes to verdicts, and the reports that show them.

  1. Ranking: the runs of each profile (points `name#r`) as one result, its mean TGS and Δ vs
     baseline-deployed, the noise band, a verdict per profile, the winner and the +5 % stop rule.
  2. Reporting: the leaderboard (summary.md and the terminal) and `<model>-tuning.md` in the sweep dir:
     inventory, leaderboard, effect of the deployed settings, conclusion, the winner's deployment
     recipe, negative findings, every profile and every job.

Noise band: the spread of the baseline-deployed repeats (jobkit.sweep.common.spread: the full max-min
range as a percentage of their mean, the definition the batch driver uses too), at least 0.5 %. A profile's mean and the baseline's mean each carry run-to-run noise; the whole range the
baseline showed against itself is about one standard deviation of the difference of two 2-run means, so
a half-range band would call noise a win too often. With one run per profile the band is unknown and the
verdicts use the floor alone (the report says so). Verdicts: win (Δ above +band), within noise, loss
(below -band), FAIL (a class: OOM and unknown flags are never retried, the engine's rule). A profile with
any failed run is a failure, never a winner.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.core import config as maxtext_config
from jobkit.core.paths import REPO_ROOT
from jobkit.sweep import common
from jobkit.sweep.jobs import Outcome
from jobkit.sweep.xla_catalog import DEPLOYED, NO_ENV, Plan, Profile, profile_name

BAND_FLOOR = 0.5  # percent: below this, pinned-node noise cannot be told from a flag's effect
EARLY_WIN = 5.0  # percent over baseline-deployed that ends the search (the seed's stop rule)
BOUNDED_AFTER, BOUNDED_BELOW = 25, 2.0  # >= 25 profiles and none above +2 %: structurally bounded
_INVENTORY_KEYS = ("per_device_batch_size", "max_target_length", "remat_policy")


# --- 1. ranking ---
@dataclass
class Result:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def passed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.passed and o.tgs is not None]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not (o.passed and o.tgs is not None)]

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and not self.failed

    @property
    def tgs(self) -> float | None:
        return statistics.fmean(o.tgs for o in self.passed) if self.passed else None

    @property
    def step_time(self) -> float | None:
        times = [o.step_time for o in self.passed if o.step_time is not None]
        return statistics.fmean(times) if times else None

    @property
    def spread(self) -> float | None:
        """The passing runs' spread (jobkit.sweep.common.spread: max - min, % of their mean)."""
        return common.spread([o.tgs for o in self.passed])


def results(outcomes: list[Outcome]) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for outcome in outcomes:
        out.setdefault(profile_name(outcome.key), Result(profile_name(outcome.key))).outcomes.append(outcome)
    return out


def noise_band(baseline: Result | None) -> tuple[float, bool]:
    """(band in %, measured?) from the baseline-deployed repeats; the floor, unmeasured, with fewer than two."""
    return common.noise_band([[o.tgs for o in baseline.passed]] if baseline else [], BAND_FLOOR)


def delta(result: Result, reference: float | None) -> float | None:
    if result.tgs is None or not reference:
        return None
    return (result.tgs - reference) / reference * 100


def failure_word(outcome: Outcome) -> str:
    if outcome.status == "HANG":
        return f"HANG ({outcome.detail})"
    return "FAIL (oom)" if outcome.is_oom else f"FAIL ({outcome.reason or outcome.status.lower()})"


def verdict(result: Result, reference: float | None, band: float) -> str:
    if result.name == DEPLOYED:
        return "reference" if result.ok else failure_word(result.failed[0])
    if result.failed:
        word = failure_word(result.failed[0])
        return word if not result.passed else f"{word} in {len(result.failed)}/{len(result.outcomes)}"
    d = delta(result, reference)
    if d is None:
        return "—"
    return "win" if d > band else "loss" if d < -band else "within noise"


@dataclass
class Ranking:
    results: dict[str, Result]
    band: float
    measured: bool
    reference: float | None

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> Ranking:
        found = results(outcomes)
        base = found.get(DEPLOYED)
        band, measured = noise_band(base)
        return cls(found, band, measured, base.tgs if base else None)

    def delta(self, name: str) -> float | None:
        return delta(self.results[name], self.reference)

    def verdict(self, name: str) -> str:
        return verdict(self.results[name], self.reference, self.band)

    @property
    def profiles(self) -> list[Result]:
        """Catalog profiles only (not the baseline pair)."""
        return [r for n, r in self.results.items() if n not in (DEPLOYED, NO_ENV)]

    @property
    def winner(self) -> Result | None:
        wins = [r for r in self.profiles if self.verdict(r.name) == "win"]
        return max(wins, key=lambda r: r.tgs or 0.0, default=None)

    @property
    def tied_with_winner(self) -> list[str]:
        """Other winning profiles within the band of the winner (common.pick): as good, as far as the runs
        tell. The winner stays the higher mean (there is no "smaller" among profiles); the report says it."""
        wins = {r.name: r.tgs for r in self.profiles if self.verdict(r.name) == "win" and r.tgs}
        chosen = common.pick(wins, self.band, lambda tied: tied[0])
        return [n for n in chosen.tied if n != chosen.best] if chosen else []

    def ordered(self) -> list[Result]:
        """By mean TGS, best first; profiles with no passing run last."""
        return sorted(self.results.values(), key=lambda r: (r.tgs is None or bool(r.failed), -(r.tgs or 0.0)))


def early_win(ranking: Ranking) -> Result | None:
    """The seed's stop rule: a profile >= +5 % over baseline-deployed and outside the band."""
    best = ranking.winner
    d = ranking.delta(best.name) if best else None
    return best if d is not None and d >= EARLY_WIN else None


# --- 2. the report ---
def _fmt_time(seconds: float | None) -> str:
    return f"{seconds:.4g} s" if seconds is not None else "—"


def leaderboard(ranking: Ranking, skipped: list[str]) -> str:
    winner = ranking.winner
    rows = []
    for result in ranking.ordered():
        word = ranking.verdict(result.name)
        if winner is not None and result.name == winner.name:
            word += " ← winner"
        runs = f"{len(result.passed)}/{len(result.outcomes)}"
        rows.append(
            [
                result.name,
                runs,
                common.fmt_tgs(result.tgs),
                _fmt_time(result.step_time),
                "—" if result.name == DEPLOYED else common.fmt_pct(ranking.delta(result.name), True),
                word,
            ]
        )
    headers = ["Profile", "Runs", "TGS/device (mean)", "Step time", "Δ vs baseline-deployed", "Verdict"]
    lines = [common.table(headers, rows)]
    if ranking.measured:
        lines.append(
            f"Noise band: ±{ranking.band:.1f}% (the max-min spread of the {DEPLOYED} runs, floor {BAND_FLOOR:g}%)."
        )
    else:
        lines.append(
            f"Noise band: unknown (one {DEPLOYED} run); verdicts use the {BAND_FLOOR:g}% floor alone, so a win"
            " needs confirming with --repeats 2 or more."
        )
    lines.append(
        f"Winner: {winner.name} ({common.fmt_pct(ranking.delta(winner.name), True)})." if winner else "Winner: none."
    )
    if winner is not None and ranking.tied_with_winner:
        lines.append(
            f"Within the ±{ranking.band:.1f}% band of the winner (a tie as far as the runs tell; confirm with more"
            f" --repeats before choosing): {', '.join(ranking.tied_with_winner)}."
        )
    if skipped:
        lines.append(f"Not run (the +{EARLY_WIN:g}% stop rule ended the search): {', '.join(skipped)}.")
    return "\n".join(lines) + "\n"


@dataclass
class Inventory:
    model: str
    nodes: str
    settings: list[str]  # parallelism / batch keys from the config, EXTRA overrides applied
    env_file: str | None
    deployed_flags: str | None
    image_flags: str | None

    @classmethod
    def of(cls, model, num_nodes, nodes, extra, ranking: Ranking) -> Inventory:
        keys = maxtext_config.load_yaml_keys(str(REPO_ROOT / "configs" / f"{model}.yml"))
        keys.update(maxtext_config.parse_overrides([a for a in extra if not a.startswith("_env_")]))
        wanted = [k for k in keys if k.endswith("_parallelism")] + [k for k in _INVENTORY_KEYS if k in keys]
        env_file = REPO_ROOT / "configs" / f"{model}.env.sh"
        where = ",".join(nodes) if nodes else "this machine (--local)"
        return cls(
            model,
            f"{num_nodes} × {where}",
            [f"{k}={keys[k]}" for k in wanted],
            f"configs/{model}.env.sh" if env_file.exists() else None,
            _logged_flags(ranking.results.get(DEPLOYED)),
            _logged_flags(ranking.results.get(NO_ENV)),
        )


_XLA_LINE = re.compile(r"\[_train\] XLA_FLAGS=(.*)$", re.M)


def _logged_flags(result: Result | None) -> str | None:
    """XLA_FLAGS as the training tier printed them in the first readable log of RESULT."""
    for outcome in result.outcomes if result else []:
        try:
            found = _XLA_LINE.search(Path(outcome.log).read_text(errors="replace")) if outcome.log else None
        except OSError:
            continue
        if found:
            return found.group(1).strip()
    return None


def report(
    sweep_id: str,
    catalog: Path,
    plan: Plan,
    profiles: list[Profile],
    ranking: Ranking,
    skipped: list[str],
    inventory: Inventory,
) -> str:
    """<model>-tuning.md: what was measured, the leaderboard, the winner's recipe, what did not help."""
    by_name = {p.name: p for p in profiles}
    tried = [r for r in ranking.profiles if r.outcomes]
    out = [
        f"# XLA tuning: {plan.model}, {plan.num_nodes} node(s)\n",
        f"- Sweep `{sweep_id}`, {time.strftime('%Y-%m-%d %H:%M')}; catalog `{catalog}`",
        f"- Nodes: {inventory.nodes}; {plan.repeats} run(s) per profile; every job: `{' '.join(plan.args)}`",
        "- Metric: mean Tokens/s/device over the steady steps (5-14 by default), the job verdict's own number;"
        " per profile the mean of its runs\n",
        "## Inventory\n",
        f"- Config: `configs/{plan.model}.yml`: " + (", ".join(f"`{s}`" for s in inventory.settings) or "(no keys)"),
        f"- Model env file: `{inventory.env_file}`" if inventory.env_file else "- Model env file: none",
        f"- Deployed XLA_FLAGS ({DEPLOYED}'s log): `{inventory.deployed_flags or 'not found in the log'}`",
        f"- Image XLA_FLAGS (restore_default, {NO_ENV}'s log): `{inventory.image_flags or 'not found in the log'}`\n",
        "## Leaderboard\n",
        leaderboard(ranking, skipped),
        "## Effect of the deployed settings\n",
        _env_effect(ranking) + "\n",
        "## Result\n",
        _conclusion(ranking, tried, skipped),
    ]
    winner = ranking.winner
    if winner is not None:
        out += ["## Deployment recipe\n", _recipe(by_name[winner.name], plan, sweep_id)]
    out += ["## Negative findings\n", _negatives(ranking, by_name)]
    out += ["## Profiles\n", _profile_table(profiles, skipped)]
    out += ["## Jobs\n", _jobs(ranking)]
    return "\n".join(out) + "\n"


def _env_effect(ranking: Ranking) -> str:
    no_env = ranking.results.get(NO_ENV)
    if no_env is None or not no_env.ok:
        word = failure_word(no_env.failed[0]) if no_env and no_env.failed else "not run"
        return f"`{NO_ENV}` (restore_default): {word}; the effect of the deployed flags is unknown."
    d = ranking.delta(NO_ENV)
    text = f"`{NO_ENV}` (the image's own XLA_FLAGS) is {common.fmt_pct(d, True)} vs `{DEPLOYED}`: "
    verdict_word = ranking.verdict(NO_ENV)
    if verdict_word == "win":
        return text + "the deployed settings cost throughput on this cell; review configs/<model>.env.sh."
    if verdict_word == "loss":
        return text + "the deployed settings help on this cell; keep them."
    return text + "within noise: the deployed settings neither help nor hurt measurably here."


def _conclusion(ranking: Ranking, tried: list[Result], skipped: list[str]) -> str:
    winner = ranking.winner
    best = max((ranking.delta(r.name) for r in tried if r.ok and ranking.delta(r.name) is not None), default=None)
    band = f"±{ranking.band:.1f}%"
    lines = []
    if winner is not None:
        lines.append(
            f"Winner: **{winner.name}**, {common.fmt_tgs(winner.tgs)} TGS/device,"
            f" {common.fmt_pct(ranking.delta(winner.name), True)} vs `{DEPLOYED}` (outside the {band} band)."
        )
    else:
        lines.append(f"No win: {len(tried)} profile(s) tried, none above `{DEPLOYED}` by more than the {band} band.")
    if skipped:
        lines.append(
            f"The search ended early: a win of at least +{EARLY_WIN:g}% is the seed's stop rule;"
            f" {len(skipped)} profile(s) were not run."
        )
    elif len(tried) >= BOUNDED_AFTER and (best is None or best <= BOUNDED_BELOW):
        lines.append(
            f"Structurally bounded at this scope: {len(tried)} profiles tried and none beats `{DEPLOYED}` by more"
            f" than +{BOUNDED_BELOW:g}% (best {common.fmt_pct(best, True)}). Further gains need changes outside"
            " XLA/collective flags (batch size, parallelism, the model code)."
        )
    elif winner is None or (best is not None and best < EARLY_WIN):
        lines.append(
            f"{len(tried)} profile(s) tried: the seed's conclusions need a +{EARLY_WIN:g}% win or at least"
            f" {BOUNDED_AFTER} profiles without +{BOUNDED_BELOW:g}%; extend the catalog to close the question."
        )
    return "\n".join(lines) + "\n"


def _recipe(profile: Profile, plan: Plan, sweep_id: str) -> str:
    flags = " ".join(profile.xla_flags)
    lines = [f"Profile `{profile.name}`" + (f": {profile.description}" if profile.description else "") + "\n"]
    lines += ["Try it on any job first (the profile file this sweep used):\n", "```bash"]
    if plan.nodes:
        lines.append(f"./submit.sh {plan.model} -N {plan.num_nodes} -w {','.join(plan.nodes)} -- \\")
    else:
        lines.append(f"./run_local.sh {plan.model} -- \\")
    lines.append(f"  _env_TUNE_PROFILE_FILE={plan.profile_dir}/{profile.name}.profile")
    lines += ["```\n", f"Deploy for every {plan.model} job: append to `configs/{plan.model}.env.sh`:\n", "```bash"]
    if flags:
        lines.append(f"append_xla_flags {flags}")
    lines += [f"export {k}={_shell_word(v)}" for k, v in profile.env]
    lines += [
        "```\n",
        f"or, to keep it opt-in, add it as a named case `{profile.name.replace('-', '_')})` in `apply_tune_profile`"
        " (train_env.sh): the flags in block 1 (`append_xla_flags ...`), the environment in block 2.",
        f"Re-measure after deploying: `jobkit sweep xla {plan.model} ... --profiles <next candidates>`"
        f" (this sweep: `{sweep_id}`).",
    ]
    return "\n".join(lines) + "\n"


def _shell_word(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z0-9_.,:/=+-]*", value) else "'" + value.replace("'", "'\\''") + "'"


def _describe(profile: Profile | None) -> str:
    if profile is None:
        return ""
    parts = list(profile.xla_flags) + [f"{k}={v}" for k, v in profile.env]
    return " ".join(f"`{p}`" for p in parts)


def _negatives(ranking: Ranking, by_name: dict[str, Profile]) -> str:
    rows = []
    for result in ranking.ordered():
        word = ranking.verdict(result.name)
        if result.name in (DEPLOYED, NO_ENV) or word in ("win", "within noise"):
            continue
        evidence = result.failed[0].detail if result.failed else ""
        rows.append(
            [
                result.name,
                common.fmt_pct(ranking.delta(result.name), True),
                word,
                _describe(by_name.get(result.name)),
                evidence,
            ]
        )
    if not rows:
        return "None: no profile lost throughput or failed.\n"
    intro = (
        "Profiles that cost throughput or failed (failures are never retried for OOM or an unknown flag;"
        " an unknown flag means this XLA build does not have it: drop it from the catalog):\n\n"
    )
    return intro + common.table(["Profile", "Δ", "Verdict", "Settings", "Evidence"], rows)


def _profile_table(profiles: list[Profile], skipped: list[str]) -> str:
    rows = [
        [p.name, _describe(p), ",".join(p.parallelism) or "any", "not run (stop rule)" if p.name in skipped else "run"]
        for p in profiles
    ]
    return common.table(["Profile", "Settings", "Parallelism", "Run"], rows)


def _jobs(ranking: Ranking) -> str:
    outcomes = sorted(
        (o for r in ranking.results.values() for o in r.outcomes), key=lambda o: (len(o.job_id), o.job_id)
    )
    rows = [
        [o.key, o.job_id or "—", common.fmt_status(o), common.fmt_tgs(o.tgs), _fmt_time(o.step_time), o.log or "—"]
        for o in outcomes
    ]
    return common.table(["Point", "Job", "Status", "TGS/device", "Step time", "Log"], rows)
