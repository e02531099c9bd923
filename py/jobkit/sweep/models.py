"""`jobkit sweep models`: every production model at its node counts, on this checkout or two commits side by side.

What runs comes from a table in the repo (configs/sweeps/models.yml, or --table): each model with its node
counts, and a placement that pins every node count to fixed positions of -w, so a model x node count runs
on the same nodes in every sweep and a TGS difference is the code's, not the hardware's.

One commit (the default) submits from this checkout as it is. Two commits (--commits BASE CANDIDATE):
  1. each commit gets a git worktree of its own under the sweep dir (detached, never touching this
     checkout), and its jobs are submitted from there, so submit.sh snapshots exactly that commit;
  2. the jobs share this checkout's venv (VENV_DIR): setup_env.sh keys a venv on requirements.lock,
     py/pyproject.toml and the interpreter, not on the tree, so a commit with the same two files finds it
     current; a commit with others would rebuild it from its own tree, which is refused up front;
  3. baseline and candidate jobs are interleaved per model, so each model compares as soon as both land;
  4. two models that pass on the baseline but fail on the candidate stop the sweep (the commit is
     broken); `jobkit sweep resume` runs the rest anyway;
  5. the worktrees are removed at the end, however the sweep ends.
Every job adds dataset_type=synthetic (no data dependency) and steps=N.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import click
import yaml

from jobkit.core.errors import JobkitError
from jobkit.core.paths import REPO_ROOT
from jobkit.sweep import common, state
from jobkit.sweep.engine import Engine, SweepStopped
from jobkit.sweep.jobs import Outcome, Point

TABLE = Path("configs") / "sweeps" / "models.yml"  # relative to the repo
REGRESSION, WATCH = -5.0, -2.0  # percent TGS change: flagged, worth a look
STOP_AFTER_BROKEN = 2  # models newly failing on the candidate before the sweep stops
# A commit's jobs share this checkout's venv only when these match (what setup_env.sh's stamp digest covers).
VENV_INPUTS = ("requirements.lock", "py/pyproject.toml")


# --- the table ---
@dataclass(frozen=True)
class Entry:
    model: str
    nodes: int


@dataclass(frozen=True)
class Table:
    path: Path
    placement: dict[int, tuple[int, ...]]  # node count -> 1-based positions in -w
    entries: tuple[Entry, ...]  # every model x node count, in table order
    opt_in: frozenset[str]  # models that run only when --only names them

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(e.model for e in self.entries))


def _positions(text, count: int, where: str) -> tuple[int, ...]:
    """'3-4' or '1' or [3, 4] -> (3, 4), checked to be COUNT distinct positions >= 1."""
    try:
        if isinstance(text, list):
            found = tuple(int(v) for v in text)
        else:
            first, _, last = str(text).partition("-")
            found = tuple(range(int(first), int(last or first) + 1))
    except ValueError as exc:
        raise state.SweepError(f"{where}: {text!r} is not a position range like '3-4'") from exc
    if len(found) != count or len(set(found)) != count or min(found) < 1:
        raise state.SweepError(f"{where}: {text!r} must name {count} distinct positions (1 = first node of -w)")
    return found


def load_table(path: Path, repo: Path) -> Table:
    """The table at PATH, checked against REPO's configs; SweepError naming the first problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise state.SweepError(f"cannot read the model table {path} ({exc.strerror}); give one with --table") from exc
    except UnicodeDecodeError:
        raise state.SweepError(f"cannot read the model table {path} (not UTF-8 text); give one with --table") from None
    except yaml.YAMLError as exc:
        raise state.SweepError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix it") from exc
    if not isinstance(data, dict) or set(data) - {"placement", "models"} or not data.get("models"):
        raise state.SweepError(f"{path}: want a mapping with `placement:` and a non-empty `models:` list only")
    placement = {}
    for count, spec in (data.get("placement") or {}).items():
        if not isinstance(count, int) or count < 1:
            raise state.SweepError(f"{path}: placement key {count!r} is not a node count")
        placement[count] = _positions(spec, count, f"{path}: placement {count}")
    entries, opt_in = [], set()
    for item in data["models"]:
        if not isinstance(item, dict) or "model" not in item or set(item) - {"model", "nodes", "opt_in", "why"}:
            raise state.SweepError(f"{path}: {item!r} is not `- model: NAME` with nodes/opt_in/why only")
        model = str(item["model"])
        if not (repo / "configs" / f"{model}.yml").is_file():
            raise state.SweepError(f"{path}: model {model!r} has no configs/{model}.yml; fix the table")
        counts = item.get("nodes") or [1]
        if not isinstance(counts, list) or not all(isinstance(c, int) for c in counts):
            raise state.SweepError(f"{path}: {model}: nodes must be a list of node counts, e.g. [1, 2]")
        for count in counts:
            if count not in placement:
                raise state.SweepError(f"{path}: {model} runs on {count} nodes, but placement has no {count}: add it")
            entries.append(Entry(model, count))
        if item.get("opt_in"):
            opt_in.add(model)
    if len(set(entries)) != len(entries):
        raise state.SweepError(f"{path}: a model x node count appears twice; list each once")
    return Table(path, placement, tuple(entries), frozenset(opt_in))


