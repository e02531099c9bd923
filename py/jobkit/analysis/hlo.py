"""`jobkit hlo JOB`: per HLO module of a job's XLA dump, its collectives (count and bytes) and its fusions.

A job run with `-- _env_ENABLE_XLA_DUMP=1` has `<job dir>/xla_dump/` (train_env.sh: node rank 0, modules whose
name matches `train_step`). XLA writes several texts per module; this reads only the ones after optimizations,
`module_<id>.<name>.<platform>_after_optimizations.txt` (the glob `*after_optimizations.txt`): that is the
program that ran, after the collective combiners, the async conversion and fusion, so its counts are the ones
the XLA flags change (the `before_optimizations` text has neither fusions nor combined collectives, and the
`-buffer-assignment` / `-memory-usage-report` texts are not HLO).

What is counted, statically (an op inside a while body counts once, not once per trip):
- collectives: all-reduce, all-gather, reduce-scatter, all-to-all (with ragged-all-to-all), collective-permute.
  A sync op counts itself; an async pair (`all-gather-start` / `all-gather-done`) counts once, at its `-done`;
  a collective wrapped in `async-start` counts as the op inside the async computation.
- bytes: the size of the op's result shape (`bf16[8,128]{1,0}` = 8*128*2 bytes; a tuple is the sum of its
  parts). That is the all-reduce'd buffer, the all-gather's gathered output, the reduce-scatter's scattered
  output; dynamic dims (`<=N`) count at their bound.
- fusions: instructions whose opcode is `fusion` (in any computation).

Reads only; writes nothing anywhere.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.core import paths
from jobkit.core.errors import JobkitError
from jobkit.ops import jobs

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# opcode -> the collective it counts as (None: not counted itself; its -done or async computation is).
_COLLECTIVE_OPCODES = {
    **{c: c for c in COLLECTIVES},
    **{f"{c}-done": c for c in COLLECTIVES},
    "ragged-all-to-all": "all-to-all",
}
DUMP_GLOB = "*after_optimizations.txt"

# Bytes per element of each XLA primitive type (s4/u4 pack two to a byte; token and opaque have no data).
_ELEMENT_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
    "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "tf32": 4,
    "token": 0, "opaque": 0,
}  # fmt: skip
_ARRAY = re.compile(r"\b(?P<type>[a-z]+\d*(?:e\d+m\d+\w*)?)\[(?P<dims>[^\]]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"^\s*(?P<op>[a-z][\w\-]*)\(")
_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*[({]")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?(?P<names>[^},\s]+(?:,\s*[^},\s]+)*)")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')


class HloError(Exception):
    """One line that says what is wrong and what to do."""


def element_bytes(dtype: str) -> float:
    if dtype in _ELEMENT_BYTES:
        return _ELEMENT_BYTES[dtype]
    if dtype.startswith("f8") or dtype.startswith("f6") or dtype.startswith("f4"):  # f8e4m3fn, f8e5m2, ...
        return {"f8": 1, "f6": 0.75, "f4": 0.5}[dtype[:2]]
    raise ValueError(f"unknown element type {dtype}")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape: `f32[1024]{0}` -> 4096; a tuple `(f32[8]{0}, bf16[4,4]{1,0})` -> the sum; `f32[]` -> 4."""
    total = 0.0
    for m in _ARRAY.finditer(_COMMENT.sub("", shape)):
        count = 1
        for dim in filter(None, (d.strip() for d in m.group("dims").split(","))):
            count *= int(dim.removeprefix("<="))
        total += count * element_bytes(m.group("type"))
    return int(total)


@dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    calls: list[str] = field(default_factory=list)
    target: str = ""  # custom-call target


@dataclass
class Module:
    name: str
    computations: dict[str, list[Instr]]
    entry: str = ""

    @functools.cached_property
    def instructions(self) -> dict[str, Instr]:
        """Every instruction of every computation, by name (built once per module, kept with it)."""
        return {i.name: i for instrs in self.computations.values() for i in instrs}


def _split_shape(rest: str) -> tuple[str, str]:
    """`(f32[2], s32[]) all-reduce(...)` -> the shape and what follows it (tuples may nest)."""
    rest = _COMMENT.sub("", rest).lstrip()
    if not rest.startswith("("):
        shape, _, tail = rest.partition(" ")
        return shape, tail
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rest[: i + 1], rest[i + 1 :]
    return rest, ""


