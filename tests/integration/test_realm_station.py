"""A station protecting a realm (issue 13), driven by raw frames over real QUIC: a non-member
receives nothing of the realm, reaches nobody and is answered 0x05; after presenting a valid
endorsement it gets everything; a revocation takes it all away again (at once when put here,
at the next sweep when it only reached the record store); bad endorsements are refused with a
reason each; unprotected realms behave as before."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from macula.wire.codes import ErrorCode
from macula.wire.frames import StreamOpen
from macula.wire.identity import Identity
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import RecordType
from relay.core.policy import StationPolicy
from relay.realms.gate import ProtectedRealm
from relay.station.station import Station
from support.meshkit import REALM, station_config
from support.rawclient import now_ms, raw_client, stamp
from support.realmkit import (
    PRIVATE,
    REALM_NAME,
    advertise,
    call,
    endorse,
    is_event,
    present,
    publish,
    put_record,
    refused,
    revoke,
    serve_one,
    subscribe,
    tombstone,
)
from support.waiting import eventually

pytestmark = pytest.mark.anyio

NEWS = "private.news"
ECHO = "org.example.private_echo_v1"
AUTHORITY = Identity.generate(os.urandom)


@pytest.fixture
async def station(tmp_path: Path) -> AsyncIterator[Station]:
    config = station_config(tmp_path / "station")
    config.realms = [ProtectedRealm(REALM_NAME, PRIVATE, AUTHORITY.node_id)]
    async with Station(config) as running:
        yield running


async def test_a_non_member_gets_nothing_until_it_presents_an_endorsement(
    station: Station,
) -> None:
    async with (
        raw_client(station) as alice,
        raw_client(station) as bob,
        raw_client(station) as eve,
    ):
        for member in (alice, bob):
            answer = await present(member, endorse(AUTHORITY, member.node_id))
            assert [a["realm"] for a in answer["accepted"]] == [PRIVATE], answer
            assert answer["accepted"][0]["name"] == REALM_NAME
            assert answer["refused"] == []
        subscribe(alice, NEWS)
        advertise(bob, ECHO)
        # eve, no endorsement: her SUBSCRIBE, ADVERTISE, PUBLISH are refused and counted
        subscribe(eve, NEWS)
        advertise(eve, "org.example.eve_v1")
        await alice.flush()
        await bob.flush()
        await eve.flush()
        publish(bob, NEWS, 1, "for members")
        await alice.expect(is_event(NEWS, "for members"))
        await eve.quiet(is_event(NEWS))
        publish(eve, NEWS, 1, "from eve")
        await alice.quiet(is_event(NEWS, "from eve"))
        reply = await call(eve, ECHO, {"x": 1}, realm=PRIVATE)
        assert (reply["frame_type"], reply["code"]) == ("error", ErrorCode.TARGET_REALM_REFUSED)
        reply = await call(eve, "org.example.eve_v1", {}, realm=PRIVATE)
        assert reply["code"] == ErrorCode.TARGET_REALM_REFUSED
        # stream RPC too: STREAM_ERROR target_realm_refused, then FIN
        stream = eve.new_stream()
        opening = StreamOpen(
            **stamp(),
            stream_id=os.urandom(16),
            procedure=ECHO,
            realm=PRIVATE,
            mode="bidi",
            args=None,
            deadline_ms=now_ms() + 30_000,
            caller=eve.node_id,
        )
        eve.send(opening, stream=stream)
        await eve.wait_fin(stream)
        [error] = eve.frames("stream_error", stream=stream)
        assert error["code"] in ("target_realm_refused", b"target_realm_refused"), error
        # subscribe, advertise, publish, stream_open
        assert (await refused(eve))["realm_refused"] == 4
        assert station.core.stats["realm_calls_refused"] == 2
        # a member calls the provider: it works
        start = len(bob.received)
        pending = call(alice, ECHO, {"x": 2}, realm=PRIVATE)
        served = serve_one(bob, "pong", start)
        reply, _ = await asyncio.gather(pending, served)
        assert reply["payload"] == "pong"

        # an unprotected realm is unchanged for eve
        subscribe(eve, NEWS, realm=REALM)
        await eve.flush()
        publish(bob, NEWS, 2, "open", realm=REALM)
        await eve.expect(is_event(NEWS, "open"))

        # eve presents a valid endorsement: from now on she gets everything
        answer = await present(eve, endorse(AUTHORITY, eve.node_id))
        assert [a["realm"] for a in answer["accepted"]] == [PRIVATE]
        subscribe(eve, NEWS)
        await eve.flush()
        publish(bob, NEWS, 3, "now eve too")
        await eve.expect(is_event(NEWS, "now eve too"))
        publish(eve, NEWS, 2, "eve speaks")
        await alice.expect(is_event(NEWS, "eve speaks"))
        start = len(bob.received)
        pending = call(eve, ECHO, {"x": 3}, realm=PRIVATE)
        reply, _ = await asyncio.gather(pending, serve_one(bob, "pong", start))
        assert reply["payload"] == "pong"


async def test_a_reconnect_presents_again(station: Station) -> None:
    eve_id = Identity.generate(os.urandom)
    async with raw_client(station, eve_id) as eve:
        await present(eve, endorse(AUTHORITY, eve.node_id))
        subscribe(eve, NEWS)
        assert "realm_refused" not in await refused(eve)
    async with raw_client(station, eve_id) as eve:  # a new connection: not a member yet
        subscribe(eve, NEWS)
        assert (await refused(eve))["realm_refused"] == 1


async def test_a_revocation_put_here_ends_access_at_once(station: Station) -> None:
    async with (
        raw_client(station) as bob,
        raw_client(station) as eve,
        raw_client(station) as alice,
    ):
        for member in (bob, eve, alice):
            await present(member, endorse(AUTHORITY, member.node_id))
        subscribe(eve, NEWS)
        subscribe(alice, NEWS)
        advertise(bob, ECHO)
        for member in (bob, eve, alice):
            await member.flush()
        publish(bob, NEWS, 1, "before")
        await eve.expect(is_event(NEWS, "before"))
        # the realm's authority revokes eve (a newer 0x05 with role "revoked"), put by anyone
        assert await put_record(alice, revoke(AUTHORITY, eve.node_id)) == "ok"
        publish(bob, NEWS, 2, "after")
        await alice.expect(is_event(NEWS, "after"))
        await eve.quiet(is_event(NEWS, "after"))  # her subscription from before gets nothing
        reply = await call(eve, ECHO, {}, realm=PRIVATE)
        assert reply["code"] == ErrorCode.TARGET_REALM_REFUSED
        publish(eve, NEWS, 1, "from a revoked member")
        await alice.quiet(is_event(NEWS, "from a revoked member"))
        # presenting the old endorsement again does not help
        answer = await present(eve, endorse(AUTHORITY, eve.node_id, at_ms=now_ms() - 10_000))
        assert [r["reason"] for r in answer["refused"]] == ["revoked"]
        # revoking bob, the provider: his advertisement goes at the next tick
        assert await put_record(alice, revoke(AUTHORITY, bob.node_id)) == "ok"
        await eventually(lambda: station.core.stats["realm_memberships_ended"] == 2)
        reply = await call(alice, ECHO, {}, realm=PRIVATE)
        assert reply["code"] == ErrorCode.UNKNOWN_NEXT_PEER  # no member serves it any more


async def test_a_revocation_only_in_the_store_is_honoured_by_the_sweep(station: Station) -> None:
    """A revocation that reached the record store without a put here (as from the mesh) ends
    the membership at the next sweep, at most ``realm_sweep_ms`` (60 s) later: the test
    drives the sweep with the station's clock 61 s ahead instead of waiting."""
    async with raw_client(station) as bob, raw_client(station) as eve:
        for member in (bob, eve):
            await present(member, endorse(AUTHORITY, member.node_id))
        subscribe(eve, NEWS)
        await eve.flush()
        records = station._records
        assert records is not None
        revocation = revoke(AUTHORITY, eve.node_id)
        key = member_endorsement_key(PRIVATE, eve.node_id)
        await records.put(revocation, key, now_ms())
        publish(bob, NEWS, 1, "not yet swept")
        await eve.expect(is_event(NEWS, "not yet swept"))
        assert await station.sweep_revocations(now_ms() + 61_000) == 1
        publish(bob, NEWS, 2, "swept")
        await eve.quiet(is_event(NEWS, "swept"))
        assert station.core.stats["realm_memberships_ended"] == 1


