"""`jobkit profile JOB [--compare JOB2]`: what a job's captured profile says, from xprof's own converters.

MaxText captures a profile with `-- profiler=xplane skip_first_n_steps_for_profiler=N profiler_steps=K`; it lands
in `<job dir>/<run_name>/tensorboard/plugins/profile/<session>/<host>.xplane.pb` (one session directory per
capture, one file per host). The newest session is read unless `--session` names one.

Which xprof converter (`xprof.convert.raw_to_tool_data.xspace_to_tool_data`, xprof 2.24) serves what, and why:
- Step-time composition: `overview_page`, its step-time graph: per captured step, its time and the parts xprof
  splits it into (device compute, device collectives, device to device, host compute, kernel launch, input,
  output, compilation, other). Works on CPU and GPU profiles alike; the captured step count is its row count.
- Per-op time: `hlo_stats` (xprof's per-HLO-op table: self time, occurrences, program) where it has rows. It
  is built from device planes only, so a CPU-backend profile (no device plane: XLA runs its ops on host
  threads) leaves it empty; then the `trace_viewer` converter's events are used instead: every event that
  carries `hlo_op` / `hlo_module` arguments is one execution of an HLO op (XLA's CPU runtime records one per
  thunk), and its self time is its duration less that of op events nested in it on the same thread.
  Op times are summed over all threads, so on a backend that runs ops in parallel they add up to more than the
  wall time (as xprof's own op tables do).
- Categories: `graph_viewer` with `type=short_txt` gives each profiled module's HLO text (the program that ran,
  embedded in the xplane), parsed with jobkit.analysis.hlo; an op falls in the first category that fits
  (`categorize`):
    1. collectives: it is, or its fused / async computation holds, an all-reduce, all-gather, reduce-scatter,
       all-to-all, collective-permute or collective-broadcast (sync, -start or -done);
    2. matmul/convolution: it is, or its fused computation holds, a dot or a convolution, or it is a
       custom-call to a GEMM / convolution library (cuBLAS, cuDNN, hipBLASLt, a Triton GEMM, ...);
    3. host: infeed, outfeed, send, recv (and -done), or a custom-call to a host callback;
    4. copies: copy, copy-start/-done or transpose, or a fusion of nothing but those and bitcast / reshape /
       tuple plumbing (XLA's `copy_bitcast_fusion`, `wrapped_transpose`, ...);
    5. fusions: every other fusion;
    6. other: every other op (unfused elementwise, reduce, gather/scatter, while/conditional control, ...).
  An op the HLO text does not hold falls back to its xprof category (hlo_stats) or its name.

The converters write caches next to the file they read (`*.hlo_proto.pb`, `ALL_HOSTS.op_stats_v2.pb`), so the
xplane files are linked into a temporary directory first: nothing is written into the job dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.analysis import hlo
from jobkit.core import paths
from jobkit.core.errors import JobkitError
from jobkit.ops import jobs

CATEGORIES = ("matmul/convolution", "collectives", "fusions", "copies", "host", "other")
# overview_page step-time graph column id -> our name for the part of a step.
STEP_PARTS = {
    "deviceComputeTimeMs": "device_compute",
    "deviceCollectivesTimeMs": "device_collectives",
    "deviceToDeviceTimeMs": "device_to_device",
    "hostComputeTimeMs": "host_compute",
    "kernelLaunchTimeMs": "kernel_launch",
    "infeedTimeMs": "input",
    "outfeedTimeMs": "output",
    "compileTimeMs": "compilation",
    "otherTimeMs": "other",
}
RERUN = "rerun the job with `-- profiler=xplane skip_first_n_steps_for_profiler=5 profiler_steps=3`"
_COLLECTIVE_OPS = {
    f"{c}{s}" for c in (*hlo.COLLECTIVES, "collective-broadcast", "ragged-all-to-all") for s in ("", "-start", "-done")
}
_MATMUL_TARGET = re.compile(r"gemm|matmul|cublas|cudnn|conv|hipblas|triton", re.I)
_HOST_OPS = {"infeed", "outfeed", "send", "recv", "send-done", "recv-done"}
_COPY_OPS = {"copy", "copy-start", "copy-done", "transpose"}
_PLUMBING = {"bitcast", "reshape", "parameter", "tuple", "get-tuple-element", "constant"}
_FUSION_LIKE = {"fusion", "async-start", "async-done", "call"}  # ops whose called computations are their body


class ProfileError(Exception):
    """One line that says what is wrong and what to do."""


@dataclass
class Op:
    name: str
    module: str
    category: str
    occurrences: int = 0
    self_us: float = 0.0


@dataclass
class Summary:
    job_dir: str
    session: str
    xplanes: list[str]
    op_source: str
    steps: list[dict] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    @property
    def total_us(self) -> float:
        return sum(o.self_us for o in self.ops)

    def categories(self) -> dict[str, float]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        for o in self.ops:
            out[o.category] += o.self_us
        return out

    def step_mean(self) -> dict[str, float]:
        if not self.steps:
            return {}
        keys = ["step_ms", *STEP_PARTS.values()]
        return {k: sum(s[k] for s in self.steps) / len(self.steps) for k in keys}

    def modules(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for o in self.ops:
            out[o.module] += o.self_us
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_json(self, top: int) -> dict:
        total = self.total_us
        n = max(len(self.steps), 1)
        return {
            "job_dir": self.job_dir,
            "session": self.session,
            "xplanes": self.xplanes,
            "op_source": self.op_source,
            "steps_captured": len(self.steps),
            "steps": self.steps,
            "step_mean_ms": self.step_mean(),
            "op_time_ms": total / 1000,
            "op_time_per_step_ms": total / 1000 / n,
            "categories": {
                c: {"ms": us / 1000, "per_step_ms": us / 1000 / n, "share": us / total if total else 0.0}
                for c, us in self.categories().items()
            },
            "modules_ms": {m: us / 1000 for m, us in self.modules().items()},
            "top_ops": [
                {
                    "op": o.name,
                    "module": o.module,
                    "category": o.category,
                    "occurrences": o.occurrences,
                    "ms": o.self_us / 1000,
                    "share": o.self_us / total if total else 0.0,
                }
                for o in self.top(top)
            ],
        }

    def top(self, n: int) -> list[Op]:
        return sorted(self.ops, key=lambda o: -o.self_us)[:n]


# --- finding the profile ---


def sessions(job_dir: Path) -> dict[str, list[Path]]:
    """Profile session name -> its xplane files, oldest session first."""
    found: dict[str, list[Path]] = defaultdict(list)
    for pattern in ("*/tensorboard/plugins/profile/*/*.xplane.pb", "tensorboard/plugins/profile/*/*.xplane.pb",
                    "*/plugins/profile/*/*.xplane.pb", "plugins/profile/*/*.xplane.pb"):  # fmt: skip
        for path in job_dir.glob(pattern):
            found[path.parent.name].append(path)
    return {k: sorted(set(found[k])) for k in sorted(found)}


def find_profile(job_dir: Path, session: str | None) -> tuple[str, list[Path]]:
    problem = hlo.job_dir_problem(job_dir)
    if problem:
        raise ProfileError(problem)
    try:
        found = sessions(job_dir)
    except OSError as e:
        raise ProfileError(f"cannot read {job_dir}: {e.strerror or e}; check its permissions") from None
    if not found:
        raise ProfileError(f"no profile captured in {job_dir.name} (no plugins/profile/*/*.xplane.pb); {RERUN}")
    if session is None:
        session = list(found)[-1]
    elif session not in found:
        raise ProfileError(f"no profile session '{session}' in {job_dir.name}; it has: {', '.join(found)}")
    for path in found[session]:
        if not os.access(path, os.R_OK) or not path.is_file():
            raise ProfileError(f"cannot read {path}; check the file and its permissions")
        if path.stat().st_size == 0:  # xprof reads an empty XSpace as a profile of nothing: all-zero tables
            raise ProfileError(f"{path} is empty (0 bytes; the capture did not finish); {RERUN}")
    return session, found[session]


# --- running xprof's converters ---


@contextlib.contextmanager
def _quiet_stderr():
    """xprof's C++ side logs to fd 2 (absl); keep it off the terminal, and hand back its text for errors."""
    captured: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode("utf-8", "replace"))


