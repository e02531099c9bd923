"""`jobkit requeue`: after a Slurm job ends, submit it again when its outcome is worth another attempt.

_job.sbatch runs this as its last act when `MAX_RETRIES` is above 0, in the environment the job was
submitted with (its own additions and Slurm's SLURM_* variables removed), so the next attempt is what the
user asked for, not what the batch script made of it. Steps:

1. Decide (`decide`), from the job log: the status in its JOB SUMMARY and the failure `jobkit why` gives,
   whose catalogue entry (configs/failure_signatures.yaml, or the site-local file) carries the retry policy:
   `retry` resubmits, `retry-without-node` resubmits without the blamed host, `never` stops and says why (the
   entry's advice). A failure that only has a class (the `TIME LIMIT` line of _job.sbatch) takes its class's
   policy (failures.retry_policy). A hang, or a time limit the batch script acted on, also needs the marker the
   job's own watchdog or batch script wrote (hang_watchdog.read_marker, time_limit_requested): a log line alone
   may have been appended by a teammate in a shared workspace, and is not retried. Success, an early stop that
   was not for a time limit, a cancel by a person and anything unknown are never retried.
2. Blame: under `retry-without-node`, the host the failure blames is added to the next attempt's --exclude,
   along with every host earlier attempts excluded (a failure that names no host excludes none).
3. Claim: `<job dir>/requeue.json` is created exclusively (O_EXCL), so whoever else might requeue the same
   job (a second call, a monitor) finds it taken and does nothing. It is taken only once the snapshot and the
   arguments have been checked, and a submit that certainly submitted nothing (submit.sh or sbatch refused it)
   gives it back: it is renamed to `requeue.failed.json`, so a later call may try again. A claim whose submit
   may have reached Slurm (a timeout, an answer that cannot be read) keeps blocking: at most once.
4. Submit: the snapshot's own submit.sh with the original arguments (SUBMIT_ARGV, a JSON array written by submit.sh),
   reusing the same snapshot, with ATTEMPT=n+1 and RETRY_OF=<this job>. With checkpointing on, MaxText
   resumes from the last checkpoint in the shared output directory.
5. Record: the new job id in requeue.json, a `next` link in this job dir (the new job dir gets `previous`
   from submit.sh), and the line `== REQUEUED as job N (attempt 2 of 3): <why> ==` on stdout (the log).

A job whose batch host died wrote no JOB SUMMARY and could not requeue itself: `requeue(..., lost=STATE)`
(`jobkit monitor --requeue`) decides from the scheduler's end state instead (`decide_lost`: NODE_FAIL or
FAILED), excludes the batch host (the first host of the log's nodelist) and then claims and submits as above,
with the snapshot and arguments submit.sh saved in `<job dir>/submit_env.json` (owner-only).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from jobkit.core import clitypes, failures, files, logparse
from jobkit.core.errors import (
    EXIT_ACTION_FAILED,
    EXIT_ANSWER_NO,
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_SETTINGS,
    JobkitError,
    exit_with,
)
from jobkit.observe import hang_tsdb
from jobkit.ops import hang_watchdog

CLAIM_FILE = "requeue.json"
# Where a claim whose submit certainly submitted nothing goes: it no longer blocks, and still says what failed.
FAILED_FILE = "requeue.failed.json"
# What submit.sh saves in the job dir (MAX_RETRIES above 0) for a requeue that does not run in the job's own
# environment: the monitor's, for a job whose batch host died, or one by hand. A JSON array of NAME=VALUE.
ENV_FILE = "submit_env.json"
JOB_KEYS = ("MAXTEXT_LAUNCHER_DIR", "ARTIFACT_SHA256", "SUBMIT_ARGV", "JOB_WORKSPACE")
# The scheduler's end states of a job with no JOB SUMMARY that are retried as a lost batch host.
LOST_STATES = {"NODE_FAIL", "FAILED"}
# submit.sh's lines when sbatch took the job and something after it failed: the claim must keep blocking.
_SUBMITTED_ANYWAY = re.compile(
    r"^Submitted job \d+|could not read a job id from sbatch|died before writing its log", re.M
)
# _job.sbatch's line when Slurm's time-limit warning (--signal) asked training to save and stop.
TIME_LIMIT_LINE = re.compile(r"^== TIME LIMIT near", re.M)
# The line a requeue leaves in the log (`command` prints it); jobkit monitor follows the new job from it.
REQUEUED_LINE = re.compile(r"^== REQUEUED as job (\d+) .*==$", re.M)


class RequeueError(Exception):
    """Why a requeue that was decided could not be submitted: one line with the fix. NOTHING_SUBMITTED: the
    submit certainly reached no scheduler (the claim is given back). CODE: the command's exit code for it
    (EXIT_SETTINGS for a refused setting, else EXIT_ACTION_FAILED)."""

    def __init__(self, message: str, nothing_submitted: bool = True, code: int = EXIT_ACTION_FAILED):
        super().__init__(message)
        self.nothing_submitted = nothing_submitted
        self.code = code


class WouldFail(RequeueError):
    """--dry-run: the requeue decided would be refused by a check (the snapshot, the arguments)."""


@dataclass
class Decision:
    retry: bool
    why: str  # the outcome, in words: "hang: training", "time-limit", "oom (not retried)"
    attempt: int  # this job's attempt (1 = the first submission)
    max_retries: int
    exclude: list[str] = field(default_factory=list)  # hosts the next attempt must not get
    rule: str = ""  # what decided, in words: the catalogue entry, its retry policy and its advice

    @property
    def next_attempt(self) -> int:
        return self.attempt + 1

    @property
    def said(self) -> str:
        """WHY with the rule that decided it, for the log's requeue line and --dry-run."""
        return f"{self.why} [{self.rule}]" if self.rule else self.why


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def _unverified(claim: str, job_dir: Path, job_id: str, check) -> failures.Failure | None:
    """None when CHECK(job_dir, job_id) confirms what the log claims, else the class `unverified` saying why."""
    try:
        if check(job_dir, job_id):
            return None
        why = "this job's watchdog left no marker in " + str(job_dir)
    except files.Untrusted as exc:
        why = f"ignored {exc}"
    return failures.Failure("unverified", f"the log says {claim}, but {why}")


