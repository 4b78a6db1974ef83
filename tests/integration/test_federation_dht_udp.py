"""The DHT's UDP port seen from outside (issue 26): a plain UDP socket speaking rpcudp's msgpack
framing at a real StationDht on loopback. A source that never proves its address gets at most
3x the bytes it sent; a STORE from a station not linked is refused; a flood leaves an honest
record held."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import umsgpack

from macula.clock import now_ms
from macula.quic.transport import ALPN
from macula.wire.identity import Identity
from macula.wire.record_keys import station_endpoint_key
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.federation.dht.guard import GuardLimits
from relay.federation.dht.station import DhtConfig, StationDht
from relay.federation.dht.storage import DhtLimits, dht_id, encode_value
from support.dhtkit import dht_nodes, note
from support.identities import new_identity
from support.meshkit import start_mesh
from support.waiting import eventually

pytestmark = pytest.mark.anyio

LOOPBACK = "127.0.0.1"
FAST = DhtConfig(rpc_timeout_s=0.5)
CONTENT = bytes(34)


def announcement(who: Identity) -> Record:
    """One of many records under one key (the same content, announced by many nodes)."""
    now = now_ms()
    payload = {"announcer_node": who.node_id, "mcid": CONTENT, "endpoint": "quic://h:1"}
    return new_record(
        who,
        RecordType.CONTENT_ANNOUNCEMENT,
        payload,
        now_ms=now,
        version=record_version(now, os.urandom(10)),
    )


class Stranger(asyncio.DatagramProtocol):
    """A plain UDP socket: sends rpcudp requests, counts every byte it sends and receives."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.sent = 0
        self.received = 0
        self.replies: dict[bytes, object] = {}
        self.requests: list[bytes] = []  # requests the station sent this socket

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received += len(data)
        if data[:1] == b"\x01":
            self.replies[data[1:21]] = umsgpack.unpackb(data[21:])
        else:
            self.requests.append(data)

    def send(self, to: int, name: str, *args: object) -> bytes:
        assert self.transport is not None
        msg_id = os.urandom(20)
        datagram = b"\x00" + msg_id + umsgpack.packb([name, list(args)])
        self.sent += len(datagram)
        self.transport.sendto(datagram, (LOOPBACK, to))
        return msg_id

    async def ask(self, to: int, name: str, *args: object) -> object:
        msg_id = self.send(to, name, *args)
        await eventually(lambda: msg_id in self.replies, message=f"no reply to {name}")
        return self.replies[msg_id]


@asynccontextmanager
async def stranger() -> AsyncIterator[Stranger]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Stranger, local_addr=(LOOPBACK, 0))
    try:
        yield protocol
    finally:
        transport.close()


async def settled(dht: StationDht, who: Stranger) -> None:
    """Everything the station sent ``who`` so far has arrived: a last ping's reply (the
    station answers in order) after the pushes it scheduled have started."""
    await asyncio.sleep(0)  # one loop turn: pushes scheduled by the requests start
    await who.ask(dht.port, "ping", os.urandom(20))


async def test_an_unproven_source_gets_at_most_three_times_the_bytes_it_sent() -> None:
    async with dht_nodes(3, FAST) as nodes:
        target = nodes[0]
        signers = [new_identity() for _ in range(60)]
        heavy = announcement(signers[0]).storage_key()
        dkey = dht_id(heavy)
        for who in signers:  # ~10 KiB of records under one key
            assert target.storage.accept(dkey, announcement(who), now_ms())
        flooder = new_identity()
        for i in range(40):  # and many digests a newcomer would be welcomed with
            rec = note(flooder, subject=bytes([i]))
            assert target.storage.accept(dht_id(rec.storage_key()), rec, now_ms())
        value = encode_value([note(new_identity())])
        async with stranger() as s:
            for _ in range(5):
                fresh = os.urandom(20)  # a fresh id each time: a newcomer to be welcomed
                s.send(target.port, "ping", fresh)
                s.send(target.port, "find_node", fresh, os.urandom(20))
                s.send(target.port, "find_value", fresh, dkey)
                s.send(target.port, "store", fresh, dkey, value)
                s.send(target.port, "token", fresh)
            await settled(target, s)
            ratio = s.received / s.sent
            print(f"\nunproven source: sent {s.sent} B, got {s.received} B, ratio {ratio:.2f}")
            assert ratio <= 3, f"{s.received} bytes answered to {s.sent} sent"
            assert s.requests == []  # nothing pushed to it
            assert target.stats["dht_challenged"] >= 15
        assert target.contacts == 2  # the stranger never entered the routing table


