"""A short soak: hostile clients beside honest pairs on a station process; nothing honest lost."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.paths import SCRIPTS

SCRIPT = SCRIPTS / "soak_station.py"


# slow: a soak; scripts/soak_station.py is the long one, the hostile integration tests stay in the
# default run
@pytest.mark.slow
def test_a_short_soak_loses_no_honest_event_and_the_station_survives() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "4", "--pairs", "2", "--rate", "40", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, (report, run.stderr[-2000:])
    assert report["honest_sent"] > 0 and report["honest_lost"] == 0
    assert report["station_survived"] == 1
    station = report["station"]
    assert station["peak_rss_mib"] > 0 and station["log_bytes"] >= 0
    hostile = report["hostile"]
    assert hostile.get("garbage_connections", 0) > 0  # the attackers did run
    assert hostile.get("bad_signature_frames", 0) > 0
