"""The client ``Node`` against real stations: reconnect, failover, content, DHT, direct dial."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from macula.client.backoff import Backoff
from macula.clock import now_ms
from macula.config import configured_stations
from macula.errors import CallTimeout, ConfigError, MeshError
from macula.node.node import Node
from macula.node.serving import CallRefused, IncomingCall
from macula.node.session import StreamChannel
from macula.node.subscriptions import Subscription
from macula.services.dht import DhtClient, ResolveError
from macula.stations import StationAddress, parse_station, parse_station_list
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.processkit import free_udp_port
from support.waiting import eventually

pytestmark = pytest.mark.anyio
FAST = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1)


async def test_five_hundred_subscriptions_on_one_node(make_node: Callable[..., Node]) -> None:
    async with make_node() as subscriber, make_node() as publisher:
        subs = [await subscriber.subscribe(REALM, f"many.{i}") for i in range(500)]
        await subscriber.flush()  # every SUBSCRIBE has taken effect at the station
        session = await subscriber.session()
        for i in range(0, 500, 50):
            await publisher.publish(REALM, f"many.{i}", i)
        for i in range(0, 500, 50):
            assert (await subs[i].next(5)).payload == i
        assert session is await subscriber.session()  # one connection carried all of it


async def test_station_restart_resumes_events_without_resubscribing(tmp_path: Path) -> None:
    port = free_udp_port()
    config = station_config(tmp_path / "station", port=port)
    states: list[str] = []
    async with Station(config) as first:
        endpoint = first.endpoint
        subscriber = Node(new_identity(), [endpoint], backoff=FAST)
        publisher = Node(new_identity(), [endpoint], backoff=FAST)
        await subscriber.__aenter__()
        await publisher.__aenter__()
        subscriber.on_state(states.append)
        sub = await subscriber.subscribe(REALM, "restart.news")
        await subscriber.flush()
        await publisher.publish(REALM, "restart.news", "before")
        assert (await sub.next(3)).payload == "before"
    try:
        async with Station(config) as second:
            assert second.endpoint == endpoint  # same key, same port: the pin still holds
            await eventually(lambda: subscriber.connected and publisher.connected)
            assert "reconnected" in states
            await subscriber.flush()  # the replayed SUBSCRIBE has taken effect
            await publisher.publish(REALM, "restart.news", "after")
            assert (await sub.next(3)).payload == "after"
            assert subscriber.stats.reconnects >= 1
    finally:
        await subscriber.__aexit__(None, None, None)
        await publisher.__aexit__(None, None, None)


async def test_failover_to_the_second_station(station: Station) -> None:
    dead = StationAddress("127.0.0.1", free_udp_port())
    async with Node(
        new_identity(), [dead, station.endpoint], connect_timeout=0.5, backoff=FAST
    ) as node:
        assert node.station is not None and node.station.port == station.port
        assert await node.call(bytes(32), "_relay.ping", {}) is not None


async def test_call_timeout_is_typed(make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:

        async def never(call: IncomingCall) -> None:
            await asyncio.Event().wait()  # cancelled when the provider closes

        await provider.advertise(REALM, "org.example.never_v1", never)
        await provider.flush()
        with pytest.raises(CallTimeout) as info:
            await caller.call(REALM, "org.example.never_v1", {}, timeout=0.3)
        assert info.value.retryable


async def test_twenty_mib_content_round_trip(make_node: Callable[..., Node]) -> None:
    data = os.urandom(20 * 1024 * 1024)
    async with make_node() as alice, make_node() as bob:
        mcid = await alice.put_content(data, name="big.bin")
        assert mcid[:2] == b"\x01\x56"
        assert await bob.get_content(mcid) == data
        with pytest.raises(MeshError, match="not_found"):
            await bob.get_content(b"\x01\x55" + bytes(32))


async def test_dht_records_are_verified_before_use(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node() as node:
        now = now_ms()
        good = new_record(
            node.identity,
            RecordType.PROCEDURE_ADVERTISEMENT,
            {
                "procedure_uri": "org.example.dht_v1",
                "advertiser_node": node.identity.node_id,
                "serving_station": station.node_id,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
        )
        await node.dht.put_record(good)
        found = await node.dht.find_record(good.storage_key())
        assert found == good
        # a record whose signature was tampered with after it reached the store is never
        # returned: write it behind the station's back, read it through the DHT client
        forged = Record(
            **{
                **_fields(good),
                "payload": {**good.payload, "procedure_uri": "org.example.dht_v1", "x": 1},
            }
        )
        store = station._records
        assert store is not None
        await store.put(forged, forged.storage_key(), now)
        assert await node.dht.find_records(good.storage_key()) == []
        assert node.dht.stats["bad_signature"] == 1


def _fields(record: Record) -> dict[str, object]:
    return {
        "type": record.type,
        "key": record.key,
        "version": record.version,
        "created_at": record.created_at + 1,
        "expires_at": record.expires_at,
        "payload": record.payload,
        "subject_id": record.subject_id,
        "signature": record.signature,
    }


def test_dht_client_drops_expired_and_malformed_answers() -> None:
    """The station is an edge here: whatever it answers, bad records never get through."""
    identity = new_identity()
    now = now_ms()
    fresh = new_record(
        identity, 0x20, {"n": 1}, now_ms=now, version=record_version(now, os.urandom(10))
    )
    stale = new_record(
        identity,
        0x20,
        {"n": 2},
        now_ms=now - 10_000,
        version=record_version(now, os.urandom(10)),
        ttl_ms=5_000,
    )
    client = DhtClient(caller=None, identity=identity)  # type: ignore[arg-type]
    records = client._valid_list([fresh.to_rpc(), stale.to_rpc(), {"not": "a record"}, "junk"])
    assert records == [fresh]
    assert client.stats["expired"] == 1
    assert client.stats["malformed"] + client.stats["bad_signature"] == 2
    assert client._valid_list("not_found") == []


async def test_direct_dial_through_dht_records(tmp_path: Path) -> None:
    async with (
        Station(station_config(tmp_path / "a")) as home,
        Station(station_config(tmp_path / "b")) as remote,
        Node(new_identity(), [remote.endpoint]) as provider,
        Node(new_identity(), [home.endpoint]) as caller,
    ):
        await provider.advertise(
            REALM, "org.example.direct_v1", lambda c: {"served_by": "remote"}, announce=True
        )
        with pytest.raises(ResolveError, match="procedure_advertisement"):
            await caller.call(REALM, "org.example.direct_v1", {}, direct=True)
        # no federation yet: carry the provider's signed records to the caller's station
        for record in await provider.dht.procedure_records("org.example.direct_v1"):
            await caller.dht.put_record(record)
        with pytest.raises(ResolveError, match="station_endpoint"):
            await caller.call(REALM, "org.example.direct_v1", {}, direct=True)
        for record in await provider.dht.find_records_by_type(RecordType.STATION_ENDPOINT):
            await caller.dht.put_record(record)
        assert await caller.dht.resolve_realm("org.example.direct_v1") == REALM
        result = await caller.call(REALM, "org.example.direct_v1", {}, direct=True)
        assert result == {"served_by": "remote"}
        with pytest.raises(MeshError):  # not advertised at the caller's own station
            await caller.call(REALM, "org.example.direct_v1", {})


def test_station_addresses_and_the_environment() -> None:
    pinned = parse_station(f"{'ab' * 32}@example.org:5000")
    assert (pinned.host, pinned.port, pinned.node_id) == (
        "example.org",
        5000,
        bytes.fromhex("ab" * 32),
    )
    assert parse_station("[::1]:4433").host == "::1"
    assert parse_station("localhost").port == 4433
    assert str(parse_station("quic://127.0.0.1:9")) == "127.0.0.1:9"
    assert len(parse_station_list("127.0.0.1:1, 127.0.0.1:2", source="stations")) == 2
    for bad in ("zz@h:1", f"{'ab' * 31}@h:1", "h:0", "h:99999", "h:x", ":1", "[::1", "a,,b"):
        with pytest.raises(ConfigError, match="MACULA_MESH_STATIONS"):
            configured_stations({"MACULA_MESH_STATIONS": bad})


def test_node_from_the_environment(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "agent.key"
    env = {
        "MACULA_MESH_STATIONS": "127.0.0.1:4433, 127.0.0.1:4434",
        "MACULA_MCP_IDENTITY": str(key),
    }
    node = Node.from_env(env)
    assert [s.port for s in node.stations] == [4433, 4434]
    assert key.exists() and Node.from_env(env).identity.node_id == node.identity.node_id
    home = {"MACULA_MESH_STATIONS": "h:1", "MACULA_HOME": str(tmp_path / "home")}
    by_session = Node.from_env(home | {"CLAUDE_CODE_SESSION_ID": "s1"})
    key_file = tmp_path / "home" / "sessions" / "s1.key"
    assert key_file.exists() and by_session.identity.has_valid_puzzle()
    with pytest.raises(ConfigError, match="MACULA_MESH_STATIONS"):
        Node.from_env({"MACULA_MESH_STATIONS": "h:1,,h:2", "MACULA_MCP_IDENTITY": str(key)})
    with pytest.raises(ConfigError, match="MACULA_MESH_STATIONS is empty"):
        Node.from_env({"MACULA_MCP_IDENTITY": str(key)})
    (tmp_path / "bad.key").write_bytes(b"junk")
    (tmp_path / "bad.key").chmod(0o600)
    with pytest.raises(ConfigError, match="MACULA_MCP_IDENTITY"):
        Node.from_env(
            {"MACULA_MESH_STATIONS": "h:1", "MACULA_MCP_IDENTITY": str(tmp_path / "bad.key")}
        )


async def _drain(sub: Subscription) -> list[object]:
    return [delivery.payload async for delivery in sub]


async def test_a_full_subscription_still_ends(make_node: Callable[..., Node]) -> None:
    """The end-of-stream marker reaches the consumer even when the buffer is full."""
    async with make_node() as publisher:
        subscriber = make_node()
        await subscriber.__aenter__()
        try:
            closed = await subscriber.subscribe(REALM, "full.closed", buffer=2)
            ended = await subscriber.subscribe(REALM, "full.ended", buffer=2)
            await subscriber.flush()
            for i in range(3):
                await publisher.publish(REALM, "full.closed", i)
                await publisher.publish(REALM, "full.ended", i)
            await eventually(lambda: closed.delivered == 3 and ended.delivered == 3)
            await closed.close()
            assert await asyncio.wait_for(_drain(closed), 5) == [1, 2]
            assert closed.dropped == 1
        finally:
            await subscriber.__aexit__(None, None, None)
        assert await asyncio.wait_for(_drain(ended), 5) == [1, 2]


async def test_a_failing_handler_is_logged_and_its_text_stays_home(
    make_node: Callable[..., Node], caplog: pytest.LogCaptureFixture
) -> None:
    async with make_node() as provider, make_node() as caller:

        def broken(call: IncomingCall) -> object:
            raise ValueError("secret call state")

        async def broken_stream(channel: StreamChannel, call: IncomingCall) -> object:
            raise ValueError("secret stream state")

        await provider.advertise(REALM, "org.example.broken_v1", broken)
        await provider.advertise_stream(REALM, "org.example.broken_stream_v1", broken_stream)
        await provider.flush()
        with caplog.at_level(logging.ERROR, logger="macula"):
            with pytest.raises(MeshError) as error:
                await caller.call(REALM, "org.example.broken_v1", {})
            assert (error.value.code, error.value.detail) == (0x0F, "handler_error")
            channel = await caller.open_stream(REALM, "org.example.broken_stream_v1")
            with pytest.raises(MeshError) as stream_error:
                await asyncio.wait_for(_drain_channel(channel), 5)
        assert "handler_error" in str(stream_error.value)
        assert "secret" not in str(stream_error.value)
        logged = "\n".join(caplog.text.splitlines())
        assert "secret call state" in logged and "secret stream state" in logged
        assert "Traceback" in logged and provider.stats.handler_errors == 2


async def test_a_handler_refuses_with_a_reason_for_the_caller(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as provider, make_node() as caller:

        def busy(call: IncomingCall) -> object:
            raise CallRefused("busy: retry later")

        await provider.advertise(REALM, "org.example.busy_v1", busy)
        await provider.flush()
        with pytest.raises(MeshError) as error:
            await caller.call(REALM, "org.example.busy_v1", {})
        assert (error.value.code, error.value.detail) == (0x0F, "busy: retry later")


async def _drain_channel(channel: StreamChannel) -> list[object]:
    return [body async for body in channel]


async def test_publish_confirmed_publishes_again_when_the_connection_broke_before_the_answer(
    make_node: Callable[..., Node],
) -> None:
    from macula.errors import BrokenError

    async with make_node() as subscriber, make_node(backoff=FAST) as publisher:
        sub = await subscriber.subscribe(REALM, "confirmed.topic")
        await subscriber.flush()
        first = await publisher.session()
        broke: list[int] = []

        async def broken(*args: object, **kwargs: object) -> object:
            broke.append(1)
            first.close()  # the PUBLISH may or may not have gone out: publish again
            await eventually(lambda: not first.alive)
            raise BrokenError("the connection broke before the station answered")

        first.builtin = broken  # type: ignore[method-assign]
        seq = await publisher.publish_confirmed(REALM, "confirmed.topic", {"n": 1}, timeout=10)
        assert broke == [1] and publisher._session is not first
        delivery = await sub.next(timeout=5)
        assert delivery.payload == {"n": 1} and seq >= 1


async def test_publish_confirmed_raises_broken_when_no_attempt_is_answered(
    make_node: Callable[..., Node],
) -> None:
    from macula.errors import BrokenError

    async with make_node(backoff=FAST) as publisher:
        calls: list[int] = []

        async def broken(*args: object, **kwargs: object) -> object:
            calls.append(1)
            raise BrokenError("gone")

        session = await publisher.session()
        session.builtin = broken  # type: ignore[method-assign]
        with pytest.raises(BrokenError):
            await publisher.publish_confirmed(REALM, "t", 1, timeout=5, attempts=2)
        assert calls == [1, 1]
