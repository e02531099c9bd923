"""What Slurm says about jobs, in one place: squeue for the jobs it still holds, sacct for the ones that ended.

Used by `jobkit monitor` (whose jobs are where) and `jobkit artifacts clean` (which snapshots a queued or
running job still needs). The sweep drivers ask about one job they submitted (jobkit.sweep.jobs).
"""

from __future__ import annotations

import subprocess

# Job states after which a job runs no more.
ENDED = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "REVOKED", "TIMEOUT",
}  # fmt: skip


class SlurmError(Exception):
    """squeue could not be asked: one line with squeue's own words."""


def queue(user: str | None = None, include_ended: bool = False) -> dict[str, str]:
    """Job id -> state of the jobs Slurm holds: USER's, or everyone's (a workspace may be shared);
    INCLUDE_ENDED adds those that ended in the last minutes (squeue -t all). Raises SlurmError."""
    who = ["-u", user] if user else ["-a"]
    # %A: the job id (unique per array task, what SLURM_JOB_ID and the log name hold); %i: the `<base>_<n>` form.
    argv = ["squeue", "-h", *who, *(["-t", "all"] if include_ended else []), "-o", "%A %i %T"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError("squeue is not on PATH") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"squeue did not answer ({exc})") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise SlurmError(f"squeue failed (exit {result.returncode}: {said})")
    states: dict[str, str] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        for job_id in parts[:-1]:
            states[job_id] = parts[-1]
            states.setdefault(job_id.split("_")[0], parts[-1])  # `4250_[2-3]`: pending tasks of array 4250
    return states


def accounted(job_ids: list[str]) -> dict[str, str]:
    """Job id -> the state sacct keeps (first word: `CANCELLED by 1000` -> CANCELLED); empty when there is no
    accounting. Falls back to the job completion file (`sacct -c`, jobcomp/filetxt clusters)."""
    if not job_ids:
        return {}
    wanted = set(job_ids)
    for extra in ([], ["-c"]):
        try:
            result = subprocess.run(
                ["sacct", *extra, "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if result.returncode != 0:
            continue
        found = {}
        for line in result.stdout.splitlines():
            job_id, _, state = line.partition("|")
            if job_id.strip() in wanted and state.strip():
                found[job_id.strip()] = state.split()[0]
        if found:
            return found
    return {}
