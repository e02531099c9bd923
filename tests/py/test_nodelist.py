"""Slurm hostlist expansion (core/nodelist.py): Slurm's grammar and order, and one-line refusals of malformed lists."""

import shutil
import subprocess

import pytest

from jobkit.core.nodelist import MAX_HOSTS, NodelistError, expand_nodelist


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", []),
        ("node1", ["node1"]),
        ("node[1-3,7],gpu5", ["node1", "node2", "node3", "node7", "gpu5"]),
        ("node[01-03,10]", ["node01", "node02", "node03", "node10"]),
        ("n[007-9]", ["n007", "n008", "n009"]),  # the width is lo's, as written
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[5]", ["n5"]),
        ("n1,n[2-3] n4\tn5", ["n1", "n2", "n3", "n4", "n5"]),  # Slurm's separators outside brackets
        ("n[1-2],n1", ["n1", "n2", "n1"]),  # kept as written: callers decide about duplicates
        ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
        ("a[1-2].ib", ["a1.ib", "a2.ib"]),  # text after the last group (Slurm >= 23 accepts it)
    ],
)
def test_expands_like_slurm(text, names):
    assert expand_nodelist(text) == names


def test_three_groups_follow_slurms_push_order():
    # hostlist.c's _push_range_list loops over the prefix's groups from the right; the last group is fastest.
    assert expand_nodelist("a[1-2]b[3-4]c[5-6]") == [
        "a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("node[1-", "'[' at position 5 has no closing ']'"),
        ("node[1", "'[' at position 5 has no closing ']'"),
        ("node[5-1]", "range 5-1 runs backwards; write 1-5"),
        ("node[a-b]", "'a-b' in [a-b] is not a number or a lo-hi range"),
        ("node[1-2-3]", "'1-2-3' in [1-2-3] is not a number"),
        ("node[-1]", "'-1' in [-1] is not a number"),
        ("x[]", "empty []"),
        ("n[1,,2]", "[1,,2] has an empty item"),
        ("node]1", "']' at position 5 has no opening '['"),
        ("n[[1]]", "'[' at position 3 is inside another [...]"),
        ("node[0-99999999]", f"names more than {MAX_HOSTS} hosts"),
        ("a[0-999]b[0-999]", f"names more than {MAX_HOSTS} hosts"),
    ],
)
def test_malformed_lists_are_refused_in_one_line(text, problem):
    with pytest.raises(NodelistError) as caught:
        expand_nodelist(text)
    message = str(caught.value)
    assert problem in message and repr(text) in message and "\n" not in message
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError keep working


SCONTROL_LISTS = [
    "node[1-3,7],gpu5",
    "node[01-03,10]",
    "n[007-9],n[9-11]",
    "rack[1-2]-node[1-2]",
    "a[1-2]b[3-4]c[5-6]",
    "a[1-2]b[3-4]c[5-6]d[7-8]",
    "x[1,3]y[2-3] z",
]


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol is not installed")
@pytest.mark.parametrize("text", SCONTROL_LISTS)
def test_matches_scontrol_show_hostnames(text, tmp_path):
    # `scontrol show hostnames` expands locally: any valid slurm.conf will do, no daemon is asked.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nodelist\nSlurmctldHost=localhost\n")
    result = subprocess.run(
        ["scontrol", "show", "hostnames", text],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)},
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert expand_nodelist(text) == result.stdout.split()
