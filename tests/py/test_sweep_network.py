"""`jobkit sweep network`: the bisection's paths against recorded real job logs (no Slurm).

The fake cluster: every multi-node job runs at GOOD TGS/device unless it crosses a fault, then at SLOW.
A bad node (its NIC) slows any group it is in; a bad link slows a group holding both its ends.
"""

import json

from sweep_fakes import failing, hanging, invoke, passing

from jobkit.core.errors import EXIT_STOPPED

GOOD, SLOW = 1000.0, 880.0


def cluster(bad_nodes=(), bad_links=(), hang=False):
    def script(point, nodes, attempt):
        group = set(nodes)
        hit = any(n in group for n in bad_nodes) or any(set(link) <= group for link in bad_links)
        if hit and hang:
            return hanging("training")
        return passing(SLOW if hit else GOOD)

    return script


def rows(output):
    """Isolation table rows: {group label: (nodes, status cell)}."""
    found = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 6 and cells[0] not in ("Group",) and not cells[0].startswith("-"):
            found[cells[0]] = (cells[1], cells[5], cells[4])
    return found


def network(monkeypatch, tmp_path, nodes, script, *more, sweep_id="net"):
    args = ["network", "--id", sweep_id, "tiny", "-w", nodes, *more]
    if "--from-sweep" not in more and "--baseline" not in more:
        args += ["--baseline", str(GOOD)]
    return invoke(monkeypatch, tmp_path, args, script)


