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

Noise band: the full max-min spread of the baseline-deployed repeats as a percentage of their mean, at
least 0.5 %. A profile's mean and the baseline's mean each carry run-to-run noise; the whole range the
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

import click
import yaml

from jobkit import config as maxtext_config
from jobkit.sweep import common, state
from jobkit.sweep.cli import group
from jobkit.sweep.engine import SweepStopped
from jobkit.sweep.jobs import REPO_ROOT, Outcome, Point

DEPLOYED, NO_ENV = "baseline-deployed", "baseline-no-env"
BAND_FLOOR = 0.5  # percent: below this, pinned-node noise cannot be told from a flag's effect
EARLY_WIN = 5.0  # percent over baseline-deployed that ends the search (the seed's stop rule)
BOUNDED_AFTER, BOUNDED_BELOW = 25, 2.0  # >= 25 profiles and none above +2 %: structurally bounded
PROFILE_KEYS = {"description", "xla_flags", "env", "parallelism"}
CATALOG_KEYS = {"profiles", "description"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG = re.compile(r"^--[A-Za-z0-9_]+(=\S*)?$")  # what train_env.sh accepts as a flag line
# Settings the driver owns: a job-wide _env_ of these would undo what each profile sets.
_DRIVER_ENV = {"XLA_FLAGS", "TUNE_PROFILE", "TUNE_PROFILE_FILE"}
_INVENTORY_KEYS = ("per_device_batch_size", "max_target_length", "remat_policy")


# --- 1. the catalog ---
@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    xla_flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    parallelism: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The profile as TUNE_PROFILE_FILE lines (what train_env.sh reads)."""
        return [*self.xla_flags, *(f"{k}={v}" for k, v in self.env)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (YAML itself would silently keep the last one)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _env_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def load_catalog(path: Path) -> list[Profile]:
    """The profiles of catalog PATH, in file order; SweepError (one line naming file and key) if it is bad."""
    where = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise state.SweepError(f"catalog {where}: cannot read it ({exc.strerror}); give an existing YAML file") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise state.SweepError(f"catalog {where}: not valid YAML{at} ({problem}); fix the file") from exc
    if not isinstance(data, dict):
        raise state.SweepError(f"catalog {where}: not a mapping; it needs a top-level `profiles:` mapping")
    unknown = sorted(set(map(str, data)) - CATALOG_KEYS)
    if unknown:
        raise state.SweepError(f"catalog {where}: unknown top-level key {unknown[0]!r} (known: profiles, description)")
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise state.SweepError(f"catalog {where}: `profiles` must be a non-empty mapping of name -> profile")
    return [_profile(where, name, body) for name, body in profiles.items()]


def _profile(where: str, name, body) -> Profile:
    at = f"catalog {where}: profiles.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise state.SweepError(f"{at}: the name must be letters, digits, '.', '_' or '-' (at most 60)")
    if name in (DEPLOYED, NO_ENV):
        raise state.SweepError(f"{at}: the name is reserved for the sweep's baseline; rename the profile")
    if body is None or body == {}:
        raise state.SweepError(f"{at}: empty profile; give it xla_flags and/or env")
    if not isinstance(body, dict):
        raise state.SweepError(f"{at}: must be a mapping with description, xla_flags, env, parallelism")
    unknown = sorted(set(map(str, body)) - PROFILE_KEYS)
    if unknown:
        raise state.SweepError(f"{at}: unknown key {unknown[0]!r} (known: {', '.join(sorted(PROFILE_KEYS))})")
    description = body.get("description") or ""
    if not isinstance(description, str):
        raise state.SweepError(f"{at}.description: must be text")
    flags = body.get("xla_flags") or []
    if not isinstance(flags, list):
        raise state.SweepError(f"{at}.xla_flags: must be a list of --flag=value strings")
    for flag in flags:
        if not isinstance(flag, str) or not _FLAG.match(flag):
            raise state.SweepError(f"{at}.xla_flags: {flag!r} is not a flag (--name=value, no spaces)")
    env = body.get("env") or {}
    if not isinstance(env, dict):
        raise state.SweepError(f"{at}.env: must be a mapping NAME: value")
    pairs = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            hint = " (YAML reads on/off/yes/no as true/false: quote the name)" if isinstance(key, bool) else ""
            raise state.SweepError(f"{at}.env: {key!r} is not an environment variable name (letters, digits, _){hint}")
        if key in _DRIVER_ENV:
            raise state.SweepError(f"{at}.env.{key}: set by the sweep itself; put XLA flags under xla_flags")
        if value is None or isinstance(value, dict | list) or "\n" in str(value):
            raise state.SweepError(f"{at}.env.{key}: the value must be one line of text or a number")
        pairs.append((key, _env_value(value)))
    if not flags and not pairs:
        raise state.SweepError(f"{at}: empty profile (no xla_flags, no env); it would be the baseline again")
    tags = body.get("parallelism") or []
    tags = [tags] if isinstance(tags, str) else tags
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise state.SweepError(f"{at}.parallelism: must be a tag or a list of tags (e.g. [fsdp, pp])")
    return Profile(name, description.strip(), tuple(flags), tuple(pairs), tuple(t.lower() for t in tags))


def select(profiles: list[Profile], names: str | None, parallelism: str | None, where: str) -> list[Profile]:
    """--profiles (in the order given) and --parallelism (tagged with it, or untagged) applied."""
    chosen = profiles
    if names:
        by_name = {p.name: p for p in profiles}
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise state.SweepError(
                f"--profiles: {missing[0]!r} is not in catalog {where} (it has: {', '.join(by_name)})"
            )
        chosen = [by_name[n] for n in dict.fromkeys(wanted)]
    if parallelism:
        tag = parallelism.lower()
        chosen = [p for p in chosen if not p.parallelism or tag in p.parallelism]
    if not chosen:
        raise state.SweepError(f"no profile of catalog {where} is left after --profiles / --parallelism")
    return chosen


def check_extra(extra: tuple[str, ...], profiles: list[Profile]) -> None:
    """EXTRA must not undo what the sweep controls (flags, profiles, synthetic data) nor mask a profile's env."""
    overrides = maxtext_config.parse_overrides([a for a in extra if not a.startswith("_env_")])
    if overrides.get("dataset_type", "synthetic") != "synthetic":
        raise state.SweepError(
            "tuning runs use synthetic data (real data's jitter hides 1-3 % effects); drop dataset_type="
        )
    job_env = {a[5:].partition("=")[0] for a in extra if a.startswith("_env_")}
    owned = sorted(job_env & _DRIVER_ENV)
    if owned:
        raise state.SweepError(
            f"_env_{owned[0]} would override every profile's settings; put them in a catalog profile"
        )
    for profile in profiles:
        clash = sorted(job_env & {k for k, _ in profile.env})
        if clash:
            raise state.SweepError(
                f"profile {profile.name} sets {clash[0]}, which _env_{clash[0]} after -- overrides in every job; drop one"
            )


# --- 2. the points ---
def key(name: str, repeat: int) -> str:
    return f"{name}#{repeat}"


def profile_name(point_key: str) -> str:
    return point_key.rsplit("#", 1)[0]


@dataclass(frozen=True)
class Plan:
    model: str
    num_nodes: int
    nodes: tuple[str, ...]
    args: tuple[str, ...]  # every job's: EXTRA, dataset_type=synthetic, steps
    repeats: int
    profile_dir: str  # relative to JOB_WORKSPACE (the container sees the workspace elsewhere)

    def point(self, name: str, repeat: int, added: tuple[str, ...]) -> Point:
        k = key(name, repeat)
        return Point(key=k, model=self.model, num_nodes=self.num_nodes, nodes=self.nodes, args=(*self.args, *added))

    def baseline_points(self) -> list[Point]:
        out = []
        for r in range(1, self.repeats + 1):
            out.append(self.point(DEPLOYED, r, ()))
            out.append(self.point(NO_ENV, r, ("_env_TUNE_PROFILE=restore_default",)))
        return out

    def profile_points(self, profiles: list[Profile]) -> list[Point]:
        """Repeats interleaved (a#1 b#1 a#2 b#2) so slow drift of the machine hits every profile alike."""
        return [
            self.point(p.name, r, (f"_env_TUNE_PROFILE_FILE={self.profile_dir}/{p.name}.profile",))
            for r in range(1, self.repeats + 1)
            for p in profiles
        ]


def write_profile_files(directory: Path, profiles: list[Profile], catalog: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for profile in profiles:
        head = [f"# jobkit sweep xla: profile {profile.name} from {catalog}"]
        head += [f"# {line}" for line in profile.description.splitlines()]
        (directory / f"{profile.name}.profile").write_text("\n".join([*head, *profile.lines()]) + "\n")


# --- 3. ranking ---
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
        """max - min of the passing runs, % of their mean (None with fewer than two)."""
        values = [o.tgs for o in self.passed]
        if len(values) < 2 or not self.tgs:
            return None
        return (max(values) - min(values)) / self.tgs * 100


def results(outcomes: list[Outcome]) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for outcome in outcomes:
        out.setdefault(profile_name(outcome.key), Result(profile_name(outcome.key))).outcomes.append(outcome)
    return out


def noise_band(baseline: Result | None) -> tuple[float, bool]:
    """(band in %, measured?) from the baseline-deployed repeats; the floor, unmeasured, with fewer than two."""
    spread = baseline.spread if baseline else None
    if spread is None:
        return BAND_FLOOR, False
    return max(BAND_FLOOR, spread), True


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

    def ordered(self) -> list[Result]:
        """By mean TGS, best first; profiles with no passing run last."""
        return sorted(self.results.values(), key=lambda r: (r.tgs is None or bool(r.failed), -(r.tgs or 0.0)))


def early_win(ranking: Ranking) -> Result | None:
    """The seed's stop rule: a profile >= +5 % over baseline-deployed and outside the band."""
    best = ranking.winner
    d = ranking.delta(best.name) if best else None
    return best if d is not None and d >= EARLY_WIN else None


# --- 4. the driver ---
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


@common.driver_command(group, "xla")
@click.argument("model")
@click.option("-N", "--nodes", "num_nodes", type=click.IntRange(1), default=1, show_default=True, help="Nodes per job.")
@click.option("-w", "--nodelist", "nodelist", help="Exactly -N nodes every job runs on, e.g. node[1-2].")
@click.option("--catalog", required=True, help="YAML catalog of profiles (configs/xla_catalogs/*.yml).")
@click.option("--repeats", type=click.IntRange(1, 10), default=2, show_default=True, help="Runs per profile.")
@click.option("--profiles", "profile_names", help="Only these catalog profiles, in this order (a,b,c).")
@click.option("--parallelism", help="Only profiles tagged with this parallelism (and untagged ones), e.g. fsdp.")
@click.option("--wave-size", type=click.IntRange(1, 50), default=5, show_default=True, help="Profiles per wave.")
@click.option("--steps", type=click.IntRange(1), default=15, show_default=True, help="Steps per job (steady 5-14).")
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
    params.update(
        model=model,
        num_nodes=num_nodes,
        nodelist=nodelist,
        catalog=str(catalog_path),
        repeats=repeats,
        profile_names=profile_names,
        parallelism=parallelism,
        wave_size=wave_size,
        steps=steps,
        extra=extra,
    )
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
        copy = _catalog_copy(params.get("sweep_id"))
        profiles = select(load_catalog(copy or catalog_path), profile_names, parallelism, str(catalog_path))
        check_extra(tuple(extra), profiles)
    except state.SweepError as exc:
        common.fail(str(exc))
    args = common.with_steps((*extra, "dataset_type=synthetic"), steps)

    def body(engine) -> str:
        sweep = engine.sweep
        saved = sweep.path / "catalog.yml"
        if not saved.exists():
            saved.write_text(catalog_path.read_text())
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

    common.execute("xla", params, model, body)


def _catalog_copy(sweep_id: str | None) -> Path | None:
    if not sweep_id:
        return None
    try:
        path = state.sweeps_dir() / state.check_id(sweep_id) / "catalog.yml"
    except state.SweepError:
        return None  # execute() reports the bad id
    return path if path.is_file() else None


# --- 5. the report ---
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
