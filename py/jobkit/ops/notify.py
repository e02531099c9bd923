"""`jobkit notify`: send a message to the user's notification targets through apprise.

apprise speaks Telegram, Slack, Discord, ntfy, email, Matrix, generic JSON webhooks and ~100 more, each
named by a URL (`tgram://TOKEN/CHAT`, `json://host:port/path`, ...). Where the URLs come from, first found:

1. `--url URL` (repeatable), for a one-off;
2. `JOBKIT_NOTIFY_URLS`: URLs separated by spaces, commas or newlines;
3. the config file: `JOBKIT_NOTIFY_CONFIG`, else `$XDG_CONFIG_HOME/jobkit/notify.conf`
   (`~/.config/jobkit/notify.conf`): one URL per line; lines starting with `#` are comments.

The URLs carry tokens, so a config file that others may read (any group or other permission bit) is
refused until it is `chmod 600`. Every URL gets short connect/read timeouts unless it sets its own, so an
unreachable target costs seconds, not minutes, and the monitor that calls `send` keeps its pace.

Exit codes (jobkit's table: docs/architecture.md#exit-codes): 0 delivered to every target, 7 some target
failed (one line each), 5 no targets or a bad target list (a malformed URL, a config file others can read).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.core.errors import EXIT_ACTION_FAILED, EXIT_SETTINGS, JobkitError, exit_with

ENV_URLS = "JOBKIT_NOTIFY_URLS"
ENV_CONFIG = "JOBKIT_NOTIFY_CONFIG"
# Seconds to connect and to read, added to a URL that says nothing of its own (apprise's cto/rto options).
DEFAULT_TIMEOUTS = {"cto": "4", "rto": "4"}
_SPLIT = re.compile(r"[\s,]+")


class NotifyError(Exception):
    """A target list that cannot be used: one line naming the problem and the fix."""


@dataclass
class Targets:
    urls: list[str]
    source: str  # where they came from, for messages: "--url", "$JOBKIT_NOTIFY_URLS", a file path
    problems: list[str] = field(default_factory=list)


def config_path() -> Path:
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "jobkit" / "notify.conf"


def _read_config(path: Path) -> list[str]:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise NotifyError(
            f"{path} is readable or writable by others (mode {stat.S_IMODE(mode):03o}) and holds tokens; "
            f"run: chmod 600 {path}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NotifyError(f"cannot read {path}: {exc.strerror}; check its permissions (chmod 600 {path})") from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise NotifyError(f"{path} is not a text file of apprise URLs; put one URL per line in it (or move it away)")
    # Whole-line comments only: a URL may hold '#' itself (a Slack channel: slack://.../#ops).
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def find_targets(given: tuple[str, ...] | list[str] = ()) -> Targets | None:
    """The URLs to notify (see the module doc for the order), or None when none are configured."""
    if given:
        return Targets(list(given), "--url")
    if os.environ.get(ENV_URLS, "").strip():
        return Targets([u for u in _SPLIT.split(os.environ[ENV_URLS].strip()) if u], f"${ENV_URLS}")
    path = config_path()
    if path.is_file():
        urls = _read_config(path)
        return Targets(urls, str(path)) if urls else None
    if os.path.lexists(path):  # a directory (or a dangling link) where the URLs are looked for
        what = "a directory" if path.is_dir() else "not a file"
        raise NotifyError(
            f"{path} is {what}, not a file of apprise URLs; move it away and put the URLs in a file of that name "
            f"(chmod 600), or set ${ENV_CONFIG}"
        )
    return None


def with_timeouts(url: str) -> str:
    """URL with apprise's connect/read timeouts added where it sets none."""
    missing = [f"{k}={v}" for k, v in DEFAULT_TIMEOUTS.items() if not re.search(rf"[?&]{k}=", url)]
    if not missing:
        return url
    return url + ("&" if "?" in url else "?") + "&".join(missing)


def redact(url: str, index: int) -> str:
    """How a message names the INDEX-th target (from 1): its scheme and position only (`tgram:// #1`). Any
    other part of an apprise URL may be the token: the host is the bot token of tgram://, pbul://, join://,
    slack:// and msteams://, the path or the user:password of others."""
    m = re.match(r"^([A-Za-z][\w+.-]*://)", url)
    return f"{m.group(1) if m else '<not a URL>'} #{index}"


def scrub(text: str, url: str) -> str:
    """TEXT (apprise's own reason) without any part of URL that could be a token (6 characters or more)."""
    for part in sorted(set(re.split(r"[/:@?&=#,]+", url.partition("://")[2])), key=len, reverse=True):
        if len(part) >= 6:
            text = text.replace(part, "***")
    return text


def send(title: str, body: str, targets: Targets, level: str = "info") -> list[str]:
    """Send to every target; returns one line per failure (empty when everything was delivered)."""
    import apprise  # imported here: `jobkit --help` and the other commands do not pay for it

    notify_type = {
        "info": apprise.NotifyType.INFO,
        "success": apprise.NotifyType.SUCCESS,
        "warning": apprise.NotifyType.WARNING,
        "failure": apprise.NotifyType.FAILURE,
    }[level]
    failures = []
    # apprise's log records may carry a target's URL, secrets and all: they go to our LogCapture only, never on
    # to whatever handlers the process's root logger has (absl's, a test runner's), which would print them.
    apprise.logging.getLogger("apprise").propagate = False
    for index, url in enumerate(targets.urls, 1):
        app = apprise.Apprise()
        if not app.add(with_timeouts(url)):
            failures.append(
                f"{redact(url, index)} from {targets.source}: not a URL apprise knows; see apprise's URL list"
            )
            continue
        # apprise says why a send failed only through logging; catch it for the one-line report.
        with apprise.LogCapture(level=apprise.logging.WARNING) as log:
            ok = bool(app.notify(title=title, body=body, notify_type=notify_type))
        if not ok:
            said = " ".join(line.split(" - ", 2)[-1].strip() for line in log.getvalue().splitlines() if line.strip())
            failures.append(f"{redact(url, index)}: not delivered ({scrub(said, url) or 'no reason given'})")
    return failures


@click.command("notify")
@click.argument("text")
@click.option("--title", default="jobkit", show_default=True, help="Message title.")
@click.option("--url", "urls", multiple=True, help="An apprise URL (repeatable); overrides the configured ones.")
@click.option(
    "--level",
    type=click.Choice(["info", "success", "warning", "failure"]),
    default="info",
    show_default=True,
    help="How targets that have levels show it.",
)
def command(text, title, urls, level):
    """Send TEXT to your notification targets (apprise URLs: --url, $JOBKIT_NOTIFY_URLS or the config file)."""
    try:
        targets = find_targets(urls)
    except (NotifyError, OSError) as exc:
        raise JobkitError("notify", str(exc), EXIT_SETTINGS) from None
    if targets is None:
        raise JobkitError(
            "notify",
            f"no notification targets; put apprise URLs in {config_path()} (chmod 600) "
            f"or in ${ENV_URLS}, or pass --url",
            EXIT_SETTINGS,
        )
    problems = send(title, text, targets, level)
    for line in problems:
        click.echo(f"jobkit notify: {line}", err=True)
    if problems:
        exit_with(EXIT_SETTINGS if all("not a URL" in p for p in problems) else EXIT_ACTION_FAILED)
    click.echo(f"sent to {len(targets.urls)} target(s) from {targets.source}")
