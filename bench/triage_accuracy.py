#!/usr/bin/env python3
"""Run `jobkit why --json` on every log of a failure corpus and compare with its expected.yaml.

Usage: bench/triage_accuracy.py [CORPUS_DIR]   (default: tests/fixtures/failures/corpus)
Summary: the confusion table (expected class -> the class given, counts), class and host accuracy, and one
line per miss; exit 1 when any class or host is wrong. bench/triage_accuracy.sh runs it with the venv.
"""

import json
import sys
from collections import Counter
from pathlib import Path

import yaml
from click.testing import CliRunner

from jobkit.cli import main

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "failures" / "corpus"


def verdict(log: Path) -> tuple[str, str]:
    """(class, host) as `jobkit why --json` gives them; succeeded/stopped-early/incomplete as the class."""
    result = CliRunner().invoke(main, ["why", "--json", str(log)])
    if result.exit_code != 0:
        return f"error: {result.output.strip()[:80]}", ""
    data = json.loads(result.stdout)
    return data.get("class") or data["outcome"], data.get("host", "")


def main_(corpus: Path) -> int:
    expected = yaml.safe_load((corpus / "expected.yaml").read_text())["cases"]
    confusion: Counter = Counter()
    misses = []
    host_right = 0
    for name, want in sorted(expected.items()):
        got_class, got_host = verdict(corpus / f"{name}.log")
        confusion[(want["class"], got_class)] += 1
        host_right += got_host == want["host"]
        if (got_class, got_host) != (want["class"], want["host"]):
            misses.append(
                f"  {name}: want {want['class']} @ {want['host'] or '-'}, got {got_class} @ {got_host or '-'}"
            )
    classes = sorted({w for w, _ in confusion})
    width = max(len(c) for c in classes) + 2
    print(f"{'expected class':<{width}} {'n':>3} {'right':>5}  given instead")
    for want in classes:
        row = {got: n for (w, got), n in confusion.items() if w == want}
        other = ", ".join(f"{got} x{n}" for got, n in sorted(row.items()) if got != want)
        print(f"{want:<{width}} {sum(row.values()):>3} {row.get(want, 0):>5}  {other or '-'}")
    total = len(expected)
    right = sum(n for (w, g), n in confusion.items() if w == g)
    print(f"\n{total} logs: class right {right}/{total}, host right {host_right}/{total}")
    if misses:
        print("misses:\n" + "\n".join(misses))
    return 0 if not misses else 1


if __name__ == "__main__":
    sys.exit(main_(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT))
