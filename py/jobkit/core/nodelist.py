"""Slurm nodelists: `rack[1-2]-node[01-03,7],gpu5` as the hostnames it names, in Slurm's order (rank i runs on
the i-th).

The grammar is Slurm's hostlist (src/common/hostlist.c, `_hostlist_create_bracketed` and `_push_range_list`):
names are separated by commas, spaces, tabs or newlines outside brackets; a name may hold several `[...]` groups,
each a comma list of numbers and `lo-hi` ranges whose width is the width of `lo` as written (`[01-10]` pads to two
digits, `[9-11]` does not); text may sit before, between and after the groups. Several groups expand to their
cartesian product in the order Slurm pushes them: the last group varies fastest, and the groups before it vary
from the first (fastest) to the one just before the last (slowest). For two groups that is plain row-major order
(`rack[1-2]-node[1-2]` -> rack1-node1, rack1-node2, rack2-node1, rack2-node2); for three,
`a[1-2]b[3-4]c[5-6]` -> a1b3c5, a1b3c6, a2b3c5, a2b3c6, a1b4c5, ... (`scontrol show hostnames` agrees).
Anything else (an unclosed or stray bracket, an empty group, a range that runs backwards, a non-number) raises
NodelistError rather than passing a half-expanded name on to the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Slurm refuses a list that names more hosts than this in one range or prefix (MAX_RANGE / MAX_PREFIX_CNT in
# hostlist.h); past it a typo such as node[1-999999999] would build a billion names.
MAX_HOSTS = 64 * 1024

_SEPARATORS = ",\t\n "
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class NodelistError(ValueError):
    """A Slurm node list that cannot be expanded; the message names the list and what is wrong with it."""


def expand_nodelist(text: str) -> list[str]:
    """`rack[1-2]-n[1-2],gpu5` -> [rack1-n1, rack1-n2, rack2-n1, rack2-n2, gpu5]; NodelistError if malformed."""
    names: list[str] = []
    for token in _tokens(text):
        texts, groups = _parse_token(text, token)
        count = 1
        for group in groups:
            count *= len(group)
        if len(names) + count > MAX_HOSTS:
            raise NodelistError(f"node list {text!r} names more than {MAX_HOSTS} hosts; check its ranges")
        names.extend(_push(texts, groups) if groups else texts)
    return names


def _tokens(text: str) -> Iterator[str]:
    """The names in TEXT: split at separators outside brackets (a comma inside `[1,3]` belongs to the range)."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise NodelistError(f"node list {text!r}: '[' at position {i + 1} is inside another [...]")
            depth = 1
        elif ch == "]":
            if not depth:
                raise NodelistError(f"node list {text!r}: ']' at position {i + 1} has no opening '['")
            depth = 0
        elif ch in _SEPARATORS and not depth:
            if i > start:
                yield text[start:i]
            start = i + 1
    if depth:
        raise NodelistError(f"node list {text!r}: '[' at position {text.rindex('[') + 1} has no closing ']'")
    if start < len(text):
        yield text[start:]


def _parse_token(text: str, token: str) -> tuple[list[str], list[list[str]]]:
    """TOKEN as its texts around brackets (one more than groups) and each group's numbers, formatted."""
    texts: list[str] = []
    groups: list[list[str]] = []
    rest = token
    while "[" in rest:
        before, _, after = rest.partition("[")
        inside, _, rest = after.partition("]")  # _tokens checked every '[' has its ']'
        texts.append(before)
        groups.append(_parse_group(text, inside))
    texts.append(rest)
    return texts, groups


def _parse_group(text: str, inside: str) -> list[str]:
    """`01-03,7` -> [01, 02, 03, 7] (width from lo, as Slurm's `%0*lu` with strlen(lo))."""
    if not inside:
        raise NodelistError(f"node list {text!r}: empty [] (write e.g. node[1-4])")
    numbers: list[str] = []
    for item in inside.split(","):
        match = _RANGE.fullmatch(item)
        if not item:
            raise NodelistError(f"node list {text!r}: [{inside}] has an empty item (a stray comma)")
        if not match:
            raise NodelistError(
                f"node list {text!r}: {item!r} in [{inside}] is not a number or a lo-hi range (e.g. 1-4, 01-10)"
            )
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(lo) > int(hi):
            raise NodelistError(f"node list {text!r}: range {item} runs backwards; write {hi}-{lo}")
        if int(hi) - int(lo) + 1 > MAX_HOSTS:
            raise NodelistError(f"node list {text!r} names more than {MAX_HOSTS} hosts; check its ranges")
        numbers += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
    return numbers


def _push(texts: list[str], groups: list[list[str]]) -> Iterator[str]:
    """The names of one token in Slurm's order: its `_push_range_list` takes the last group as the host range
    and loops over the prefix's groups from its right end outward, each level recursing into the rest."""
    if len(groups) == 1:
        for number in groups[0]:
            yield f"{texts[0]}{number}{texts[1]}"
        return
    # The prefix's rightmost group (the one before the last) is the outer loop here.
    for number in groups[-2]:
        merged = [*texts[:-3], f"{texts[-3]}{number}{texts[-2]}", texts[-1]]
        yield from _push(merged, [*groups[:-2], groups[-1]])
