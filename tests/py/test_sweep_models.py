"""`jobkit sweep models`: the shipped table, placement, one-commit and two-commit reports, the early stop,
and the commits' worktrees (real `git worktree` on a throwaway repo; jobs replay recorded logs, no Slurm)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from sweep_fakes import failing, invoke, passing

from jobkit.core.errors import EXIT_STOPPED
from jobkit.core.paths import REPO_ROOT
from jobkit.sweep import models, state

SMALL_TABLE = {
    "placement": {1: "1", 2: "2-3"},
    "models": [
        {"model": "tiny", "nodes": [1, 2]},
        {"model": "llama2-70b", "nodes": [1]},
        {"model": "llama3.1-8b", "nodes": [1]},
        {"model": "qwen3-30b-a3b", "nodes": [1]},
    ],
}


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repo with this project's configs and model resolver; commit `base`, then `cand` (tiny.yml edited)."""
    root = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "configs", root / "configs")
    (root / "utils" / "lib").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "utils" / "lib" / "resolve_model.sh", root / "utils" / "lib")
    (root / "configs" / "sweeps" / "small.yml").write_text(yaml.safe_dump(SMALL_TABLE))
    git(tmp_path, "init", "-q", str(root))
    for name, value in (("user.email", "t@example.invalid"), ("user.name", "test")):
        git(root, "config", name, value)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "tag", "base")
    with open(root / "configs" / "tiny.yml", "a") as fh:
        fh.write("# candidate edit\n")
    git(root, "commit", "-q", "-am", "cand")
    monkeypatch.setattr(models, "REPO_ROOT", root)
    monkeypatch.setenv("VENV_DIR", str(REPO_ROOT / ".venv"))  # the user's own venv: no sharing checks
    return root


def heads(repo):
    return {"base": git(repo, "rev-parse", "base"), "cand": git(repo, "rev-parse", "HEAD")}


def table_rows(output, width):
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == width and cells[0] not in ("Model",) and not cells[0].startswith("-"):
            rows[(cells[0], cells[1])] = cells
    return rows


SCRIPT = {
    ("base", "tiny", 1): passing(1000),
    ("cand", "tiny", 1): passing(900),  # 10 % slower: a regression
    ("base", "tiny", 2): passing(1000),
    ("cand", "tiny", 2): passing(990),  # 1 %: the same
    ("base", "llama2-70b", 1): passing(500),
    ("cand", "llama2-70b", 1): failing("tiny-config-error.log"),  # new breakage
    ("base", "llama3.1-8b", 1): failing("tiny-config-error.log"),
    ("cand", "llama3.1-8b", 1): failing("tiny-config-error.log"),  # pre-existing
    ("base", "qwen3-30b-a3b", 1): failing("tiny-config-error.log"),
    ("cand", "qwen3-30b-a3b", 1): passing(700),  # fixed
}


def scripted(repo, script, seen):
    """A job script that looks at the tree each job is submitted from: which commit it has checked out."""
    expected = heads(repo)

    def run(point, nodes, attempt):
        role = point.key.split("-", 1)[0]
        seen.append((point.key, git(point.repo, "rev-parse", "HEAD") == expected[role], Path(point.repo).parent))
        return script[(role, point.model, point.num_nodes)]

    return run


def test_the_shipped_table_covers_every_config_with_fixed_disjoint_placement():
    table = models.load_table(REPO_ROOT / models.TABLE, REPO_ROOT)
    assert sorted(table.models) == sorted(p.stem for p in (REPO_ROOT / "configs").glob("*.yml"))
    assert table.opt_in == {"tiny"}
    # 1-, 2- and 4-node jobs share no node, so they can run at once; 8 takes them all
    small = [set(table.placement[n]) for n in (1, 2, 4)]
    assert all(a.isdisjoint(b) for i, a in enumerate(small) for b in small[i + 1 :])
    assert table.placement[8] == tuple(range(1, 9))


def test_one_commit_runs_from_this_checkout_on_the_placed_nodes(monkeypatch, tmp_path):
    result, runner = invoke(
        monkeypatch,
        tmp_path,
        ["models", "--id", "m1", "--only", "tiny", "-w", "n[1-4]"],
        lambda p, n, a: passing(1000 * p.num_nodes),
    )
    assert result.exit_code == 0, result.output
    assert [(p.key, p.nodes, p.repo) for p, _ in runner.submitted] == [
        ("tiny:1N", ("n1",), None),
        ("tiny:2N", ("n3", "n4"), None),
    ]
    assert all(p.args == ("dataset_type=synthetic", "steps=15") for p, _ in runner.submitted)
    rows = table_rows(result.output, 6)
    assert rows[("tiny", "1N")] == ["tiny", "1N", "1001", "1,000", "—", "PASS"]
    assert rows[("tiny", "2N")] == ["tiny", "2N", "1002", "2,000", "—", "PASS"]
    assert "2 of 2 jobs passed." in result.output
    assert "## Model sweep: this checkout (HEAD " in result.output


