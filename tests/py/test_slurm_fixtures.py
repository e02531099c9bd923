"""The 3-node cluster the slow requeue proof takes (slurm_cluster.resized), with utils/local_cluster.sh faked: a
2-node cluster is taken down first, and the cluster is never left at 3 nodes for the next user."""

import pytest
import slurm_cluster


class Calls(list):
    """The up/down calls made, in order; `state["nodes"]`: the fake cluster's size now (0: down)."""

    state: dict[str, int]


@pytest.fixture
def calls(monkeypatch):
    """The up/down calls resized() makes, on a fake cluster whose size the test sets first."""
    made = Calls()
    state = made.state = {"nodes": 0}

    def up(nodes=slurm_cluster.NODES):
        made.append(f"up {nodes}")
        state["nodes"] = nodes
        return f"cluster of {nodes}"

    def down():
        made.append("down")
        state["nodes"] = 0

    monkeypatch.setattr(slurm_cluster, "cluster_up", up)
    monkeypatch.setattr(slurm_cluster, "cluster_down", down)
    monkeypatch.setattr(slurm_cluster, "nodes_up", lambda: state["nodes"])
    monkeypatch.setitem(slurm_cluster._session, "users", 0)
    monkeypatch.setitem(slurm_cluster._session, "cluster", None)
    return made


@pytest.mark.parametrize(
    ("before", "expected"), [(0, ["up 3", "down"]), (2, ["down", "up 3", "down"]), (3, ["up 3", "down"])]
)
def test_the_cluster_is_brought_to_three_nodes_and_left_down(calls, before, expected):
    calls.state["nodes"] = before
    with slurm_cluster.resized(3) as cluster:
        assert cluster == "cluster of 3" and calls.state["nodes"] == 3
    assert calls == expected and calls.state["nodes"] == 0


def test_a_cluster_this_session_holds_is_brought_back_to_two_nodes(calls, monkeypatch):
    calls.state["nodes"] = 2
    monkeypatch.setitem(slurm_cluster._session, "users", 1)
    with slurm_cluster.resized(3):
        pass
    assert calls == ["down", "up 3", "down", "up 2"] and calls.state["nodes"] == 2
    assert slurm_cluster._session["cluster"] == "cluster of 2"  # the session's tests get the new one


def test_a_failing_test_still_takes_the_three_nodes_down(calls):
    with pytest.raises(AssertionError, match="the proof failed"), slurm_cluster.resized(3):
        raise AssertionError("the proof failed")
    assert calls == ["up 3", "down"] and calls.state["nodes"] == 0