def _from_entry(sig_id: str, cls: str, evidence: str) -> failures.Failure:
    """A failure of class CLS that the catalogue entry SIG_ID describes (its policy and advice), where requeue
    read the line itself; the class's policy when a site-local file dropped that entry."""
    for sig in failures.load_catalogue().signatures:
        if sig.id == sig_id and sig.cls == cls:
            return failures.Failure(cls, evidence=evidence, signature=sig.id, source=sig.source, retry=sig.retry,
                                    advice=sig.advice)  # fmt: skip
    return failures.Failure(cls, evidence=evidence, retry=failures.retry_policy(cls))


def rule(found: failures.Failure) -> str:
    """Which catalogue entry decided FOUND's retry, its policy and its advice, in one phrase."""
    policy = found.retry_decision
    where = f"catalogue entry {found.signature}" if found.signature else f"class {found.reason}"
    return f"{where}: {policy}" + (f"; advice: {found.advice}" if found.advice else "")


def outcome(log: logparse.JobLog, text: str, job_dir: Path) -> failures.Failure | None:
    """How the job of LOG (its tail TEXT; its dir JOB_DIR) ended, as a failure class; None for a success or a
    job not ended."""
    if log.footer_status in (None, "SUCCESS"):
        return None
    job_id = log.header.get("JOB_ID", "")
    limit = TIME_LIMIT_LINE.search(text)
    if limit:
        bad = _unverified("TIME LIMIT", job_dir, job_id, hang_watchdog.time_limit_requested)
        if bad:
            return bad
        # Slurm warned of the limit and training was asked to save and stop: whether it then exited 0
        # (STOPPED) or had to be killed, the cause is the limit.
        return _from_entry("time-limit-warning", "time-limit", failures._line_at(text, limit.start()))
    if log.footer_status == "STOPPED":
        stopped = re.search(r"Training stopped: (.*?)\.?$", text, re.M)
        return failures.Failure("stopped-early", stopped.group(1) if stopped else "")
    nodes, _ = logparse.header_nodes(log.header)  # an unexpandable nodelist excludes no host
    found = failures.classify(
        text, log.footer_status, log.footer_exit, has_steps=log.has_steps, nodes=nodes, job_dir=job_dir,
        procs=log.local_world_size, hang_window=hang_tsdb.read_window,
    )  # fmt: skip  # a hang is blamed from the stacks in JOB_DIR/hang/ (core.hang_stacks) and its TSDB
    if found.reason == "hang":
        return _unverified("HANG", job_dir, job_id, hang_watchdog.read_marker) or found
    return found