def _last_error(log: str) -> str:
    errors = [line.split("] ", 1)[-1] for line in log.splitlines() if line.startswith(("E0", "F0"))]
    errors = [e for e in errors if "UnifiedProfileProcessor" not in e]
    return errors[-1].strip() if errors else "no reason given"


class Converter:
    """xprof's tools over one session's xplane files, linked into a private temporary directory."""

    def __init__(self, xplanes: list[Path], workdir: Path):
        self.paths = []
        for path in xplanes:
            link = workdir / path.name
            try:
                link.symlink_to(path.resolve())
            except OSError:
                link.write_bytes(path.read_bytes())
            self.paths.append(str(link))
        self.workdir = workdir
        logging.getLogger("tensorboard").setLevel(logging.ERROR)

    def tool(self, tool: str, params: dict | None = None, required: bool = True):
        from xprof.convert import raw_to_tool_data  # imported here: only this command pays for it

        with _quiet_stderr() as log:
            try:
                data, _ = raw_to_tool_data.xspace_to_tool_data(self.paths, tool, {"use_saved_result": False,
                                                                                  **(params or {})})  # fmt: skip
            except Exception as e:  # noqa: BLE001 - xprof raises ValueError and friends with its message
                data, log = None, [str(e)]
        if data is None and required:
            names = ", ".join(Path(p).name for p in self.paths)
            raise ProfileError(f"xprof could not read {names} ({tool}: {_last_error(''.join(log))}); {RERUN}")
        return data.decode() if isinstance(data, bytes) else data

    def extract_hlo(self) -> None:
        """Have xprof write the HLO protos embedded in the xplane into the work dir (as its plugin does)."""
        from xprof.convert import raw_to_tool_data

        with _quiet_stderr(), contextlib.suppress(Exception):
            raw_to_tool_data.xspace_to_tool_names(self.paths)

    def module_names(self) -> list[str]:
        """`jit_train_step(31)`-style names of the HLO modules embedded in the xplane (graph_viewer's keys)."""
        return sorted(p.name.removesuffix(".hlo_proto.pb") for p in self.workdir.glob("*.hlo_proto.pb"))


