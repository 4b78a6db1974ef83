"""The whole mesh, end to end: three real Stations in one process (loopback, ports 0).

A starts alone; B and C name only A in ``peers``. They learn each other through the DHT (the
station records they put on link-up) and link directly, so the three form a full mesh. Then:
records, pub/sub, RPC, streaming RPC and content across stations; A stopped (and, in another
test, its connections cut without a GOODBYE) while B and C keep exchanging events and calls;
a client failing over from A to B with nothing lost for a subscriber on C. "Once" is checked
on the stations' counters too: the client's own dedup would hide a duplicate.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from macula.client.backoff import Backoff
from macula.clock import now_ms
from macula.errors import CallTimeout, MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.session import StreamChannel
from macula.wire.records import new_record, record_version
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import (
    REALM,
    interest_at,
    linked,
    mesh_config,
    start_mesh,
)
from support.waiting import eventually

pytestmark = pytest.mark.anyio

FAST = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1)
ECHO = "org.example.mesh_echo_v1"


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[Station, Station, Station]]:
    async with AsyncExitStack() as stack:
        yield await start_mesh(stack, tmp_path)


def served_at(station: Station, holder: Station, procedure: str) -> bool:
    """``station`` routes ``procedure`` to its link with ``holder``."""
    conn = station.core.node_conn.get(holder.node_id)
    return conn is not None and conn in station.core.gossip.remote.links_for((REALM, procedure))


async def answer(caller: Node, payload: Any) -> Any:
    """``ECHO``'s answer through ``caller``'s station, or None while nobody serves it there."""
    try:
        return await caller.call(REALM, ECHO, payload, timeout=1)
    except (MeshError, CallTimeout):
        return None


def echo(call: IncomingCall) -> Any:
    return {"echo": call.payload}


# --- the mesh forms and carries everything ------------------------------------------------


async def test_b_and_c_link_directly_through_the_dht_having_named_only_a(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    # B and C dialled nobody but A on their own: the link between them came from discovery
    assert {t.node_id for t in b.config.peers} == {a.node_id}
    assert {t.node_id for t in c.config.peers} == {a.node_id}
    listed = {s.node_id for s in await b.dht.stations()}
    assert listed == {a.node_id, b.node_id, c.node_id}


async def test_a_record_put_at_one_station_is_found_at_another(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    alice = new_identity()
    now = now_ms()
    note = new_record(
        alice,
        0x21,
        {"text": "across the mesh"},
        now_ms=now,
        version=record_version(now, os.urandom(10)),
        subject_id=b"mesh",
    )
    async with Node(alice, [a.endpoint]) as at_a, Node(new_identity(), [c.endpoint]) as at_c:
        await at_a.dht.put_record(note)
        assert await at_c.dht.find_records(note.storage_key()) == [note]
    async with Node(new_identity(), [b.endpoint]) as at_b:
        assert await at_b.dht.find_records(note.storage_key()) == [note]


async def test_pubsub_and_rpc_cross_stations_each_once(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    async with (
        Node(new_identity(), [a.endpoint]) as publisher,
        Node(new_identity(), [c.endpoint]) as subscriber,
        Node(new_identity(), [b.endpoint]) as server,
    ):
        watch = await subscriber.subscribe(REALM, "mesh.news")
        await subscriber.flush()
        await eventually(lambda: interest_at(a, c, "mesh.news"))
        served: list[Any] = []

        def counting(call: IncomingCall) -> Any:
            served.append(call.payload)
            return echo(call)

        await server.advertise(REALM, ECHO, counting)
        await server.flush()
        await eventually(lambda: served_at(a, b, ECHO) and served_at(c, b, ECHO))
        for n in range(5):
            await publisher.publish(REALM, "mesh.news", n)
        assert [(await watch.next(5)).payload for _ in range(5)] == list(range(5))
        assert await publisher.call(REALM, ECHO, "from a") == {"echo": "from a"}
        assert await subscriber.call(REALM, ECHO, "from c") == {"echo": "from c"}
        await publisher.flush()
        await subscriber.flush()
        assert served == ["from a", "from c"]  # each call answered once
        assert c.core.stats["relayed_events_received"] == 5
        assert c.core.stats["duplicate_relayed_event"] == 0
        assert b.core.stats["relayed_events_received"] == 0  # no subscriber there
        assert subscriber.stats.events_duplicate == 0


async def test_a_streaming_call_and_content_cross_stations(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, _b, c = mesh
    async with (
        Node(new_identity(), [a.endpoint]) as provider,
        Node(new_identity(), [c.endpoint]) as caller,
    ):

        async def countdown(channel: StreamChannel, incoming: IncomingCall) -> None:
            for i in range(incoming.payload["from"], 0, -1):
                channel.send(f"tick {i}".encode())

        await provider.advertise_stream(REALM, "org.example.mesh_countdown_v1", countdown)
        await provider.flush()
        await eventually(lambda: served_at(c, a, "org.example.mesh_countdown_v1"))
        channel = await caller.open_stream(
            REALM, "org.example.mesh_countdown_v1", {"from": 3}, mode="server_stream"
        )
        bodies = await asyncio.wait_for(_drain(channel), 10)
        assert bodies == [b"tick 3", b"tick 2", b"tick 1"] and channel.error is None

        data = os.urandom(300_000)  # several blocks
        mcid = await provider.put_content(data, name="mesh.bin")
        assert await caller.get_content(mcid) == data


async def _drain(channel: StreamChannel) -> list[Any]:
    return [body async for body in channel]


# --- the mesh survives the loss of the station B and C joined through ---------------------


async def _b_and_c_still_talk(b: Station, c: Station, rounds: int) -> None:
    """A node on B publishes to a subscriber on C and calls a procedure served on C."""
    async with (
        Node(new_identity(), [b.endpoint]) as at_b,
        Node(new_identity(), [c.endpoint]) as at_c,
    ):
        watch = await at_c.subscribe(REALM, f"after.{rounds}")
        await at_c.advertise(REALM, ECHO, echo)
        await at_c.flush()
        await eventually(lambda: interest_at(b, c, f"after.{rounds}") and served_at(b, c, ECHO))
        for n in range(rounds):
            await at_b.publish(REALM, f"after.{rounds}", n)
        assert [(await watch.next(5)).payload for _ in range(rounds)] == list(range(rounds))
        assert await at_b.call(REALM, ECHO, "still") == {"echo": "still"}
        assert at_c.stats.events_duplicate == 0


async def test_b_and_c_keep_talking_when_a_stops(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start_mesh(stack, tmp_path)
        async with (
            Node(new_identity(), [b.endpoint]) as at_b,
            Node(new_identity(), [c.endpoint]) as at_c,
        ):
            watch = await at_c.subscribe(REALM, "through.a.dying")
            await at_c.flush()
            await eventually(lambda: interest_at(b, c, "through.a.dying"))
            started = time.monotonic()
            await a.stop()
            await eventually(lambda: linked(b) == {c.node_id} and linked(c) == {b.node_id})
            await at_b.publish(REALM, "through.a.dying", "after a")
            assert (await watch.next(5)).payload == "after a"
            flowing = time.monotonic() - started
            print(f"mesh: A stopped -> B<->C event delivered in {flowing:.3f} s")
        await _b_and_c_still_talk(b, c, 5)


async def test_b_and_c_keep_talking_when_as_connections_are_cut_abruptly(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start_mesh(stack, tmp_path)
        assert a.links is not None
        a.links.halt()  # A redials nobody
        started = time.monotonic()
        for connection in list(a._connections.values()):
            connection.close_connection("crashed")  # no GOODBYE, no drain
        a._close_server()  # and nothing answers B's and C's redials any more
        await eventually(lambda: a.node_id not in linked(b) | linked(c))
        assert c.node_id in linked(b) and b.node_id in linked(c)
        await _b_and_c_still_talk(b, c, 5)
        print(f"mesh: A cut -> B<->C event and call through in {time.monotonic() - started:.3f} s")


async def test_a_client_fails_over_from_a_to_b_with_nothing_lost_for_a_subscriber_on_c(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start_mesh(stack, tmp_path)
        mover = Node(new_identity(), [a.endpoint, b.endpoint], backoff=FAST)
        async with (
            mover,
            Node(new_identity(), [b.endpoint]) as publisher,
            Node(new_identity(), [c.endpoint]) as at_c,
        ):
            moved = await mover.subscribe(REALM, "to.the.mover")
            await mover.advertise(REALM, ECHO, echo)
            await mover.flush()
            info = mover.station_info
            assert info is not None and info.node_id == a.node_id
            watch = await at_c.subscribe(REALM, "steady")
            await at_c.flush()
            await eventually(lambda: interest_at(b, c, "steady") and served_at(c, a, ECHO))

            sent = 0

            async def publish(until: asyncio.Event) -> None:
                nonlocal sent
                while not until.is_set() or sent < 10:
                    await publisher.publish(REALM, "steady", sent)
                    sent += 1
                    await publisher.flush()

            done = asyncio.Event()
            publishing = asyncio.create_task(publish(done))
            await eventually(lambda: sent >= 3)
            started = time.monotonic()
            await a.stop()
            # the mover is serving and subscribed again, now at B
            assert await eventually(lambda: answer(at_c, 1), timeout=5) == {"echo": 1}
            back = time.monotonic() - started
            info = mover.station_info
            assert info is not None and info.node_id == b.node_id
            await eventually(lambda: interest_at(c, b, "to.the.mover"))
            await at_c.publish(REALM, "to.the.mover", "found you")
            assert (await moved.next(5)).payload == "found you"
            done.set()
            await publishing
            got = [(await watch.next(5)).payload for _ in range(sent)]
            assert got == list(range(sent))  # all, in order, none twice
            await at_c.flush()
            assert at_c.stats.events_duplicate == 0
            assert c.core.stats["relayed_events_received"] == sent + 0  # "found you" is C's own
            assert c.core.stats["duplicate_relayed_event"] == 0
            print(f"failover across the mesh: served again at B {back:.3f} s after A stopped")


# --- a station rejoins from the peers it stored itself -------------------------------------


async def test_a_station_restarted_without_peers_relinks_with_the_mesh_it_knew(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start_mesh(stack, tmp_path)
        assert c.known_peers is not None
        await eventually(
            lambda: {t.node_id for t in c.known_peers.targets()} == {a.node_id, b.node_id}
        )
        await c.stop()
        await eventually(lambda: c.node_id not in linked(a) | linked(b))
        started = time.monotonic()
        again = await stack.enter_async_context(Station(mesh_config(tmp_path / "c", [])))
        assert again.node_id == c.node_id and again.config.peers == []
        await eventually(
            lambda: linked(again) == {a.node_id, b.node_id}, timeout=10, message="no rejoin"
        )
        assert again.core.stats["links_dialled"] >= 2  # it dialled them: nobody named it
        print(f"rejoin: no --peer, relinked with A and B in {time.monotonic() - started:.3f} s")
        async with (
            Node(new_identity(), [a.endpoint]) as at_a,
            Node(new_identity(), [again.endpoint]) as at_c,
        ):
            watch = await at_c.subscribe(REALM, "rejoined")
            await at_c.flush()
            await eventually(lambda: interest_at(a, again, "rejoined"))
            await at_a.publish(REALM, "rejoined", "welcome back")
            assert (await watch.next(5)).payload == "welcome back"


async def test_a_corrupt_known_peers_file_is_logged_and_the_station_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "s"
    data_dir.mkdir(mode=0o700)
    (data_dir / "known_peers.json").write_bytes(b"\x00{not json")
    with caplog.at_level("WARNING", logger="macula.relay"):
        async with Station(mesh_config(data_dir, [])) as station:
            assert station.links is not None and station.links.targets == {}
    assert "known_peers.json cannot be read" in caplog.text
