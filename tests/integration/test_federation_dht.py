"""The DHT among stations over real UDP on loopback: StationDht instances, then real Stations."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import cast

import pytest
import umsgpack
from kademlia.node import Node as KadNode

from macula.clock import now_ms
from macula.node.node import Node
from macula.wire.record_keys import station_endpoint_key
from macula.wire.records import RecordType, new_record, record_version
from relay.federation.dht.station import DhtConfig, StationDht
from relay.federation.dht.storage import dht_id
from relay.station.station import Station
from support.dhtkit import dht_nodes, note
from support.identities import new_identity
from support.meshkit import station_config
from support.waiting import eventually

pytestmark = pytest.mark.anyio

LOOPBACK = "127.0.0.1"
FAST = DhtConfig(rpc_timeout_s=0.5)


async def test_a_record_put_through_one_station_is_found_through_another() -> None:
    async with dht_nodes(4, FAST) as nodes:
        alice = new_identity()
        rec = note(alice)
        assert await nodes[1].put(rec) == 4  # k = 20 > 4: every station holds it
        assert await nodes[3].find(rec.storage_key()) == [rec]
        newer = note(alice, "again")
        await nodes[2].put(newer)
        assert await nodes[0].find(rec.storage_key()) == [newer]  # newest per signer


async def test_a_record_is_still_found_after_the_station_that_took_the_put_stops() -> None:
    async with dht_nodes(4, FAST) as nodes:
        rec = note(new_identity())
        await nodes[1].put(rec)
        await nodes[1].stop()
        assert await nodes[2].find(rec.storage_key()) == [rec]
        await nodes[0].stop()  # the bootstrap station too
        assert await nodes[3].find(rec.storage_key()) == [rec]


async def test_find_merges_the_newest_record_of_every_signer_from_several_stations() -> None:
    async with dht_nodes(3, FAST) as nodes:
        content = bytes(34)
        signers = [new_identity() for _ in range(3)]
        records = []
        for i, who in enumerate(signers):
            now = now_ms()
            payload = {"announcer_node": who.node_id, "mcid": content, "endpoint": "quic://h:1"}
            rec = new_record(
                who,
                RecordType.CONTENT_ANNOUNCEMENT,
                payload,
                now_ms=now,
                version=record_version(now, os.urandom(10)),
            )
            # each record is held by one station only, behind the DHT's back
            assert nodes[i].storage.accept(dht_id(rec.storage_key()), rec, now)
            records.append(rec)
        found = await nodes[0].find(records[0].storage_key())
        assert sorted(r.key for r in found) == sorted(w.node_id for w in signers)


async def test_stations_lists_every_live_station_and_forgets_a_dead_one() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, own_period_s=0.2, own_ttl_ms=1_500)
    async with dht_nodes(5, config) as nodes:

        async def lists(wanted: set[bytes]) -> bool:
            return {a.node_id for a in await nodes[4].stations()} == wanted

        everyone = {d.identity.node_id for d in nodes}
        await eventually(lambda: lists(everyone))
        addresses = {a.node_id: a for a in await nodes[2].stations()}
        for dht in nodes:
            address = addresses[dht.identity.node_id]
            assert (address.host, address.quic_port, address.dht_port) == (
                LOOPBACK,
                dht.quic_port,
                dht.port,
            )
        await nodes[1].stop()
        alive = everyone - {nodes[1].identity.node_id}
        await eventually(lambda: lists(alive), timeout=10)


async def test_bootstrap_from_one_address_learns_the_mesh() -> None:
    async with dht_nodes(4, FAST) as nodes:
        late = StationDht(new_identity(), quic_port=1, hosts=[LOOPBACK], config=FAST)
        await late.start(LOOPBACK, 0)
        try:
            await late.bootstrap([("localhost", nodes[2].port)])
            assert late.contacts == 4
            rec = note(new_identity())
            await nodes[3].put(rec)
            assert await late.find(rec.storage_key()) == [rec]
        finally:
            await late.stop()


async def test_replication_re_stores_held_records_on_the_closest_stations() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, replicate_period_s=0.2)
    async with dht_nodes(3, config) as nodes:
        rec = note(new_identity())
        dkey = dht_id(rec.storage_key())
        assert nodes[0].storage.accept(dkey, rec, now_ms())  # held by one station only
        await eventually(lambda: all(d.storage.records(dkey, now_ms()) == [rec] for d in nodes))
        # counted once its round of stores settled, which may be just after they landed
        await eventually(lambda: nodes[0].stats["replicated"] > 0)


async def test_own_records_are_republished_on_their_period() -> None:
    config = DhtConfig(rpc_timeout_s=0.5, own_period_s=0.1)
    async with dht_nodes(2, config) as nodes:
        key = station_endpoint_key(nodes[0].identity.node_id)
        first = (await nodes[1].find(key))[0]

        async def refreshed() -> bool:
            found = await nodes[1].find(key)
            return bool(found) and found[0].version != first.version

        await eventually(refreshed)


async def test_expired_records_are_reaped() -> None:
    clock = [now_ms()]
    dht = StationDht(new_identity(), quic_port=1, hosts=[LOOPBACK], clock=lambda: clock[0])
    await dht.start(LOOPBACK, 0)
    try:
        rec = note(new_identity())
        assert await dht.put(rec) == 1
        clock[0] = rec.expires_at + 1
        assert await dht.find(rec.storage_key()) == []
        assert await dht.replicate() == 0
        assert dht.storage.rows == 0 and dht.stats["reaped"] >= 1
    finally:
        await dht.stop()


async def test_garbage_from_the_network_is_counted_and_the_node_keeps_working() -> None:
    async with dht_nodes(2, FAST) as nodes:
        target = nodes[0]
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            junk = [
                b"\x00" + os.urandom(20) + b"\xc1\xc1",  # not msgpack
                b"\x00" + os.urandom(20) + umsgpack.packb({"a": 1}),
                b"\x00" + os.urandom(20) + umsgpack.packb(["stun", []]),
                b"\x00" + os.urandom(20) + umsgpack.packb(["store", [b"x", 1, None]]),
                b"\x00" + os.urandom(20) + umsgpack.packb(["ping", [b"x" * 20, 1]]),
                b"\x00" + os.urandom(20) + umsgpack.packb(["find_value", [b"x" * 20, 5]]),
                b"\x00"
                + os.urandom(20)
                + umsgpack.packb(["store", [b"n" * 20, b"k" * 20, b"\xff"]]),
                b"\x01" + os.urandom(20) + umsgpack.packb("an unasked reply"),
                b"\x07" * 40,
                b"short",
            ]
            for datagram in junk:
                sock.sendto(datagram, (LOOPBACK, target.port))
            await eventually(
                lambda: (
                    target.stats["malformed_request"] >= 5
                    and target.stats["malformed_datagram"] >= 1
                    and target.stats["dht_challenged"] >= 1  # a STORE without a token
                )
            )
        finally:
            sock.close()
        rec = note(new_identity())
        await nodes[1].put(rec)
        assert await target.find(rec.storage_key()) == [rec]


class _Liar(asyncio.DatagramProtocol):
    """A 'station' answering every request with a well-framed reply of the wrong shape."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        self.transport.sendto(b"\x01" + data[1:21] + umsgpack.packb(self.answer), addr)