def test_two_commits_side_by_side_from_their_own_worktrees(monkeypatch, tmp_path, repo):
    seen = []
    args = ["models", "--id", "m2", "--commits", "base", "HEAD", "--table", str(repo / "configs/sweeps/small.yml")]
    result, runner = invoke(monkeypatch, tmp_path, [*args, "-w", "n[1-3]"], scripted(repo, SCRIPT, seen))
    assert result.exit_code == 0, result.output
    # baseline and candidate interleaved per model x node count, in table order
    sha = {role: value[:10] for role, value in heads(repo).items()}
    assert runner.keys == [
        f"{role}-{sha[role]}:{m}:{n}N"
        for m, n in [("tiny", 1), ("tiny", 2), ("llama2-70b", 1), ("llama3.1-8b", 1), ("qwen3-30b-a3b", 1)]
        for role in ("base", "cand")
    ]
    # every job came from a tree with its own commit checked out, under the sweep dir
    sweep = tmp_path / "ws" / "sweeps" / "m2"
    assert all(ok for _, ok, _ in seen) and {parent for *_, parent in seen} == {sweep / "trees"}
    assert [p.nodes for p, _ in runner.submitted][2:4] == [("n2", "n3")] * 2
    # ...and the trees are gone afterwards, from disk and from git's list
    assert not (sweep / "trees").exists()
    assert git(repo, "worktree", "list").count("\n") == 0
    rows = table_rows(result.output, 8)
    assert rows[("tiny", "1N")][3:] == ["1,000", rows[("tiny", "1N")][4], "900", "-10.0%", "REGRESSION"]
    assert rows[("tiny", "2N")][-2:] == ["-1.0%", "same"]
    assert rows[("llama2-70b", "1N")][-3:] == ["FAIL (config-error)", "—", "NEW BREAKAGE"]
    assert rows[("llama3.1-8b", "1N")][-1] == "pre-existing failure"
    assert rows[("qwen3-30b-a3b", "1N")][-1] == "fixed"
    assert f"baseline base ({sha['base']}) vs candidate HEAD ({sha['cand']})" in result.output
    assert "Regressions (more than 5 % slower): tiny 1N" in result.output
    assert "New breakage (fails on the candidate, passes on the baseline): llama2-70b 1N" in result.output
    assert "Pre-existing failures (fail on both): llama3.1-8b 1N" in result.output


def test_two_models_broken_on_the_candidate_stop_the_sweep_and_resume_runs_the_rest(monkeypatch, tmp_path, repo):
    script = dict(SCRIPT)
    script[("base", "llama3.1-8b", 1)] = passing(800)  # now a second model breaks on the candidate
    seen = []
    args = ["models", "--serial", "--id", "m3", "--commits", "base", "HEAD"]
    args += ["--table", str(repo / "configs/sweeps/small.yml"), "-w", "n[1-3]"]
    result, runner = invoke(monkeypatch, tmp_path, args, scripted(repo, script, seen))
    assert result.exit_code == EXIT_STOPPED, result.output
    assert "llama2-70b, llama3.1-8b fail on the candidate but pass on the baseline" in result.output
    assert not any("qwen3" in k for k in runner.keys)  # stopped before the last model
    sweep = tmp_path / "ws" / "sweeps" / "m3"
    assert json.loads((sweep / "plan.json").read_text())["state"] == "stopped"
    summary = (sweep / "summary.md").read_text()
    assert "llama3.1-8b" in summary and "NEW BREAKAGE" in summary and "not run" in summary
    assert not (sweep / "trees").exists()
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "m3"], scripted(repo, script, seen))
    assert result.exit_code == 0, result.output
    assert [k.split(":", 1)[1] for k in runner.keys] == ["qwen3-30b-a3b:1N"] * 2
    assert all(ok for _, ok, _ in seen)
    assert not (sweep / "trees").exists()


