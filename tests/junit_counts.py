#!/usr/bin/env python3
"""Usage: tests/junit_counts.py REPORT.xml

Prints "PASSED FAILED SKIPPED" for one pytest JUnit XML report (errors count as failed), the numbers
tests/run.sh adds into its closing "N passed, N failed" line."""

import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> tuple[int, int, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[0])
    print(*counts(sys.argv[1]))