def _counts(log: logparse.JobLog, env: dict[str, str]) -> tuple[int, int, list[str]]:
    """(this attempt, MAX_RETRIES, hosts earlier attempts excluded): the environment's, else the log header's."""
    attempt = _int(env.get("ATTEMPT") or log.header.get("ATTEMPT"), 1)
    # The same reading submit.sh gives it (settings.sh setting_uint): 'abc' or -1 is refused, never taken for 0.
    setting = {"MAX_RETRIES": env.get("MAX_RETRIES") or log.header.get("MAX_RETRIES") or ""}
    try:
        max_retries = clitypes.env_uint(setting, "MAX_RETRIES", 0)
    except clitypes.SettingError as exc:
        raise RequeueError(str(exc), code=EXIT_SETTINGS) from None
    earlier = [h for h in (env.get("REQUEUE_EXCLUDE") or log.header.get("REQUEUE_EXCLUDE") or "").split(",") if h]
    return attempt, max_retries, earlier


def _within_retries(decision: Decision) -> Decision:
    if decision.attempt > decision.max_retries:
        decision.retry = False
        decision.why += f"; retries used up ({decision.max_retries} allowed, this was attempt {decision.attempt})"
    return decision


def decide(log: logparse.JobLog, text: str, env: dict[str, str], job_dir: Path) -> Decision:
    """Whether the job in LOG (its tail TEXT, its dir JOB_DIR) gets another attempt, and which hosts it must
    avoid."""
    attempt, max_retries, earlier = _counts(log, env)

    def no(why: str) -> Decision:
        return Decision(False, why, attempt, max_retries, earlier)

    if log.footer_status is None:
        return no("the log has no JOB SUMMARY (the job is still running, or died without one)")
    found = outcome(log, text, job_dir)
    if found is None:
        return no("succeeded")
    if found.reason == "unverified":
        return no(f"{found.detail} (not retried)")
    if found.reason == "stopped-early":
        return no(f"{found.label} (not retried: not for a time limit)")
    policy = found.retry_decision
    if policy == "never":
        return Decision(False, f"{found.label} (not retried)", attempt, max_retries, earlier, rule(found))
    exclude, why = list(earlier), found.label
    if policy == "retry-without-node":
        if not found.host:
            why += " (no host blamed: none excluded)"
        elif found.host not in exclude:
            exclude.append(found.host)
    return _within_retries(Decision(True, why, attempt, max_retries, exclude, rule(found)))


def decide_lost(log: logparse.JobLog, env: dict[str, str], state: str) -> Decision:
    """Whether a job that wrote no JOB SUMMARY and that the scheduler ended in STATE gets another attempt: its
    batch host died (NODE_FAIL, or FAILED with nothing written), so the batch script could not decide. The batch
    host, the first of the log's nodes, is excluded with every host earlier attempts excluded."""
    attempt, max_retries, earlier = _counts(log, env)

    def no(why: str) -> Decision:
        return Decision(False, why, attempt, max_retries, earlier)

    if log.footer_status is not None:
        return no("the log has a JOB SUMMARY: its batch script decided (see the log's last lines)")
    if state not in LOST_STATES:
        return no(f"{state.lower()} without a JOB SUMMARY (not retried: only {' or '.join(sorted(LOST_STATES))} is)")
    nodes, _ = logparse.header_nodes(log.header)
    host = nodes[0] if nodes else None
    exclude = [*earlier, host] if host and host not in earlier else list(earlier)
    where = f"its batch host {host}" if host else "its batch host (not named: the log has no nodelist)"
    why = f"node-fail: {where} died (Slurm: {state}, no JOB SUMMARY)"
    return _within_retries(Decision(True, why, attempt, max_retries, exclude, "lost batch host: retry-without-node"))


