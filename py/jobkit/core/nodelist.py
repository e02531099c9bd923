"""Slurm nodelists: `node[1-3,7],gpu5` as the hostnames it names, in order (rank i runs on the i-th)."""

from __future__ import annotations


def expand_nodelist(text: str) -> list[str]:
    """`node[1-3,7],gpu5` -> [node1, node2, node3, node7, gpu5] (Slurm's bracket ranges, one level)."""
    out: list[str] = []
    depth, part = 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            if part:
                out.extend(_expand_one(part))
            part = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        part += ch
    return out


def _expand_one(item: str) -> list[str]:
    if "[" not in item:
        return [item]
    prefix, rest = item.split("[", 1)
    ranges, suffix = rest.split("]", 1)
    names = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        if hi:
            width = len(lo)
            names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
        else:
            names.append(f"{prefix}{lo}{suffix}")
    return names
