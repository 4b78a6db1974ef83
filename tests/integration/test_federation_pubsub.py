"""Pub/sub across three real stations in one process (loopback, ports 0, real SQLite files).

Station B links to A through ``peers``, C to A and B, so the three form a full mesh. Nodes sit
on different stations; what crosses a link is checked on the stations' counters, not only on
what the subscriber saw (the client's own dedup would hide a duplicate).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from macula.node.node import Node
from relay.federation.links import LinkTarget
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, fast, interest_at, linked, station_config, target
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_a_subscriber_on_c_gets_exactly_once_what_a_node_on_a_publishes(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    async with (
        Node(new_identity(), [a.endpoint]) as publisher,
        Node(new_identity(), [c.endpoint]) as subscriber,
    ):
        watch = await subscriber.subscribe(REALM, "crossing")
        await subscriber.flush()
        await eventually(lambda: interest_at(a, c, "crossing") and interest_at(b, c, "crossing"))
        for n in range(3):
            await publisher.publish(REALM, "crossing", {"n": n})
        got = [(await watch.next(5)).payload for _ in range(3)]
        assert got == [{"n": 0}, {"n": 1}, {"n": 2}]
        await publisher.flush()
        await subscriber.flush()
        assert a.core.stats["events_to_stations"] == 3  # to c only: b has no subscriber
        assert c.core.stats["relayed_events_received"] == 3
        assert b.core.stats["relayed_events_received"] == 0
        assert b.core.stats["unwanted_relayed_event"] == 0
        assert c.core.stats["duplicate_relayed_event"] == 0
        assert subscriber.stats.events_duplicate == 0 and watch.delivered == 3


async def test_interest_is_withdrawn_when_the_subscriber_leaves(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, _, c = mesh
    async with Node(new_identity(), [a.endpoint]) as publisher:
        async with Node(new_identity(), [c.endpoint]) as subscriber:
            await subscriber.subscribe(REALM, "leaving")
            await subscriber.flush()
            await eventually(lambda: interest_at(a, c, "leaving"))
        await eventually(lambda: not interest_at(a, c, "leaving"))
        sent = a.core.stats["events_to_stations"]
        await publisher.publish(REALM, "leaving", "nobody")
        await publisher.flush()
        assert a.core.stats["events_to_stations"] == sent


async def test_b_and_c_keep_exchanging_events_after_a_dies(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    await a.stop()
    await eventually(lambda: linked(b) == {c.node_id} and linked(c) == {b.node_id})
    async with (
        Node(new_identity(), [b.endpoint]) as publisher,
        Node(new_identity(), [c.endpoint]) as subscriber,
    ):
        watch = await subscriber.subscribe(REALM, "survivors")
        await subscriber.flush()
        await eventually(lambda: interest_at(b, c, "survivors"))
        await publisher.publish(REALM, "survivors", "still here")
        assert (await watch.next(5)).payload == "still here"


async def test_a_link_that_drops_is_redialled(mesh: tuple[Station, Station, Station]) -> None:
    a, b, _ = mesh
    conn = b.core.node_conn[a.node_id]
    assert b.core.peers[conn].dialled  # b dialled a (its --peer)
    b._connections[conn].close_connection("test cuts the link")
    await eventually(
        lambda: b.core.node_conn.get(a.node_id, conn) != conn and a.node_id in linked(b)
    )
    await eventually(lambda: b.node_id in linked(a))
    async with (
        Node(new_identity(), [a.endpoint]) as publisher,
        Node(new_identity(), [b.endpoint]) as subscriber,
    ):
        watch = await subscriber.subscribe(REALM, "again")
        await subscriber.flush()
        await eventually(lambda: interest_at(a, b, "again"))
        await publisher.publish(REALM, "again", "over the new link")
        assert (await watch.next(5)).payload == "over the new link"


async def test_stations_found_by_discovery_are_linked(tmp_path: Path) -> None:
    async with Station(fast(station_config(tmp_path / "a"), [])) as a:

        async def discover() -> list[LinkTarget]:
            return [target(a)]

        config = dataclasses.replace(
            fast(station_config(tmp_path / "b"), []), discover=discover, discover_interval_s=0.05
        )
        hooked: list[tuple[bytes, str, int]] = []
        async with Station(config) as b:
            b.link_up_hook = lambda node, host, port: hooked.append((node, host, port))
            await eventually(lambda: linked(b) == {a.node_id} and linked(a) == {b.node_id})
            assert b.links is not None and set(b.links.targets) == {a.node_id}
        assert hooked == [(a.node_id, "127.0.0.1", a.dht.port)]  # its DHT port, told in HELLO
        await eventually(lambda: linked(a) == set())


async def test_a_peer_with_the_wrong_key_is_never_linked(tmp_path: Path) -> None:
    async with Station(fast(station_config(tmp_path / "a"), [])) as a:
        wrong = LinkTarget(new_identity().node_id, "127.0.0.1", a.port)
        async with Station(fast(station_config(tmp_path / "b"), [wrong])) as b:
            assert b.links is not None
            await eventually(lambda: b.links is not None and b.links.attempts >= 2)
            assert linked(a) == set() and linked(b) == set()


async def test_two_stations_that_know_each_other_keep_one_link(tmp_path: Path) -> None:
    found: list[LinkTarget] = []

    async def discover() -> list[LinkTarget]:
        return found

    config_a = dataclasses.replace(
        fast(station_config(tmp_path / "a"), []), discover=discover, discover_interval_s=0.02
    )
    async with (
        Station(config_a) as a,
        Station(fast(station_config(tmp_path / "b"), [target(a)])) as b,
    ):
        found.append(target(b))  # a may dial b while b dials a (the unit tests force it)
        await eventually(lambda: linked(a) == {b.node_id} and linked(b) == {a.node_id})
        async with (
            Node(new_identity(), [a.endpoint]) as publisher,
            Node(new_identity(), [b.endpoint]) as subscriber,
        ):
            watch = await subscriber.subscribe(REALM, "one-link")
            await subscriber.flush()
            await eventually(lambda: interest_at(a, b, "one-link"))
            await publisher.publish(REALM, "one-link", "once")
            assert (await watch.next(5)).payload == "once"
            await publisher.flush()
            assert a.core.stats["events_to_stations"] == 1
            assert b.core.stats["relayed_events_received"] == 1
        # the link that stayed is the same connection on both sides: one each
        assert sum(p.linked for p in a.core.peers.values()) == 1
        assert sum(p.linked for p in b.core.peers.values()) == 1