async def test_the_ticker_sweeps_every_realm_sweep_ms(tmp_path: Path) -> None:
    config = station_config(tmp_path / "s", StationPolicy(realm_sweep_ms=100))
    config.realms = [ProtectedRealm(REALM_NAME, PRIVATE, AUTHORITY.node_id)]
    async with Station(config) as station, raw_client(station) as eve:
        await present(eve, endorse(AUTHORITY, eve.node_id))
        records = station._records
        assert records is not None
        revocation = revoke(AUTHORITY, eve.node_id)
        key = revocation.payload["realm"], revocation.payload["member_node"]
        await records.put(revocation, member_endorsement_key(*key), now_ms())
        await eventually(lambda: station.core.stats["realm_memberships_ended"] == 1)
        subscribe(eve, NEWS)
        assert (await refused(eve))["realm_refused"] == 1


async def test_bad_endorsements_are_refused_with_a_reason_each(station: Station) -> None:
    stranger = Identity.generate(os.urandom)
    async with raw_client(station) as eve:
        me = eve.node_id
        good = endorse(AUTHORITY, me)
        forged = good.to_rpc()
        forged["payload"] = {**good.payload, "role": "owner"}  # changed after signing
        now = now_ms()
        cases = {
            "forged": forged,
            "another node's": endorse(AUTHORITY, stranger.node_id),
            "valid_until passed": endorse(AUTHORITY, me, valid_until=now - 1),
            "record expired": endorse(AUTHORITY, me, at_ms=now - 10_000, ttl_ms=5_000),
            "wrong authority": endorse(stranger, me),
            "unprotected realm": endorse(AUTHORITY, me, name="org.example.other"),
            "a revocation": endorse(AUTHORITY, me, role="revoked"),
            "not an endorsement": tombstone(AUTHORITY, me),
            "not a record": "endorse me",
        }
        answer = await present(eve, *cases.values())
        assert answer["accepted"] == []
        reasons = {name: None for name in cases}
        for refusal in answer["refused"]:
            reasons[list(cases)[refusal["index"]]] = refusal["reason"]
            assert refusal["detail"]
        assert reasons == {
            "forged": "bad_signature",
            "another node's": "other_node",
            "valid_until passed": "expired",
            "record expired": "expired",
            "wrong authority": "wrong_authority",
            "unprotected realm": "realm_not_protected",
            "a revocation": "revoked",
            "not an endorsement": "not_an_endorsement",
            "not a record": "bad_record",
        }
        # none of them made eve a member
        subscribe(eve, NEWS)
        assert (await refused(eve))["realm_refused"] == 1
        # malformed arguments: 0x0F bad_request, nothing learned
        for payload in ({}, {"endorsements": "x"}, {"endorsements": [good.to_rpc()] * 17}):
            reply = await call(eve, "_realm.present", payload)
            assert reply["code"] == ErrorCode.UNKNOWN_ERROR, reply
            assert reply["detail"].startswith(b"bad_request"), reply
        # one good one among bad ones is accepted
        answer = await present(eve, "junk", good)
        assert [a["realm"] for a in answer["accepted"]] == [PRIVATE]
        assert [r["index"] for r in answer["refused"]] == [0]


async def test_endorsement_record_put_is_stored_under_its_derived_key(station: Station) -> None:
    """A 0x05 can be put with ``_dht.put_record`` (its key from realm and member_node)."""
    async with raw_client(station) as eve:
        record = endorse(AUTHORITY, eve.node_id)
        assert await put_record(eve, record) == "ok"
        key = member_endorsement_key(PRIVATE, eve.node_id)
        reply = await call(eve, "_dht.find_record", {"key": key})
        assert reply["payload"]["type"] == RecordType.REALM_MEMBER_ENDORSEMENT
        assert station.core.realms.revocations == {}  # an endorsement revokes nothing
