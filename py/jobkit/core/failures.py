"""Why did a failed run fail? A catalogue of what the programs a job runs print when they fail -> a class,
the host to blame, whether to retry, and what to do.

The catalogue is data: `configs/failure_signatures.yaml` (each entry: class, patterns, the program and
source file that prints the message, retry policy, how to blame a host, one line of advice), plus an
optional site-local file that adds or overrides entries (`configs/failure_signatures.local.yaml`, or the
file `FAILURE_SIGNATURES_FILE` names). A bad catalogue is one line naming the file, the entry and the fix.

Order matters: a failing run usually shows several symptoms (an OOM inside a Python traceback, a coordination
timeout that ends in SIGABRT, a GPU fault that ends in a collective error), and the first matching entry names
the root cause. What Slurm says about the end (time limit, node failure, preemption) comes first, since those
jobs also end as CANCELLED. Within that entry the host blamed is the one that failed first (absl or NCCL timestamps,
else log order); the other failing hosts are followers. Only meant for runs already known to have failed;
the catalogue's `benign:` lines (seen in successful runs) are ignored. The class table in docs/diagnosis.md is
generated from the catalogue (`markdown_table`; tests/py/test_failures.py checks it).
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path

from jobkit.core.errors import JobkitError
from jobkit.core.paths import CONFIGS_DIR

TAIL_BYTES = 4 << 20  # failures show at the end; bounded read for huge logs

CATALOGUE = CONFIGS_DIR / "failure_signatures.yaml"
LOCAL_CATALOGUE = CONFIGS_DIR / "failure_signatures.local.yaml"
LOCAL_SETTING = "FAILURE_SIGNATURES_FILE"
RETRY_POLICIES = ("retry", "retry-without-node", "never")
BLAME_METHODS = ("none", "line", "jax-task", "failed-task", "hang-stacks", "timed-out-task")
CANCEL_EXIT_CODES = (130, 143)  # SIGINT, SIGTERM: Ctrl-C / scancel, or srun stopping the peers of a failed task
# Classes that no catalogue entry names: how classify ends when nothing matched.
BUILTIN_POLICIES = {"cancelled": "never", "no-steps": "never", "unknown": "never", "killed-by-signal": "retry"}
_KEYS = {"id", "class", "patterns", "source", "retry", "blame", "advice", "when_cancelled", "weak", "unless",
         "detail", "ignore_case", "disabled", "before", "accused"}  # fmt: skip
ACCUSED_STATES = ("alive", "silent")  # `accused:` of a JAX message: what the task it accuses did afterwards


class CatalogueError(JobkitError):
    """A catalogue file that cannot be used: one line naming the file, the entry and the fix."""

    def __init__(self, message: str):
        super().__init__("failures", message)


@dataclass(frozen=True)
class Signature:
    id: str
    cls: str
    patterns: tuple[re.Pattern[str], ...]
    source: str
    retry: str
    blame: str
    advice: str
    when_cancelled: bool = False
    weak: bool = False
    unless: tuple[re.Pattern[str], ...] = ()
    detail: re.Pattern[str] | None = None
    origin: str = ""  # the file it came from
    accused: str = ""  # alive | silent: counts only where the JAX task its message accuses did that (accused_state)

    def matches(self, text: str) -> list[int]:
        """Where any of its patterns matches TEXT, in log order (none when an `unless` pattern is there)."""
        # A match that starts with blank space (a prefix's optional spaces) is placed at its first character.
        found = sorted({m.start() + len(m.group(0)) - len(m.group(0).lstrip()) for p in self.patterns
                        for m in p.finditer(text)})  # fmt: skip
        if found and any(u.search(text) for u in self.unless):
            return []
        if found and self.accused and accused_state(text, found[0]) != self.accused:
            return []  # the first accusation decides: later copies (the accused's own abort) come after it
        return found


@dataclass(frozen=True)
class Catalogue:
    signatures: tuple[Signature, ...]
    benign: tuple[re.Pattern[str], ...]
    files: tuple[str, ...]


@dataclass(frozen=True)
class Failure:
    reason: str
    detail: str = ""
    evidence: str = ""  # the log line that decided it (trimmed)
    host: str = ""  # the node the log blames, when it names one
    signature: str = ""  # the catalogue entry that matched
    source: str = ""  # the program and file that print its message
    retry: str = ""  # retry | retry-without-node | never
    advice: str = ""
    blame_how: str = ""  # how the host was found, in words
    followers: tuple[str, ...] = field(default_factory=tuple)  # other hosts that failed after it
    noticed: str = ""  # a hang: where it was noticed (the watchdog's marker), which is not what is blamed
    waiting: tuple[str, ...] = field(default_factory=tuple)  # a hang: the ranks that wait, and where
    rank: int | None = None  # the global rank of the process blamed, where the log names one (several per node)
    process: str = ""  # that process in words: `node2, process 0 (global rank 2)`
    metrics: str = ""  # a hang: each host's metrics during the stall and what they read as (core.hang_metrics)

    @property
    def label(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason

    @property
    def retry_decision(self) -> str:
        return self.retry or retry_policy(self.reason)


# ------------------------------------------------------------------------------------------- the catalogue


def _compile(where: str, pattern: object, flags: int) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise CatalogueError(f"{where}: a pattern must be a non-empty string; quote it in single quotes")
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise CatalogueError(f"{where}: pattern {pattern!r} is not a regex ({exc}); fix it") from None


def _entry(path: str, index: int, raw: object, partial: bool) -> tuple[Signature | None, dict]:
    """One catalogue entry, validated. PARTIAL (site-local): an override may give only the keys it changes."""
    if not isinstance(raw, dict):
        raise CatalogueError(f"{path}: signature {index + 1} is not a mapping; give id, class, patterns, ... keys")
    sid = raw.get("id")
    where = f"{path}: signature {index + 1}" + (f" ({sid})" if isinstance(sid, str) else "")
    if not isinstance(sid, str) or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", sid):
        raise CatalogueError(f"{where}: id must be a lower-case name (letters, digits, - and .); add one")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise CatalogueError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(_KEYS))}")
    if partial:
        return None, raw
    for key in ("class", "patterns", "source", "retry", "blame", "advice"):
        if key not in raw:
            raise CatalogueError(f"{where}: '{key}' is missing; every entry names it")
    return _signature(where, raw, path), raw


def _signature(where: str, raw: dict, origin: str) -> Signature:
    cls, patterns = raw["class"], raw["patterns"]
    if not isinstance(cls, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", cls):
        raise CatalogueError(f"{where}: class {cls!r} must be a lower-case name such as gpu-hardware")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list) or not patterns:
        raise CatalogueError(f"{where}: patterns must be a non-empty list of regexes")
    if raw["retry"] not in RETRY_POLICIES:
        raise CatalogueError(f"{where}: retry {raw['retry']!r} is not one of {', '.join(RETRY_POLICIES)}; pick one")
    if raw["blame"] not in BLAME_METHODS:
        raise CatalogueError(f"{where}: blame {raw['blame']!r} is not one of {', '.join(BLAME_METHODS)}; pick one")
    for key in ("source", "advice"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise CatalogueError(f"{where}: {key} must be one line of text; write it")
    for key in ("when_cancelled", "weak", "ignore_case"):
        if not isinstance(raw.get(key, False), bool):
            raise CatalogueError(f"{where}: {key} must be true or false")
    flags = re.M | (re.I if raw.get("ignore_case") else 0)
    unless = raw.get("unless", [])
    if not isinstance(unless, list):
        raise CatalogueError(f"{where}: unless must be a list of regexes")
    if raw.get("accused", "") not in ("", *ACCUSED_STATES):
        raise CatalogueError(f"{where}: accused {raw['accused']!r} is not one of {', '.join(ACCUSED_STATES)}; pick one")
    detail = raw.get("detail")
    detail_re = _compile(where, detail, flags) if detail is not None else None
    if detail_re is not None and detail_re.groups != 1:
        raise CatalogueError(f"{where}: detail {detail!r} must have exactly one (group); add one")
    return Signature(
        raw["id"], cls, tuple(_compile(where, p, flags) for p in patterns), raw["source"].strip(), raw["retry"],
        raw["blame"], raw["advice"].strip(), raw.get("when_cancelled", False), raw.get("weak", False),
        tuple(_compile(where, p, re.M) for p in unless), detail_re, origin, raw.get("accused", ""),
    )  # fmt: skip


def _read(path: Path) -> dict:
    import yaml  # deferred: only when a run is classified

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise CatalogueError(
            f"{path}: cannot be read ({exc.strerror or exc}); fix its permissions or remove it"
        ) from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise CatalogueError(f"{path}: not a YAML catalogue{at} ({first}); fix the syntax") from None
    if not isinstance(data, dict) or not isinstance(data.get("signatures", []), list):
        raise CatalogueError(f"{path}: not a catalogue (a mapping with a 'signatures:' list); see {CATALOGUE}")
    return data


def _benign(path: Path, data: dict) -> list[re.Pattern[str]]:
    out = []
    for index, raw in enumerate(data.get("benign") or []):
        pattern = raw.get("pattern") if isinstance(raw, dict) else None
        out.append(_compile(f"{path}: benign {index + 1}", pattern, re.M))
    return out


def _local_path() -> Path | None:
    given = os.environ.get(LOCAL_SETTING)
    if given:
        path = Path(given)
        if not path.is_file():
            raise CatalogueError(f"{LOCAL_SETTING}={given}: no such file; point it at a catalogue or unset it")
        return path
    return LOCAL_CATALOGUE if LOCAL_CATALOGUE.is_file() else None


def _merge(base: list[Signature], path: Path, data: dict) -> list[Signature]:
    """BASE with a site-local file's entries: same id replaces in place, disabled removes, new ones go
    before `before:` (default: the first weak entry)."""
    out = list(base)
    for index, raw in enumerate(data.get("signatures") or []):
        _, raw = _entry(str(path), index, raw, partial=True)
        where = f"{path}: signature {index + 1} ({raw['id']})"
        at = next((i for i, s in enumerate(out) if s.id == raw["id"]), None)
        if raw.get("disabled"):
            if at is None:
                raise CatalogueError(f"{where}: disables an id the catalogue does not have; check the id")
            del out[at]
            continue
        if at is not None:
            old = out[at]
            merged = {
                "id": old.id, "class": old.cls, "patterns": [p.pattern for p in old.patterns], "source": old.source,
                "retry": old.retry, "blame": old.blame, "advice": old.advice, "when_cancelled": old.when_cancelled,
                "weak": old.weak, "unless": [u.pattern for u in old.unless],
                "detail": old.detail.pattern if old.detail else None,
                "ignore_case": bool(old.patterns[0].flags & re.I),
            }  # fmt: skip
            merged.update({k: v for k, v in raw.items() if k != "before"})
            if merged["detail"] is None:
                merged.pop("detail")
            out[at] = _signature(where, merged, str(path))
            continue
        _, full = _entry(str(path), index, raw, partial=False)
        sig = _signature(where, full, str(path))
        before = raw.get("before")
        if before is not None:
            at = next((i for i, s in enumerate(out) if s.id == before), None)
            if at is None:
                raise CatalogueError(f"{where}: before {before!r} names no entry; give an id from {CATALOGUE.name}")
        else:
            at = next((i for i, s in enumerate(out) if s.weak), len(out))
        out.insert(at, sig)
    return out


_CACHE: dict[tuple, Catalogue] = {}


def load_catalogue(path: Path | None = None, local: Path | None | bool = True) -> Catalogue:
    """The catalogue (PATH, default configs/failure_signatures.yaml) with the site-local file (LOCAL; True:
    the default one if present, None/False: none). Cached by the files' modification times."""
    path = Path(path or CATALOGUE)
    local_path = _local_path() if local is True else (Path(local) if local else None)
    files = [p for p in (path, local_path) if p is not None]
    try:
        key = tuple((str(p), p.stat().st_mtime_ns) for p in files)
    except OSError as exc:
        raise CatalogueError(f"{exc.filename}: cannot be read ({exc.strerror}); restore it") from None
    if key in _CACHE:
        return _CACHE[key]
    data = _read(path)
    sigs: list[Signature] = []
    seen: set[str] = set()
    for index, raw in enumerate(data.get("signatures") or []):
        sig, _ = _entry(str(path), index, raw, partial=False)
        assert sig is not None
        if sig.id in seen:
            raise CatalogueError(f"{path}: signature {index + 1} ({sig.id}): id used twice; rename one")
        seen.add(sig.id)
        sigs.append(sig)
    if not sigs:
        raise CatalogueError(f"{path}: has no signatures; restore it (git checkout -- {path.name})")
    benign = _benign(path, data)
    if local_path is not None:
        local_data = _read(local_path)
        sigs = _merge(sigs, local_path, local_data)
        benign += _benign(local_path, local_data)
    catalogue = Catalogue(tuple(sigs), tuple(benign), tuple(str(p) for p in files))
    _CACHE.clear()
    _CACHE[key] = catalogue
    return catalogue


