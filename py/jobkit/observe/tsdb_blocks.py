"""A TSDB's blocks and which of them are damaged: the one check behind `prometheus.sh list`/`view` and
`jobkit analyze`.

A block is a directory named by a ULID (Prometheus's `isBlockDir`). Prometheus and promtool read its meta.json
first; when that cannot be read, is not JSON (random bytes, a NUL, cut short), lacks an integer minTime/maxTime
or is not version 1, they log an error and skip the whole block: its samples are simply absent, and a reader
that only looks at the samples would say "no data". So every reader asks here first and names the block.

    jobkit tsdb blocks TSDB    one line per block: "ULID ok MIN_MS MAX_MS" or "ULID damaged WHY" (list/view
                               use it from bash; nothing is written)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from jobkit.core import metrics_state

_ULID = metrics_state.BLOCK_NAME  # one definition of a block's name (core.metrics_state.is_tsdb uses it too)


@dataclass(frozen=True)
class Block:
    name: str
    min_ms: int | None = None
    max_ms: int | None = None
    damage: str | None = None  # why Prometheus would skip it; None for a healthy block


def _meta_problem(meta: dict | list | str | float | None) -> str | None:
    if not isinstance(meta, dict):
        return "meta.json is not a JSON object"
    for key in ("minTime", "maxTime"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"meta.json has no whole-number {key}"
    if meta.get("version") != 1:
        return f"meta.json has version {meta.get('version')!r}, not 1"
    return None


def read_block(path: str) -> Block:
    """The block at PATH, healthy or with the reason Prometheus would skip it."""
    name = os.path.basename(os.path.normpath(path))
    meta_path = os.path.join(path, "meta.json")
    try:
        with open(meta_path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        return Block(name, damage="no meta.json")
    except OSError as e:
        return Block(name, damage=f"cannot read meta.json: {(e.strerror or str(e)).lower()}")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return Block(name, damage="meta.json is not JSON" if raw.strip() else "meta.json is empty")
    problem = _meta_problem(meta)
    if problem:
        return Block(name, damage=problem)
    return Block(name, meta["minTime"], meta["maxTime"])


def blocks(tsdb: str) -> list[Block]:
    """Every block of TSDB, by name; [] when TSDB cannot be listed (its reader says why)."""
    try:
        names = sorted(os.listdir(tsdb))
    except OSError:
        return []
    return [read_block(os.path.join(tsdb, n)) for n in names if _ULID.match(n) and os.path.isdir(os.path.join(tsdb, n))]


def damaged(tsdb: str) -> list[Block]:
    return [b for b in blocks(tsdb) if b.damage]


def damage_text(tsdb: str, bad: list[Block]) -> str:
    """One line: which blocks of TSDB are damaged, what that means for what is shown, and the fix. A meta.json
    rewritten with any minTime/maxTime that cover the samples gives them all back (its index and chunks hold the
    data; checked with promtool 2.42)."""
    if len(bad) == 1:
        head, it, its = f"block {bad[0].name} of {tsdb} is damaged ({bad[0].damage})", "it", "its"
    else:
        what = "; ".join(f"{b.name}: {b.damage}" for b in bad)
        head, it, its = f"{len(bad)} blocks of {tsdb} are damaged ({what})", "them", "their"
    return (
        f"{head}: Prometheus and promtool skip {it}, so {its} samples are missing and only the rest of the TSDB "
        f"is read; to get them back, restore the meta.json from a backup, or in a copy (cp -a {tsdb} "
        '/tmp/tsdb-copy; the job dir is evidence) write {"ulid": "<block>", "minTime": <ms before the job>, '
        '"maxTime": <ms after it>, "version": 1} into <block>/meta.json and read the copy'
    )
