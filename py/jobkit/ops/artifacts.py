"""`jobkit artifacts clean`: remove the code snapshots of jobs that can no longer need them.

submit.sh copies the launcher into `$JOB_WORKSPACE/.artifacts/<user>/artifact_<ts>_<hex>/` (read-only; before
per-user dirs: `.artifacts/artifact_<ts>_<hex>/`, still cleaned) for every job,
and the job runs from that copy; the job dir's `artifact` link names it. A requeued attempt may run from its
predecessor's snapshot, so a snapshot belongs to every job dir whose link names it, and it is kept while ANY
of them may still run:
- Slurm lists the job (squeue, all users': a workspace may be shared) in any state: queued, running, ending;
- or its log has no JOB SUMMARY yet and changed within LIVE_SECONDS (or it has no log and its job dir is that
  young), and sacct does not say it is over: a job squeue cannot show us (another cluster, hidden jobs);
- or no job dir links it yet and it is younger than FRESH_SECONDS: submit.sh links the snapshot only after
  sbatch answers, so a submission may be in flight.
Without an answer from squeue nothing is removed, unless --no-scheduler says no job runs (the log rule still
holds then: nobody says those jobs are over).

Only real directories named like a snapshot directly under .artifacts/ or a real dir in it (a user's) are
removed, never through a symlink (another user's 0700 dir cannot be read: its snapshots are not seen);
job dirs keep their `artifact` link, dangling afterwards: the job dir is the job's evidence, and the link's
name still says which snapshot (time stamp) it ran.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.core import failures, logparse, paths, slurm
from jobkit.core.errors import JobkitError
from jobkit.ops import jobs

SNAPSHOT = re.compile(r"^artifact_\d{8}_\d{6}_[0-9a-f]+$")
# Longer than the hang watchdog's default allowance before the first step (HANG_COMPILE_TIMEOUT, 3600 s), the
# longest a live job normally goes without writing to its log.
LIVE_SECONDS = 2 * 3600
FRESH_SECONDS = 3600
_QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"}


class ArtifactsError(Exception):
    """One line: what was wrong, and what to do instead."""


@dataclass
class JobRef:
    job_id: str
    job_dir: Path
    log: Path | None


@dataclass
class Snapshot:
    path: Path
    jobs: list[JobRef] = field(default_factory=list)
    keep: str = ""  # why it stays; empty: remove it
    name: str = ""  # its path under .artifacts/: `<user>/artifact_...` (`artifact_...` in the older layout)


def _snapshot_dirs(arts: Path) -> dict[str, Path]:
    """Name under ARTS -> path of each real snapshot dir in ARTS or in a real dir in ARTS (a user's)."""
    found = {}
    for entry in os.scandir(arts):
        if not entry.is_dir(follow_symlinks=False):
            continue
        if SNAPSHOT.match(entry.name):
            found[entry.name] = Path(entry.path)
            continue
        try:
            inner = list(os.scandir(entry.path))
        except OSError:  # another user's private dir
            continue
        for sub in inner:
            if SNAPSHOT.match(sub.name) and sub.is_dir(follow_symlinks=False):
                found[f"{entry.name}/{sub.name}"] = Path(sub.path)
    return found


def _linked_name(named: str, real_arts: str) -> str | None:
    """The name under .artifacts/ of the snapshot a job dir's link names, or None when it names no such dir.
    The parent dirs are resolved and compared, the names are taken as written: no link is followed past them."""
    parent = os.path.dirname(named)
    if os.path.realpath(parent) == real_arts:
        return os.path.basename(named)
    if os.path.realpath(os.path.dirname(parent)) == real_arts and not os.path.islink(parent):
        return f"{os.path.basename(parent)}/{os.path.basename(named)}"
    return None


def find_snapshots(ws: Path) -> list[Snapshot]:
    """The snapshots under WS/.artifacts, with the job dirs that link each one."""
    arts = ws / ".artifacts"
    if not arts.is_dir() or arts.is_symlink():
        return []
    found = {name: Snapshot(path, name=name) for name, path in _snapshot_dirs(arts).items()}
    real_arts = os.path.realpath(arts)
    for entry in os.scandir(ws):
        m = jobs.JOB_LOG.match(f"{entry.name}.log")
        if not m or not entry.is_dir(follow_symlinks=False):
            continue
        link = os.path.join(entry.path, "artifact")
        if not os.path.islink(link):
            continue
        name = _linked_name(os.path.normpath(os.path.join(entry.path, os.readlink(link))), real_arts)
        if name not in found:
            continue
        log = ws / f"{entry.name}.log"
        found[name].jobs.append(JobRef(m.group("id"), Path(entry.path), log if log.is_file() else None))
    return [found[name] for name in sorted(found)]


def squeue_states() -> dict[str, str]:
    """Job id -> state of every job Slurm still holds; ArtifactsError when squeue cannot be asked."""
    try:
        return slurm.queue()
    except slurm.SlurmError as exc:
        raise ArtifactsError(str(exc)) from None


def sacct_over(job_ids: list[str]) -> set[str]:
    """The jobs sacct says have ended; empty when sacct cannot be asked (then nothing is known to be over)."""
    return {job_id for job_id, state in slurm.accounted(job_ids).items() if state in slurm.ENDED}


def _age(seconds: float) -> str:
    if seconds < 60:
        return "under a minute"
    return f"{seconds // 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _maybe_live(job: JobRef, now: float) -> str:
    """Why JOB may still run by its files alone; empty when they say it ended or went quiet long ago."""
    if job.log is None:
        age = now - job.job_dir.stat().st_mtime
        return f"job {job.job_id} has no log yet and its dir is {_age(age)} old (queued?)" if age < LIVE_SECONDS else ""
    age = now - job.log.stat().st_mtime
    if age >= LIVE_SECONDS or logparse.parse_text(failures.read_tail(str(job.log))).footer_status:
        return ""
    return f"job {job.job_id}'s log has no JOB SUMMARY and changed {_age(age)} ago (may still run)"


def _slurm_word(state: str) -> str:
    return "queued" if state in _QUEUED else "running" if state == "RUNNING" else "still in Slurm's queue"


def decide(snapshots: list[Snapshot], states: dict[str, str] | None, now: float) -> None:
    """Set each snapshot's `keep` reason (states None: the scheduler was not asked)."""
    maybe: dict[int, list[tuple[JobRef, str]]] = {}
    for i, snap in enumerate(snapshots):
        listed = [j for j in snap.jobs if states and j.job_id in states]
        if listed:
            snap.keep = "; ".join(
                f"job {j.job_id} is {_slurm_word(states[j.job_id])} ({states[j.job_id]})" for j in listed
            )
            continue
        if not snap.jobs:
            age = now - snap.path.lstat().st_mtime
            if age < FRESH_SECONDS:
                snap.keep = f"no job dir links it yet, made {_age(age)} ago (a submit may be in flight)"
            continue
        found = [(j, why) for j in snap.jobs if (why := _maybe_live(j, now))]
        if found:
            maybe[i] = found
    over = sacct_over(sorted({j.job_id for found in maybe.values() for j, _ in found})) if states is not None else set()
    for i, found in maybe.items():
        still = [why for j, why in found if j.job_id not in over]
        if still:
            snapshots[i].keep = "; ".join(still)


def _not_ours(path: Path) -> str:
    """Why PATH cannot be made writable by us (another user's snapshot), else empty."""
    if os.geteuid() == 0:
        return ""
    for root, _, _ in os.walk(path):
        uid = os.lstat(root).st_uid
        if uid != os.geteuid():
            return f"owned by another user (uid {uid}); ask them, or whoever runs the workspace, to clean it"
    return ""


def disk_usage(path: Path) -> int:
    """Bytes on disk under PATH, symlinks counted as themselves and never followed (like du)."""
    total = os.lstat(path).st_blocks * 512
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def remove_snapshot(path: Path, arts: Path) -> None:
    """The Python twin of remove_artifact (utils/lib/artifact.sh): a snapshot is read-only by design, so its
    dirs are made writable first, then it is removed. Refuses anything but a real snapshot dir in ARTS."""
    st = os.lstat(path)
    if (
        not SNAPSHOT.match(path.name)
        or not stat.S_ISDIR(st.st_mode)
        or _linked_name(str(path), os.path.realpath(arts)) != os.path.relpath(path, arts)
    ):
        raise ArtifactsError(f"{path} is not a snapshot dir in {arts}; not removing it")
    for root, _, _ in os.walk(path):  # files need no write bit to be unlinked; their dirs do
        os.chmod(root, os.lstat(root).st_mode | stat.S_IWUSR)
    shutil.rmtree(path)


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@click.group("artifacts")
def group():
    """The code snapshots submit.sh makes for each job ($JOB_WORKSPACE/.artifacts/)."""


@group.command("clean")
@click.option("--workspace", "ws", help="Where the jobs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed and kept; remove nothing.")
@click.option(
    "--no-scheduler", is_flag=True, help="Do not ask Slurm (you know no job of this workspace is queued or running)."
)
def clean_command(ws, dry_run, no_scheduler):
    """Remove the snapshots no queued or running job uses (Slurm is asked; recently active logs are kept)."""
    workspace = paths.workspace(ws)
    problem = paths.workspace_problem(workspace)
    if problem:
        raise JobkitError("artifacts clean", problem)
    arts = workspace / ".artifacts"
    snapshots = find_snapshots(workspace)
    if not snapshots:
        click.echo(f"no snapshots in {arts}")
        return
    states = None
    if not no_scheduler:
        try:
            states = squeue_states()
        except ArtifactsError as exc:
            raise JobkitError(
                "artifacts clean",
                f"cannot ask Slurm which jobs are queued or running ({exc}); nothing removed, "
                "since removing a live job's code breaks it. Run it where squeue works, or pass --no-scheduler "
                "if you know no job of this workspace is queued or running",
            ) from None
    decide(snapshots, states, time.time())
    verb = "would remove" if dry_run else "removed"
    freed = removed = kept = 0
    dangling = []
    for snap in snapshots:
        why = snap.keep or _not_ours(snap.path)
        if why:
            click.echo(f"kept {snap.name}: {why}")
            kept += 1
            continue
        size = disk_usage(snap.path)
        if not dry_run:
            try:
                remove_snapshot(snap.path, arts)
            except (OSError, ArtifactsError) as exc:
                raise JobkitError(
                    "artifacts clean", f"could not remove {snap.path}: {exc}; fix that and run again"
                ) from None
        click.echo(f"{verb} {snap.name} ({human(size)})")
        freed += size
        removed += 1
        dangling += [j.job_dir.name for j in snap.jobs]
    click.echo(f"{verb} {removed} snapshot(s), {'would free' if dry_run else 'freed'} {human(freed)}; kept {kept}")
    if dangling:
        click.echo(
            f"the artifact link of {len(dangling)} job dir(s) {'would dangle' if dry_run else 'now dangles'} "
            "(kept: the job dirs are evidence)"
        )