def retry_policy(reason: str) -> str:
    """What to do after a failure of class REASON: retry, retry-without-node (exclude the blamed host) or
    never; from its first catalogue entry (the classes no entry names: BUILTIN_POLICIES; else never)."""
    for sig in load_catalogue().signatures:
        if sig.cls == reason:
            return sig.retry
    return BUILTIN_POLICIES.get(reason, "never")


def classes() -> list[str]:
    """Every failure class, in catalogue order, then the built-in ends."""
    out: list[str] = []
    for name in [s.cls for s in load_catalogue().signatures] + list(BUILTIN_POLICIES):
        if name not in out:
            out.append(name)
    return out


def markdown_table() -> str:
    """docs/diagnosis.md's failure-class table, from the catalogue: class, retry, how a host is blamed, entries."""
    rows = ["| class | retry | blames | catalogue entries (another retry policy in brackets) |", "|---|---|---|---|"]
    by_class: dict[str, list[Signature]] = {}
    for sig in load_catalogue(local=None).signatures:
        by_class.setdefault(sig.cls, []).append(sig)
    for name, sigs in by_class.items():
        blames = sorted({s.blame for s in sigs} - {"none"}) or ["none"]
        entries = "; ".join(f"`{s.id}`" + (f" ({s.retry})" if s.retry != sigs[0].retry else "") for s in sigs)
        rows.append(f"| {name} | {sigs[0].retry} | {', '.join(blames)} | {entries} |")
    rows.append(
        "| no-steps, unknown | never | failed-task | built in: no step line at all; anything else "
        "(and `cancelled` for status CANCELLED, or exit 130/143 with no task failing first) |"
    )
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------------- blame

