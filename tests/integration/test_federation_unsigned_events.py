"""Events without ``publisher_sig`` across station links (issue 22), on real stations in one
process (loopback, ports 0, SQLite files).

Three stations as the README starts them: B and C each with A as their peer. A raw v2 client
on A publishes without ``publisher_sig`` (PROTOCOL.md §4.4 makes it optional): subscribers on
B and C get every event once, station-attested (``attested_by`` = A), as a subscriber on A gets
them attested by A. A signed event still arrives end to end. A raw peer station that claims
another station's attestation is refused; our agent layer still refuses unsigned hellos.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import tools.server.server
from macula.agent.presence import HELLO_TOPIC
from macula.node.node import Node
from macula.node.subscriptions import Subscription
from macula.wire.frames import Event, Publish
from macula.wire.identity import ZERO_REALM
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, agent_in, interest_at, three_stations
from support.rawclient import RawClient, link_in, raw_client, stamp
from support.waiting import eventually
from tools.groups import pubsub
from tools.server import surface

pytestmark = pytest.mark.anyio

Mesh = tuple[Station, Station, Station]
EVENTS = 50


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    async with three_stations(tmp_path, c_dials_b=False) as stations:  # B, C with --peer A
        yield stations


def unsigned_publish(raw: RawClient, topic: str, seq: int, realm: bytes = REALM) -> Publish:
    return Publish(
        **stamp(),
        topic=topic,
        realm=realm,
        publisher=raw.node_id,
        seq=seq,
        payload={"n": seq},
        published_at_ms=stamp()["sent_at_ms"],
    )


async def collect(watch: Subscription, n: int) -> list[Any]:
    return [await watch.next(5) for _ in range(n)]


async def test_unsigned_events_published_on_a_reach_b_and_c_once_each_attested_by_a(
    mesh: Mesh,
) -> None:
    a, b, c = mesh
    async with (
        raw_client(a) as publisher,
        Node(new_identity(), [a.endpoint]) as on_a,
        Node(new_identity(), [b.endpoint]) as on_b,
        Node(new_identity(), [c.endpoint]) as on_c,
        Node(new_identity(), [a.endpoint]) as signer,
    ):
        watches = [await node.subscribe(REALM, "plain") for node in (on_a, on_b, on_c)]
        for node in (on_a, on_b, on_c):
            await node.flush()
        await eventually(lambda: interest_at(a, b, "plain") and interest_at(a, c, "plain"))
        for seq in range(1, EVENTS + 1):
            publisher.send(unsigned_publish(publisher, "plain", seq))
        await publisher.flush()
        for watch in watches:
            got = await collect(watch, EVENTS)
            assert [d.seq for d in got] == list(range(1, EVENTS + 1))
            assert {(d.publisher, d.authenticated, d.attested_by) for d in got} == {
                (publisher.node_id, False, a.node_id)
            }
        assert a.core.stats["unsigned_events_not_relayed"] == 0
        assert a.core.stats["events_to_stations"] == 2 * EVENTS
        for station in (b, c):
            assert station.core.stats["relayed_attested_events_received"] == EVENTS
            assert station.core.stats["duplicate_relayed_event"] == 0
        # with publisher_sig: end to end, as before
        await signer.publish(REALM, "plain", "signed")
        for watch in watches:
            delivery = await watch.next(5)
            assert (delivery.payload, delivery.authenticated, delivery.attested_by) == (
                "signed",
                True,
                None,
            )
        for node, watch in zip((on_a, on_b, on_c), watches, strict=True):
            await node.flush()
            assert watch.delivered == EVENTS + 1 and node.stats.events_duplicate == 0
        assert b.core.stats["relayed_attested_events_received"] == EVENTS


def event_from(station: RawClient, seq: int, **fields: Any) -> Event:
    return Event(
        **stamp(),
        topic="vouched",
        realm=REALM,
        publisher=new_identity().node_id,
        seq=seq,
        payload={"n": seq},
        **fields,
    )


async def test_a_linked_station_claiming_another_stations_attestation_is_refused(
    mesh: Mesh,
) -> None:
    a, b, _ = mesh
    async with (
        raw_client(b, handshake=False) as hostile,
        Node(new_identity(), [b.endpoint]) as subscriber,
    ):
        assert (await link_in(hostile))["accepted"] == "true"
        watch = await subscriber.subscribe(REALM, "vouched")
        await subscriber.flush()
        await eventually(lambda: b.core.interest.federation.local[(REALM, b"vouched")] == 1)
        hostile.send(event_from(hostile, 1, attested_by=a.node_id))  # "A vouches for it"
        hostile.send(event_from(hostile, 2, attested_by=os.urandom(32)))
        hostile.send(event_from(hostile, 3))  # vouched for by the hostile station itself
        hostile.send(event_from(hostile, 4, attested_by=hostile.node_id))
        await hostile.flush()
        got = await collect(watch, 2)
        assert [(d.seq, d.attested_by) for d in got] == [(3, hostile.node_id), (4, hostile.node_id)]
        assert b.core.stats["forged_attestation"] == 2
        await subscriber.flush()
        assert watch.delivered == 2


async def test_our_agents_still_refuse_an_unsigned_hello_from_another_station(
    mesh: Mesh, tmp_path: Path
) -> None:
    a, b, _ = mesh
    async with (
        agent_in(b, tmp_path / "bob") as bob,
        raw_client(a) as stranger,
    ):
        await bob.hello()
        await eventually(
            lambda: (
                b.node_id in a.core.subscriptions.subscribers((ZERO_REALM, HELLO_TOPIC.encode()))
            )
        )
        hello = {"node_id": stranger.node_id.hex(), "operator_name": "trust me"}
        stranger.send(
            Publish(
                **stamp(),
                topic=HELLO_TOPIC,
                realm=ZERO_REALM,
                publisher=stranger.node_id,
                seq=1,
                payload=hello,
                published_at_ms=stamp()["sent_at_ms"],
            )
        )
        await stranger.flush()
        await eventually(lambda: bob.presence.stats["hello_unauthenticated"] >= 1)
        heard = {entry.node_id for entry in await bob.presence.agents()}
        assert stranger.node_id not in heard
        assert b.core.stats["relayed_attested_events_received"] >= 1  # it crossed, attested


async def test_mesh_watch_on_b_shows_who_vouches_for_an_unsigned_event_from_a(
    mesh: Mesh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = mesh
    monkeypatch.setattr(tools.server.server, "GROUPS", (pubsub, surface))
    home = tmp_path / "agent"
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": b.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
    }
    app = tools.server.server.build_server(env)
    async with Client(app) as client, raw_client(a) as publisher:
        watch = asyncio.ensure_future(
            client.call_tool("mesh_watch", {"topic": "news", "duration_seconds": 10, "count": 1})
        )
        seq = 0
        while not watch.done():  # the watch subscribes when it starts: publish until it hears
            seq += 1
            publisher.send(unsigned_publish(publisher, "news", seq, realm=bytes(32)))
            await asyncio.wait([watch], timeout=0.05)
        result = (await watch).structured_content
        assert result is not None and result["count"] == 1
        [event] = result["events"]
        assert (event["publisher"], event["authenticated"], event["attested_by"]) == (
            publisher.node_id.hex(),
            0,
            a.node_id.hex(),
        )
