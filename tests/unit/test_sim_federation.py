"""scripts/sim_federation.py runs end to end with a small mesh and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from support.paths import SCRIPTS

SCRIPT = SCRIPTS / "sim_federation.py"
SMALL = ["--stations", "4", "--clients", "4", "--events", "5", "--lookups", "5"]
FAST = ["--discover-interval", "1", "--idle-window", "0.5", "--deadline", "40"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_a_small_mesh_settles_delivers_once_and_survives_a_death() -> None:
    done = run(*SMALL, *FAST, "--json")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    figures: dict[str, Any] = json.loads(done.stdout)
    assert figures["failures"] == []
    assert figures["links_per_station"] == {"min": 3, "median": 3, "max": 3}
    assert figures["links_per_station_after_death"] == {"min": 2, "median": 2, "max": 2}
    per_event = figures["per_event"]
    # the publisher sits on the last station; the 4 clients on stations 0..3: 3 remote copies
    assert per_event["events_to_stations"] == 3
    assert per_event["relayed_events_received"] == 3
    assert per_event["events_delivered"] == 4
    assert per_event["duplicate_relayed_event"] == 0
    assert figures["max_station_hops"] == 1
    assert figures["dht_lookup_ms"]["found"] == figures["dht_lookup_ms"]["of"] == 5
    assert figures["discovery_round"]["found"] == 4
    for key in ("settle_s", "relink_after_death_s", "event_reaches_all_after_death_s"):
        assert 0 <= figures[key] < 40, key
    assert figures["process"]["cpu_s"] > 0 and figures["process"]["peak_rss_mib"] > 0


@pytest.mark.slow  # a second mesh: the JSON run above covers the figures themselves
def test_the_plain_output_names_every_figure() -> None:
    done = run(*SMALL[:4], "--events", "2", "--lookups", "2", *FAST)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for phrase in (
        "mesh settled",
        "peer links per station:",
        "per published event",
        "station links crossed per delivery",
        "publish -> deliver: p50",
        "DHT lookup",
        "one discovery round",
        "idle CPU",
        "links re-formed",
        "reached all 4 subscribers",
        "process: CPU",
        "all phases passed",
    ):
        assert phrase in done.stdout, f"{phrase!r} missing from:\n{done.stdout}"


def test_bad_arguments_are_refused_clearly() -> None:
    for args in (["--stations", "1"], ["--clients", "0"], ["--events", "0"]):
        done = run(*args)
        assert done.returncode != 0
        assert "sim_federation:" in done.stderr, done.stderr
