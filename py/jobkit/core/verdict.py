"""A finished run's verdict: `PASS`, `STOPPED early ...`, `FAIL (<reason class>)` or `status unknown`.

It closes the end-of-run line (`jobkit tgs --line`); `jobkit why` gives the detail and the evidence.
"""

from jobkit.core import failures, logparse

STATUSES = ("SUCCESS", "FAILED", "CANCELLED", "HANG", "STOPPED")


def resolve_status(status: str | None, exit_code: int | None, log: logparse.JobLog) -> str | None:
    """--status, else the log's JOB SUMMARY, else the exit code; None if unknown."""
    if status:
        return status.upper()
    if log.footer_status:
        return log.footer_status
    if exit_code is not None:
        return "SUCCESS" if exit_code == 0 else "FAILED"
    return None


def verdict(log: logparse.JobLog, status: str | None, exit_code: int | None) -> str:
    """`PASS`, `STOPPED early ...`, `FAIL (<reason class>)` or `status unknown`."""
    status = resolve_status(status, exit_code, log)
    if status is None:
        return "status unknown"
    if status == "SUCCESS":
        return "PASS"
    if status == "STOPPED":
        return "STOPPED early (not a full run; see the JOB SUMMARY)"
    if exit_code is None:
        exit_code = log.footer_exit
    found = failures.classify(failures.read_tail(log.path), status, exit_code, has_steps=log.has_steps)
    return f"FAIL ({found.reason})"  # the class only; `jobkit why` gives detail and evidence