def select(table: Table, only: str | None, repo: Path) -> list[Entry]:
    """The entries to run: --only's models (names, aliases or unique parts), else all but the opt-in ones."""
    if not only:
        return [e for e in table.entries if e.model not in table.opt_in]
    wanted = []
    for name in (n.strip() for n in only.split(",")):
        if not name:
            continue
        try:
            model = name if name in table.models else common.resolve_model(name, repo)
        except state.SweepError:
            model = None
        if model not in table.models:
            raise state.SweepError(
                f"--only names {name!r}, which is no model of {table.path}; it has: {', '.join(table.models)}"
            )
        wanted.append(model)
    return [e for e in table.entries if e.model in wanted]


def place(entries: list[Entry], table: Table, nodes: tuple[str, ...]) -> dict[Entry, tuple[str, ...]]:
    """Each entry's nodes: the placement's positions in -w; SweepError when -w is too short."""
    placed = {}
    for entry in entries:
        positions = table.placement[entry.nodes]
        if max(positions) > len(nodes):
            raise state.SweepError(
                f"-w has {len(nodes)} node(s), but {entry.model} {entry.nodes}N runs on positions "
                f"{positions[0]}-{positions[-1]} of it (placement in {table.path}); give at least "
                f"{max(positions)} nodes or leave it out with --only"
            )
        placed[entry] = tuple(nodes[p - 1] for p in positions)
    return placed


# --- commits and their trees ---
@dataclass
class Side:
    role: str  # base | cand
    name: str  # as the user gave it
    sha: str
    tree: Path | None = None

    @property
    def short(self) -> str:
        return self.sha[:10]

    @property
    def shown(self) -> str:
        """The name as given, or the short sha when that name was a sha itself."""
        return self.short if self.sha.startswith(self.name.lower()) else self.name

    @property
    def title(self) -> str:
        return f"{self.shown} ({self.short})" if self.shown != self.short else self.short


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)


def resolve_commit(repo: Path, name: str) -> str:
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}") if not name.startswith("-") else None
    if found is None or found.returncode != 0:
        raise state.SweepError(f"unknown commit {name!r}: no commit, branch or tag of {repo} has that name (git log)")
    return found.stdout.strip()


def has_config(repo: Path, sha: str, model: str) -> bool:
    return _git(repo, "cat-file", "-e", f"{sha}:configs/{model}.yml").returncode == 0