async def test_malformed_replies_count_as_no_reply_and_drop_the_peer() -> None:
    loop = asyncio.get_running_loop()
    answers: list[object] = [
        {"value": 5, "nodes": []},
        {"value": b"", "nodes": [[b"x" * 20, "not-an-ip", 1]]},
        [[b"short", LOOPBACK, 1]],
        "nonsense",
    ]
    async with dht_nodes(1, FAST) as nodes:
        dht = nodes[0]
        for answer in answers:
            transport, _ = await loop.create_datagram_endpoint(
                lambda a=answer: _Liar(a),  # type: ignore[misc]
                local_addr=(LOOPBACK, 0),
            )
            try:
                port = transport.get_extra_info("sockname")[1]
                dht._server.protocol.router.add_contact(KadNode(os.urandom(20), LOOPBACK, port))
                before = dht.stats["bad_reply"]
                assert await dht.find(os.urandom(32)) == []
                assert dht.stats["bad_reply"] == before + 1
                assert dht.contacts == 0
            finally:
                transport.close()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Liar(b"not an id"), local_addr=(LOOPBACK, 0)
        )
        try:
            await dht.bootstrap([(LOOPBACK, transport.get_extra_info("sockname")[1])])
            assert dht.contacts == 0
        finally:
            transport.close()


# --- real stations --------------------------------------------------------------------------


async def test_a_node_put_at_station_a_is_found_by_a_node_at_station_b(tmp_path: Path) -> None:
    async with (
        Station(station_config(tmp_path / "a")) as a,
        Station(station_config(tmp_path / "b")) as b,
    ):
        assert a.dht.port not in (0, a.port) and b.dht.port not in (0, b.port)
        await b.dht.bootstrap([(LOOPBACK, a.dht.port)])
        alice, bob = new_identity(), new_identity()
        now = now_ms()
        advert = new_record(
            alice,
            RecordType.PROCEDURE_ADVERTISEMENT,
            {
                "procedure_uri": "org.example.federated_v1",
                "advertiser_node": alice.node_id,
                "serving_station": a.node_id,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
        )
        async with Node(alice, [a.endpoint]) as at_a, Node(bob, [b.endpoint]) as at_b:
            await at_a.dht.put_record(advert)
            assert await at_b.dht.find_records(advert.storage_key()) == [advert]
            assert await at_b.dht.find_record(advert.storage_key()) == advert
            # each station's endpoint, with its DHT port, is known at the other
            endpoints = await at_b.dht.find_records(station_endpoint_key(a.node_id))
            assert [r.payload["dht_port"] for r in endpoints] == [a.dht.port]
        listed = {s.node_id for s in await a.dht.stations()}
        assert listed == {a.node_id, b.node_id}


async def test_a_station_runs_its_dht_on_the_port_asked_and_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind((LOOPBACK, 0))
    port = probe.getsockname()[1]
    probe.close()
    config = station_config(tmp_path / "s")
    config.dht_port = port
    with caplog.at_level("INFO", logger="macula.relay"):
        async with Station(config) as station:
            assert station.dht.port == port
            assert f"DHT listening on udp {LOOPBACK}:{port}" in caplog.text
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
                busy.bind((LOOPBACK, 0))
                taken = station_config(tmp_path / "t")
                taken.dht_port = busy.getsockname()[1]
                with pytest.raises(OSError, match="DHT udp port"):
                    async with Station(taken):
                        pass
