"""A station process SIGKILLed, noticed dead by its node (its ping met ICMP "port unreachable"),
then started again on the same key, port and data dir: the node, redialling the refused station
every 0.25-0.5 s, is back within a redial or two of the new process listening, not at its next
backoff (issue 37). The normal backoff here is 60 s, so only the short redial can bring it back
in time; the counters say which path it took (no wall-clock figures: ``scripts/bench_restart.py
--noticed`` measures). With two stations, a refused one does not hold the node: it moves on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.client.backoff import Backoff
from macula.node.node import Node
from support.identities import new_identity
from support.meshkit import REALM
from support.processkit import StationProcess, station_process
from support.waiting import eventually

pytestmark = pytest.mark.anyio

HELD_OFF = Backoff(initial_s=60, max_s=60, jitter=0.0)  # only a short redial is back in time
DOWN_S = 20.0  # how long the node may take to notice and to be back (a loaded CI machine)


async def test_a_node_that_noticed_the_death_is_back_within_a_redial_of_the_restart(
    tmp_path: Path,
) -> None:
    async with station_process(tmp_path / "station") as station:
        node = Node(new_identity(), [station.endpoint], backoff=HELD_OFF, settle_s=0)
        async with node:
            sub = await node.subscribe(REALM, "redial.news")
            await node.flush()
            await station.kill()  # no GOODBYE, no CONNECTION_CLOSE
            # the node noticed (its ping met ICMP) and keeps dialling the dead port, refused
            await eventually(lambda: node.stats.dials_refused >= 3, DOWN_S)
            assert not node.connected and node.stats.reconnects == 0
            assert node.stats.quick_redials >= node.stats.dials_refused - 1  # each one quick
            await station.start()  # same key, port and data dir; listening from here on
            redials_at_listening = node.stats.quick_redials
            await node.publish_confirmed(REALM, "redial.news", "after", timeout=DOWN_S)
            assert node.stats.reconnects == 1
            assert node.stats.quick_redials - redials_at_listening <= 2  # back within two redials
            assert node.stats.stateless_resets == 0  # nothing was left to reset
            assert (await sub.next(5)).payload == "after"  # the subscription was replayed


async def test_a_refused_station_does_not_hold_the_node_and_both_down_are_redialled(
    tmp_path: Path,
) -> None:
    first, second = StationProcess(tmp_path / "a"), StationProcess(tmp_path / "b")
    try:
        await first.start()
        await second.start()
        endpoints = [first.endpoint, second.endpoint]
        async with Node(new_identity(), endpoints, backoff=HELD_OFF, settle_s=0) as node:
            assert node.station_info is not None and node.station_info.index == 0
            await first.kill()
            # refused first station: straight on to the next one, no wait of any kind
            await eventually(lambda: node.connected and node.station_index == 1, DOWN_S)
            assert node.stats.quick_redials == 0 and node.stats.reconnects == 1
            await second.kill()
            # both down: rounds of two refused dials, each round followed by a short wait
            await eventually(lambda: node.stats.quick_redials >= 2, DOWN_S)
            assert node.stats.dials_refused >= 2 * node.stats.quick_redials - 1
            await first.start()
            redials_at_listening = node.stats.quick_redials
            await node.flush(timeout=DOWN_S)
            info = node.station_info
            assert info is not None and info.index == 0 and node.stats.reconnects == 2
            assert node.stats.quick_redials - redials_at_listening <= 2
    finally:
        await first.kill()
        await second.kill()
