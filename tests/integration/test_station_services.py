"""Station services over real QUIC: the built-ins (PROTOCOL.md §6.6, §10, §11), content
transfer between nodes, streaming RPC in every mode (§8), restart durability, deadlines (§6.4).

Every built-in is reached the way a client reaches it: a CALL with the zero realm on the
control stream (or a content stream), answered by the station.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from macula.errors import MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.session import Session, StreamChannel
from macula.wire.codes import ErrorCode
from macula.wire.content import CODEC_MANIFEST, Manifest, raw_mcid
from macula.wire.identity import ZERO_REALM, Identity
from macula.wire.record_keys import station_endpoint_key, storage_key_for_procedure
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.rawclient import now_ms
from support.waiting import eventually

pytestmark = pytest.mark.anyio

BAD = ErrorCode.UNKNOWN_ERROR  # 0x0F: a built-in refused its argument
KIB = 1024
MIB = 1024 * KIB


def procedure_record(
    who: Identity,
    uri: str,
    serving_station: bytes,
    *,
    created_ms: int | None = None,
    ttl_ms: int | None = None,
    **extra: Any,
) -> Record:
    created = now_ms() if created_ms is None else created_ms
    return new_record(
        who,
        RecordType.PROCEDURE_ADVERTISEMENT,
        {
            "procedure_uri": uri,
            "advertiser_node": who.node_id,
            "serving_station": serving_station,
            **extra,
        },
        now_ms=created,
        version=record_version(created, os.urandom(10)),
        ttl_ms=ttl_ms,
    )


def unchecked_record(who: Identity, record_type: int, payload: dict[str, Any]) -> Record:
    """A correctly signed record that ``new_record`` would refuse to build."""
    created = now_ms()
    version = record_version(created, os.urandom(10))
    return Record(record_type, who.node_id, version, created, created + 60_000, payload).signed(who)


async def builtin_error(node: Node, procedure: str, argument: object) -> MeshError:
    with pytest.raises(MeshError) as caught:
        await node.call(ZERO_REALM, procedure, argument, timeout=5)
    return caught.value


async def assert_refused(
    node: Node, procedure: str, argument: object, code: int, detail_prefix: str
) -> None:
    error = await builtin_error(node, procedure, argument)
    assert error.code == code, f"{procedure}({argument!r:.80}): {error}"
    assert (error.detail or "").startswith(detail_prefix), f"{procedure}: {error.detail!r}"


# --- _relay.ping and names that are not built-ins ---------------------------------------------


async def test_relay_ping_answers_the_station_clock_in_microseconds(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as node:
        before_us = time.time_ns() // 1000
        answer = await node.call(ZERO_REALM, "_relay.ping", {}, timeout=5)
        after_us = time.time_ns() // 1000
        assert set(answer) == {"ts", "refused"}
        assert before_us <= answer["ts"] <= after_us  # same host clock, microseconds
        assert answer["refused"] == {}  # nothing refused on this connection
        # built-ins are realm-blind (§6.6) and take any argument
        assert set(await node.call(REALM, "_relay.ping", None, timeout=5)) == {"ts", "refused"}
        error = await builtin_error(node, "_macula.ping", {})  # not a built-in (§6.6)
        assert error.code == ErrorCode.UNKNOWN_NEXT_PEER


async def test_a_client_cannot_serve_a_builtin_name(make_node: Callable[..., Node]) -> None:
    async with make_node() as impostor, make_node() as caller:
        served: list[object] = []

        def fake_ping(call: IncomingCall) -> object:
            served.append(call.payload)
            return {"ts": 0}

        await impostor.advertise(ZERO_REALM, "_relay.ping", fake_ping)
        await impostor.advertise(ZERO_REALM, "_dht.find_record", fake_ping)
        await impostor.flush()
        assert (await caller.call(ZERO_REALM, "_relay.ping", {}, timeout=5))["ts"] > 0
        assert (
            await caller.call(ZERO_REALM, "_dht.find_record", {"key": bytes(32)}, timeout=5)
            == "not_found"
        )
        assert served == []


# --- _dht.* -----------------------------------------------------------------------------------


async def test_put_and_find_records(station: Station, make_node: Callable[..., Node]) -> None:
    async with make_node() as alice, make_node() as bob:
        uri = "org.example.weather_v1"
        key = storage_key_for_procedure(uri)
        by_alice = procedure_record(alice.identity, uri, station.node_id)
        by_bob = procedure_record(bob.identity, uri, station.node_id, rate_limit_qps=5)
        assert await alice.call(ZERO_REALM, "_dht.put_record", by_alice.to_rpc()) == "ok"
        assert await bob.call(ZERO_REALM, "_dht.put_record", by_bob.to_rpc()) == "ok"
        # an identical put is an idempotent retry
        assert await alice.call(ZERO_REALM, "_dht.put_record", by_alice.to_rpc()) == "ok"

        found = await bob.call(ZERO_REALM, "_dht.find_record", {"key": key})
        assert found in (by_alice.to_rpc(), by_bob.to_rpc())
        Record.from_rpc(found).verify(now_ms())
        both = await bob.call(ZERO_REALM, "_dht.find_records", {"key": key})
        assert sorted(both, key=lambda r: r["key"]) == sorted(
            [by_alice.to_rpc(), by_bob.to_rpc()], key=lambda r: r["key"]
        )
        by_type = await alice.call(
            ZERO_REALM, "_dht.find_records_by_type", {"type": RecordType.PROCEDURE_ADVERTISEMENT}
        )
        # (the station announces its own house services with the same record type)
        ours = {r["key"] for r in by_type if r["payload"]["procedure_uri"] == uri}
        assert ours == {alice.identity.node_id, bob.identity.node_id}

        # misses
        assert await alice.call(ZERO_REALM, "_dht.find_record", {"key": bytes(32)}) == "not_found"
        assert await alice.call(ZERO_REALM, "_dht.find_records", {"key": bytes(32)}) == []
        assert await alice.call(ZERO_REALM, "_dht.find_records_by_type", {"type": 0x30}) == []


async def test_the_station_publishes_its_own_endpoint_record(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node() as node:
        key = station_endpoint_key(station.node_id)
        found: object = "not_found"

        async def stored() -> bool:
            nonlocal found
            found = await node.call(ZERO_REALM, "_dht.find_record", {"key": key})
            return found != "not_found"

        await eventually(stored)  # the refresher stores it right after start
        assert isinstance(found, dict), found
        record = Record.from_rpc(found)
        record.verify(now_ms())
        assert record.key == station.node_id
        assert record.type == RecordType.STATION_ENDPOINT
        assert record.payload["quic_port"] == station.port
        assert b"127.0.0.1" in record.payload["host_advertised"]


async def test_newest_record_per_signer_wins(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node() as node:
        uri = "org.example.versioned_v1"
        key = storage_key_for_procedure(uri)
        older = procedure_record(node.identity, uri, station.node_id, created_ms=now_ms() - 5000)
        newer = procedure_record(node.identity, uri, station.node_id, max_concurrency=3)
        assert await node.call(ZERO_REALM, "_dht.put_record", newer.to_rpc()) == "ok"
        await assert_refused(node, "_dht.put_record", older.to_rpc(), BAD, "stale")  # §13 #12
        assert await node.call(ZERO_REALM, "_dht.find_records", {"key": key}) == [newer.to_rpc()]


def _tampered(record: Record) -> dict[str, Any]:
    rpc = record.to_rpc()
    rpc["payload"] = {**rpc["payload"], "procedure_uri": "org.example.evil_v1"}
    return rpc


def _without(record: Record, name: str) -> dict[str, Any]:
    return {k: v for k, v in record.to_rpc().items() if k != name}


async def test_put_record_refusals(station: Station, make_node: Callable[..., Node]) -> None:
    async with make_node() as node:
        me = node.identity
        good = procedure_record(me, "org.example.refused_v1", station.node_id)
        expired = procedure_record(
            me, "org.example.refused_v1", station.node_id, created_ms=now_ms() - 10_000, ttl_ms=1
        )
        no_uri = unchecked_record(
            me, RecordType.PROCEDURE_ADVERTISEMENT, {"advertiser_node": me.node_id}
        )
        huge = unchecked_record(me, 0x20, {"blob": bytes(70 * KIB)})
        cases: list[tuple[str, object, int, str]] = [
            ("not a map", "record", BAD, "bad_request"),
            ("an array", [good.to_rpc()], BAD, "bad_request"),
            ("tampered payload", _tampered(good), BAD, "bad_signature"),
            ("no signature", _without(good, "signature"), BAD, "bad_signature"),
            ("no key", _without(good, "key"), BAD, "bad_signature"),
            ("foreign key", {**good.to_rpc(), "key": new_identity().node_id}, BAD, "bad_signature"),
            ("zero signature", {**good.to_rpc(), "signature": bytes(64)}, BAD, "bad_signature"),
            ("expired", expired.to_rpc(), BAD, "expired"),
            ("no storage rule", unchecked_record(me, 0x02, {"x": 1}).to_rpc(), BAD, "bad_request"),
            ("bad payload", no_uri.to_rpc(), BAD, "bad_request"),  # §13 #13: not a crash
            ("no type", _without(good, "type"), BAD, "bad_request"),
            ("over 64 KiB", huge.to_rpc(), ErrorCode.PAYLOAD_TOO_LARGE, "payload_too_large"),
        ]
        for name, argument, code, prefix in cases:
            error = await builtin_error(node, "_dht.put_record", argument)
            assert (error.code, (error.detail or "")[: len(prefix)]) == (code, prefix), name
        everything = await node.call(
            ZERO_REALM,
            "_dht.find_records",
            {"key": storage_key_for_procedure(good.payload["procedure_uri"])},
        )
        assert everything == []  # nothing refused was stored


async def test_find_bad_arguments(make_node: Callable[..., Node]) -> None:
    async with make_node() as node:
        for procedure in ("_dht.find_record", "_dht.find_records"):
            for argument in (None, "key", {}, {"key": bytes(31)}, {"key": bytes(32).hex()}):
                await assert_refused(node, procedure, argument, BAD, "bad_request")
        for bad_type in (None, {}, {"type": -1}, {"type": 256}, {"type": "6"}, [6]):
            await assert_refused(node, "_dht.find_records_by_type", bad_type, BAD, "bad_request")


# --- _content.* -------------------------------------------------------------------------------


async def test_block_builtins_with_good_and_bad_arguments(make_node: Callable[..., Node]) -> None:
    async with make_node() as node:
        data = b"a block of content"
        mcid = raw_mcid(data).to_bytes()

        async def call(procedure: str, argument: object) -> object:
            return await node.call(ZERO_REALM, procedure, argument, timeout=5)

        assert await call("_content.get_block", {"mcid": mcid}) == "not_found"
        assert await call("_content.put_block", {"mcid": mcid, "payload": data}) == "ok"
        assert await call("_content.get_block", {"mcid": mcid}) == data
        replicated = {"mcid": mcid, "payload": data, "replicate": "false"}
        assert await call("_content.put_block", replicated) == "ok"
        # a digest that does not match is a RESULT, not an ERROR (§6.6); SHA-256 ids too (§13 #15)
        other = raw_mcid(b"promised").to_bytes()
        assert await call("_content.put_block", {"mcid": other, "payload": data}) == (
            "hash_mismatch"
        )
        sha = raw_mcid(data, "sha256").to_bytes()
        assert await call("_content.put_block", {"mcid": sha, "payload": data}) == "hash_mismatch"
        assert await call("_content.get_block", {"mcid": other}) == "not_found"

        manifest_id = b"\x01" + bytes([CODEC_MANIFEST]) + mcid[2:]
        for argument in (
            None,
            {},
            {"mcid": mcid},
            {"mcid": mcid[:33], "payload": data},  # §13 #13: refused, not a crash
            {"mcid": manifest_id, "payload": data},
            {"mcid": mcid, "payload": data.decode()},
            {"mcid": mcid, "payload": data, "replicate": 1},
        ):
            await assert_refused(node, "_content.put_block", argument, BAD, "bad_request")
        for bad_get in (None, {}, {"mcid": mcid[:-1]}, {"mcid": manifest_id}, {"mcid": "x"}):
            await assert_refused(node, "_content.get_block", bad_get, BAD, "bad_request")
        # a block over the cap, on a content stream (control-stream frames stop at 1 MiB)
        too_big = bytes(4 * MIB + 1)
        session = await node.session()
        async with session.content_stream() as stream:
            argument = {"mcid": raw_mcid(too_big).to_bytes(), "payload": too_big}
            with pytest.raises(MeshError) as caught:
                await session.builtin("_content.put_block", argument, 5, stream=stream)
        assert caught.value.code == ErrorCode.PAYLOAD_TOO_LARGE


async def test_manifest_builtins_with_good_and_bad_arguments(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as node:
        data = os.urandom(600 * KIB)
        manifest = Manifest.create(data, "three-chunks.bin", created=int(time.time()))
        wire = manifest.to_wire()
        mcid = manifest.mcid.to_bytes()

        async def call(procedure: str, argument: object) -> object:
            return await node.call(ZERO_REALM, procedure, argument, timeout=5)

        assert await call("_content.get_manifest", {"mcid": mcid}) == "not_found"
        renamed = {**wire, "name": "renamed.bin"}  # fields no longer hash to the mcid (§13 #14)
        await assert_refused(
            node, "_content.put_manifest", {"manifest": renamed}, BAD, "mcid_mismatch"
        )
        assert await call("_content.put_manifest", {"manifest": wire}) == "ok"
        got = await call("_content.get_manifest", {"mcid": mcid})
        assert got == wire and isinstance(got, dict) and got["name"] == "three-chunks.bin"
        as_bytes = {**wire, "name": b"three-chunks.bin"}  # §11.5: a bytes name is accepted too
        assert await call("_content.put_manifest", {"manifest": as_bytes}) == "ok"
        for argument in (None, {}, {"manifest": "x"}, {"manifest": [wire]}):
            await assert_refused(node, "_content.put_manifest", argument, BAD, "bad_request")
        for bad_get in (None, {}, {"mcid": mcid[:33]}, {"mcid": raw_mcid(data).to_bytes()}):
            await assert_refused(node, "_content.get_manifest", bad_get, BAD, "bad_request")


async def test_a_content_stream_serves_only_builtins(make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:
        await provider.advertise(REALM, "org.example.echo_v1", lambda call: call.payload)
        await provider.flush()
        assert await caller.call(REALM, "org.example.echo_v1", 1, timeout=5) == 1
        session = await caller.session()
        async with session.content_stream() as stream:
            ping = await session.builtin("_relay.ping", {}, 5, stream=stream)
            assert set(ping) == {"ts", "refused"}
            with pytest.raises(MeshError) as caught:  # §6.3: no forwarding from a content stream
                await session.call(REALM, "org.example.echo_v1", 1, 5, stream=stream)
            assert caught.value.code == ErrorCode.UNKNOWN_NEXT_PEER
            # the stream keeps serving after an error
            assert set(await session.builtin("_relay.ping", {}, 5, stream=stream)) == {
                "ts",
                "refused",
            }


@pytest.mark.parametrize("size", [1, 256 * KIB, 5 * MIB], ids=["1B", "256KiB", "5MiB"])
async def test_content_round_trip_between_two_nodes(
    make_node: Callable[..., Node], size: int
) -> None:
    data = os.urandom(size)
    async with make_node() as writer, make_node() as reader:
        mcid = await writer.put_content(data, name="payload.bin")
        assert mcid[1] == (CODEC_MANIFEST if size > 256 * KIB else 0x55)
        assert await reader.get_content(mcid) == data
        # putting the same content again is idempotent and yields the same id
        if size <= 256 * KIB:
            assert await writer.put_content(data, name="payload.bin") == mcid


async def test_missing_content_is_a_clear_error(make_node: Callable[..., Node]) -> None:
    async with make_node() as reader:
        with pytest.raises(MeshError, match="not_found"):
            await reader.get_content(raw_mcid(b"never stored").to_bytes())
        absent = Manifest.create(os.urandom(300 * KIB), "absent", created=0)
        with pytest.raises(MeshError, match="not_found"):
            await reader.get_content(absent.mcid.to_bytes())


# --- streaming RPC (§8) -----------------------------------------------------------------------


async def wait_forgotten(session: Session, channel: StreamChannel) -> None:
    """Until the session has dropped ``channel`` (terminal frame or FIN seen)."""
    await eventually(
        lambda: session.core.channel(channel.quic_stream) is None,
        message="the stream was never closed",
    )


async def test_server_stream(station: Station, make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:
        opened: list[IncomingCall] = []

        async def countdown(channel: StreamChannel, incoming: IncomingCall) -> None:
            opened.append(incoming)
            for i in range(3):
                channel.send(f"body {i}".encode())
            return None  # STREAM_END(both)

        await provider.advertise_stream(REALM, "org.example.countdown_v1", countdown)
        await provider.flush()
        channel = await caller.open_stream(
            REALM, "org.example.countdown_v1", {"from": 3}, mode="server_stream"
        )
        assert [body async for body in channel] == [b"body 0", b"body 1", b"body 2"]
        assert channel.error is None
        await wait_forgotten(await caller.session(), channel)
        assert channel.error is None
        assert [(o.payload, o.caller) for o in opened] == [({"from": 3}, caller.identity.node_id)]
        assert len(station.core.routes) == 0


async def test_client_stream(station: Station, make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:

        async def total(channel: StreamChannel, incoming: IncomingCall) -> int:
            return sum([body async for body in channel])  # STREAM_REPLY after the caller's END

        await provider.advertise_stream(REALM, "org.example.sum_v1", total)
        await provider.flush()
        channel = await caller.open_stream(REALM, "org.example.sum_v1", None, mode="client_stream")
        for i in range(1, 21):
            channel.send(i, encoding="msgpack")  # msgpack: the body is any CBOR value (§3.13)
        channel.end("send")
        assert await channel.wait_reply(5) == 210
        assert channel.error is None and channel.replied
        await wait_forgotten(await caller.session(), channel)
        assert len(station.core.routes) == 0


async def test_bidi_echo_ends_cleanly(station: Station, make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:

        async def echo(channel: StreamChannel, incoming: IncomingCall) -> None:
            async for body in channel:
                channel.send(body)
            channel.end("send")
            return None

        await provider.advertise_stream(REALM, "org.example.echo_stream_v1", echo)
        await provider.flush()
        channel = await caller.open_stream(REALM, "org.example.echo_stream_v1", None, mode="bidi")
        sent = [os.urandom(8) for _ in range(5)]
        for body in sent:
            channel.send(body)
        channel.end("send")
        try:
            echoed = [body async for body in channel]
        except MeshError as exc:
            pytest.fail(f"a clean bidi end was reported as an error: {exc}")
        assert echoed == sent
        await wait_forgotten(await caller.session(), channel)
        assert channel.error is None
        assert len(station.core.routes) == 0


async def test_bidi_echo_relays_every_body(
    station: Station, make_node: Callable[..., Node]
) -> None:
    """The station half of bidi (§8.4): both directions relayed, the route ends with both ENDs."""
    async with make_node() as provider, make_node() as caller:

        async def echo(channel: StreamChannel, incoming: IncomingCall) -> None:
            async for body in channel:
                channel.send(body)
            channel.end("send")
            return None

        await provider.advertise_stream(REALM, "org.example.echo_stream_v1", echo)
        await provider.flush()
        channel = await caller.open_stream(REALM, "org.example.echo_stream_v1", None, mode="bidi")
        sent = [os.urandom(8) for _ in range(5)]
        for body in sent:
            channel.send(body)
        echoed = []
        for _ in sent:
            echoed.append(await asyncio.wait_for(channel.receive(), 5))
        assert echoed == sent  # echoes flow while the caller's half is still open
        channel.end("send")
        await wait_forgotten(await caller.session(), channel)
        await eventually(lambda: len(station.core.routes) == 0)


async def test_unknown_streaming_procedure_is_an_error(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as provider, make_node() as caller:
        channel = await caller.open_stream(REALM, "org.example.nobody_v1", None, mode="bidi")
        with pytest.raises(MeshError, match="unknown_next_peer"):
            async for _ in channel:
                pass
        assert channel.error == ("unknown_next_peer", "procedure not advertised")
        # advertised, but only as a unary procedure: the provider refuses the stream
        await provider.advertise(REALM, "org.example.unary_v1", lambda call: call.payload)
        await provider.flush()
        channel = await caller.open_stream(REALM, "org.example.unary_v1", None)
        with pytest.raises(MeshError, match="not_found"):
            async for _ in channel:
                pass
        assert channel.error is not None and channel.error[0] == "not_found"


# --- restart ------------------------------------------------------------------------------------


async def test_restart_keeps_records_and_content(tmp_path: Path) -> None:
    data_dir = tmp_path / "station"
    small = os.urandom(100)
    large = os.urandom(700 * KIB)
    writer = new_identity()
    async with Station(station_config(data_dir)) as first:
        first_id = first.node_id
        record = procedure_record(writer, "org.example.durable_v1", first_id)
        async with Node(writer, [first.endpoint]) as node:
            assert await node.call(ZERO_REALM, "_dht.put_record", record.to_rpc()) == "ok"
            small_id = await node.put_content(small)
            large_id = await node.put_content(large, name="large.bin")
    async with Station(station_config(data_dir)) as second:
        assert second.node_id == first_id  # the key survives too
        async with Node(new_identity(), [second.endpoint]) as reader:
            key = storage_key_for_procedure("org.example.durable_v1")
            assert await reader.call(ZERO_REALM, "_dht.find_record", {"key": key}) == (
                record.to_rpc()
            )
            assert await reader.get_content(small_id) == small
            assert await reader.get_content(large_id) == large


# --- deadlines (§6.4, §13 #9) -------------------------------------------------------------------


async def call_with_deadline(
    node: Node, realm: bytes, procedure: str, payload: object, deadline_ms: int
) -> object:
    """A CALL whose ``deadline_ms`` the test chooses, answered through the node's session."""
    session = await node.session()
    return await session.call(realm, procedure, payload, 5, deadline_ms=deadline_ms)