# Where a line names the host at fault, most direct first: Slurm or our launcher naming the node, then a rank
# prefix (`1: ...`, srun -l) or a JAX task (`/task:1`), the node of that process rank (one process per node).
# With LOCAL_WORLD_SIZE=N processes per node (`jobkit procs`), a process's line is `[rank<G>]: ...` (after srun's
# node prefix), JAX's task ids are global ranks, and the supervisor tells the first failing process as
# `PROC_EXIT host=<h> rank=<G> local=<i> exit=<rc>`: global rank G is process G % N of node G // N.
_PROC_EXIT = re.compile(r"^(?:[ \t]*\d+: )?PROC_EXIT host=(\S+) rank=(\d+) local=(\d+) exit=(\d+)", re.M)
_SRUN_TASK = re.compile(r"^srun: error: ([\w.-]+): tasks? ([\d,-]+): (.+)$", re.M)
_NODE_EXIT = re.compile(r"^(?:[ \t]*\d+: )?NODE_EXIT host=(\S+) exit=(\d+)", re.M)
_NAMED = [
    (re.compile(r"^srun: error: ([\w.-]+): tasks? ([\d,-]+):"), "srun names the node of task {1}"),
    (re.compile(r"Node failure on ([\w.-]+)"), "srun's 'Node failure on {0}'"),
    (re.compile(r"\bPROC_EXIT host=([\w.-]+) rank=(\d+)"), "the supervisor's PROC_EXIT line names it"),
    (re.compile(r"\bNODE_EXIT host=([\w.-]+)"), "the launcher's NODE_EXIT line names it"),
    (re.compile(r"\[preflight ([\w.-]+)\]"), "preflight names its host"),
    (re.compile(r"\[coredump\] training killed by SIG\w+ \(exit \d+\) on ([\w.-]+)"), "the training tier names it"),
    (re.compile(r"^(?:\s*\d+: )?([\w.-]+): GPU\[\d+\]"), "the ECC check names its host"),
    (re.compile(r"^\w{3} +\d+ [\d:]+ ([\w.-]+) kernel: "), "the kernel log line names the host"),
]
_RANK_PREFIX = re.compile(r"^\s*(\d+): ")
_PROC_PREFIX = re.compile(r"^\s*(?:\d+: )?\[rank(\d+)\]: ")
_LINE_PREFIX = re.compile(r"^\s*(?:\d+: )?(?:\[rank\d+\]: )?")  # a line's whole prefix: its node and process
_JAX_TASK = re.compile(r"/task:(\d+)\b")
_TASK_WORD = re.compile(r"\btask[: ](\d+)\b", re.I)
_BARE_NUMBER = re.compile(r"^\s*(?:\d+: )?(?:\[rank\d+\]: )?(\d+)\s*$")
_FIRST_AT_BARRIER = re.compile(r"first task at the barrier: \S+", re.I)
# absl's prefix: I1124 07:31:04.338372, or (before absl is set up) E0000 00:00:1732528800.123456
_ABSL_TIME = re.compile(r"^(?:\s*\d+: )?(?:\[rank\d+\]: )?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d+(?:\.\d+)?)\s")
# NCCL's own prefix since 2.23 (NCCL_DEBUG_TIMESTAMP_FORMAT, default "[%F %T] "): [2026-11-20 03:04:00]; the
# year is dropped so that it orders with absl's (which has none) within a job.
_NCCL_TIME = re.compile(r"^(?:\s*\d+: )?(?:\[rank\d+\]: )?\[\d{4}-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?)\] ")
# The key JAX waits on while the processes swap their local topologies names the process that did not publish
# it: cuda:local_topology/cuda/2 is process 2's (xla's GPU client, through GetKeyValue).
_TOPOLOGY_KEY = re.compile(r"GetKeyValue\(\) timed out with key: \S*local_topology/\w+/(\d+)\b")
FOLLOWER_REASONS = ("Terminated", "Exited with exit code 143", "Exited with exit code 130")