# --- reading what they return ---


def _table(data, wanted: str) -> dict | None:
    """The DataTable-style table (`cols` / `rows`) whose columns include WANTED."""
    tables = data if isinstance(data, list) else [data]
    for t in tables:
        if isinstance(t, dict) and any(c.get("id") == wanted for c in t.get("cols", [])):
            return t
    return None


def _rows(table: dict) -> list[dict]:
    ids = [c.get("id") for c in table.get("cols", [])]
    return [{i: (c or {}).get("v") for i, c in zip(ids, row.get("c", []), strict=False)} for row in table["rows"]]


def step_rows(overview: str) -> list[dict]:
    """Per captured step: `step` (xprof's step name), `step_ms` and the STEP_PARTS in ms."""
    table = _table(json.loads(overview), "stepTimeMs")
    if table is None:
        return []
    steps = []
    for row in _rows(table):
        step = {"step": str(row.get("stepnum") or ""), "step_ms": float(row.get("stepTimeMs") or 0.0)}
        step.update({name: float(row.get(col) or 0.0) for col, name in STEP_PARTS.items()})
        steps.append(step)
    return steps


def hlo_stats_ops(text: str) -> list[tuple[str, str, str, int, float]]:
    """(program id, op name, xprof category, occurrences, self time us) per row of xprof's hlo_stats."""
    table = _table(json.loads(text), "hlo_op_name")
    if table is None:
        return []
    out = []
    for row in _rows(table):
        if str(row.get("category") or "").upper() == "IDLE":
            continue
        out.append((str(row.get("program_id") or ""), str(row.get("hlo_op_name") or ""), str(row.get("category") or ""),
                    int(row.get("occurrences") or 0), float(row.get("total_self_time") or 0.0)))  # fmt: skip
    return out


