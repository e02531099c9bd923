"""The stage lines utils/lib/stage_timeout.sh prints (with their UTC time) as the analysis reads them."""

import re
import subprocess
from datetime import UTC, datetime

from conftest import REPO

from jobkit.analysis import job

STAGES = """
source utils/lib/stage_timeout.sh
stage_timeouts_init preflight:900 ecc:none train:1
run_stage preflight Preflight true
run_stage ecc "ECC check" bash -c 'exit 3'
run_stage train Training sleep 30
true
"""


def test_timestamped_stage_lines_still_parse_and_carry_utc_time():
    before = datetime.now(UTC).replace(microsecond=0)
    out = subprocess.run(["bash", "-c", STAGES], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    after = datetime.now(UTC)
    stages = job._stages(out, {})
    assert [(s["name"], s["result"]) for s in stages] == [
        ("Preflight", "end"),
        ("ECC check", "failed"),
        ("Training", "timeout"),
    ]
    stamps = re.findall(r"^== .* (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) ==$", out, re.M)
    assert len(stamps) == 6  # a BEGIN and an end line per stage
    times = [datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) for s in stamps]
    assert times == sorted(times) and before <= times[0] and times[-1] <= after