async def test_a_source_that_echoes_its_token_gets_the_records() -> None:
    async with dht_nodes(1, FAST) as (target,):
        rec = note(new_identity())
        dkey = dht_id(rec.storage_key())
        assert target.storage.accept(dkey, rec, now_ms())
        async with stranger() as s:
            me = os.urandom(20)
            challenge = cast(dict[str, Any], await s.ask(target.port, "find_value", me, dkey))
            token = challenge["token"]
            found = cast(dict[str, Any], await s.ask(target.port, "find_value", me, dkey, token))
            assert found["value"] == encode_value([rec])
            forged = bytes(16)
            again = cast(dict[str, Any], await s.ask(target.port, "find_value", me, dkey, forged))
            assert set(again) == {"token"}  # a token it was not given is no token


async def test_a_store_from_a_source_not_linked_is_refused() -> None:
    async with dht_nodes(1, FAST) as (target,):
        rec = note(new_identity())
        dkey = dht_id(rec.storage_key())
        async with stranger() as s:
            me = os.urandom(20)
            await s.ask(target.port, "store", me, dkey, encode_value([rec]))  # no token
            assert target.storage.records(dkey, now_ms()) == []
            challenge = cast(dict[str, Any], await s.ask(target.port, "token", me))
            taken = await s.ask(
                target.port, "store", me, dkey, encode_value([rec]), challenge["token"]
            )
            assert taken == 0
            assert target.storage.records(dkey, now_ms()) == []
            assert target.stats["dht_refused_unlinked"] == 1


async def test_a_udp_store_flood_leaves_an_honest_record_held() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, limits=DhtLimits(records_total=100))
    async with dht_nodes(1, config) as (target,):
        async with stranger() as s:
            me = os.urandom(20)
            token = cast(dict[str, Any], await s.ask(target.port, "token", me))["token"]
            flooder = new_identity()
            for i in range(150):  # bare STOREs, with and without the token it was given
                rec = note(flooder, subject=i.to_bytes(2, "big"))
                value = encode_value([rec])
                s.send(target.port, "store", me, dht_id(rec.storage_key()), value)
                s.send(target.port, "store", me, dht_id(rec.storage_key()), value, token)
            await settled(target, s)
        assert target.stats["dht_challenged"] == 150
        assert target.stats["dht_refused_unlinked"] == 150
        assert target.storage.rows <= 2  # its own records only
        honest = note(new_identity(), subject=b"honest")
        assert await target.put(honest) == 1
        assert target.storage.records(dht_id(honest.storage_key()), now_ms()) == [honest]


async def test_a_linked_station_flooding_holds_its_share_and_an_honest_record_stays() -> None:
    limits = DhtLimits(records_total=60, records_per_source=30)
    config = DhtConfig(rpc_timeout_s=0.5, limits=limits)
    async with dht_nodes(3, config) as (target, flooder, other):
        honest = note(new_identity(), subject=b"honest")
        assert await other.put(honest) == 3  # held at the target for the other station
        protocol = flooder._server.protocol
        (peer,) = [
            n for b in protocol.router.buckets for n in b.get_nodes() if n.port == target.port
        ]
        flooding = new_identity()
        flood = [note(flooding, subject=i.to_bytes(2, "big")) for i in range(150)]
        taken = await asyncio.gather(
            *(protocol.call_store(peer, dht_id(r.storage_key()), encode_value([r])) for r in flood)
        )
        assert sum(t[1] for t in taken if t[0]) <= 30
        assert target.stats["refused_source_records"] >= 120
        dkey = dht_id(honest.storage_key())
        assert target.storage.records(dkey, now_ms()) == [honest]
        author = new_identity()
        for i in range(40):  # the station's own puts fill the shelf: the flooder makes room
            mine = note(author, subject=bytes([i]))
            await target.put(mine)
            assert target.storage.records(dht_id(mine.storage_key()), now_ms()) == [mine]
        assert target.storage.records(dkey, now_ms()) == [honest]
        assert target.stats["dropped_for_room"] >= 1


async def test_many_records_under_one_key_come_in_pages_each_one_small_datagram() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, limits=DhtLimits(max_reply_bytes=2_000))
    async with dht_nodes(2, config) as (holder, reader):
        signers = [new_identity() for _ in range(40)]
        records = [announcement(who) for who in signers]
        dkey = dht_id(records[0].storage_key())
        for rec in records:  # ~7 KiB under one key, held at one station only
            assert holder.storage.accept(dkey, rec, now_ms())
        found = await reader.find(records[0].storage_key())
        assert sorted(r.key for r in found) == sorted(w.node_id for w in signers)
        async with stranger() as s:  # a proven source reads them page by page
            me = os.urandom(20)
            token = cast(dict[str, Any], await s.ask(holder.port, "token", me))["token"]
            pages = [cast(dict[str, Any], await s.ask(holder.port, "find_value", me, dkey, token))]
            while pages[-1]["next"]:
                skip = pages[-1]["next"]
                page = await s.ask(holder.port, "find_more", me, dkey, skip, token)
                pages.append(cast(dict[str, Any], page))
            assert len(pages) >= 4
            assert all(len(p["value"]) <= 2_000 for p in pages)
        config = DhtConfig(rpc_timeout_s=0.5, find_pages=2)
        capped = StationDht(new_identity(), quic_port=1, hosts=[LOOPBACK], config=config)
        await capped.start(LOOPBACK, 0)
        try:
            await capped.bootstrap([(LOOPBACK, holder.port)])
            assert 0 < len(await capped.find(records[0].storage_key())) < len(records)
            assert capped.stats["find_pages_capped"] >= 1
        finally:
            await capped.stop()


