"""`jobkit tag JOB|--all`: put a finished job's steady-state TGS into its log and job dir names.

`31-JAX-tiny.log` and `31-JAX-tiny/` become `31-JAX-tiny-tgs5042.log` and `31-JAX-tiny-tgs5042/`, so a plain
`ls` of the workspace ranks runs without opening a log. The number is the one `jobkit jobs` shows: the mean
Tokens/s/device of the steady window (steps 5-14), rounded to a whole number.

What points at the old names is repointed in the same step, so nothing dangles afterwards:
- symlinks in the workspace and in any job dir (the job dir's `log`, a requeued attempt's `previous` /
  `next`), and absolute symlinks inside the renamed job dir;
- the records that name the log or job dir by path: a sweep's points.jsonl, plan.json and summary.md, and a
  job dir's requeue.json.
Logs are never edited (they are the job's evidence, and paths printed in them stay as they were).

Refused, with nothing renamed: a job without steady-state steps (nothing to tag it with), a job whose log has
no JOB SUMMARY yet (still running, and its processes write to the job dir by name), a new name that exists, a
log it may not read, a workspace, job dir or link dir it may not change (checked before the first rename, so a
job is never left half renamed with its `log` link dangling).
Tagging a tagged job again does nothing: a finished log no longer changes, so neither would the number.
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.core import logparse, paths, tgs
from jobkit.core.errors import JobkitError
from jobkit.ops import jobs

TAGGED = re.compile(r"-tgs\d+$")
NAME_MAX = 255  # bytes in one file name on the filesystems jobs write to
# Files that record a job's log or job dir by path (the sweep engine and jobkit requeue write them).
RECORDS = ("sweeps/*/points.jsonl", "sweeps/*/plan.json", "sweeps/*/summary.md", "*/requeue.json")


class TagError(Exception):
    """One line: why this job is not tagged, and what to do instead.

    `skip`: an expected reason that --all reports and goes on from; `done`: already tagged (not an error).
    """

    def __init__(self, message: str, skip: bool = False, done: bool = False):
        super().__init__(message)
        self.skip = skip or done
        self.done = done


@dataclass
class Plan:
    log: Path
    new_log: Path
    job_dir: Path | None
    new_dir: Path | None
    value: float
    links: list[tuple[Path, str, str]] = field(default_factory=list)  # (link after the renames, old, new target)
    records: list[tuple[Path, str, str]] = field(default_factory=list)  # (file, old text, new text)

    @property
    def old_stem(self) -> str:
        return self.log.name.removesuffix(".log")

    @property
    def new_stem(self) -> str:
        return self.new_log.name.removesuffix(".log")


def steady_tgs(log: Path) -> tuple[float | None, str | None]:
    """The steady-state TGS/device (None without a finite steady step) and the JOB SUMMARY status;
    logparse.LogError when the log cannot be read. Both sit at the log's ends (the steady window near its first
    step, the summary at its end), so a big log is read there only, as `jobkit jobs` reads it: the same number."""
    parsed = logparse.load(str(log), tgs.steps_needed())
    summary = tgs.summarize(parsed)
    value = summary.tgs if summary.tgs is not None and math.isfinite(summary.tgs) else None
    return value, parsed.footer_status


def _check_tagged_meanwhile(log: Path) -> None:
    """TagError(done) when LOG is gone because it was tagged meanwhile (a `jobkit tag` run at the same time)."""
    if os.path.lexists(log):
        return
    stem = log.name.removesuffix(".log")
    tagged = sorted(p.name for p in log.parent.glob(f"{glob.escape(stem)}-tgs*.log") if TAGGED.search(p.stem))
    if tagged:
        raise TagError(f"{stem}: already tagged as {tagged[0].removesuffix('.log')}; nothing to do", done=True)


def _canon(path: str) -> str:
    # The real directory plus the last name, so a link is matched to what it names, not to what that resolves to.
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _moved(path: str, old: str, new: str) -> str | None:
    """PATH after OLD was renamed to NEW (PATH is OLD or inside it); None if the rename does not touch it."""
    if path == old:
        return new
    if path.startswith(old + os.sep):
        return new + path[len(old) :]
    return None


def _symlinks(ws: Path, job_dir: Path | None):
    """Every symlink that could name the job: in the workspace, one level into each dir, all of the job dir."""
    seen = set()
    for entry in os.scandir(ws):
        if entry.is_symlink():
            seen.add(entry.path)
        elif entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            try:
                seen.update(e.path for e in os.scandir(entry.path) if e.is_symlink())
            except OSError:
                continue  # a dir we may not read (another user's) cannot point at our job by a link we could fix
    if job_dir is not None:

        def unreadable(exc: OSError) -> None:  # a link in it could not be seen, so not repointed: it would dangle
            raise TagError(
                f"{job_dir.name}: cannot read {exc.filename} ({exc.strerror}), so the links in it could not be "
                "repointed; fix its permissions (or tag as its owner), then tag again"
            )

        for root, dirs, files in os.walk(job_dir, onerror=unreadable):  # does not descend into symlinked dirs
            for name in dirs + files:
                if os.path.islink(os.path.join(root, name)):
                    seen.add(os.path.join(root, name))
    return sorted(seen)


def _plan_links(plan: Plan, ws: Path) -> None:
    renames = [(str(plan.log), str(plan.new_log))]
    if plan.job_dir is not None:
        renames.append((str(plan.job_dir), str(plan.new_dir)))
    for link in _symlinks(ws, plan.job_dir):
        target = os.readlink(link)
        points_at = _canon(os.path.normpath(os.path.join(os.path.dirname(link), target)))
        new_points_at = next((m for o, n in renames if (m := _moved(points_at, o, n))), None)
        if new_points_at is None:
            continue
        new_link = next((m for o, n in renames if (m := _moved(link, o, n))), link)
        new_target = (
            os.path.relpath(new_points_at, os.path.dirname(new_link)) if not os.path.isabs(target) else new_points_at
        )
        if new_target != target:  # a relative link within the job dir moves with it and stays right
            if not os.access(os.path.dirname(link), os.W_OK | os.X_OK):
                raise TagError(
                    f"{plan.old_stem}: cannot repoint {link} (its directory is not writable), so it would dangle; "
                    "fix the directory's permissions (or tag as its owner), then tag again"
                )
            plan.links.append((Path(new_link), target, new_target))


def _plan_records(plan: Plan, ws: Path) -> None:
    # The stem as a whole path component: `31-JAX-tiny` in `/ws/31-JAX-tiny.log` or `.../31-JAX-tiny/x`, never
    # inside `131-JAX-tiny` or `31-JAX-tiny-tgs5042` (another job, or this one already tagged).
    pattern = re.compile(r"(?<![\w.-])" + re.escape(plan.old_stem) + r"(?![\w-])")
    for record_glob in RECORDS:
        for path in sorted(ws.glob(record_glob)):
            if path.is_symlink() or not path.is_file():
                continue
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError):
                continue  # not ours to read, or not a text record: nothing we could rewrite safely
            new = pattern.sub(plan.new_stem, text)
            if new != text:
                plan.records.append((path, text, new))


def make_plan(log: Path) -> Plan:
    """What tagging LOG would rename and repoint; TagError when it must not be tagged."""
    log = Path(os.path.realpath(log))  # a job dir's `log` link names the real log
    ws = log.parent
    stem = log.name.removesuffix(".log")
    if not jobs.JOB_LOG.match(log.name):
        raise TagError(f"{log} is not a job log (<JOB_ID>-<JOB_NAME>.log); pass a job from 'jobkit jobs'")
    if TAGGED.search(stem):
        raise TagError(f"{stem}: already tagged; nothing to do", done=True)
    _check_tagged_meanwhile(log)
    try:
        value, status = steady_tgs(log)
    except logparse.LogError as exc:
        _check_tagged_meanwhile(log)
        raise TagError(f"{stem}: {exc}; check its permissions", skip=True) from None
    if status is None:
        raise TagError(
            f"{stem}: no JOB SUMMARY in its log yet (still running?); tag it once it has finished", skip=True
        )
    if value is None:
        raise TagError(
            f"{stem}: no steady-state steps ({tgs.DEFAULT_STEADY[0]}-{tgs.DEFAULT_STEADY[1]}) in its log, so no "
            f"TGS to tag it with (runs need steps>={tgs.DEFAULT_STEADY[1] + 1})",
            skip=True,
        )
    new_stem = f"{stem}-tgs{value:.0f}"
    if len(f"{new_stem}.log".encode()) > NAME_MAX:
        raise TagError(f"{stem}: the tagged name would be longer than {NAME_MAX} bytes; rename the job by hand")
    job_dir = ws / stem
    if os.path.lexists(job_dir) and (job_dir.is_symlink() or not job_dir.is_dir()):
        raise TagError(f"{job_dir} is not a directory; move it away, then tag the job")
    plan = Plan(log, ws / f"{new_stem}.log", job_dir if job_dir.is_dir() else None, None, value)
    if plan.job_dir is not None:
        plan.new_dir = ws / new_stem
    for new in (plan.new_log, plan.new_dir):
        if new is not None and os.path.lexists(new):
            _check_tagged_meanwhile(log)
            raise TagError(f"{stem}: {new} already exists; move it away (or rename it), then tag again")
    # Everything the renames and repoints need is checked before the first rename: a job half renamed (its
    # dir's `log` link left pointing at the old name) is worse than one not tagged.
    for where, need in ((ws, "write to"), (plan.job_dir, "read and write")):
        if where is not None and not os.access(where, os.R_OK | os.W_OK | os.X_OK):
            raise TagError(
                f"{stem}: cannot {need} {where} (permission denied), so its renames and links could not all be "
                "done; fix its permissions (or tag as its owner), then tag again"
            )
    _plan_links(plan, ws)
    _plan_records(plan, ws)
    return plan


def _replace_link(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.jobkit-tag")
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _replace_text(path: Path, expected: str, text: str) -> None:
    tmp = path.with_name(f".{path.name}.jobkit-tag")
    try:
        tmp.write_text(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        # A running sweep appends to points.jsonl: if it wrote since we read, replacing would drop its line.
        if path.read_text() != expected:
            raise OSError(f"{path} changed while it was being rewritten; run the command again")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def apply(plan: Plan) -> None:
    """Rename and repoint; on any failure undo what was done, so the job is left as it was."""
    undo = []
    try:
        if os.path.lexists(plan.new_log):  # rename would replace it silently
            _check_tagged_meanwhile(plan.log)
            raise OSError(f"{plan.new_log} appeared meanwhile; move it away (or rename it), then tag again")
        os.rename(plan.log, plan.new_log)
        undo.append(lambda: os.rename(plan.new_log, plan.log))
        if plan.job_dir is not None:
            os.rename(plan.job_dir, plan.new_dir)
            undo.append(lambda: os.rename(plan.new_dir, plan.job_dir))
        for link, old, new in plan.links:
            _replace_link(link, new)
            undo.append(lambda link=link, old=old: _replace_link(link, old))
        for path, old, new in plan.records:
            _replace_text(path, old, new)
            undo.append(lambda path=path, old=old, new=new: _replace_text(path, new, old))
    except OSError as exc:
        for step in reversed(undo):
            step()
        if not undo:
            _check_tagged_meanwhile(plan.log)
        raise TagError(f"{plan.old_stem}: {exc}; nothing was renamed") from None


def describe(plan: Plan, ws: Path, dry_run: bool) -> list[str]:
    """What was (or would be) done, one line each, with paths relative to the workspace."""

    def rel(path: Path) -> str:
        return os.path.relpath(path, ws)

    rename, repoint, update = (
        ("would rename", "would repoint", "would update") if dry_run else ("renamed", "repointed", "updated")
    )
    lines = [f"{rename} {plan.log.name} -> {plan.new_log.name} ({plan.value:,.0f} TGS/device)"]
    if plan.job_dir is not None:
        lines.append(f"{rename} {plan.job_dir.name}/ -> {plan.new_dir.name}/")
    lines += [f"{repoint} {rel(link)} -> {new}" for link, _, new in plan.links]
    lines += [f"{update} {rel(path)}" for path, _, _ in plan.records]
    return lines


def _tag_one(log: Path, dry_run: bool) -> list[str]:
    plan = make_plan(log)
    if not dry_run:
        apply(plan)
    return describe(plan, plan.log.parent, dry_run)


@click.command("tag")
@click.argument("job", required=False)
@click.option("--all", "all_jobs", is_flag=True, help="Every finished, untagged job with steady-state steps.")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--dry-run", is_flag=True, help="Print what would be renamed and repointed; change nothing.")
def command(job, all_jobs, ws, dry_run):
    """Add the steady-state TGS/device to JOB's log and job dir names (JOB: latest, id, name part or path)."""
    if bool(job) == all_jobs:
        raise click.UsageError("give one JOB (latest, a job id, a unique part of its name, a path) or --all")
    workspace = paths.workspace(ws)
    if job:
        try:
            log = jobs.resolve(workspace, job)
            for line in _tag_one(log, dry_run):
                click.echo(line)
        except jobs.JobsError as exc:
            raise JobkitError("tag", str(exc)) from None
        except TagError as exc:
            if exc.done:
                click.echo(str(exc))
                return
            raise JobkitError("tag", str(exc)) from None
        return
    try:
        logs = jobs.job_logs(workspace)
    except jobs.JobsError as exc:
        raise JobkitError("tag", str(exc)) from None
    failed = 0
    for log in logs:
        if log.is_symlink():
            continue  # the log it names is in the list itself
        try:
            for line in _tag_one(log, dry_run):
                click.echo(line)
        except TagError as exc:
            click.echo(f"skip {exc}" if exc.skip else f"jobkit tag: {exc}", err=not exc.skip)
            failed += not exc.skip
    if failed:
        raise JobkitError("tag", f"{failed} job(s) could not be tagged (see above)")