def test_local_runs_the_one_node_entries_only(monkeypatch, tmp_path):
    result, runner = invoke(
        monkeypatch, tmp_path, ["models", "--local", "--id", "m4", "--only", "tiny"], lambda p, n, a: passing(1000)
    )
    assert result.exit_code == 0, result.output
    assert [(p.key, p.nodes) for p, _ in runner.submitted] == [("tiny:1N", ())]
    assert "Left out (--local runs 1-node jobs only): tiny 2N" in result.output


def test_a_model_missing_in_one_commit_is_shown_absent_and_not_submitted(monkeypatch, tmp_path, repo):
    git(repo, "rm", "-q", "configs/qwen3-30b-a3b.yml")
    git(repo, "commit", "-q", "-m", "drop qwen")
    shutil.copy(REPO_ROOT / "configs" / "qwen3-30b-a3b.yml", repo / "configs")  # still in the table's checkout
    seen = []
    args = ["models", "--id", "m5", "--commits", "base", "HEAD", "--only", "qwen3-30b-a3b,tiny"]
    args += ["--table", str(repo / "configs/sweeps/small.yml"), "-w", "n[1-3]"]
    result, runner = invoke(monkeypatch, tmp_path, args, scripted(repo, SCRIPT, seen))
    assert result.exit_code == 0, result.output
    assert [k for k in runner.keys if "qwen3" in k] == [f"base-{heads(repo)['base'][:10]}:qwen3-30b-a3b:1N"]
    assert table_rows(result.output, 8)[("qwen3-30b-a3b", "1N")][-1] == "absent in HEAD"


def test_bad_input_is_one_line_and_leaves_nothing(monkeypatch, tmp_path, repo):
    (tmp_path / "bad.yml").write_text("models: [oops")
    (tmp_path / "unknown.yml").write_text(yaml.safe_dump({"placement": {1: "1"}, "models": [{"model": "nope"}]}))
    small = str(repo / "configs/sweeps/small.yml")
    cases = [
        (["models", "--commits", "base", "no-such-commit", "--table", small, "-w", "n[1-3]"], "unknown commit"),
        (["models", "--only", "tiny,nope", "-w", "n[1-4]"], "--only names 'nope'"),
        (["models", "--only", "llama2-70b", "-w", "n[1-3]"], "give at least 4 nodes"),
        (["models", "--table", str(tmp_path / "bad.yml"), "-w", "n1"], "not valid YAML"),
        (["models", "--table", str(tmp_path / "unknown.yml"), "-w", "n1"], "has no configs/nope.yml"),
        (["models", "--table", str(tmp_path / "none.yml"), "-w", "n1"], "cannot read the model table"),
        (["models", "--local", "--only", "tiny", "-w", "n1"], "drop -w or --local"),
        (["models", "--only", "tiny"], "give the nodes"),
    ]
    for args, needle in cases:
        result, runner = invoke(monkeypatch, tmp_path, args, lambda p, n, a: passing(1))
        assert result.exit_code == 1, (args, result.output)
        assert needle in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert runner.submitted == []
    assert not (tmp_path / "ws" / "sweeps").exists()
    assert git(repo, "worktree", "list").count("\n") == 0


def test_a_commit_with_other_pins_may_not_share_this_checkouts_venv(monkeypatch, repo):
    monkeypatch.delenv("VENV_DIR")
    (repo / "requirements.lock").write_text("jax==0.1\n")
    git(repo, "add", "requirements.lock")
    git(repo, "commit", "-q", "-m", "pins")
    (repo / "requirements.lock").write_text("jax==0.2\n")  # this checkout's venv was built from other pins
    side = models.Side("cand", "HEAD", git(repo, "rev-parse", "HEAD"))
    with pytest.raises(state.SweepError, match="another requirements.lock than this checkout"):
        models.shared_venv(repo, [side])


def test_a_commit_with_the_same_pins_shares_the_current_venv(monkeypatch):
    monkeypatch.delenv("VENV_DIR", raising=False)
    side = models.Side("cand", "HEAD", git(REPO_ROOT, "rev-parse", "HEAD"))
    if any(git(REPO_ROOT, "status", "--porcelain", "--", p) for p in models.VENV_INPUTS):
        pytest.skip("this checkout has uncommitted pin changes")
    assert models.shared_venv(REPO_ROOT, [side]) == str(REPO_ROOT / ".venv")


def test_a_commit_given_as_a_sha_is_shown_by_its_short_sha():
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert models.Side("base", sha, sha).title == "0123456789"
    assert models.Side("base", "0123456", sha).shown == "0123456789"
    assert models.Side("cand", "main", sha).title == "main (0123456789)"
