"""The join flow on a real station: a realm's join service (its authority's Node), a member's
RealmJoiner, approve/deny/revoke through the realm's state file, records through the DHT."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from macula.client.backoff import Backoff
from macula.clock import now_ms
from macula.node.node import Node
from macula.realm.join import ReplayCache, build_request
from macula.realm.joiner import JoinError, RealmJoiner, Ticket
from macula.realm.membership import MembershipStore, memberships_path
from macula.realm.records import (
    build_directory,
    build_endorsement,
    check_endorsement,
    join_procedure,
    read_member_record,
)
from macula.wire.identity import ZERO_REALM, Identity, realm_tag
from macula.wire.record_keys import member_endorsement_key
from relay.station.station import Station
from support.identities import new_identity
from support.joinkit import join_service
from support.meshkit import station_config
from support.waiting import eventually

pytestmark = pytest.mark.anyio
NAME = "org.example.crew"


@asynccontextmanager
async def member(station: Station, home: Path) -> AsyncIterator[tuple[Node, RealmJoiner]]:
    identity = new_identity()
    store = MembershipStore(memberships_path(home, identity.node_id), identity)
    async with Node(identity, [station.endpoint], presenter=store.present_on) as node:
        yield node, RealmJoiner(node, store, node._spawn_task, poll_every_s=0.05)


async def test_join_approve_store_list_then_revoke(station: Station, tmp_path: Path) -> None:
    async with (
        join_service(station, tmp_path / "owner", NAME) as service,
        member(station, tmp_path / "member") as (node, joiner),
    ):
        ticket = await joiner.start(NAME)
        assert isinstance(ticket, Ticket)
        assert ticket.authority == service.realm.authority.node_id
        assert ticket.link.endswith(ticket.code) and len(ticket.code) == 9
        # the service state holds the pending session; nothing was stored for the member yet
        [pending] = service.realm.pending(service.clock())
        assert pending.node == node.identity.node_id
        assert joiner.store.memberships() == []
        assert (await joiner.wait(NAME, 0.1))["status"] == "pending"
        with pytest.raises(JoinError) as excinfo:
            await joiner.start(NAME)  # one pending join per realm: its code is not shown again
        assert excinfo.value.reason == "in_progress"

        service.realm.decide(ticket.code, True, service.clock())  # macula-realm approve CODE
        outcome = await joiner.wait(NAME, 10)
        assert outcome["status"] == "approved", outcome
        assert "code" not in outcome and "link" not in outcome
        [held] = joiner.store.memberships()
        assert held.view()["name"] == NAME and held.view()["role"] == "member"
        assert held.endorsement.authority == service.realm.authority.node_id
        path = memberships_path(tmp_path / "member", node.identity.node_id)
        assert path.stat().st_mode & 0o777 == 0o600
        assert ticket.code.replace("-", "") not in path.read_text()

        # the service put the endorsement in the DHT, under its storage key
        key = member_endorsement_key(realm_tag(NAME), node.identity.node_id)

        async def in_dht(role: str) -> bool:
            found = await node.dht.find_records(key)
            authority = service.realm.authority.node_id
            return any(read_member_record(r, authority=authority).role == role for r in found)

        await eventually(lambda: in_dht("member"), message="endorsement not in the DHT")

        # asking again after approval returns the stored outcome, no new code
        again = await joiner.start(NAME)
        assert isinstance(again, dict) and again["status"] == "approved"

        service.realm.revoke(node.identity.node_id, service.clock())  # macula-realm revoke
        await eventually(lambda: in_dht("revoked"), message="revocation not in the DHT")
        await joiner.store.refresh(node.dht)
        assert joiner.store.memberships() == []


async def test_deny(station: Station, tmp_path: Path) -> None:
    async with (
        join_service(station, tmp_path / "owner", NAME) as service,
        member(station, tmp_path / "member") as (_, joiner),
    ):
        ticket = await joiner.start(NAME)
        assert isinstance(ticket, Ticket)
        service.realm.decide(ticket.code, False, service.clock())
        outcome = await joiner.wait(NAME, 10)
        assert outcome["status"] == "denied" and joiner.store.memberships() == []


async def test_replayed_and_foreign_requests_are_refused(station: Station, tmp_path: Path) -> None:
    async with (
        join_service(station, tmp_path / "owner", NAME) as service,
        member(station, tmp_path / "member") as (node, _),
        member(station, tmp_path / "mallory") as (mallory, _),
    ):
        service_key = service.node.identity.node_id
        request = build_request(node.identity, NAME, service_key, "start", service.clock())
        procedure = join_procedure(NAME)
        first = await node.call(ZERO_REALM, procedure, request)
        assert first["status"] == "pending"
        replayed = await node.call(ZERO_REALM, procedure, request)
        assert replayed["status"] == "refused" and replayed["reason"] == "replayed"
        # mallory sends the member's (fresh) request as her own: the CALL's caller differs
        fresh = build_request(node.identity, NAME, service_key, "poll", service.clock())
        stolen = await mallory.call(ZERO_REALM, procedure, fresh)
        assert stolen["reason"] == "wrong_node"
        assert service.stats["refused_replayed"] == 1
        assert isinstance(service.replays, ReplayCache)


async def test_a_pinned_authority_refuses_another_one(station: Station, tmp_path: Path) -> None:
    async with (
        join_service(station, tmp_path / "owner", NAME),
        member(station, tmp_path / "member") as (_, joiner),
    ):
        with pytest.raises(JoinError) as excinfo:
            await joiner.start(NAME, authority=new_identity().node_id)
        assert excinfo.value.reason == "directory_wrong_authority"


async def test_a_lying_join_service_is_refused(station: Station, tmp_path: Path) -> None:
    """A service answering for the realm with a directory signed by someone else's key is
    accepted only without a pin; its endorsement must then verify for that key and this node."""
    impostor = new_identity()

    def about(call: Any) -> Any:
        other: Identity = new_identity()
        record = build_directory(other, NAME, now_ms=call.deadline_ms - 10_000, random10=bytes(10))
        return {"status": "ok", "service": impostor.node_id, "directory": record.to_rpc()}

    async with (
        Node(impostor, [station.endpoint]) as fake,
        member(station, tmp_path / "member") as (_, joiner),
    ):
        await fake.advertise(ZERO_REALM, join_procedure(NAME), about)
        await fake.flush()
        with pytest.raises(JoinError) as excinfo:
            await joiner.start(NAME)
        assert excinfo.value.reason == "wrong_service"


async def test_node_presents_after_each_handshake(tmp_path: Path) -> None:
    """The hook runs on the first connection and again after a reconnect; the station's
    refusal of a realm it does not protect is counted, never fatal."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = station_config(tmp_path / "station", port=port)
    identity = new_identity()
    authority = new_identity()
    store = MembershipStore(memberships_path(tmp_path, identity.node_id), identity)
    now = now_ms()
    record = build_endorsement(
        authority, NAME, identity.node_id, valid_until=now + 60_000, now_ms=now, random10=bytes(10)
    )
    store.put(
        check_endorsement(
            record,
            realm=realm_tag(NAME),
            authority=authority.node_id,
            member=identity.node_id,
            now_ms=now,
        ),
        now,
    )
    sessions: list[object] = []

    async def presenter(node: Node, session: Any) -> list[bytes]:
        sessions.append(session)
        return await store.present_on(node, session)

    async with Station(config) as first:
        node = Node(
            identity,
            [first.endpoint],
            presenter=presenter,
            backoff=Backoff(initial_s=0.05, max_s=0.2, jitter=0.1),
        )
        await node.__aenter__()
        try:
            # this station protects no realm: it answers, refusing the membership (counted)
            await eventually(lambda: store.stats.get("refused_by_station") == 1)
            assert len(sessions) == 1
        except BaseException:
            await node.__aexit__(None, None, None)
            raise
    try:
        async with Station(config):
            await eventually(lambda: len(sessions) == 2, timeout=10)
            await eventually(lambda: store.stats.get("refused_by_station") == 2)
            assert sessions[0] is not sessions[1]
    finally:
        await node.__aexit__(None, None, None)
