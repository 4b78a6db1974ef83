"""A protected realm across links (issue 26): its traffic crosses a link only to a station its
authority endorsed for it (a 0x05 of role "station", presented on the link), whatever a
station says about itself. Three stations over real QUIC: A protects realm R (authority K) and
is endorsed by K; B protects R, is endorsed by K and dials A; C runs ``--realm R=OTHER_KEY``
(same name, its own key: another realm), is endorsed by OTHER_KEY and dials A. C's client,
endorsed by OTHER_KEY, reads none of the members' events, injects none, and cannot answer a
member's CALL; B's members talk with A's as before. A raw client that sets the station bit and
lists R in CONNECT ``realms`` gets nothing and injects nothing. A revocation of B's station
endorsement stops the flow (at once when put at A, at the sweep when only in A's store)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from macula.keyfile import load_or_create_identity
from macula.wire.codes import ErrorCode
from macula.wire.frames import Event, Result, publication_signable
from macula.wire.identity import Identity
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record
from relay.realms.gate import ProtectedRealm
from relay.station.station import Station, StationConfig
from support.meshkit import linked, station_config, target
from support.rawclient import RawClient, link_in, now_ms, raw_client, stamp
from support.realmkit import (
    PRIVATE,
    REALM_NAME,
    advertise,
    call,
    call_frame,
    endorse,
    is_event,
    present,
    publish,
    put_record,
    revoke,
    serve_one,
    subscribe,
)
from support.waiting import eventually

pytestmark = pytest.mark.anyio

AUTHORITY = Identity.generate(os.urandom)  # K, R's authority
OTHER = Identity.generate(os.urandom)  # C's key for "the same" realm
NEWS = "linked.private.news"
ECHO = "org.example.linked_echo_v1"
ROUNDS = 10
VOUCHES = ("_realm.vouch", b"_realm.vouch")


def station_endorsement(authority: Identity, station: bytes) -> Record:
    return endorse(authority, station, role="station")


def make(tmp: Path, peers: list[Station], authority: Identity) -> StationConfig:
    """A station protecting R under ``authority``, endorsed by it for R."""
    node_id = load_or_create_identity(tmp / "station.key").node_id  # its key, known up front
    config = dataclasses.replace(
        station_config(tmp),
        peers=[target(p) for p in peers],
        link_backoff_s=0.05,
        link_backoff_max_s=0.2,
        link_timeout_s=2.0,
    )
    config.realms = [ProtectedRealm(REALM_NAME, PRIVATE, authority.node_id)]
    config.station_endorsements = [station_endorsement(authority, node_id)]
    return config


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[Station, Station, Station]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(Station(make(tmp_path / "a", [], AUTHORITY)))
        b = await stack.enter_async_context(Station(make(tmp_path / "b", [a], AUTHORITY)))
        c = await stack.enter_async_context(Station(make(tmp_path / "c", [a], OTHER)))
        await eventually(lambda: len(linked(a)) == 2, message="links not up")
        yield a, b, c


def holds(station: Station, holder: bytes) -> bool:
    return holder in station.core.subscriptions.subscribers((PRIVATE, NEWS.encode()))


async def joined(raw: RawClient, authority: Identity) -> None:
    answer = await present(raw, endorse(authority, raw.node_id))
    assert len(answer["accepted"]) == 1, answer


def events(raw: RawClient, start: int = 0) -> list[Any]:
    return [
        r.frame["payload"]
        for r in raw.received[start:]
        if r.frame_type == "event" and r.frame.get("topic") in (NEWS, NEWS.encode())
    ]


async def test_a_station_naming_the_realm_with_another_key_reads_and_injects_nothing(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    async with raw_client(a) as on_a, raw_client(b) as on_b, raw_client(c) as on_c:
        await joined(on_a, AUTHORITY)
        await joined(on_b, AUTHORITY)
        await joined(on_c, OTHER)  # a member of C's realm, which only shares R's name
        for client in (on_a, on_b, on_c):
            subscribe(client, NEWS)
            await client.flush()
        await eventually(lambda: holds(a, b.node_id), message="B's interest did not reach A")
        assert not holds(a, c.node_id)  # C was not told A's interest and its own is refused
        a_conn = b.core.node_conn[a.node_id]
        assert b.core.realms.endorsed_realms(a_conn, now_ms()) == {PRIVATE}
        assert a.core.realms.endorsed_realms(a.core.node_conn[c.node_id], now_ms()) == set()
        c_seen, b_seen = len(on_c.received), len(on_b.received)
        for n in range(ROUNDS):
            publish(on_a, NEWS, n + 1, f"a{n}", e2e=True)
        await eventually(lambda: len(events(on_b, b_seen)) == ROUNDS, message="B missed A's")
        await on_c.quiet(is_event(NEWS))
        assert events(on_c, c_seen) == []  # 0/10
        a_seen, b_seen = len(on_a.received), len(on_b.received)
        for n in range(ROUNDS):
            publish(on_c, NEWS, n + 1, f"c{n}", e2e=True)
        await on_c.flush()
        publish(on_b, NEWS, 100, "b after c", e2e=True)  # B's still arrive, C's never
        await on_a.expect(is_event(NEWS, "b after c"), start=a_seen)
        await on_a.quiet(is_event(NEWS))
        assert events(on_a, a_seen) == ["b after c"]
        assert [p for p in events(on_b, b_seen) if str(p).startswith("c")] == []
        assert c.core.stats["relayed_events_received"] == 0


async def test_a_station_of_another_key_cannot_answer_a_members_call(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, c = mesh
    async with raw_client(a) as on_a, raw_client(b) as on_b, raw_client(c) as on_c:
        await joined(on_a, AUTHORITY)
        await joined(on_c, OTHER)
        advertise(on_c, ECHO)  # C serves it in its realm; it must not become R's at A
        await on_c.flush()
        await eventually(lambda: c.core.adverts.get((PRIVATE, ECHO)) is not None)
        assert a.core.gossip.serving((PRIVATE, ECHO), local_only=False) is None
        reply = await call(on_a, ECHO, "hi", PRIVATE)
        assert reply["frame_type"] == "error" and reply["code"] == ErrorCode.UNKNOWN_NEXT_PEER
        await on_c.quiet(lambda r: r.frame_type == "call")
        # the regression: a member on B serves it, a member on A reaches it across the link
        await joined(on_b, AUTHORITY)
        advertise(on_b, ECHO)
        await on_b.flush()
        await eventually(
            lambda: a.core.gossip.serving((PRIVATE, ECHO), local_only=False) is not None,
            message="B's advertisement did not reach A",
        )
        start = len(on_b.received)
        outgoing = call(on_a, ECHO, "hi", PRIVATE)
        _, reply = await asyncio.gather(serve_one(on_b, "from b", start), outgoing)
        assert reply["frame_type"] == "result" and reply["payload"] == "from b", reply


async def link_in_realm(raw: RawClient, *endorsements: Record) -> dict[str, Any]:
    """CONNECT with the station bit, claiming R (CONNECT ``realms``): the HELLO."""
    signed = [e.to_rpc() for e in endorsements]
    return await link_in(raw, realms=[PRIVATE], endorsements=signed)


def relayed_event(sender: Identity, publisher: Identity, seq: int, payload: Any) -> Event:
    """An EVENT in R as a station relays it, with a valid ``publisher_sig``."""
    signable = publication_signable(NEWS, PRIVATE, publisher.node_id, seq, payload)
    return Event(
        **stamp(),
        topic=NEWS,
        realm=PRIVATE,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        publisher_sig=publisher.sign(signable),
    ).signed_by(sender)


async def test_a_client_claiming_to_be_a_station_of_the_realm_gets_and_injects_nothing(
    tmp_path: Path,
) -> None:
    async with (
        Station(make(tmp_path / "a", [], AUTHORITY)) as a,
        raw_client(a) as member,
        raw_client(a, handshake=False) as fake,
    ):
        await joined(member, AUTHORITY)
        subscribe(member, NEWS)
        await member.flush()
        hello = await link_in_realm(fake)
        assert hello.get("accepted") == "true"  # in open admission: a station without a realm
        subscribe(fake, NEWS)
        advertise(fake, ECHO)
        await fake.flush()
        assert not holds(a, fake.node_id)
        seen = len(fake.received)
        for n in range(ROUNDS):
            publish(member, NEWS, n + 1, f"m{n}", e2e=True)
        await member.flush()
        member_seen = len(member.received)
        for n in range(ROUNDS):
            fake.send(relayed_event(fake.identity, fake.identity, n + 1, f"f{n}"))
        await fake.flush()
        await fake.quiet(is_event(NEWS))
        assert events(fake, seen) == []  # 0/10 read
        await member.quiet(is_event(NEWS))
        assert events(member, member_seen) == []  # 0/10 injected
        reply = await call(member, ECHO, "hi", PRIVATE)
        assert reply["code"] == ErrorCode.UNKNOWN_NEXT_PEER
        await fake.quiet(lambda r: r.frame_type == "call")
        assert a.core.stats["realm_refused"] >= 1 + ROUNDS  # its SUBSCRIBE, ADVERTISE, EVENTs


async def test_revoking_a_station_endorsement_stops_the_flow(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, _ = mesh
    async with raw_client(a) as on_a, raw_client(b) as on_b:
        await joined(on_a, AUTHORITY)
        await joined(on_b, AUTHORITY)
        for client in (on_a, on_b):
            subscribe(client, NEWS)
            await client.flush()
        await eventually(lambda: holds(a, b.node_id), message="B's interest did not reach A")
        await eventually(lambda: holds(b, a.node_id), message="A's interest did not reach B")
        publish(on_a, NEWS, 1, "before", e2e=True)
        await on_b.expect(is_event(NEWS, "before"))
        # the revocation only reaches A's record store (as from the mesh): the sweep finds it
        records = a._records
        assert records is not None
        revocation = revoke(AUTHORITY, b.node_id)
        await records.put(revocation, member_endorsement_key(PRIVATE, b.node_id), now_ms())
        publish(on_a, NEWS, 2, "not yet swept", e2e=True)
        await on_b.expect(is_event(NEWS, "not yet swept"))
        assert await a.sweep_revocations(now_ms() + 61_000) == 1
        b_conn = a.core.node_conn[b.node_id]
        assert a.core.realms.endorsed_realms(b_conn, now_ms()) == set()
        publish(on_a, NEWS, 3, "after", e2e=True)
        await on_b.quiet(is_event(NEWS, "after"))
        publish(on_b, NEWS, 4, "from b after", e2e=True)
        await on_a.quiet(is_event(NEWS, "from b after"))


async def test_a_revocation_put_at_the_station_stops_the_flow_at_once(
    mesh: tuple[Station, Station, Station],
) -> None:
    a, b, _ = mesh
    async with raw_client(a) as on_a, raw_client(b) as on_b:
        await joined(on_a, AUTHORITY)
        await joined(on_b, AUTHORITY)
        subscribe(on_b, NEWS)
        await on_b.flush()
        await eventually(lambda: holds(a, b.node_id), message="B's interest did not reach A")
        assert await put_record(on_a, revoke(AUTHORITY, b.node_id)) == "ok"
        publish(on_a, NEWS, 1, "after", e2e=True)
        await on_b.quiet(is_event(NEWS, "after"))
        assert a.core.stats["realm_sends_withheld"] >= 1


async def test_an_endorsed_station_cannot_pass_off_its_own_keys_as_members(
    tmp_path: Path,
) -> None:
    """Even a station K endorsed (a raw one here) delivers in R only what members it vouched
    for (with their endorsements, checked at A) published, and calls only as them."""
    async with (
        Station(make(tmp_path / "a", [], AUTHORITY)) as a,
        raw_client(a) as member,
        raw_client(a, handshake=False) as rogue,
    ):
        await joined(member, AUTHORITY)
        subscribe(member, NEWS)
        advertise(member, ECHO)
        await member.flush()
        hello = await link_in_realm(rogue, station_endorsement(AUTHORITY, rogue.node_id))
        assert hello.get("accepted") == "true"
        conn = a.core.node_conn[rogue.node_id]
        assert a.core.realms.endorsed_realms(conn, now_ms()) == {PRIVATE}
        # A vouched for its member to the link, and told it the member's interest
        vouch = await rogue.expect(
            lambda r: r.frame_type == "call" and r.frame.get("procedure") in VOUCHES
        )
        vouched = [e["payload"]["member_node"] for e in vouch.frame["payload"]["endorsements"]]
        assert vouched == [member.node_id]
        seen = len(member.received)
        for n in range(ROUNDS):  # its own key, a valid publisher_sig, but no member
            rogue.send(relayed_event(rogue.identity, rogue.identity, n + 1, f"r{n}"))
        await rogue.flush()
        await member.quiet(is_event(NEWS))
        assert events(member, seen) == []
        assert a.core.stats["realm_refused"] == 0  # the link may carry R: refused per publisher
        call = call_frame(rogue, ECHO, "hi", PRIVATE)  # as itself: not a member
        rogue.send(call)
        reply = await rogue.reply_to(call.call_id)
        assert reply["frame_type"] == "error" and reply["code"] == ErrorCode.TARGET_REALM_REFUSED
        await member.quiet(lambda r: r.frame_type == "call")
        # a vouch signed by another key is refused; a real member's endorsement is kept
        puppet = Identity.generate(os.urandom)
        forged = endorse(OTHER, puppet.node_id)
        answer = await call_raw(rogue, "_realm.vouch", {"endorsements": [forged.to_rpc()]})
        assert answer["kept"] == 0 and [r["reason"] for r in answer["refused"]] == [
            "wrong_authority"
        ]
        rogue.send(relayed_event(rogue.identity, puppet, 1, "forged"))
        real = endorse(AUTHORITY, puppet.node_id)
        answer = await call_raw(rogue, "_realm.vouch", {"endorsements": [real.to_rpc()]})
        assert answer == {"kept": 1, "refused": []}
        unsigned = dataclasses.replace(
            relayed_event(rogue.identity, puppet, 2, "station-attested"), publisher_sig=None
        )
        rogue.send(unsigned.signed_by(rogue.identity))  # no publisher_sig: never in R
        rogue.send(relayed_event(rogue.identity, puppet, 3, "vouched"))
        await member.expect(is_event(NEWS, "vouched"), start=seen)
        assert events(member, seen) == ["vouched"]
        assert a.core.stats["realm_members_vouched"] == 1
        assert a.core.stats["realm_event_unsigned"] == 1


async def call_raw(raw: RawClient, procedure: str, payload: Any) -> Any:
    frame = call_frame(raw, procedure, payload)
    raw.send(frame)
    reply = await raw.reply_to(frame.call_id)
    assert reply["frame_type"] == "result", reply
    return reply["payload"]


async def test_an_endorsed_station_answers_a_members_call_only_as_a_vouched_member(
    tmp_path: Path,
) -> None:
    async with (
        Station(make(tmp_path / "a", [], AUTHORITY)) as a,
        raw_client(a) as member,
        raw_client(a, handshake=False) as rogue,
    ):
        await joined(member, AUTHORITY)
        hello = await link_in_realm(rogue, station_endorsement(AUTHORITY, rogue.node_id))
        assert hello.get("accepted") == "true"
        advertise(rogue, ECHO)  # as a station gossips: advertiser = the station
        await rogue.flush()
        await eventually(
            lambda: a.core.gossip.serving((PRIVATE, ECHO), local_only=False) is not None,
            message="the endorsed link's advertisement was not taken",
        )

        async def answered_by(server: Identity, answer: str) -> dict[str, Any]:
            start = len(rogue.received)
            frame = call_frame(member, ECHO, "hi", PRIVATE)
            frame = dataclasses.replace(frame, deadline_ms=now_ms() + 1_000)
            member.send(frame)
            forwarded = await rogue.expect(lambda r: r.frame_type == "call", start=start)
            assert forwarded.frame["call_id"] == frame.call_id
            result = Result(
                **stamp(), call_id=frame.call_id, payload=answer, responded_by=server.node_id
            )
            rogue.send(result, signer=server)
            return await member.reply_to(frame.call_id)

        reply = await answered_by(rogue.identity, "from the station's own key")
        assert reply["frame_type"] == "error"  # its RESULT was dropped: the deadline ended it
        assert a.core.stats["realm_result_unvouched"] == 1
        puppet = Identity.generate(os.urandom)
        answer = await call_raw(
            rogue, "_realm.vouch", {"endorsements": [endorse(AUTHORITY, puppet.node_id).to_rpc()]}
        )
        assert answer["kept"] == 1
        reply = await answered_by(puppet, "from a vouched member")
        assert reply["frame_type"] == "result", reply
        assert reply["payload"] == "from a vouched member"
        assert len(a.core.realm_calls) == 0