def parse_module(text: str) -> Module:
    """The computations and instructions of one module's HLO text (as XLA dumps it, with or without `%`)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first.startswith("HloModule "):
        raise ValueError("not HLO text (no `HloModule` first line)")
    module = Module(first.split()[1].rstrip(","), {})
    current: list[Instr] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("HloModule "):
            continue
        if not line[0].isspace():
            header = _COMP_HEADER.match(line)
            if header and line.rstrip().endswith("{"):
                current = module.computations.setdefault(header.group("name"), [])
                if line.startswith("ENTRY"):
                    module.entry = header.group("name")
            elif line.startswith("}"):
                current = None
            continue
        m = _INSTR.match(line)
        if current is None or not m:
            continue
        shape, tail = _split_shape(m.group("rest"))
        op = _OPCODE.match(tail)
        if not op:
            continue
        calls = [n.strip().lstrip("%") for c in _CALLS.finditer(tail) for n in c.group("names").split(",")]
        target = _TARGET.search(tail)
        current.append(Instr(m.group("name"), shape, op.group("op"), calls, target.group("target") if target else ""))
    if not module.computations:
        raise ValueError("no computations in the HLO text")
    return module


def summarize(module: Module) -> dict:
    """Collective counts and bytes by kind, fusion and instruction counts (see the module docstring)."""
    kinds = {c: {"count": 0, "bytes": 0} for c in COLLECTIVES}
    fusions = instructions = 0
    for instrs in module.computations.values():
        for ins in instrs:
            instructions += 1
            fusions += ins.opcode == "fusion"
            kind = _COLLECTIVE_OPCODES.get(ins.opcode)
            if kind:
                kinds[kind]["count"] += 1
                kinds[kind]["bytes"] += shape_bytes(ins.shape)
    return {
        "module": module.name,
        "fusions": fusions,
        "instructions": instructions,
        "collectives": kinds,
        "collective_count": sum(k["count"] for k in kinds.values()),
        "collective_bytes": sum(k["bytes"] for k in kinds.values()),
    }


def job_dir_problem(job_dir: Path) -> str | None:
    """Why JOB_DIR cannot be read (absent, or a dir this user may not list: someone else's, mode 700), else
    None. Asked first, so that a permission error is not taken for a job that captured nothing."""
    try:
        with os.scandir(job_dir) as entries:
            next(entries, None)
    except FileNotFoundError:
        return f"the job dir {job_dir} does not exist (log only); pass the job dir of a job that ran"
    except NotADirectoryError:
        return f"{job_dir} is not a directory; pass the job dir of a job that ran"
    except OSError as e:
        return f"cannot read {job_dir}: {(e.strerror or str(e)).lower()}; ask its owner for read access"
    return None


def dump_files(job_dir: Path) -> list[Path]:
    """The job's after-optimizations HLO texts, by module id. Raises HloError saying how to get a dump."""
    dump = job_dir / "xla_dump"
    problem = job_dir_problem(job_dir)
    if problem:
        raise HloError(problem)
    if not dump.exists():
        raise HloError(f"{job_dir.name} has no HLO dump (no xla_dump/); rerun the job with `-- _env_ENABLE_XLA_DUMP=1`")
    if not dump.is_dir():
        raise HloError(f"{dump} is not a directory; rerun the job with `-- _env_ENABLE_XLA_DUMP=1`")
    problem = job_dir_problem(dump)  # glob says nothing of a dir it may not list
    if problem:
        raise HloError(problem)
    try:
        files = sorted(p for p in dump.glob(DUMP_GLOB) if not p.name.startswith("."))
    except OSError as e:
        raise HloError(f"cannot read {dump}: {e.strerror}; check its permissions") from None
    if not files:
        raise HloError(
            f"{dump} has no {DUMP_GLOB} (XLA dumps only what it compiles: a compile served from the JAX "
            "cache leaves none); rerun with `-- _env_ENABLE_XLA_DUMP=1 _env_JAX_CACHE_DIR=<an empty dir>`"
        )
    return files


def read_dump(job_dir: Path) -> list[dict]:
    """One summary per after-optimizations file, with `file` and the module `id` from its name."""
    rows = []
    for path in dump_files(job_dir):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise HloError(f"cannot read {path}: {e.strerror or e}; check the file and its permissions") from None
        try:
            summary = summarize(parse_module(text))
        except ValueError as e:
            raise HloError(f"{path} is not readable HLO ({e}); the dump is damaged, rerun the job") from None
        m = re.match(r"module_(\d+)\.", path.name)
        rows.append({"id": m.group(1) if m else "", "file": path.name, **summary})
    return rows


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_table(rows: list[dict]) -> str:
    head = ["MODULE", "FUSIONS", *(c.upper() for c in COLLECTIVES), "TOTAL"]
    table = [head]
    for r in rows:
        cells = [f"{r['id']} {r['module']}".strip(), str(r["fusions"])]
        for c in COLLECTIVES:
            k = r["collectives"][c]
            cells.append(f"{k['count']} / {human_bytes(k['bytes'])}" if k["count"] else "0")
        cells.append(f"{r['collective_count']} / {human_bytes(r['collective_bytes'])}")
        table.append(cells)
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip() for t in table]
    return "\n".join(lines)


@click.command("hlo")
@click.argument("job")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the dump dir and one entry per module.")
def command(job, ws, as_json):
    """Collectives (count / bytes of the result) and fusions per HLO module of JOB's XLA dump.

    JOB is `latest`, a job id, a unique part of its name, or its log / job dir path. The job must have run
    with `-- _env_ENABLE_XLA_DUMP=1`; only the `*after_optimizations.txt` texts are read (the program that
    ran). Counts are static: an op in a loop body counts once.
    """
    try:
        log = jobs.resolve(paths.workspace(ws), job)
        job_dir = log.with_name(log.name.removesuffix(".log"))
        rows = read_dump(job_dir)
    except (jobs.JobsError, HloError) as exc:
        raise JobkitError("hlo", str(exc)) from None
    if as_json:
        click.echo(json.dumps({"job_dir": str(job_dir), "dump": str(job_dir / "xla_dump"), "source": DUMP_GLOB,
                               "modules": rows}, indent=1))  # fmt: skip
        return
    click.echo(f"{job_dir.name}: {len(rows)} module(s) from xla_dump/{DUMP_GLOB} (count / bytes of the result)")
    click.echo(format_table(rows))