def trace_ops(text: str) -> list[tuple[str, str, float]]:
    """(module, op name, self time us) per HLO op execution in trace_viewer's events (see the module doc)."""
    events = json.loads(text).get("traceEvents", [])
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e.get("ts", 0)), -float(e.get("dur", 0))))
        stack: list[list] = []  # [end, event, child time]
        for e in evs:
            start, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), out)
            if stack:
                stack[-1][2] += dur
            stack.append([start + dur, e, 0.0])
        while stack:
            _close(stack.pop(), out)
    return out


def _close(frame: list, out: list) -> None:
    _, e, children = frame
    args = e["args"]
    out.append((str(args.get("hlo_module") or ""), str(args["hlo_op"]), max(float(e.get("dur", 0)) - children, 0.0)))


def categorize(module: hlo.Module | None, op: str, fallback: str = "") -> str:
    """The category of op OP in MODULE (rules in the module docstring); FALLBACK is xprof's category, if any."""
    instr = module.instructions.get(op) if module else None
    if instr is None:
        return _by_name(fallback or op)
    opcodes = {instr.opcode}
    targets = {instr.target} if instr.target else set()
    if instr.opcode in _FUSION_LIKE:
        for ins in _body(module, instr.calls):
            opcodes.add(ins.opcode)
            if ins.target:
                targets.add(ins.target)
    if opcodes & _COLLECTIVE_OPS:
        return "collectives"
    if opcodes & {"dot", "convolution"} or any(_MATMUL_TARGET.search(t) for t in targets):
        return "matmul/convolution"
    if opcodes & _HOST_OPS or any("callback" in t.lower() or "host" in t.lower() for t in targets):
        return "host"
    body = opcodes - _FUSION_LIKE if instr.opcode in _FUSION_LIKE else opcodes
    if body & _COPY_OPS and body <= _COPY_OPS | _PLUMBING:
        return "copies"
    if instr.opcode == "fusion":
        return "fusions"
    return "other"