async def test_an_expired_call_is_answered_0x07(make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:
        served: list[object] = []
        await provider.advertise(REALM, "org.example.late_v1", lambda c: served.append(c.payload))
        await provider.flush()
        for realm, procedure in ((ZERO_REALM, "_relay.ping"), (REALM, "org.example.late_v1")):
            for deadline in (now_ms() - 1000, 0, -5):
                with pytest.raises(MeshError) as caught:
                    await call_with_deadline(caller, realm, procedure, {}, deadline)
                assert caught.value.code == ErrorCode.EXPIRY_TOO_SOON, procedure
        assert served == []  # the provider never saw an expired call
        assert await caller.call(REALM, "org.example.late_v1", 1, timeout=5) is None
        assert served == [1]


async def test_a_deadline_passing_at_the_provider_is_answered_0x07(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node() as provider, make_node() as caller:
        gate = asyncio.Event()
        started = asyncio.Event()

        async def held(call: IncomingCall) -> str:
            started.set()
            await gate.wait()
            return "too late"

        await provider.advertise(REALM, "org.example.held_v1", held)
        await provider.flush()
        try:
            pending = asyncio.ensure_future(
                call_with_deadline(caller, REALM, "org.example.held_v1", {}, now_ms() + 300)
            )
            await asyncio.wait_for(started.wait(), 5)
            with pytest.raises(MeshError) as caught:
                await pending
            assert caught.value.code == ErrorCode.EXPIRY_TOO_SOON
        finally:
            gate.set()
        # the provider's late RESULT is dropped; the caller is still served afterwards
        await eventually(lambda: station.core.stats["unexpected_reply"])
        assert station.core.stats["unexpected_reply"] == 1
        assert await caller.call(ZERO_REALM, "_relay.ping", {}, timeout=5)
