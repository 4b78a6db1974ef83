"""The station shell's part of RPC across stations, over real QUIC on loopback: a raw
connection with the station capability bit plays the linked station (the real dialling is
the links slice's). ``Station.call_station`` settles from the peer's reply, its absence and
its link's loss; a content get missing here is fetched from the linked station, verified,
cached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import pytest

from macula.wire.codes import ErrorCode
from macula.wire.content import raw_mcid
from macula.wire.frames import Advertise, Call, Result
from macula.wire.identity import Identity, realm_tag
from relay.federation.mesh_roster import MESH_PROCEDURE
from relay.station.station import Station
from support.rawclient import RawClient, link_in, raw_client, stamp

pytestmark = pytest.mark.anyio

REALM = realm_tag("test.federation-shell")
ZERO_REALM = bytes(32)


async def as_station(raw: RawClient) -> None:
    """CONNECT with the station bit: the station now holds ``raw`` as a linked station."""
    hello = await link_in(raw)
    assert hello["accepted"] == "true"


def not_introduction(received: Any) -> bool:
    """A CALL other than the station's introduction on a new link (``_mesh.stations``)."""
    procedure = received.frame.get("procedure") if received.frame_type == "call" else None
    return procedure is not None and procedure not in (MESH_PROCEDURE, MESH_PROCEDURE.encode())


def result(call_id: bytes, payload: Any, by: Identity) -> Result:
    return Result(**stamp(), call_id=call_id, payload=payload, responded_by=by.node_id)


async def test_a_station_call_is_answered_over_the_link(station: Station) -> None:
    async with raw_client(station, handshake=False) as peer:
        await as_station(peer)
        pending = asyncio.create_task(
            station.call_station(peer.node_id, "org.example.echo_v1", {"n": 1}, 5.0)
        )
        got = await peer.expect(not_introduction)
        assert got.frame["caller"] == station.node_id and got.frame["payload"] == {"n": 1}
        behind = Identity.generate(os.urandom)  # a client of the far station answers
        peer.send(result(got.frame["call_id"], "echo", behind), signer=behind)
        replied = await pending
        assert replied.ok and replied.payload == "echo"


async def test_a_station_call_settles_without_a_link_by_deadline_and_on_loss(
    station: Station,
) -> None:
    replied = await station.call_station(os.urandom(32), "org.example.echo_v1", 1, 1.0)
    assert not replied.ok and replied.code == ErrorCode.UNKNOWN_NEXT_PEER
    async with raw_client(station, handshake=False) as peer:
        await as_station(peer)
        replied = await station.call_station(peer.node_id, "org.example.echo_v1", 1, 0.3)
        assert not replied.ok and replied.code == ErrorCode.EXPIRY_TOO_SOON
        pending = asyncio.create_task(
            station.call_station(peer.node_id, "org.example.echo_v1", 1, 30.0)
        )
        await peer.expect(not_introduction, start=1)
        peer.protocol.close_connection("gone")
    replied = await asyncio.wait_for(pending, 10.0)
    assert not replied.ok and replied.code == ErrorCode.UNKNOWN_NEXT_PEER


async def test_a_client_call_is_served_behind_the_link(station: Station) -> None:
    async with raw_client(station, handshake=False) as peer, raw_client(station) as alice:
        await as_station(peer)
        advert = Advertise(
            **stamp(), realm=REALM, procedure="org.example.far_v1", advertiser=peer.node_id
        )
        peer.send(advert)
        await peer.flush()
        call = Call(
            **stamp(),
            call_id=os.urandom(16),
            procedure="org.example.far_v1",
            realm=REALM,
            payload=[1, 2],
            deadline_ms=stamp()["sent_at_ms"] + 5_000,
            caller=alice.node_id,
        )
        alice.send(call)
        got = await peer.expect(not_introduction)
        assert got.frame["caller"] == alice.node_id
        behind = Identity.generate(os.urandom)
        peer.send(result(call.call_id, 3, behind), signer=behind)
        reply = await alice.reply_to(call.call_id)
        assert reply["frame_type"] == "result" and reply["payload"] == 3


async def test_a_missing_block_is_fetched_from_the_linked_station(station: Station) -> None:
    block = b"only the far station has this"
    mcid = raw_mcid(block)
    async with raw_client(station, handshake=False) as peer, raw_client(station) as alice:
        await as_station(peer)

        async def far_station() -> None:
            ask = await peer.expect(not_introduction)
            assert ask.frame["procedure"] in ("_content.get_block", b"_content.get_block")
            assert ask.frame["payload"] == {"mcid": mcid.to_bytes(), "hops_remaining": 0}
            peer.send(result(ask.frame["call_id"], block, peer.identity))

        serving = asyncio.create_task(far_station())
        call = Call(
            **stamp(),
            call_id=os.urandom(16),
            procedure="_content.get_block",
            realm=ZERO_REALM,
            payload={"mcid": mcid.to_bytes()},
            deadline_ms=stamp()["sent_at_ms"] + 10_000,
            caller=alice.node_id,
        )
        alice.send(call)
        reply = await alice.reply_to(call.call_id)
        await serving
        assert reply["payload"] == block
        # cached: asked again, the station answers without asking the peer
        again = dataclasses.replace(call, **stamp(), call_id=os.urandom(16), signature=None)
        alice.send(again)
        assert (await alice.reply_to(again.call_id))["payload"] == block
        assert len([r for r in peer.received if not_introduction(r)]) == 1