def read_submit_argv(value: str) -> list[str]:
    """SUBMIT_ARGV as submit.sh wrote it: a JSON array of strings (exact), or, from jobs submitted before that,
    `printf %q` words (shlex reads them, except the $'...' that bash writes for a tab or a newline)."""
    if value.startswith("["):
        argv = json.loads(value)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("not a JSON list of strings")
        return argv
    return shlex.split(value)


def split_submit_argv(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """submit.sh's arguments -> (model spec, sbatch args, passthrough after `--`)."""
    if not argv:
        raise RequeueError("SUBMIT_ARGV is empty; only jobs submitted with submit.sh can be requeued")
    head, tail = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    return head[0], head[1:], tail


def with_exclude(sbatch_args: list[str], hosts: list[str]) -> list[str]:
    """SBATCH_ARGS with HOSTS added to its --exclude (sbatch keeps only the last one: merge, not append)."""
    if not hosts:
        return list(sbatch_args)
    kept, excluded, i = [], [], 0
    while i < len(sbatch_args):
        arg = sbatch_args[i]
        if arg in ("-x", "--exclude") and i + 1 < len(sbatch_args):
            excluded += sbatch_args[i + 1].split(",")
            i += 2
            continue
        if arg.startswith("--exclude="):
            excluded += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-x") and len(arg) > 2:
            excluded += arg[2:].split(",")
        else:
            kept.append(arg)
        i += 1
    merged = list(dict.fromkeys([*excluded, *hosts]))
    return [*kept, f"--exclude={','.join(merged)}"]


def claim(job_dir: Path, decision: Decision) -> bool:
    """Take the job's one requeue; False when someone already did."""
    try:
        fd = os.open(job_dir / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump({"decision": asdict(decision)}, fh)
    return True


def _record(job_dir: Path, **fields) -> None:
    path = job_dir / CLAIM_FILE
    data = json.loads(path.read_text())
    data.update(fields)
    files.write_atomic(path, json.dumps(data, indent=1) + "\n")  # never through a planted link


def job_env(job_dir: Path, env: dict[str, str], lost: bool = False) -> dict[str, str]:
    """ENV completed with what submit.sh saved in JOB_DIR/submit_env.json (the snapshot, the arguments); with
    LOST (the monitor's requeue of a job whose batch host died) the saved values and the log header win over
    ENV's, whose SLURM_* (but SLURM_CONF) and job settings belong to the monitor, not to the job."""
    try:
        pairs = json.loads(files.read_own(job_dir / ENV_FILE, private=True))
        if not isinstance(pairs, list) or not all(isinstance(p, str) and "=" in p for p in pairs):
            raise ValueError("not a JSON list of NAME=VALUE")
    except FileNotFoundError:
        pairs = []
    except (OSError, ValueError, files.Untrusted) as exc:
        raise RequeueError(f"{job_dir / ENV_FILE} cannot be read ({exc}); resubmit by hand") from None
    saved = dict(p.split("=", 1) for p in pairs)
    if not lost:
        return {**saved, **{k: v for k, v in env.items() if v or k not in saved}}
    drop = {"ATTEMPT", "MAX_RETRIES", "REQUEUE_EXCLUDE", "RETRY_OF", *JOB_KEYS}
    kept = {k: v for k, v in env.items() if k not in drop and (not k.startswith("SLURM_") or k == "SLURM_CONF")}
    return {**kept, **saved}


def prepare(env: dict[str, str]) -> tuple[Path, str, list[str], list[str]]:
    """What the submit needs and what can be checked before the claim is taken: (snapshot, model spec, sbatch
    args, passthrough). A requeue refused here claims nothing, so a later one (with the fix) may still run."""
    launcher = env.get("MAXTEXT_LAUNCHER_DIR", "")
    if not launcher or not (Path(launcher) / "submit.sh").is_file():
        raise RequeueError(f"no snapshot with submit.sh at MAXTEXT_LAUNCHER_DIR={launcher!r}; resubmit by hand")
    try:
        spec, sbatch_args, passthrough = split_submit_argv(read_submit_argv(env.get("SUBMIT_ARGV", "")))
    except ValueError as exc:
        raise RequeueError(f"SUBMIT_ARGV cannot be read ({exc}); resubmit by hand") from None
    return Path(launcher), spec, sbatch_args, passthrough


def submit(log_path: Path, decision: Decision, env: dict[str, str]) -> tuple[str, Path]:
    """Submit the next attempt with the snapshot's submit.sh; returns (job id, job dir)."""
    launcher, spec, sbatch_args, passthrough = prepare(env)
    job = logparse.parse_file(str(log_path)).header
    child_env = {
        **env,
        "ATTEMPT": str(decision.next_attempt),
        "RETRY_OF": job.get("JOB_ID", ""),
        "REQUEUE_EXCLUDE": ",".join(decision.exclude),
        "REQUEUE_ARTIFACT": str(launcher),
        "REQUEUE_PREVIOUS_DIR": log_path.with_suffix("").name,
        # The job that calls us is ending (maybe inside Slurm's KillWait): do not wait to watch the new one start.
        "EARLY_DEATH_CHECK_SECONDS": "0",
    }
    cmd = [str(launcher / "submit.sh"), spec, *with_exclude(sbatch_args, decision.exclude), "--", *passthrough]
    try:
        result = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise RequeueError("submit.sh did not answer in 300 s (it may have submitted)", False) from None
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["(no output)"])[-1]
        if decision.exclude and "node configuration is not available" in said:
            said += f" (too few nodes left once {','.join(decision.exclude)} is excluded; resubmit when it is back, or with fewer nodes)"
        nothing = not _SUBMITTED_ANYWAY.search(result.stdout + result.stderr)
        raise RequeueError(f"submit.sh failed (exit {result.returncode}): {said}", nothing)
    m = re.search(r"^Submitted job (\d+)", result.stdout, re.M)
    d = re.search(r"^\s*job dir:\s*(\S+)", result.stdout, re.M)
    if not m or not d:
        raise RequeueError(f"could not read the new job from submit.sh's answer: {result.stdout.strip()!r}", False)
    return m.group(1), Path(d.group(1))


def _give_back(job_dir: Path, error: str) -> None:
    """The claim's submit submitted nothing: record why and rename it out of the way (only its owner, this
    call, does), so that a later requeue may claim again."""
    _record(job_dir, error=error)
    os.replace(job_dir / CLAIM_FILE, job_dir / FAILED_FILE)


def _decide_from(log_path: Path, env: dict[str, str], lost: str | None):
    """(log, job dir, the job's environment, decision): the one reading that requeue and --dry-run share. LOST:
    the scheduler's end state of a job whose batch host died (`decide_lost`); None: the log decides (`decide`)."""
    log = logparse.load(str(log_path))
    job_dir = log_path.with_suffix("")
    env = job_env(job_dir, env, lost=lost is not None)
    if lost is None:
        return log, job_dir, env, decide(log, failures.read_tail(str(log_path)), env, job_dir)
    return log, job_dir, env, decide_lost(log, env, lost)


def requeue(log_path: Path, env: dict[str, str], lost: str | None = None) -> tuple[Decision, str | None]:
    """Decide, claim, submit and record; returns the decision and the new job id (None if not requeued).
    LOST: the scheduler's end state of a job whose batch host died before writing a JOB SUMMARY (the monitor's
    requeue, `decide_lost`); None: the batch script's (or a person's) requeue from the log (`decide`)."""
    log, job_dir, env, decision = _decide_from(log_path, env, lost)
    if not decision.retry:
        return decision, None
    already = _already(job_dir)
    if already:  # the claim below decides; this only spares the checks and says what the claim holds
        return Decision(False, already, decision.attempt, decision.max_retries, decision.exclude), None
    prepare(env)  # before the claim: a refusal here must not block a later requeue
    job_dir.mkdir(exist_ok=True)
    if not claim(job_dir, decision):
        return Decision(False, _already(job_dir) or "already requeued", decision.attempt, decision.max_retries), None
    try:
        job_id, new_dir = submit(log_path, decision, env)
    except (RequeueError, OSError) as exc:
        nothing = isinstance(exc, OSError) or exc.nothing_submitted
        if nothing:
            _give_back(job_dir, str(exc))
        else:
            _record(job_dir, error=str(exc))
        raise RequeueError(str(exc), nothing) from None
    _record(job_dir, job_id=job_id, new_job_dir=str(new_dir))
    link = job_dir / "next"
    if not link.is_symlink() and not link.exists():
        link.symlink_to(Path("..") / new_dir.name)
    return decision, job_id


HELP = f"""Submit the job of LOG again when its outcome is worth another attempt, at most MAX_RETRIES times.

_job.sbatch runs this as its last act when MAX_RETRIES is above 0; run it by hand to requeue a job that
ended, or with --dry-run to see what would be decided.

\b
What is retried is the retry policy of the catalogue entry that `jobkit why`
matched (configs/failure_signatures.yaml plus a site-local file; the
failure-class table in docs/diagnosis.md lists them):
  retry               submit again on any nodes
  retry-without-node  submit again, excluding the host the failure blames
  never               not requeued: the line says which entry decided and its advice
{{classes}}
A hang or a time limit is retried only with the marker the job's own watchdog or batch script wrote.
Never: success, an early stop not for a time limit, a cancel by a person, anything unknown.

\b
MAX_RETRIES      attempts after the first (the environment's, else the log header's; 0: never)
REQUEUE_EXCLUDE  hosts earlier attempts excluded (comma-separated): the next attempt avoids them,
                 and the host a retry-without-node failure blames

At most once per job: <job dir>/{CLAIM_FILE} is the claim and names the next job; a second call (a
monitor, a rerun) submits nothing. The claim is taken only after the snapshot and the arguments are
checked, and a submit that submitted nothing (sbatch or submit.sh refused it) gives it back, renamed to
{FAILED_FILE}: a later call tries again. A claim whose submit may have reached Slurm keeps blocking.
The next attempt runs from the same code snapshot (MAXTEXT_LAUNCHER_DIR) with the same arguments
(SUBMIT_ARGV), ATTEMPT+1 and RETRY_OF=<this job>; run by hand, both come from <job dir>/{ENV_FILE}
when the environment lacks them (submit.sh saves it when MAX_RETRIES is above 0).

\b
--dry-run decides, checks and prints what would happen (the next attempt, the hosts excluded, the
catalogue entry that decided, a claim that blocks); it submits and writes nothing.
Exit {EXIT_OK}: requeued (or would be); {EXIT_ANSWER_NO}: not requeued; {EXIT_BAD_INPUT}: the log cannot
be read; {EXIT_SETTINGS}: MAX_RETRIES is not a number; {EXIT_ACTION_FAILED}: the submit failed (or would fail).
"""


def policy_lines() -> str:
    """The classes under each retry policy, from the catalogue (a class whose entries differ is under each)."""
    try:
        sigs = failures.load_catalogue().signatures
    except failures.CatalogueError as exc:
        return f"  (the catalogue cannot be read: {exc})"
    lines = ["\b", "Classes by policy (today's catalogue; a class whose entries differ is under each):"]
    for policy in failures.RETRY_POLICIES:
        names = ", ".join(sorted({s.cls for s in sigs if s.retry == policy}))
        lines += [
            f"  {policy}:",
            *textwrap.wrap(names, 72, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False),
        ]
    return "\n".join(lines)


class _Command(click.Command):
    """The help reads the catalogue when it is shown, not when the module is imported."""

    def format_help_text(self, ctx, formatter):
        self.help = HELP.replace("{classes}\n", "\n" + policy_lines() + "\n\n")
        super().format_help_text(ctx, formatter)


def _read_record(path: Path) -> dict:
    data = json.loads(files.read_own(path))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _already(job_dir: Path) -> str | None:
    """What JOB_DIR's requeue.json says about the requeue already taken, in words; None when there is none."""
    path = job_dir / CLAIM_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = _read_record(path)
    except (OSError, ValueError, files.Untrusted) as exc:
        return f"already requeued ({path} cannot be read: {exc}); a job is requeued at most once"
    decision = data.get("decision") if isinstance(data.get("decision"), dict) else {}
    exclude = decision.get("exclude") if isinstance(decision.get("exclude"), list) else []
    if data.get("job_id"):
        done = f"already requeued as job {data['job_id']}"
    elif data.get("error"):
        done = (
            f"a requeue was claimed and may have reached Slurm ({data['error']}); if squeue shows no job with "
            f"RETRY_OF={job_dir.name.split('-')[0]}, move {path} away to requeue again"
        )
    else:
        done = "a requeue was claimed (no job id recorded yet)"
    hosts = f"excluding {','.join(map(str, exclude))}" if exclude else "excluding no hosts"
    return f"{done}, {hosts} (see {path}); a job is requeued at most once"


def _failed_before(job_dir: Path) -> str:
    """', after an earlier requeue that submitted nothing (ERROR)' when JOB_DIR holds one, else ''."""
    path = job_dir / FAILED_FILE
    try:
        error = _read_record(path).get("error")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, files.Untrusted):
        error = None
    said = f": {error}" if error else ""
    return f" (again: an earlier requeue submitted nothing{said}; see {path})"


