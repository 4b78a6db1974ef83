"""The DHT's costs that grow with the mesh, over real UDP on loopback: no record storm for a
station seen again, eviction only after consecutive timeouts, stations() keeping what it
learned, a bootstrap through a known station skipped."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pytest
from kademlia.node import Node as KadNode

from macula.clock import now_ms
from macula.wire.identity import Identity
from macula.wire.records import Record, new_record, record_version
from relay.federation.dht.station import DhtConfig, StationDht
from relay.federation.dht.storage import dht_id
from support.dhtkit import dht_nodes
from support.identities import new_identity
from support.waiting import eventually

pytestmark = pytest.mark.anyio

LOOPBACK = "127.0.0.1"
FAST = DhtConfig(rpc_timeout_s=0.3)


def note(who: Identity, subject: bytes) -> Record:
    now = now_ms()
    return new_record(
        who,
        0x21,
        {"text": "hi"},
        now_ms=now,
        version=record_version(now, os.urandom(10)),
        subject_id=subject,
    )


def count_stores(dht: StationDht) -> list[Any]:
    """Every STORE ``dht`` sends from now on (the node asked)."""
    protocol = dht._server.protocol
    sent: list[Any] = []
    real = protocol.call_store

    async def counting(node: KadNode, key: bytes, value: bytes) -> Any:
        sent.append(node)
        return await real(node, key, value)

    protocol.call_store = counting  # type: ignore[method-assign,assignment]
    return sent


async def quiet(dht: StationDht) -> None:
    """Its own loops (publishing, replication) stopped: only what the test asks for runs."""
    tasks = list(dht._scope.tasks())  # the scope stays open: pushes the test causes still run
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def dead_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


async def test_a_station_seen_again_gets_no_records_pushed_a_new_one_a_bounded_push() -> None:
    config = DhtConfig(rpc_timeout_s=0.3, welcome_max_values=3)
    async with dht_nodes(1, config) as (holder,):
        for i in range(10):  # ten digests, held here alone
            rec = note(new_identity(), bytes([i]))
            assert holder.storage.accept(dht_id(rec.storage_key()), rec, now_ms())
        async with dht_nodes(1, config) as (newcomer,):
            await quiet(holder)
            sent = count_stores(holder)
            protocol = holder._server.protocol
            node = KadNode(newcomer._server.node.id, LOOPBACK, newcomer.port)
            protocol.welcome_if_new(node)
            await asyncio.sleep(0)  # one loop turn, so any push scheduled would have started
            assert sent == []  # not linked: nothing pushed
            assert holder.stats["welcome_unlinked"] == 1
            protocol.router.remove_contact(node)
            holder.link_up(newcomer.identity.node_id, LOOPBACK, newcomer.port)
            protocol.welcome_if_new(node)
            await asyncio.sleep(0)  # one loop turn: the pushes it scheduled start
            assert len(sent) == 3  # the package would push all ten
            assert holder.stats["welcome_push_capped"] == 1
            for _ in range(50):  # it leaves the table and comes back, again and again
                protocol.router.remove_contact(node)
                protocol.welcome_if_new(node)
            await asyncio.sleep(0)  # one loop turn, so any push scheduled would have started
            assert len(sent) == 3
            assert holder.stats["rewelcomed"] == 50
            assert holder.contacts == 1


async def test_no_push_at_all_when_welcome_max_values_is_zero() -> None:
    config = DhtConfig(rpc_timeout_s=0.3, welcome_max_values=0)
    async with dht_nodes(1, config) as (holder,):
        rec = note(new_identity(), b"s")
        assert holder.storage.accept(dht_id(rec.storage_key()), rec, now_ms())
        await quiet(holder)
        sent = count_stores(holder)
        holder._server.protocol.welcome_if_new(KadNode(os.urandom(20), LOOPBACK, dead_port()))
        await asyncio.sleep(0)  # one loop turn, so any push scheduled would have started
        assert sent == []
        assert holder.contacts == 1


async def test_one_unanswered_request_does_not_evict_three_in_a_row_do() -> None:
    config = DhtConfig(rpc_timeout_s=0.2, evict_after_timeouts=3)
    async with dht_nodes(1, config) as (dht,):
        await quiet(dht)
        protocol = dht._server.protocol
        silent = KadNode(os.urandom(20), LOOPBACK, dead_port())
        protocol.router.add_contact(silent)
        for expected in (1, 1):
            assert (await protocol.call_ping(silent))[0] is False
            assert dht.contacts == expected, dict(dht.stats)
        assert dht.stats["timeout_tolerated"] == 2
        assert (await protocol.call_ping(silent))[0] is False
        assert dht.contacts == 0
        assert dht.stats["evicted"] == 1


async def test_an_answer_resets_the_count_of_unanswered_requests() -> None:
    config = DhtConfig(rpc_timeout_s=0.2, evict_after_timeouts=2)
    async with dht_nodes(2, config) as (a, b):
        await quiet(a)
        protocol = a._server.protocol
        (node,) = [n for bucket in protocol.router.buckets for n in bucket.get_nodes()]
        alive = (node.ip, node.port)
        gone = KadNode(node.id, LOOPBACK, dead_port())  # same id, a port nobody answers
        assert (await protocol.call_ping(gone))[0] is False
        assert a.contacts == 1
        assert (await protocol.call_ping(KadNode(node.id, *alive)))[0] is True
        assert (await protocol.call_ping(gone))[0] is False
        assert a.contacts == 1  # one miss since the answer, not two
        assert (await protocol.call_ping(gone))[0] is False
        assert a.contacts == 0
        assert b.contacts == 1


async def listed_all(dht: StationDht, expected: set[bytes]) -> bool:
    return {a.node_id for a in await dht.stations()} == expected


async def test_stations_looks_up_only_new_or_ageing_endpoints() -> None:
    offset = [0]

    def clock() -> int:
        return now_ms() + offset[0]

    async with dht_nodes(4, FAST, clock) as nodes:
        everyone = {d.identity.node_id for d in nodes}
        reader = nodes[3]
        await eventually(
            lambda: listed_all(reader, everyone), message="stations() never listed every station"
        )
        finds: list[bytes] = []
        real = reader.find

        async def counting(storage_key: bytes) -> list[Record]:
            finds.append(storage_key)
            return await real(storage_key)

        reader.find = counting  # type: ignore[method-assign]
        listed = await reader.stations()
        assert {a.node_id for a in listed} == everyone
        assert len(finds) == 1  # the station set only: every endpoint known and fresh
        offset[0] = FAST.own_ttl_ms * 6 // 10  # past half of the records' lifetime
        finds.clear()
        # the others publish anew at this clock, so the records found are still unexpired
        for dht in nodes:
            await dht.publish_own()
        listed = await reader.stations()
        assert {a.node_id for a in listed} == everyone
        assert len(finds) == 1 + 4  # every endpoint looked up again
        finds.clear()
        await reader.stations()
        assert len(finds) == 1


async def test_stations_forgets_a_station_no_longer_in_the_station_set() -> None:
    config = DhtConfig(rpc_timeout_s=0.3, own_period_s=0.2, own_ttl_ms=1_500)
    async with dht_nodes(3, config) as nodes:
        everyone = {d.identity.node_id for d in nodes}
        await eventually(lambda: listed_all(nodes[2], everyone))
        await nodes[1].stop()
        alive = everyone - {nodes[1].identity.node_id}
        await eventually(
            lambda: listed_all(nodes[2], alive),
            timeout=10,
            message="the stopped station was never forgotten",
        )
        assert nodes[1].identity.node_id not in nodes[2]._addresses


async def test_a_bootstrap_through_a_station_in_the_routing_table_is_skipped() -> None:
    async with dht_nodes(3, FAST) as nodes:
        late = nodes[2]
        sent = count_stores(late)
        await late.bootstrap([(LOOPBACK, nodes[0].port)])
        assert late.stats["bootstrap_skipped"] == 1
        assert sent == []  # no crawl, no re-publish
        await late.bootstrap([(LOOPBACK, dead_port())])  # an address it does not know
        assert late.stats["bootstrap_skipped"] == 1 and late.stats["rejoined"] == 1
        # it joined again and publishes, once, ``rejoin_publish_delay_s`` later
        await eventually(lambda: sent, message="joined again but never published")


def test_the_new_settings_are_checked() -> None:
    for bad in (
        {"evict_after_timeouts": 0},
        {"welcome_max_values": -1},
        {"welcome_memory": 0},
        {"verified_cache": -1},
        {"endpoint_refresh_percent": 0},
        {"endpoint_refresh_percent": 101},
        {"rejoin_publish_delay_s": 0},
    ):
        with pytest.raises(ValueError):
            DhtConfig(**bad)  # type: ignore[arg-type]


async def test_joins_through_new_links_in_a_burst_share_one_put_of_own_records() -> None:
    config = DhtConfig(rpc_timeout_s=0.3, rejoin_publish_delay_s=1.0)
    async with dht_nodes(3, config) as nodes:
        late = nodes[2]
        puts = 0
        publish = late.publish_own

        async def counted() -> None:
            nonlocal puts
            puts += 1
            await publish()

        late.publish_own = counted  # type: ignore[method-assign]
        # three links coming up at once, each at an address not known
        await asyncio.gather(*(late.bootstrap([(LOOPBACK, dead_port())]) for _ in range(3)))
        assert late.stats["rejoined"] == 3
        await eventually(lambda: puts == 1, message="no put after the joins")
        await late.bootstrap([(LOOPBACK, dead_port())])  # a later join: a put of its own
        await eventually(lambda: puts == 2, message="no put after the later join")