def test_a_healthy_set_is_one_job_on_all_nodes(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", cluster())
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all"]
    point, spec = runner.submitted[0]
    assert (point.num_nodes, point.nodes, point.args) == (4, ("n1", "n2", "n3", "n4"), ("steps=15",))
    assert spec == "tiny:net-all"
    assert rows(result.output) == {"all": ("n[1-4]", "healthy", "+0.0%")}
    assert "no network problem found" in result.output
    assert "Recommended nodelist: n1,n2,n3,n4" in result.output


def test_a_bad_node_in_one_half_is_named_after_checks_with_healthy_partners(monkeypatch, tmp_path):
    seen_logs = {}

    def script(point, nodes, attempt):
        seen_logs[point.key] = sorted(p.name for p in tmp_path.glob("*.log"))
        return cluster(bad_nodes=["n3"])(point, nodes, attempt)

    result, runner = network(monkeypatch, tmp_path, "n[1-4]", script)
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all", "g:n1,n2", "g:n3,n4", "g:n1,n3", "g:n2,n4"]
    # each job pinned to its group with -N = group size
    assert all(p.num_nodes == len(p.nodes) and p.key.endswith(",".join(p.nodes)) for p, _ in runner.submitted[1:])
    # the halves run together: the second was submitted before the first had written its log
    assert not any("g_n1_n2" in name for name in seen_logs["g:n3,n4"])
    table = rows(result.output)
    assert table["all"][1] == "DEGRADED" and table["all"][2] == "-12.0%"
    assert table["half-1"] == ("n[1-2]", "healthy", "+0.0%")
    assert table["half-2"][:2] == ("n[3-4]", "DEGRADED")
    assert table["check-1"][:2] == ("n1,n3", "DEGRADED") and table["check-2"][:2] == ("n2,n4", "healthy")
    assert "Conclusion: n3's network (or its link to n4)" in result.output
    assert "Recommended nodelist: n1,n2,n4" in result.output


def test_a_link_across_the_halves_is_found_with_mixed_groups(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-8]", cluster(bad_links=[("n3", "n6")]))
    assert result.exit_code == 0, result.output
    assert runner.keys == [
        "all",
        "g:n1,n2,n3,n4",
        "g:n5,n6,n7,n8",  # both halves healthy: the problem is between them
        "g:n1,n2,n5,n6",
        "g:n3,n4,n7,n8",  # first mixing: fine
        "g:n1,n2,n7,n8",
        "g:n3,n4,n5,n6",  # second mixing: the bad one
        "g:n3,n5",
        "g:n4,n6",
        "g:n3,n6",
        "g:n4,n5",
    ]
    # n3 and n6 were each fine with other nodes (n3+n4, n5+n6 inside healthy groups): no extra check jobs
    assert "Conclusion: the link between n3 and n6: each is fine with other nodes (n1+n3, n2+n6)" in result.output
    assert "Recommended nodelist: n1,n2,n3,n4,n5,n7,n8 (leaves out one end of the link, n6" in result.output
    assert rows(result.output)["mixed-7"][:2] == ("n3,n6", "DEGRADED")


def test_a_two_node_set_can_only_name_the_pair_without_a_node_sweep(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n1,n2", cluster(bad_nodes=["n2"]))
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all"]
    assert "Conclusion: n1 or n2 (or the link between them)" in result.output
    assert "Recommended nodelist: none" in result.output


def test_expected_tgs_and_the_node_verdict_come_from_a_recorded_node_sweep(monkeypatch, tmp_path):
    alone = {"n1": 1010.0, "n2": 1000.0, "n3": 800.0, "n4": 1005.0}  # n3 is slow even by itself
    result, _ = invoke(
        monkeypatch, tmp_path, ["nodes", "--id", "ns", "tiny", "-w", "n[1-4]"], lambda p, n, a: passing(alone[p.key])
    )
    assert result.exit_code == 0, result.output

    def script(point, nodes, attempt):
        return passing(800.0 if "n3" in nodes else 1005.0)

    result, runner = network(monkeypatch, tmp_path, "n[1-4]", script, "--from-sweep", "ns")
    assert result.exit_code == 0, result.output
    # upper median of 1010, 1000, 800, 1005 is 1005; n3's groups are 20.4 % below it
    assert "Expected: 1,005 TGS/device (upper median of the 4 passing node(s) of node sweep ns)" in result.output
    assert rows(result.output)["half-1"][1:] == ("healthy", "+0.0%")
    assert rows(result.output)["half-2"][1:] == ("DEGRADED", "-20.4%")
    # the node sweep already says n3 is slow alone: no check jobs, the node (not the network) is named
    assert runner.keys == ["all", "g:n1,n2", "g:n3,n4"]
    assert "Conclusion: n3: it is slow on its own too (node sweep ns: degraded, -20.4%)" in result.output


def test_both_halves_degraded_is_reported_as_several_problems(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", cluster(bad_nodes=["n1", "n4"]))
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all", "g:n1,n2", "g:n3,n4"]
    assert "several problems, or infrastructure they share" in result.output
    assert "Recommended nodelist: none proven healthy" in result.output


def test_a_hang_counts_against_the_group(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", cluster(bad_nodes=["n4"], hang=True))
    assert result.exit_code == 0, result.output
    assert rows(result.output)["half-2"][1] == "FAILED: HANG (training)"
    assert "n4's network (or its link to n3)" in result.output


def test_a_config_error_stops_the_search_as_no_network_symptom(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", lambda p, n, a: failing("tiny-config-error.log"))
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all"]
    assert "not a network symptom, so the search stopped" in result.output


def test_tolerance_sets_what_counts_as_degraded(monkeypatch, tmp_path):
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", cluster(bad_nodes=["n3"]), "--tolerance", "15")
    assert result.exit_code == 0, result.output
    assert runner.keys == ["all"]  # 12 % below is within 15 %
    assert rows(result.output)["all"][1:] == ("healthy", "-12.0%")


def test_resume_replays_the_same_decisions_and_reruns_nothing_finished(monkeypatch, tmp_path):
    def refuse_a_half(point, nodes, attempt):
        if point.key == "g:n3,n4":
            return RuntimeError(
                "sbatch: error: Batch job submission failed: Requested node configuration is not available"
            )
        return cluster(bad_nodes=["n3"])(point, nodes, attempt)

    result, runner = network(monkeypatch, tmp_path, "n[1-4]", refuse_a_half, "--serial")
    assert result.exit_code == EXIT_STOPPED, result.output
    assert runner.keys == ["all", "g:n1,n2"]
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "net"], cluster(bad_nodes=["n3"]))
    assert result.exit_code == 0, result.output
    assert runner.keys == ["g:n3,n4", "g:n1,n3", "g:n2,n4"]
    assert "n3's network" in result.output
    plan = json.loads((tmp_path / "ws" / "sweeps" / "net" / "plan.json").read_text())
    assert plan["state"] == "finished" and plan["params"]["baseline"] == GOOD


def test_bad_input_is_one_line_and_leaves_nothing(monkeypatch, tmp_path):
    invoke(monkeypatch, tmp_path, ["nodes", "--id", "ns", "tiny", "-w", "n1,n2"], lambda p, n, a: passing(GOOD))
    invoke(monkeypatch, tmp_path, ["network", "--id", "nw", "tiny", "-w", "n1,n2", "--baseline", "5"], cluster())
    cases = [
        (["network", "tiny", "-w", "n[1-4]"], "no expected TGS"),
        (["network", "tiny", "-w", "n1", "--baseline", "5"], "needs at least 2"),
        (["network", "tiny", "-w", "n1,n1", "--baseline", "5"], "more than once"),
        (["network", "--local", "tiny", "--baseline", "5"], "--local cannot"),
        (["network", "tiny", "-w", "n1,n2", "--from-sweep", "nope"], "no sweep 'nope'"),
        (["network", "tiny", "-w", "n1,n2", "--from-sweep", "nw"], "takes a `jobkit sweep nodes` sweep"),
        (["network", "llama2-70b", "-w", "n1,n2", "--from-sweep", "ns"], "ran tiny, not llama2-70b"),
        (["network", "no-such-model-xyz", "-w", "n1,n2", "--baseline", "5"], "no-such-model-xyz"),
    ]
    before = sorted(p.name for p in (tmp_path / "ws" / "sweeps").iterdir())
    for args, needle in cases:
        result, runner = invoke(monkeypatch, tmp_path, args, cluster())
        assert result.exit_code == 1, (args, result.output)
        assert needle in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert runner.submitted == []
    assert sorted(p.name for p in (tmp_path / "ws" / "sweeps").iterdir()) == before


def test_an_unfinished_node_sweep_is_refused(monkeypatch, tmp_path):
    def refuse(point, nodes, attempt):
        return RuntimeError("sbatch: error: invalid node") if point.key == "n2" else passing(GOOD)

    invoke(monkeypatch, tmp_path, ["nodes", "--serial", "--id", "ns", "tiny", "-w", "n1,n2"], refuse)
    result, runner = network(monkeypatch, tmp_path, "n1,n2", cluster(), "--from-sweep", "ns")
    assert result.exit_code == 1 and "is stopped, not finished" in result.output and runner.submitted == []


def test_a_node_a_little_slow_alone_does_not_explain_a_much_slower_pair(monkeypatch, tmp_path):
    alone = {"n1": 1000.0, "n2": 1000.0, "n3": 1000.0, "n4": 900.0}  # n4: 10 % slow by itself
    invoke(
        monkeypatch, tmp_path, ["nodes", "--id", "ns", "tiny", "-w", "n[1-4]"], lambda p, n, a: passing(alone[p.key])
    )
    result, runner = network(monkeypatch, tmp_path, "n[1-4]", cluster(bad_nodes=["n4"]), "--from-sweep", "ns")
    assert result.exit_code == 0, result.output
    # groups with n4 are 12 % slow: n4's own 10 % (within the 5 % tolerance of it) explains that...
    assert runner.keys == ["all", "g:n1,n2", "g:n3,n4"]
    assert "Conclusion: n4: it is slow on its own too" in result.output

    def much_slower(point, nodes, attempt):
        return passing(400.0 if "n3" in nodes else GOOD)

    result, runner = network(monkeypatch, tmp_path, "n[1-4]", much_slower, "--from-sweep", "ns", sweep_id="net2")
    assert result.exit_code == 0, result.output
    # ...a pair 60 % slow (n3's link) it does not: the checks with healthy partners run and blame n3's network
    assert runner.keys[-2:] == ["g:n1,n3", "g:n2,n4"]
    assert "Conclusion: n3's network (or its link to n4)" in result.output


def test_smaller_groups_are_held_to_the_best_group_of_their_size(monkeypatch, tmp_path):
    # Nodes sharing CPUs: per-device TGS grows as groups shrink (4 nodes 1000, 2 nodes 3000), and n3's
    # throttled link costs a pair 60 % -- still above the 4-node expectation, so only peers reveal it.
    def script(point, nodes, attempt):
        healthy = GOOD if len(nodes) == 4 else 3 * GOOD
        return passing(healthy * (0.4 if "n3" in nodes else 1.0))

    result, runner = network(monkeypatch, tmp_path, "n[1-4]", script, "--baseline", str(GOOD), "--tolerance", "30")
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    assert table["all"][1] == "DEGRADED"
    assert table["half-1"][1] == "healthy" and table["half-2"][1] == "DEGRADED"
    assert table["half-2"][2] == "-60.0%"  # against half-1, its peer, not against the 4-node expectation
    assert "n3" in next(line for line in result.output.splitlines() if line.startswith("Conclusion:"))