def dry_run_decision(log_path: Path, env: dict[str, str], lost: str | None = None) -> Decision:
    """What `requeue` would decide, claim and submit, without doing any of it: a claim held is named, an
    earlier failed attempt is mentioned; a refused check (the snapshot, the arguments) raises RequeueError, as
    the requeue would."""
    log, job_dir, env, decision = _decide_from(log_path, env, lost)
    if not decision.retry:
        return decision
    already = _already(job_dir)
    if already:
        return Decision(False, already, decision.attempt, decision.max_retries, decision.exclude)
    try:
        prepare(env)
    except RequeueError as exc:
        raise WouldFail(f"{exc} (decided: {decision.why})", code=exc.code) from None
    total = 1 + decision.max_retries
    hosts = f"excluding {','.join(decision.exclude)}" if decision.exclude else "excluding no hosts"
    decision.why += f" as attempt {decision.next_attempt} of {total}, {hosts}{_failed_before(job_dir)}"
    return decision


@click.command("requeue", cls=_Command, help=HELP)
@click.argument("log", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Say what would be decided; submit and write nothing.")
def command(log, dry_run):
    path = Path(log)
    try:
        if dry_run:
            decision, job_id = dry_run_decision(path, dict(os.environ)), None
        else:
            decision, job_id = requeue(path, dict(os.environ))
    except logparse.LogError as exc:
        raise JobkitError("requeue", str(exc), EXIT_BAD_INPUT) from None
    except RequeueError as exc:  # WouldFail too
        click.echo(f"== {'REQUEUE WOULD FAIL' if isinstance(exc, WouldFail) else 'REQUEUE FAILED'}: {exc} ==")
        exit_with(exc.code)
    total = 1 + decision.max_retries
    if job_id:
        also = f"; excluding {','.join(decision.exclude)}" if decision.exclude else ""
        said = f"{decision.why}{also}" + (f" [{decision.rule}]" if decision.rule else "")
        click.echo(f"== REQUEUED as job {job_id} (attempt {decision.next_attempt} of {total}): {said} ==")
        return
    verb = "would requeue" if dry_run and decision.retry else "not requeued"
    click.echo(f"== {verb}: {decision.said} ==")
    exit_with(EXIT_OK if dry_run and decision.retry else EXIT_ANSWER_NO)
