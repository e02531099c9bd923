"""The failure corpus (tests/fixtures/failures/corpus, written by its make_corpus.py from the real message
texts): `jobkit why` gives each log's class and blamed host; successes, early stops and cancels are not failures."""

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from jobkit.cli import main

FAILURES = Path(__file__).resolve().parents[1] / "fixtures" / "failures"
CORPUS = FAILURES / "corpus"
EXPECTED = yaml.safe_load((CORPUS / "expected.yaml").read_text())["cases"]
NOT_FAILURES = {"succeeded", "stopped-early", "cancelled"}


def why_json(log: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["why", "--json", *args, str(log)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_why_gives_each_corpus_log_its_class_and_host(name):
    want = EXPECTED[name]
    got = why_json(CORPUS / f"{name}.log")
    assert (got.get("class") or got["outcome"], got.get("host", "")) == (want["class"], want["host"]), got
    if got.get("signature"):  # a catalogue entry decided: its retry decision, and its line is in the log
        assert got["retry"] in ("retry", "retry-without-node", "never")
        assert got["evidence"] and got["evidence"].strip(".")[:40] in (CORPUS / f"{name}.log").read_text()


def test_the_corpus_is_big_enough_multi_node_and_noisy():
    failing = [n for n, w in EXPECTED.items() if w["class"] not in NOT_FAILURES]
    fine = [n for n, w in EXPECTED.items() if w["class"] in NOT_FAILURES]
    assert len(failing) >= 60 and len(fine) >= 10
    assert {p.stem for p in CORPUS.glob("*.log")} == set(EXPECTED)
    texts = [(CORPUS / f"{n}.log").read_text() for n in EXPECTED]
    assert sum("NNODES=1\n" not in t for t in texts) >= 70  # multi-node
    for noise in ("[NO-OP]", "ModuleNotFoundError", "NCCL INFO", "NCCL WARN", "bfc_allocator", "failed call to cuInit"):
        assert sum(noise in t for t in texts) >= 60, noise
    assert all(EXPECTED[n]["source"] for n in EXPECTED)  # each case says where its text comes from


def test_the_committed_corpus_is_what_make_corpus_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_corpus", FAILURES / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.render(tmp_path)
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in CORPUS.iterdir()}
    assert written == committed, "run tests/fixtures/failures/make_corpus.py and commit its output"


def test_all_lists_every_matching_signature_in_log_order():
    got = why_json(CORPUS / "rocm-hsa-root-cause-logged-after-rccl-errors.log", "--all")
    assert got["class"] == "gpu-hardware" and got["host"] == "gpu02"
    classes = [m["class"] for m in got["matches"]]
    # The RCCL errors come first in the log; the verdict still names the GPU fault logged after them.
    assert classes.index("collective-error") < classes.index("gpu-hardware")
    assert all(m["signature"] and m["source"] for m in got["matches"])


def test_why_says_how_the_host_was_found_and_names_the_followers():
    result = CliRunner().invoke(main, ["why", str(CORPUS / "jax-heartbeat-bare-task-number.log")])
    lines = result.output.splitlines()
    assert lines[0] == "task-died"  # rank 1 logged nothing after it was accused
    assert "  host: gpu02" in lines
    assert (
        "  blamed because: the accused JAX task (a bare 1, 1 line(s) after the message) -> node 2 of JOB_NODELIST"
        in lines
    )
    assert "  retry: retry-without-node" in lines
    assert any(line.startswith("  advice: ") for line in lines)
    assert any(line.startswith("  signature: jax-heartbeat-task-died (xla ") for line in lines)
    got = why_json(CORPUS / "python-exception-kill-on-bad-exit-143.log")
    assert (got["class"], got["host"], got["followers"]) == ("python-exception", "gpu02", ["gpu01"])
