"""The catalog side of `jobkit sweep xla`: which profiles a sweep runs, and the jobs they become.

1. Loading and checking the catalog YAML (`profiles:` name -> description, xla_flags, env, parallelism):
   anything wrong is one SweepError naming the file and the key, raised before a sweep dir exists.
2. Choosing the profiles (--profiles, --parallelism) and refusing EXTRA that would undo them.
3. The sweep's own copy of the catalog (a resumed sweep runs what it started with).
4. Each profile as a TUNE_PROFILE_FILE file (lines `--flag` and `NAME=VALUE`, read by train_env.sh),
   and the points: the baseline pair and the profiles, repeats as points of their own (`name#r`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from jobkit.core import config as maxtext_config
from jobkit.core.paths import CONFIGS_DIR
from jobkit.sweep import state
from jobkit.sweep.jobs import Point

DEPLOYED, NO_ENV = "baseline-deployed", "baseline-no-env"  # the baseline pair; catalog names may not take them
PROFILE_KEYS = {"description", "xla_flags", "env", "parallelism"}
# The parallelism axes --parallelism may name besides a catalog's own tags (a model's axis that no profile is
# tagged with keeps only the untagged profiles, on purpose): data, fully sharded data, tensor, pipeline,
# sequence, context, expert, and a mix.
PARALLELISM_TAGS = ("dp", "fsdp", "tp", "pp", "sp", "cp", "ep", "hybrid")
CATALOG_KEYS = {"profiles", "description"}
SAVED_NAME = "catalog.yml"  # the sweep dir's copy
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG = re.compile(r"^--[A-Za-z0-9_]+(=\S*)?$")  # what train_env.sh accepts as a flag line
# Settings the driver owns: a job-wide _env_ of these would undo what each profile sets.
_DRIVER_ENV = {"XLA_FLAGS", "TUNE_PROFILE", "TUNE_PROFILE_FILE"}
# The name families a profile may set: the list train_env.sh holds TUNE_PROFILE_FILE lines to.
TUNE_ENV_PREFIXES_FILE = CONFIGS_DIR / "tune_env_prefixes.txt"


def tune_env_prefixes() -> tuple[str, ...]:
    """The prefixes of configs/tune_env_prefixes.txt (comments and blank lines skipped)."""
    lines = TUNE_ENV_PREFIXES_FILE.read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


# --- 1. loading and checking ---
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
    except UnicodeDecodeError:
        raise state.SweepError(f"catalog {where}: cannot read it (not UTF-8 text); give a YAML file") from None
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


def _profile_env(at: str, env) -> list[tuple[str, str]]:
    """A profile's env: mapping as (NAME, value) pairs; SweepError naming the first bad entry."""
    if not isinstance(env, dict):
        raise state.SweepError(f"{at}.env: must be a mapping NAME: value")
    pairs = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            hint = " (YAML reads on/off/yes/no as true/false: quote the name)" if isinstance(key, bool) else ""
            raise state.SweepError(f"{at}.env: {key!r} is not an environment variable name (letters, digits, _){hint}")
        if key in _DRIVER_ENV:
            raise state.SweepError(f"{at}.env.{key}: set by the sweep itself; put XLA flags under xla_flags")
        if not key.startswith(tune_env_prefixes()):
            raise state.SweepError(
                f"{at}.env.{key}: not a tuning variable (a profile may set names starting with "
                f"{', '.join(tune_env_prefixes())}; see {TUNE_ENV_PREFIXES_FILE.name})"
            )
        if value is None or isinstance(value, dict | list) or "\n" in str(value):
            raise state.SweepError(f"{at}.env.{key}: the value must be one line of text or a number")
        pairs.append((key, _env_value(value)))
    return pairs


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
    pairs = _profile_env(at, body.get("env") or {})
    if not flags and not pairs:
        raise state.SweepError(f"{at}: empty profile (no xla_flags, no env); it would be the baseline again")
    tags = body.get("parallelism") or []
    tags = [tags] if isinstance(tags, str) else tags
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise state.SweepError(f"{at}.parallelism: must be a tag or a list of tags (e.g. [fsdp, pp])")
    return Profile(name, description.strip(), tuple(flags), tuple(pairs), tuple(t.lower() for t in tags))


# --- 2. choosing the profiles ---
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
        tagged = sorted({t for p in profiles for t in p.parallelism})
        if tag not in tagged and tag not in PARALLELISM_TAGS:
            # A tag no profile has keeps the untagged ones only: a typo (fsdpp) would silently drop the ones wanted.
            others = sorted(set(PARALLELISM_TAGS) - set(tagged))
            raise state.SweepError(
                f"--parallelism {parallelism!r} is not a parallelism tag (catalog {where} tags: {', '.join(tagged) or 'none'};"
                f" others: {', '.join(others)}); give one of them or leave --parallelism out"
            )
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


# --- 3. the sweep's copy ---
def save_copy(sweep_dir: Path, catalog: Path) -> None:
    """Keep the catalog as the sweep started with it (once: a resume must not pick up later edits)."""
    saved = sweep_dir / SAVED_NAME
    if not saved.exists():
        saved.write_text(catalog.read_text())


def resumed_copy(sweep_id: str | None) -> Path | None:
    """The saved catalog of sweep SWEEP_ID, if it was started before (so --id names a resume)."""
    if not sweep_id:
        return None
    try:
        path = state.sweeps_dir() / state.check_id(sweep_id) / SAVED_NAME
    except state.SweepError:
        return None  # execute() reports the bad id
    return path if path.is_file() else None


# --- 4. profile files and points ---
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