def _line_at(text: str, pos: int, width: int = 200) -> str:
    """The line holding `pos`, cut to `width` chars around the match."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end >= 0 else len(text)]
    if len(line) > width:
        left = max(0, min(pos - start - width // 4, len(line) - width))
        line = ("..." if left else "") + line[left : left + width] + "..."
    return line.strip()


def process_words(rank: int, procs: int, nodes: list[str] | None) -> str:
    """Global rank RANK with PROCS processes per node in words: `node2, process 0 (global rank 2)`."""
    node = rank // procs
    host = nodes[node] if nodes and node < len(nodes) else f"node {node + 1}"
    return f"{host}, process {rank % procs} (global rank {rank})"


def _host_and_how(line: str, nodes: list[str] | None, procs: int = 1) -> tuple[str | None, str, int | None]:
    """(host, how, global rank or None) LINE blames. PROCS: processes per node (LOCAL_WORLD_SIZE)."""
    for pattern, how in _NAMED:
        m = pattern.search(line)
        if m:
            rank = int(m.group(2)) if pattern.pattern.startswith(r"\bPROC_EXIT") else None
            return m.group(1).rstrip(".,;:"), how.format(*m.groups()), rank
    m = _PROC_PREFIX.search(line)  # before the node prefix: it names the process too
    if m and nodes and int(m.group(1)) // procs < len(nodes):
        g = int(m.group(1))
        return nodes[g // procs], f"the process prefix [rank{g}] -> {process_words(g, procs, nodes)}", g
    for pattern, what in ((_RANK_PREFIX, "rank {n}'s prefix (srun -l)"), (_JAX_TASK, "JAX task {n} on the line")):
        m = pattern.search(line)
        if not (m and nodes):
            continue
        n = int(m.group(1))
        if pattern is _JAX_TASK and procs > 1:  # a JAX task id is a process's global rank
            if n // procs < len(nodes):
                return nodes[n // procs], what.format(n=n) + f" -> {process_words(n, procs, nodes)}", n
        elif n < len(nodes):
            return nodes[n], what.format(n=n) + f" -> node {n + 1} of JOB_NODELIST", None
    return None, "", None


def host_in_line(line: str, nodes: list[str] | None = None, procs: int = 1) -> str | None:
    """The host LINE blames: a node Slurm names, else rank N's or JAX task N's node (the N-th of NODES; with
    PROCS processes per node, a process's `[rank<G>]: ` or JAX task G is on node G // PROCS)."""
    return _host_and_how(line, nodes, procs)[0]


def _accused_number(text: str, pos: int) -> tuple[int | None, str, int]:
    """(task, form, line offset) of the JAX task a coordination message at POS accuses, on its line or the 4
    after it, in each format JAX prints; (None, "", 0) when it names none."""
    start = text.rfind("\n", 0, pos) + 1
    lines = text[start : start + 4000].split("\n")[:5]
    prefix = _line_prefix(lines[0])
    for i, raw in enumerate(lines):
        line = _FIRST_AT_BARRIER.sub("", raw)
        if i and (_line_prefix(raw) != prefix or _ABSL_TIME.match(raw)):
            break  # the message ended: another rank's line, or a new log record
        m, form = (None if i else _TOPOLOGY_KEY.search(line)), "the topology key of task {n} it waited for"
        if m is None:
            m, form = _JAX_TASK.search(line), "/task:{n}"
        if m is None and not i:
            m, form = _TASK_WORD.search(line), "task {n}"
        if m is None and i:
            m, form = _BARE_NUMBER.search(line), "a bare {n}"
        if m:
            return int(m.group(1)), form, i
    return None, "", 0


def _accused_task(text: str, pos: int, nodes: list[str] | None, procs: int = 1) -> tuple[str | None, str, int | None]:
    """The node of the JAX task a coordination message accuses (_accused_number), how it was found, and the
    task's global rank when there are several processes per node (a JAX task id is a process's global rank)."""
    n, form, i = _accused_number(text, pos)
    if n is not None and nodes and n // procs < len(nodes):
        where = "on the message's line" if i == 0 else f"{i} line(s) after the message"
        said = f"the accused JAX task ({form.format(n=n)}, {where})"
        if procs > 1:
            return nodes[n // procs], f"{said} -> {process_words(n, procs, nodes)}", n
        return nodes[n], f"{said} -> node {n + 1} of JOB_NODELIST", None
    return None, "", None


# What shows the accused task was alive after JAX declared it dead: its own coordination-service / heartbeat
# error (the service told it it was in error; a dead or frozen process says nothing), or a new step.
_OWN_NOTICE = re.compile(r"heartbeat|coordination service|distributed service|completed step:", re.I)
# Where the job's tasks start being torn down (srun, our task wrapper, slurmstepd): what a stopped task logs
# after it is woken by the kill says nothing of its state before.
_TEARDOWN = re.compile(
    r"^srun: error: \S+: tasks? [\d,-]+:|^(?:[ \t]*\d+: )?NODE_EXIT host=|\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED"
    r"|^srun: .*Terminating StepId|^==== JOB SUMMARY",
    re.M,
)


def accused_state(text: str, pos: int) -> str:
    """What the JAX task accused by the message at POS (heartbeats) did afterwards, from its `srun -l` rank
    prefix (one process per node: task N is rank N): `alive` when it logged its own coordination or heartbeat
    error, or a step, before the job was torn down (then the accusation was likely a false positive: it was
    slow to heartbeat, not dead); `silent` when it logged nothing of the kind (it died, or was frozen); "" when
    the message names no task or the log has no rank prefixes to tell."""
    n, _, _ = _accused_number(text, pos)
    if n is None:
        return ""
    # several processes per node: task N is the process behind `[rank<N>]: `; one: the node behind `N: `
    own = re.compile(rf"^\s*(?:\d+: )?\[rank{n}\]: (.*)$", re.M)
    if not own.search(text):
        own = re.compile(rf"^\s*{n}: (.*)$", re.M)
        if not own.search(text):
            return ""
    end = text.find("\n", pos)
    start = len(text) if end < 0 else end + 1
    teardown = _TEARDOWN.search(text, start)
    window = text[start : teardown.start() if teardown else len(text)]
    return "alive" if any(_OWN_NOTICE.search(m.group(1)) for m in own.finditer(window)) else "silent"


def _line_prefix(line: str) -> str:
    return _LINE_PREFIX.match(line).group(0)  # always matches (both parts are optional)


def failed_tasks(text: str) -> list[tuple[int, str, str, bool]]:
    """Every task Slurm (`srun: error: <node>: task N: <reason>`) or our launcher (`NODE_EXIT host= exit=`)
    reports as ended badly, and every process `jobkit procs` does (`PROC_EXIT host= rank= local= exit=`, before
    its node's NODE_EXIT): (position, host, the line, follower). A follower was stopped because another
    task failed (Terminated, exit 143/130), not failing by itself."""
    out = []
    for m in _PROC_EXIT.finditer(text):
        out.append((m.start(), m.group(1), m.group(0).strip(), int(m.group(4)) in CANCEL_EXIT_CODES))
    for m in _SRUN_TASK.finditer(text):
        out.append((m.start(), m.group(1), m.group(0).strip(), m.group(3).strip().startswith(FOLLOWER_REASONS)))
    for m in _NODE_EXIT.finditer(text):
        out.append((m.start(), m.group(1), m.group(0).strip(), int(m.group(2)) in CANCEL_EXIT_CODES))
    return sorted(out)


def _absl_key(line: str) -> float | None:
    """LINE's time in seconds (absl's prefix, or NCCL's), comparable between the lines of one job."""
    m = _ABSL_TIME.match(line) or _NCCL_TIME.match(line)
    if not m:
        return None
    month, day, hour, minute, sec = m.groups()
    return ((int(month) * 31 + int(day)) * 24 + int(hour)) * 3600 + int(minute) * 60 + float(sec)


def _first_failed(tasks, procs: int, nodes: list[str] | None, matched=()) -> tuple[str, str, int | None]:
    """(host, how, global rank or None) of the first task or process in TASKS (failed_tasks) that failed by
    itself, the first whose own line the signature MATCHED (positions) when there is one: a process killed
    outright (`PROC_EXIT ... exit=137`) is reported a moment after its peers on another node, which failed at
    once (exit 1, `Connection closed by peer`) and were told first; ("", "", None) when none failed by itself."""
    own = [t for t in tasks if not t[3]]
    if not own:
        return "", "", None
    named = [t for t in own if t[0] in set(matched)]
    _, host, line, _ = (named or own)[0]
    m = _PROC_EXIT.match(line)
    if m:  # a process: say which, on its node
        rank = int(m.group(2))
        return host, f"the first process that failed by itself: {line} -> {process_words(rank, procs, nodes)}", rank
    return host, f"the first task that failed by itself: {line}", None


def _timed_out(tasks, nodes: list[str] | None, pos: int):
    """_blame for a stage that ran out of time: the first task the launcher still had to stop (its NODE_EXIT or
    srun line, exit 143/124/137 included) when the other nodes had finished the stage; nobody when every node
    was still running (the stage is slow everywhere) or no task was reported."""
    hosts = list(dict.fromkeys(t[1] for t in tasks))
    if not hosts or (nodes and set(nodes) <= set(hosts)):
        return "", "", pos, (), None
    line = next(t[2] for t in tasks if t[1] == hosts[0])
    how = f"the stage's time limit stopped it after the other nodes had finished the stage: {line}"
    return hosts[0], how, pos, tuple(hosts[1:]), None


def _blame(sig: Signature, text: str, positions: list[int], nodes: list[str] | None, procs: int = 1):
    """(host, how, evidence position, followers, global rank or None) for SIG matched at POSITIONS."""
    tasks = failed_tasks(text)
    if sig.blame == "none":
        return "", "", positions[0], (), None
    if sig.blame == "failed-task":
        host, how, rank = _first_failed(tasks, procs, nodes, positions)
        if host:
            followers = tuple(dict.fromkeys(t[1] for t in tasks if t[1] != host))
            return host, how, positions[0], followers, rank
        return "", "", positions[0], (), None
    if sig.blame == "timed-out-task":
        return _timed_out(tasks, nodes, positions[0])
    candidates = []
    for pos in positions:
        if sig.blame == "jax-task":  # the task that reported it is not at fault: no accused task, no host
            host, how, rank = _accused_task(text, pos, nodes, procs)
        else:
            host, how, rank = _host_and_how(_line_at(text, pos, 10_000), nodes, procs)
        if host:
            candidates.append((pos, host, how, _absl_key(_line_at(text, pos, 10_000)), rank))
    if not candidates:
        return "", "", positions[0], (), None
    hosts = {c[1] for c in candidates}
    timed = len(hosts) > 1 and all(c[3] is not None for c in candidates)
    first = min(candidates, key=lambda c: (c[3], c[0])) if timed else candidates[0]
    how = first[2]
    # The evidence: the first line of the blamed host's failure, or an earlier line that names no host.
    hosted = {c[0] for c in candidates if c[1] != first[1]}
    evidence = next(p for p in positions if p not in hosted and p <= first[0])
    if len(hosts) > 1:
        stamps = (
            "absl timestamps"
            if all(_ABSL_TIME.match(_line_at(text, c[0], 10_000)) for c in candidates)
            else ("absl and NCCL timestamps")
        )
        how += f"; the first of {len(hosts)} hosts to report it ({stamps if timed else 'log order'})"
    followers = [c[1] for c in candidates] + [t[1] for t in tasks]
    return first[1], how, evidence, tuple(dict.fromkeys(h for h in followers if h != first[1])), first[4]


# ------------------------------------------------------------------------------------------ classifying

_EXC_LINE = re.compile(
    r"^(?:\s*\d+: )?(?:\[rank\d+\]: )?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b", re.M
)
_SIGNAME = re.compile(r"SIG[A-Z]+")
# The signal behind a message that does not name it (faulthandler's, the shell's, srun's); else the training
# tier's own line (COREDUMP=1), which names it even when the job's exit code is not training's.
_SIGNAL_WORDS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL", "Killed": "SIGKILL"}  # fmt: skip
_SIGNAL_WORD = re.compile("|".join(_SIGNAL_WORDS))
_HANG_LINE = re.compile(r"^\s*(?:(\d+): )?== HANG detected \((.*)\) ==")
_KILLED_BY = re.compile(r"^(?:\s*\d+: )?\[coredump\] training killed by (SIG[A-Z]+)", re.M)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# The job header's provenance (utils/lib/artifact.sh _git_summary): the commit's subject, changed files and the
# diff against HEAD are the user's text, not the run's ("fix heartbeat timeout" read as a heartbeat kill).
_PROVENANCE = re.compile(
    r"^== SOURCE ==\n.*?(?=^== (?!BRANCH ==|COMMIT ==|CHANGED FILES ==|UNTRACKED FILES ==|DIFF AGAINST HEAD ==)|\Z)",
    re.M | re.S,
)


def _blank_benign(text: str, benign: tuple[re.Pattern[str], ...]) -> str:
    """TEXT with the job header's provenance and the lines that match a benign pattern blanked (same length:
    positions stay)."""
    text = _PROVENANCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, count=1)
    if not benign:
        return text
    out = []
    for line in text.split("\n"):
        out.append(" " * len(line) if any(b.search(line) for b in benign) else line)
    return "\n".join(out)


def _detail(sig: Signature, text: str, pos: int, exit_code: int | None) -> str:
    line = _line_at(text, pos, 10_000)
    if sig.detail is not None:
        m = sig.detail.search(line)
        return m.group(1).strip() if m else ""
    if sig.cls == "killed-by-signal":
        sig_name, word, killed_by = _SIGNAME.search(line), _SIGNAL_WORD.search(line), _KILLED_BY.search(text)
        if sig_name:
            return sig_name.group(0)
        if word:
            return _SIGNAL_WORDS[word.group(0)]
        if killed_by:
            return killed_by.group(1)
        return _signal_name(exit_code - 128) if exit_code and exit_code > 128 else ""
    if sig.cls == "python-exception":
        names = _EXC_LINE.findall(text, pos + 1)
        return names[-1].rsplit(".", 1)[-1] if names else ""
    return ""


def _failure(
    sig: Signature, text: str, positions: list[int], exit_code, nodes, job_dir=None, procs=1, hang_window=None
) -> Failure:
    if sig.blame == "hang-stacks":
        found = _hang_failure(sig, text, positions[0], exit_code, nodes, job_dir)
        return _with_metrics(found, text, positions[0], nodes, procs, job_dir, hang_window)
    host, how, pos, followers, rank = _blame(sig, text, positions, nodes, procs)
    return Failure(
        sig.cls, _detail(sig, text, pos, exit_code), _line_at(text, pos), host, sig.id, sig.source, sig.retry,
        sig.advice, how, followers, rank=rank, process=process_words(rank, procs, nodes) if rank is not None else "",
    )  # fmt: skip


def _hang_failure(sig: Signature, text: str, pos: int, exit_code, nodes, job_dir) -> Failure:
    """A hang, blamed from the stacks the watchdog took (core.hang_stacks): the rank unlike the others. Where
    the hang was noticed is kept apart (`noticed`); a cause on the node itself (a stopped or D-state process,
    a node that did not answer) is retried without that node."""
    from jobkit.core import hang_stacks

    m = _HANG_LINE.match(_line_at(text, pos, 10_000))
    noticed = ""
    if m and m.group(1) is not None:  # the log's HANG line: its rank prefix says which rank's watchdog it was
        n = int(m.group(1))
        host = nodes[n] if nodes and n < len(nodes) else f"rank {n}"
        noticed = f"on {host} (rank {n}), {m.group(2)}" if nodes and n < len(nodes) else f"on {host}, {m.group(2)}"
    elif m:
        noticed = m.group(2)
    base = Failure(
        sig.cls, _detail(sig, text, pos, exit_code), _line_at(text, pos), signature=sig.id, source=sig.source,
        retry=sig.retry, advice=sig.advice, noticed=noticed,
    )  # fmt: skip
    cause = hang_stacks.read(Path(job_dir) / "hang", nodes) if job_dir is not None else None
    if cause is None:
        why = "no hang/<host>.txt stacks to read" if job_dir is not None else "the stacks were not read"
        return replace(base, blame_how=f"nobody: {why}; the rank that noticed the hang is not the one at fault")
    retry = "retry-without-node" if cause.node_local and cause.host else sig.retry
    advice = sig.advice
    if cause.node_local and cause.host:
        advice = f"the cause is on {cause.host} itself (see blamed because); retry without it and look at that node"
    return replace(
        base, host=cause.host, blame_how=cause.because, retry=retry, advice=advice,
        noticed=cause.noticed or base.noticed, waiting=cause.waiting,
    )  # fmt: skip


def gpu_fault_lines(text: str, pos: int, nodes: list[str] | None, procs: int = 1) -> dict[str, list[str]]:
    """{host: [line, ...]}: the catalogue's gpu-hardware lines in TEXT from the last step before POS (the hang's
    line) on, each tied to the host its rank prefix names (the only node of a one-node job when it names none).
    The hang's entry comes first in the catalogue, so these lines never classify a hang; here they blame."""
    since = text.rfind("completed step:", 0, pos)
    since = text.rfind("\n", 0, since) + 1 if since >= 0 else 0
    found: dict[str, list[str]] = {}
    for sig in load_catalogue().signatures:
        if sig.cls != "gpu-hardware":
            continue
        for at in sig.matches(text):
            if at < since:
                continue
            line = _line_at(text, at)
            host = _host_and_how(_line_at(text, at, 10_000), nodes, procs)[0]
            if not host and nodes and len(nodes) == 1:
                host = nodes[0]
            if host and line not in found.get(host, []):
                found.setdefault(host, []).append(line)
    return found


def _with_metrics(found: Failure, text: str, pos: int, nodes, procs, job_dir, hang_window) -> Failure:
    """FOUND (a hang blamed from its stacks) with what each host's metrics during the stall and the log's GPU
    fault lines say (core.hang_metrics). A node-local cause the stacks found stands; otherwise a GPU fault is
    blamed and left out of the retry, and where the stacks blamed nobody, so is a host whose GPUs went idle,
    or a collective deadlock is said (nobody blamed). HANG_WINDOW(job_dir) is the TSDB's reader
    (observe.hang_tsdb), passed in by the layers above."""
    from jobkit.core import hang_metrics

    window = None
    if hang_window is not None and job_dir is not None:
        try:
            window = hang_window(Path(job_dir))
        except OSError:  # the reader says its own problems in the window's note; this is the last guard
            window = None
    said = hang_metrics.judge(window, gpu_fault_lines(text, pos, nodes, procs))
    if said is None:
        return found
    found = replace(found, metrics=said.line)
    if found.host and found.retry == "retry-without-node":  # the stacks' node-local cause: it stands
        return found
    # A host whose GPUs went idle is what a rank the stacks already blamed (its training gone, or not waiting)
    # looks like: their reading stands. A GPU fault is the node's own whatever the stacks say.
    if said.verdict == "gpu-fault" or (said.verdict == "odd-host" and not found.host):
        stacks = f"; {found.blame_how}" if found.blame_how.startswith("stacks:") else ""
        return replace(
            found, host=said.host, blame_how=said.because + stacks, retry="retry-without-node", waiting=found.waiting,
            advice=f"the cause is on {said.host} itself (see blamed because); retry without it and look at that node",
        )  # fmt: skip
    if said.verdict == "collective-deadlock" and not found.host:
        return replace(
            found, blame_how=f"{said.because}; {found.blame_how}" if found.blame_how.startswith("stacks:") else said.because,
            advice="a collective deadlock: every rank waits in a collective that none completes; a retry may pass, "
            "and if it hangs again at the same step look at the program's collectives (NCCL_DEBUG=INFO)",
        )  # fmt: skip
    return found


def matches(text: str, catalogue: Catalogue | None = None) -> list[tuple[int, Signature, str]]:
    """Every catalogue entry that matches TEXT, at each line it matches, in log order: (pos, entry, line)."""
    catalogue = catalogue or load_catalogue()
    clean = _blank_benign(text, catalogue.benign)
    found = [(pos, sig, _line_at(clean, pos)) for sig in catalogue.signatures for pos in sig.matches(clean)]
    return sorted(found, key=lambda f: f[0])


def _signalled(exit_code: int | None) -> bool:
    """An exit code that names the signal that ended training (not 130/143: a cancel, or srun stopping peers)."""
    return exit_code is not None and exit_code > 128 and exit_code not in CANCEL_EXIT_CODES


def classify(
    text: str,
    status: str | None = None,
    exit_code: int | None = None,
    has_steps: bool | None = None,
    nodes: list[str] | None = None,
    job_dir: Path | str | None = None,
    procs: int = 1,
    hang_window=None,
) -> Failure:
    """Reason a run failed, from its log text plus what the caller knows. NODES (rank order) lets the
    failure name the host a rank- or task-numbered line blames; JOB_DIR (`<log without .log>`) lets a hang
    be blamed from the stacks in its hang/ dir; PROCS (the log's LOCAL_WORLD_SIZE) maps a process's global rank
    G (`[rank<G>]: `, JAX task G, PROC_EXIT rank=G) to its node, G // PROCS. HANG_WINDOW(job_dir), when given
    (observe.hang_tsdb.read_window: core does not read TSDBs), is a hang's per-host metrics during the stall."""
    catalogue = load_catalogue()
    clean = _blank_benign(text, catalogue.benign)
    cancelled = (status or "").upper() == "CANCELLED"
    # Exit 130/143 without a CANCELLED status is a person's Ctrl-C or scancel, or srun stopping the peers of
    # a task that failed (--kill-on-bad-exit): generic evidence counts only when a task failed by itself.
    stopped = exit_code in CANCEL_EXIT_CODES and not any(not t[3] for t in failed_tasks(clean))
    for sig in catalogue.signatures:
        if cancelled and not sig.when_cancelled:
            continue
        if stopped and sig.weak:
            continue
        if sig.cls == "python-exception" and _signalled(exit_code):
            return Failure("killed-by-signal", _signal_name(exit_code - 128), f"exit code {exit_code}",
                           retry=retry_policy("killed-by-signal"))  # fmt: skip
        positions = sig.matches(clean)
        if positions:
            return _failure(sig, clean, positions, exit_code, nodes, job_dir, procs, hang_window)
    if cancelled or stopped:
        evidence = f"exit code {exit_code}" if exit_code in CANCEL_EXIT_CODES and not cancelled else f"status {status}"
        return Failure("cancelled", evidence=evidence, retry="never", advice="the job was cancelled; nothing failed")
    if _signalled(exit_code):
        return Failure("killed-by-signal", _signal_name(exit_code - 128), f"exit code {exit_code}",
                       retry=retry_policy("killed-by-signal"))  # fmt: skip
    host, how, rank = _first_failed(failed_tasks(clean), procs, nodes)
    process = process_words(rank, procs, nodes) if rank is not None else ""
    if has_steps is None:
        has_steps = "completed step:" in text
    if not has_steps:
        return Failure("no-steps", host=host, blame_how=how, retry="never", rank=rank, process=process)
    return Failure("unknown", f"exit {exit_code}" if exit_code is not None else "", host=host, blame_how=how,
                   retry="never", rank=rank, process=process)  # fmt: skip


def rules() -> list[tuple[str, re.Pattern[str]]]:
    """(class, pattern) per catalogue pattern, in order (the first match wins)."""
    return [(sig.cls, p) for sig in load_catalogue().signatures for p in sig.patterns]


def __getattr__(name: str):
    if name == "RULES":  # the old table's name: read from the catalogue when asked for
        return rules()
    raise AttributeError(name)


def read_tail(path: str, max_bytes: int = TAIL_BYTES) -> str:
    """The last `max_bytes` of a file as text."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        return fh.read().decode("utf-8", errors="replace")