async def test_a_linked_station_storing_garbage_is_counted() -> None:
    async with dht_nodes(2, FAST) as (target, linked):
        protocol = linked._server.protocol
        (peer,) = [n for b in protocol.router.buckets for n in b.get_nodes()]
        assert await protocol.call_store(peer, os.urandom(20), b"\xff") == (True, 0)
        assert target.stats["refused_bad_value"] == 1


async def test_a_linked_station_whose_link_named_no_port_is_bound_by_its_endpoint() -> None:
    a = StationDht(new_identity(), quic_port=1, hosts=[LOOPBACK], config=FAST)
    b = StationDht(new_identity(), quic_port=2, hosts=[LOOPBACK], config=FAST)
    await a.start(LOOPBACK, 0)
    await b.start(LOOPBACK, 0)
    try:
        a.link_up(b.identity.node_id, LOOPBACK, 0)  # the link told no DHT port
        b.link_up(a.identity.node_id, LOOPBACK, a.port)
        await b.bootstrap([(LOOPBACK, a.port)])  # b publishes its endpoint at a first
        endpoint = dht_id(station_endpoint_key(b.identity.node_id))
        assert [r.key for r in a.storage.records(endpoint, now_ms())] == [b.identity.node_id]
        assert a.stats["dht_bound_by_endpoint"] == 1
        rec = note(new_identity())
        assert await b.put(rec) == 2
        assert a.storage.records(dht_id(rec.storage_key()), now_ms()) == [rec]
    finally:
        await a.stop()
        await b.stop()


async def test_an_endpoint_record_binds_no_station_that_is_not_linked() -> None:
    async with dht_nodes(1, FAST) as (target,), stranger() as s:
        assert s.transport is not None
        port = s.transport.get_extra_info("sockname")[1]
        who, now = new_identity(), now_ms()
        endpoint = new_record(
            who,
            RecordType.STATION_ENDPOINT,
            {
                "quic_port": 1,
                "host_advertised": [LOOPBACK.encode()],
                "alpn": ALPN,
                "dht_port": port,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
        )
        me = dht_id(who.node_id)
        dkey = dht_id(endpoint.storage_key())
        token = cast(dict[str, Any], await s.ask(target.port, "token", me))["token"]
        assert await s.ask(target.port, "store", me, dkey, encode_value([endpoint]), token) == 0
        assert target.storage.records(dkey, now_ms()) == []
        assert target.stats["dht_refused_unlinked"] == 1


async def test_a_linked_station_stores_new_records_within_its_budget_resent_ones_are_free() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, guard=GuardLimits(records_per_source_window=12))
    async with dht_nodes(2, config) as (target, linked):
        protocol = linked._server.protocol
        (peer,) = [n for b in protocol.router.buckets for n in b.get_nodes()]
        rec = note(new_identity())
        value = encode_value([rec])
        for _ in range(20):  # re-sent unchanged (as replication does): no budget spent
            assert await protocol.call_store(peer, dht_id(rec.storage_key()), value) == (True, 1)
        author = new_identity()
        flood = [note(author, subject=i.to_bytes(2, "big")) for i in range(30)]
        taken = [
            await protocol.call_store(peer, dht_id(r.storage_key()), encode_value([r]))
            for r in flood
        ]
        # 12 new records a window: its own (2 or 4: published on starting and on joining,
        # the first may reach the target or not), the first one, and the rest of the 12
        took = sum(t[1] for t in taken)
        assert 7 <= took <= 9
        assert took + target.stats["dht_refused_budget"] == 30


# --- real stations: the link layer tells the DHT who is linked ------------------------------


async def test_stations_linked_through_discovery_store_records_at_each_other(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = await start_mesh(stack, tmp_path)  # B and C learned of each other by the DHT
        assert c.dht.guard.bound(dht_id(b.node_id), (LOOPBACK, b.dht.port))
        rec = note(new_identity())
        dkey = dht_id(rec.storage_key())
        assert await b.dht.put(rec) == 3  # held at B, and stored at A and C over the DHT
        for station in (a, c):
            assert station.dht.storage.records(dkey, now_ms()) == [rec]
        assert c.dht.stats["dht_refused_unlinked"] == 0