def shared_venv(repo: Path, sides: list[Side]) -> str | None:
    """The VENV_DIR for jobs from the commits' trees: this checkout's venv; None when the user set VENV_DIR.
    SweepError when a commit's jobs would rebuild it (other pins) or it is not current itself."""
    if os.environ.get("VENV_DIR"):
        return None  # the user's choice, taken as is
    venv = repo / ".venv"
    for side in sides:
        for path in VENV_INPUTS:
            theirs = _git(repo, "show", f"{side.sha}:{path}")
            ours = (repo / path).read_text() if (repo / path).is_file() else None
            if (theirs.stdout if theirs.returncode == 0 else None) != ours:
                raise state.SweepError(
                    f"commit {side.title} has another {path} than this checkout, so its jobs would rebuild {venv} "
                    f"from its own tree; build a venv for it (VENV_DIR=DIR utils/setup_env.sh in a checkout of it) "
                    "and rerun with VENV_DIR=DIR"
                )
    check = subprocess.run(
        [str(repo / "utils" / "setup_env.sh"), "--check"],
        env=dict(os.environ, VENV_DIR=str(venv)),
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    if check.returncode != 0:
        raise state.SweepError(
            f"the venv {venv} is missing or not current (utils/setup_env.sh --check); run utils/setup_env.sh first: "
            "the commits' jobs share it and must not rebuild it from their own trees"
        )
    return str(venv)


class Trees:
    """Detached worktrees of the sweep's commits under DIR; `remove_all` takes away every one it made."""

    def __init__(self, repo: Path, base: Path):
        self.repo = repo
        self.base = base
        self.made: list[Path] = []

    def add(self, side: Side) -> Path:
        path = self.base / f"{side.role}-{side.short}"
        _git(self.repo, "worktree", "prune")  # a tree of an earlier, killed run may still be registered
        if path.exists():
            self._remove(path)
        self.base.mkdir(parents=True, exist_ok=True)
        made = _git(self.repo, "worktree", "add", "--detach", str(path), side.sha)
        if made.returncode != 0:
            raise state.SweepError(f"git worktree add for {side.title} failed: {made.stderr.strip().splitlines()[-1]}")
        self.made.append(path)
        return path

    def _remove(self, path: Path) -> None:
        if _git(self.repo, "worktree", "remove", "--force", str(path)).returncode != 0 and path.exists():
            shutil.rmtree(path, ignore_errors=True)  # not (or no longer) a registered worktree: just files
            _git(self.repo, "worktree", "prune")

    def remove_all(self) -> None:
        for path in self.made:
            self._remove(path)
        self.made.clear()
        if self.base.is_dir() and not any(self.base.iterdir()):
            self.base.rmdir()


# --- points ---
def key(side: Side | None, entry: Entry) -> str:
    head = f"{side.role}-{side.short}:" if side else ""
    return f"{head}{entry.model}:{entry.nodes}N"


def job_args(extra: tuple[str, ...], steps: int) -> tuple[str, ...]:
    args = extra if any(a.startswith("dataset_type=") for a in extra) else (*extra, "dataset_type=synthetic")
    return common.with_steps(args, steps)


def absent_keys(repo: Path, entries: list[Entry], sides: list[Side]) -> set[str]:
    """Keys of entries whose model has no config in that commit: shown as absent, never submitted."""
    return {key(s, e) for e in entries for s in sides if not has_config(repo, s.sha, e.model)}


def points(
    entries: list[Entry],
    placed: dict[Entry, tuple[str, ...]],
    sides: list[Side],
    args: tuple[str, ...],
    absent: set[str],
) -> list[Point]:
    """Baseline then candidate for each entry in table order (one commit: this checkout, side None)."""
    todo = []
    for entry in entries:
        for side in sides or [None]:
            if key(side, entry) in absent:
                continue
            label = f"{entry.model} {entry.nodes}N" + (f" @{side.shown}" if side else "")
            todo.append(
                Point(
                    key(side, entry),
                    entry.model,
                    entry.nodes,
                    placed.get(entry, ()),
                    args,
                    repo=str(side.tree) if side else None,
                    label=label,
                )
            )
    return todo


# --- verdicts and reports ---
def compare(base: Outcome | None, cand: Outcome | None) -> tuple[float | None, str]:
    """(Δ TGS %, verdict) of one model x node count across the two commits."""
    if base is None or cand is None:
        return None, "not run"
    if base.passed and cand.passed:
        if base.tgs is None or cand.tgs is None or base.tgs <= 0:
            return None, "no TGS to compare"
        delta = (cand.tgs - base.tgs) / base.tgs * 100
        if delta < REGRESSION:
            return delta, "REGRESSION"
        if delta < WATCH:
            return delta, f"slower (within {-REGRESSION:g} %)"
        return delta, "faster" if delta > -REGRESSION else "same"
    if base.passed:
        return None, "NEW BREAKAGE"
    if cand.passed:
        return None, "fixed"
    return None, "pre-existing failure"


def _cell(outcome: Outcome | None, absent: bool) -> tuple[str, str]:
    """(job, TGS or status) cells for one side."""
    if absent:
        return "—", "absent"
    if outcome is None:
        return "—", "not run"
    return outcome.job_id or "—", common.fmt_tgs(outcome.tgs) if outcome.passed else common.fmt_status(outcome)


def checkout_title(repo: Path) -> str:
    """This checkout as the one-commit report names it: its HEAD, and whether tracked files differ from it."""
    head = _git(repo, "rev-parse", "--short=10", "HEAD").stdout.strip() or "no commit"
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return f"this checkout (HEAD {head}{', with uncommitted changes' if dirty else ''})"


def report_one(entries: list[Entry], outcomes: dict[str, Outcome], title: str, notes: list[str]) -> str:
    rows, failed = [], []
    for entry in entries:
        outcome = outcomes.get(key(None, entry))
        if outcome is None:
            rows.append([entry.model, f"{entry.nodes}N", "—", "—", "—", "not run"])
            continue
        rows.append(
            [
                entry.model,
                f"{entry.nodes}N",
                outcome.job_id or "—",
                common.fmt_tgs(outcome.tgs),
                common.fmt_pct(outcome.mfu),
                common.fmt_status(outcome),
            ]
        )
        if not outcome.passed:
            failed.append(f"{entry.model} {entry.nodes}N ({common.fmt_status(outcome)})")
    ran = sum(1 for e in entries if key(None, e) in outcomes)
    lines = [
        f"## Model sweep: {title}\n",
        common.table(["Model", "Nodes", "Job", "TGS/device", "MFU", "Status"], rows),
        f"{ran - len(failed)} of {len(entries)} jobs passed." + (f" Failed: {'; '.join(failed)}." if failed else ""),
        *notes,
    ]
    return "\n".join(lines) + "\n"


def report_two(
    entries: list[Entry], sides: list[Side], outcomes: dict[str, Outcome], absent: set[str], notes: list[str]
) -> str:
    base, cand = sides
    rows = []
    flagged: dict[str, list[str]] = {"REGRESSION": [], "NEW BREAKAGE": [], "pre-existing failure": []}
    for entry in entries:
        missing = [key(s, entry) in absent for s in sides]
        got = [outcomes.get(key(s, entry)) for s in sides]
        delta, word = compare(*got)
        if any(missing):
            word = f"absent in {', '.join(s.shown for s, m in zip(sides, missing, strict=True) if m)}"
        for flag, names in flagged.items():
            if word.startswith(flag):
                names.append(f"{entry.model} {entry.nodes}N")
        rows.append(
            [entry.model, f"{entry.nodes}N", *_cell(got[0], missing[0]), *_cell(got[1], missing[1])]
            + [common.fmt_pct(delta, True), word]
        )
    headers = ["Model", "Nodes", "Base job", "Base TGS/device", "Cand job", "Cand TGS/device", "Δ TGS", "Verdict"]
    lines = [
        f"## Model sweep: baseline {base.title} vs candidate {cand.title}\n",
        common.table(headers, rows),
        f"Regressions (more than {-REGRESSION:g} % slower): {', '.join(flagged['REGRESSION']) or 'none'}",
        f"New breakage (fails on the candidate, passes on the baseline): {', '.join(flagged['NEW BREAKAGE']) or 'none'}",
        f"Pre-existing failures (fail on both): {', '.join(flagged['pre-existing failure']) or 'none'}",
        *notes,
    ]
    return "\n".join(lines) + "\n"


def stop_rule(engine: Engine, entries: list[Entry], sides: list[Side], summary):
    """An on_outcome hook: stop once STOP_AFTER_BROKEN models broke on the candidate in this run."""
    broken: list[str] = []
    by_key = {key(s, e): e for e in entries for s in sides}

    def check(point: Point, outcome: Outcome) -> None:
        entry = by_key.get(point.key)
        if entry is None:
            return
        _, word = compare(*(engine.outcomes.get(key(s, entry)) for s in sides))
        if word.startswith("NEW BREAKAGE") and entry.model not in broken:
            broken.append(entry.model)
        if len(broken) >= STOP_AFTER_BROKEN:
            text = summary()
            engine.sweep.write_summary(text)
            engine.echo("\n" + text.rstrip())
            raise SweepStopped(
                f"{', '.join(broken)} fail on the candidate but pass on the baseline: the commit looks broken "
                f"(table so far in {engine.sweep.summary_file}); run the rest anyway with "
                f"`jobkit sweep resume {engine.sweep.id}`"
            )

    return check


@common.driver_command("models")
@click.option("--commits", nargs=2, metavar="BASE CANDIDATE", help="Compare two commits (default: this checkout).")
@click.option("-w", "--nodelist", "nodelist", help="Nodes the table's placement picks from, e.g. 'node[1-8]'.")
@click.option("--table", "table_file", help=f"Model table (default {TABLE}).")
@click.option("--only", help="Comma-separated models of the table to run (opt-in ones too, e.g. tiny).")
@common.steps_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(commits, nodelist, table_file, only, steps, extra, **params):
    """Every model of the table at its node counts, each always on the same nodes; one commit or two side by side.

    EXTRA (after --) are MaxText key=value and _env_KEY=VALUE settings for every job; dataset_type=synthetic
    and steps are added.
    """
    repo = REPO_ROOT
    notes: list[str] = []
    # 1. every input checked before the sweep dir exists
    try:
        table = load_table(Path(table_file) if table_file else repo / TABLE, repo)
        entries = select(table, only, repo)
        nodes = common.parse_nodes(nodelist, local=bool(params.get("local")))
        if params.get("local"):
            dropped = [e for e in entries if e.nodes > 1]
            entries = [e for e in entries if e.nodes == 1]
            if dropped:
                notes.append(
                    "Left out (--local runs 1-node jobs only): " + ", ".join(f"{e.model} {e.nodes}N" for e in dropped)
                )
        if not entries:
            raise state.SweepError("nothing to run: the selection has no entry this mode can run (see --only, --local)")
        placed = place(entries, table, nodes) if nodes else {}
        roles = ("base", "cand")[: len(commits or ())]
        sides = [Side(role, name, resolve_commit(repo, name)) for role, name in zip(roles, commits or (), strict=True)]
        if len(sides) == 2 and sides[0].sha == sides[1].sha:
            raise state.SweepError(
                f"--commits {commits[0]} {commits[1]} name the same commit ({sides[0].sha[:10]}); comparing it with"
                " itself doubles the jobs for nothing: give two different commits, or leave --commits out"
            )
        absent = absent_keys(repo, entries, sides)
        venv = shared_venv(repo, sides) if sides else None
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    args = job_args(tuple(extra), steps)
    for note in notes:
        click.echo(f"[sweep] {note}")

    def body(engine: Engine) -> str:
        trees = Trees(repo, engine.sweep.path / "trees")
        try:
            # 2. a tree per commit; its jobs share this checkout's venv
            for side in sides:
                side.tree = trees.add(side)
            env = getattr(engine.runner, "env", None)
            if venv and isinstance(env, dict):
                env["VENV_DIR"] = venv
            if sides:
                engine.on_outcome = stop_rule(
                    engine, entries, sides, lambda: report_two(entries, sides, engine.outcomes, absent, notes)
                )
            todo = points(entries, placed, sides, args, absent)
            engine.run(todo)
            if sides:
                return report_two(entries, sides, engine.outcomes, absent, notes)
            return report_one(entries, engine.outcomes, checkout_title(repo), notes)
        finally:
            # 3. no job may still run from a tree about to go (a local job runs in it)
            engine.cancel_all()
            trees.remove_all()

    label = "-".join(dict.fromkeys(e.model for e in entries)) if only else "all"
    common.execute("models", label[:40], body)
