"""`jobkit sweep batch --apply`: writing a swept value into configs/<model>.yml, as a confirmed diff.

The key's line is replaced in place (its comment kept in its column); a missing key goes after a related
one, else at the end. Nothing is written without the user's yes (or --yes), and never over edits made to
the file while the sweep ran.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import click
import yaml

from jobkit.core.errors import JobkitError
from jobkit.core.paths import REPO_ROOT

if TYPE_CHECKING:  # batch imports this module; the annotation alone needs Param
    from jobkit.sweep.batch import Param
NEIGHBOURS = {  # where a missing key goes: after the first of these that the file has
    "per_device_batch_size": ("max_target_length",),
    "max_target_length": ("per_device_batch_size",),
    "remat_policy": ("attention", "scan_layers"),
}


def yaml_scalar(value) -> str:
    """VALUE as a YAML scalar that reads back as VALUE (quoted only when it would not)."""
    text = str(value)
    return text if yaml.safe_load(text) == value and "#" not in text else json.dumps(text)


def with_key(text: str, key: str, value) -> str:
    """TEXT (a yml) with top-level KEY set to VALUE: its line replaced with the comment kept in its column,
    or a new line after a related key (else at the end)."""
    lines = text.splitlines(keepends=True)
    new = yaml_scalar(value)
    for i, line in enumerate(lines):
        if not line.startswith(f"{key}:"):
            continue
        body = line.rstrip("\n")
        comment_at = _comment_column(body)
        head = f"{key}: {new}"
        if comment_at is None:
            lines[i] = head + "\n"
        else:
            lines[i] = head.ljust(comment_at - 1) + " " + body[comment_at:] + "\n"
        return "".join(lines)
    at = len(lines)
    for neighbour in NEIGHBOURS.get(key, ()):
        found = [i for i, line in enumerate(lines) if line.startswith(f"{neighbour}:")]
        if found:
            at = found[0] + 1
            break
    if at == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.insert(at, f"{key}: {new}\n")
    return "".join(lines)


def _comment_column(line: str) -> int | None:
    """Where a trailing `# comment` starts (outside quotes), or None."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and i > 0 and line[i - 1] in " \t":
            return i
    return None


def git_dirty(path: Path) -> bool:
    """True when git says PATH has uncommitted changes (False when it is not in a repository)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(path.parent), "status", "--porcelain", "--", path.name],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and bool(result.stdout.strip())


def apply(path: Path, read_at_start: str, param: Param, value, extra: tuple[str, ...], yes: bool) -> None:
    """Show the diff that sets PARAM to VALUE in PATH; write it when confirmed (or YES)."""
    current = path.read_text()
    if current != read_at_start:
        raise JobkitError(
            "sweep",
            f"{path} changed while the sweep ran; not writing it: set {param.name}: {param.text(value)} by hand",
        )
    updated = with_key(current, param.name, value)
    if updated == current:
        click.echo(f"[apply] {path.name} already has {param.name}: {param.text(value)}; nothing to write")
        return
    inside = path.is_relative_to(REPO_ROOT)
    rel = os.path.relpath(path, REPO_ROOT) if inside else str(path)
    names = (f"a/{rel}", f"b/{rel}") if inside else (rel, rel)
    diff = difflib.unified_diff(current.splitlines(keepends=True), updated.splitlines(keepends=True), *names)
    click.echo("".join(diff).rstrip("\n"))
    others = [a for a in extra if "=" in a and not a.startswith(("steps=", "_env_", f"{param.name}="))]
    if others:
        click.echo(f"[apply] the sweep also ran with {' '.join(others)}; those are not written")
    if git_dirty(path):
        click.echo(f"[apply] {rel} has uncommitted changes; they are kept (the diff is against the file as it is)")
    try:
        confirmed = yes or click.confirm(f"Write {param.name}: {param.text(value)} into {rel}?", default=False)
    except click.Abort:
        confirmed = False
    if not confirmed:
        click.echo(f"[apply] not written; {rel} is unchanged")
        return
    tmp = path.with_name(f".{path.name}.sweep-tmp")
    tmp.write_text(updated)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    tmp.replace(path)
    click.echo(f"[apply] wrote {param.name}: {param.text(value)} into {rel}")