def _by_name(name: str) -> str:
    low = name.lower()
    if any(c in low for c in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective", "nccl")):
        return "collectives"
    if any(c in low for c in ("convolution", "dot", "gemm", "matmul", "cublas", "cudnn")):
        return "matmul/convolution"
    if any(c in low for c in ("infeed", "outfeed", "send", "recv", "host")):
        return "host"
    if low.startswith(("copy", "transpose")) or "data formatting" in low:
        return "copies"
    if "fusion" in low:
        return "fusions"
    return "other"


def _body(module: hlo.Module, names: list[str], seen: set | None = None):
    """The instructions of computations NAMES and of the computations they call, each computation once."""
    seen = set() if seen is None else seen
    for name in names:
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        for ins in module.computations[name]:
            yield ins
            if ins.calls:
                yield from _body(module, ins.calls, seen)


def summarize(job_dir: Path, session: str | None = None) -> Summary:
    """Read the job's profile (newest session unless SESSION) with xprof's converters. Raises ProfileError."""
    session, xplanes = find_profile(job_dir, session)
    with tempfile.TemporaryDirectory(prefix="jobkit-profile-") as tmp:
        conv = Converter(xplanes, Path(tmp))
        steps = step_rows(conv.tool("overview_page"))
        stats = hlo_stats_ops(conv.tool("hlo_stats", required=False) or "[]")
        modules = _modules(conv)
        if stats:
            source = "hlo_stats"
            by_id = {re.sub(r".*\((\d+)\)$", r"\1", k): k for k in modules}
            merged: dict[tuple, Op] = {}
            for program, name, xcat, count, self_us in stats:
                full = by_id.get(program, program)
                mod_name = re.sub(r"\(\d+\)$", "", full)
                op = merged.setdefault((mod_name, name), Op(name, mod_name, categorize(modules.get(full), name, xcat)))
                op.occurrences += count
                op.self_us += self_us
        else:
            source = "trace_viewer"
            by_name = {re.sub(r"\(\d+\)$", "", k): v for k, v in modules.items()}
            merged = {}
            for mod_name, name, self_us in trace_ops(conv.tool("trace_viewer")):
                op = merged.setdefault((mod_name, name), Op(name, mod_name, categorize(by_name.get(mod_name), name)))
                op.occurrences += 1
                op.self_us += self_us
    return Summary(str(job_dir), session, [str(p) for p in xplanes], source, steps, list(merged.values()))


def _modules(conv: Converter) -> dict[str, hlo.Module]:
    """The HLO modules embedded in the profile, parsed; a module xprof cannot give is left out (ops fall back)."""
    conv.extract_hlo()
    out = {}
    for name in conv.module_names():
        text = conv.tool("graph_viewer", {"graph_viewer_options": {"module_name": name, "type": "short_txt"}},
                         required=False)  # fmt: skip
        if not text:
            continue
        with contextlib.suppress(ValueError):
            out[name] = hlo.parse_module(text)
    return out


# --- the terminal ---


def _fmt_table(rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _steps_line(s: Summary) -> str:
    names = [x["step"] for x in s.steps]
    return f"{len(s.steps)} step(s) captured ({', '.join(names)})" if names else "no steps marked in the profile"


def format_one(s: Summary, top: int) -> str:
    n = max(len(s.steps), 1)
    total = s.total_us
    out = [f"{Path(s.job_dir).name}: profile {s.session} ({len(s.xplanes)} host file(s)), {_steps_line(s)}",
           f"per-op times from xprof {s.op_source}; categories from the profile's HLO"]  # fmt: skip
    mean = s.step_mean()
    if mean:
        out += ["", "Step time (ms, mean over the captured steps, xprof overview_page):"]
        rows = [["PART", "MS", "SHARE"]]
        rows.append(["step time", f"{mean['step_ms']:.3f}", "100.0%"])
        for part in STEP_PARTS.values():
            share = mean[part] / mean["step_ms"] * 100 if mean["step_ms"] else 0.0
            rows.append([f"  {part.replace('_', ' ')}", f"{mean[part]:.3f}", f"{share:.1f}%"])
        out.append(_fmt_table(rows, {1, 2}))
    out += ["", "Op self time by category (all HLO ops in the capture, summed over threads/devices):"]
    rows = [["CATEGORY", "MS", "MS/STEP", "SHARE"]]
    for cat, us in s.categories().items():
        rows.append([cat, f"{us / 1000:.3f}", f"{us / 1000 / n:.3f}", f"{us / total * 100 if total else 0:.1f}%"])
    rows.append(["total", f"{total / 1000:.3f}", f"{total / 1000 / n:.3f}", "100.0%"])
    out.append(_fmt_table(rows, {1, 2, 3}))
    out += ["", f"Top {top} ops by self time:"]
    rows = [["OP", "MODULE", "CATEGORY", "COUNT", "MS", "SHARE"]]
    for o in s.top(top):
        share = o.self_us / total * 100 if total else 0
        rows.append([o.name, o.module, o.category, str(o.occurrences), f"{o.self_us / 1000:.3f}", f"{share:.1f}%"])
    out.append(_fmt_table(rows, {3, 4, 5}))
    return "\n".join(out)


def _delta(a: float, b: float) -> tuple[str, str]:
    pct = f"{(b - a) / a * 100:+.1f}%" if a else ("n/a" if b else "0.0%")
    return f"{b - a:+.3f}", pct


def format_compare(a: Summary, b: Summary, top: int) -> str:
    na, nb = max(len(a.steps), 1), max(len(b.steps), 1)
    out = [f"A = {Path(a.job_dir).name}: profile {a.session}, {_steps_line(a)} (per-op: {a.op_source})",
           f"B = {Path(b.job_dir).name}: profile {b.session}, {_steps_line(b)} (per-op: {b.op_source})"]  # fmt: skip
    ma, mb = a.step_mean(), b.step_mean()
    if ma and mb:
        out += ["", "Step time (ms, mean over the captured steps):"]
        rows = [["PART", "A", "B", "B-A", "CHANGE"]]
        for key in ["step_ms", *STEP_PARTS.values()]:
            label = "step time" if key == "step_ms" else f"  {key.replace('_', ' ')}"
            rows.append([label, f"{ma[key]:.3f}", f"{mb[key]:.3f}", *_delta(ma[key], mb[key])])
        out.append(_fmt_table(rows, {1, 2, 3, 4}))
    out += ["", "Op self time per step by category (ms):"]
    ca, cb = a.categories(), b.categories()
    rows = [["CATEGORY", "A", "B", "B-A", "CHANGE"]]
    for cat in [*CATEGORIES, "total"]:
        x = (a.total_us if cat == "total" else ca[cat]) / 1000 / na
        y = (b.total_us if cat == "total" else cb[cat]) / 1000 / nb
        rows.append([cat, f"{x:.3f}", f"{y:.3f}", *_delta(x, y)])
    out.append(_fmt_table(rows, {1, 2, 3, 4}))
    out += ["", f"Top ops per step (ms; the {top} largest of either job):"]
    oa = {(o.module, o.name): o.self_us / 1000 / na for o in a.ops}
    ob = {(o.module, o.name): o.self_us / 1000 / nb for o in b.ops}
    keys = sorted(set(oa) | set(ob), key=lambda k: -max(oa.get(k, 0), ob.get(k, 0)))[:top]
    rows = [["OP", "MODULE", "A", "B", "B-A", "CHANGE"]]
    for k in keys:
        x, y = oa.get(k, 0.0), ob.get(k, 0.0)
        rows.append([k[1], k[0], f"{x:.3f}", f"{y:.3f}", *_delta(x, y)])
    out.append(_fmt_table(rows, {2, 3, 4, 5}))
    return "\n".join(out)


def compare_json(a: Summary, b: Summary, top: int) -> dict:
    ja, jb = a.to_json(top), b.to_json(top)
    delta = {c: jb["categories"][c]["per_step_ms"] - ja["categories"][c]["per_step_ms"] for c in CATEGORIES}
    delta["total"] = jb["op_time_per_step_ms"] - ja["op_time_per_step_ms"]
    steps = {k: jb["step_mean_ms"].get(k, 0.0) - ja["step_mean_ms"].get(k, 0.0) for k in ja["step_mean_ms"]}
    return {"a": ja, "b": jb, "delta_per_step_ms": delta, "delta_step_mean_ms": steps}


def _job_dir(ws: str | None, spec: str) -> Path:
    log = jobs.resolve(paths.workspace(ws), spec)
    return log.with_name(log.name.removesuffix(".log"))


@click.command("profile")
@click.argument("job")
@click.option("--compare", "other", metavar="JOB2", help="A second job: both side by side, with B-A deltas.")
@click.option("--session", help="Which capture (a plugins/profile/<session> dir name; default the newest).")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="How many ops to list.")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the tables.")
def command(job, other, session, top, ws, as_json):
    """Summarise JOB's captured profile: step-time composition, op time per category, the top ops.

    JOB (and JOB2) is `latest`, a job id, a unique part of its name, or its log / job dir path. The job must
    have run with `-- profiler=xplane` (MaxText's skip_first_n_steps_for_profiler / profiler_steps choose the
    steps). Uses xprof's converters (overview_page, hlo_stats or trace_viewer, graph_viewer); writes nothing.
    """
    try:
        first = summarize(_job_dir(ws, job), session)
        second = summarize(_job_dir(ws, other)) if other else None
    except (jobs.JobsError, ProfileError) as exc:
        raise JobkitError("profile", str(exc)) from None
    if second is None:
        click.echo(json.dumps(first.to_json(top), indent=1) if as_json else format_one(first, top))
    else:
        click.echo(
            json.dumps(compare_json(first, second, top), indent=1) if as_json else format_compare(first, second, top)
        )
