"""Each claim verified once (issue 27) over real QUIC on loopback: our pinned client's
connection is bound (its CONNECT names the station), a CONNECT bound to one station is refused
by another, and a raw v2 client that names no station (no ``bound_to``, no ``publisher_sig``)
still has every frame verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.frames import Connect, Publish
from macula.wire.identity import DOMAIN_FRAME, verify
from relay.core.peers import Peer
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.rawclient import raw_client, stamp
from support.waiting import eventually

pytestmark = pytest.mark.anyio


def peer_of(station: Station, node_id: bytes) -> Peer:
    return station.core.peers[station.core.node_conn[node_id]]


async def test_our_pinned_nodes_are_bound_and_call_each_other(tmp_path: Path) -> None:
    async with (
        Station(station_config(tmp_path / "s")) as station,
        Node(new_identity(), [station.endpoint]) as provider,
        Node(new_identity(), [station.endpoint]) as caller,
    ):

        async def echo(call: IncomingCall) -> Any:
            return {"echo": call.payload}

        await provider.advertise(REALM, "org.example.echo_v1", echo)
        await provider.flush()
        assert await caller.call(REALM, "org.example.echo_v1", {"n": 1}) == {"echo": {"n": 1}}
        assert peer_of(station, provider.identity.node_id).bound
        assert peer_of(station, caller.identity.node_id).bound
        assert station.core.stats["foreign_signer"] == 0


async def test_a_station_that_binds_our_node_gets_its_publish_without_a_frame_signature(
    tmp_path: Path,
) -> None:
    """The station's HELLO names our pinned node back in ``bound_to``: its PUBLISHes go
    without the frame signature nobody would verify, with ``publisher_sig``, and arrive
    verified end to end."""
    async with (
        Station(station_config(tmp_path / "s")) as station,
        Node(new_identity(), [station.endpoint]) as publisher,
        Node(new_identity(), [station.endpoint]) as subscriber,
    ):
        seen: list[dict[str, Any]] = []
        frames_received = station.core.frames_received

        def recorded(conn: int, stream: int, frames: list[Any], now: int) -> Any:
            seen.extend(dict(f) for f in frames if f.get("frame_type") == "publish")
            return frames_received(conn, stream, frames, now)

        station.core.frames_received = recorded  # type: ignore[method-assign]
        watch = await subscriber.subscribe(REALM, "bound")
        await subscriber.flush()
        await publisher.publish(REALM, "bound", {"n": 1})
        event = await watch.next(5)
        assert event.payload == {"n": 1} and event.authenticated
        assert publisher._session is not None and publisher._session.core.station_binds
        [publish] = seen
        assert "signature" not in publish and len(publish["publisher_sig"]) == 64


async def test_a_connect_bound_to_station_a_is_refused_by_station_b(tmp_path: Path) -> None:
    async with (
        Station(station_config(tmp_path / "a")) as a,
        Station(station_config(tmp_path / "b")) as b,
        raw_client(a, handshake=False) as at_a,
        raw_client(b, handshake=False) as at_b,
    ):
        connect = Connect(
            **stamp(),
            node_id=at_a.node_id,
            station_id=at_a.node_id,
            puzzle_evidence=at_a.identity.puzzle_evidence,
            bound_to=a.node_id,
        )
        at_a.control = at_a.new_stream()
        captured = at_a.send(connect)  # what station A saw
        hello_a = await at_a.expect(lambda r: r.frame_type == "hello")
        assert hello_a.frame["accepted"] == "true"
        # the HELLO names the bound client back (an extra field), and a strict v2 client that
        # verifies it over every key it received, unknown ones included (§2.5), accepts it
        assert hello_a.frame["bound_to"] == at_a.node_id
        assert verifies_as_received(hello_a.frame, a.node_id)
        at_b.control = at_b.new_stream()
        at_b.send_bytes(captured)  # A replays it to B, well within the skew window
        hello_b = await at_b.expect(lambda r: r.frame_type == "hello")
        assert hello_b.frame["accepted"] == "false"
        assert hello_b.frame["refusal_code"] == ErrorCode.SIGNATURE_INVALID
        assert b.core.stats["connects_bound_elsewhere"] == 1
        await at_b.wait_lost()
        assert peer_of(a, at_a.node_id).bound


def verifies_as_received(frame_map: dict[str, Any], key: bytes) -> bool:
    """§4.2 as another v2 client checks it: the signature over the canonical map it received,
    without ``signature``."""
    unsigned = {k: v for k, v in frame_map.items() if k != "signature"}
    return verify(key, DOMAIN_FRAME + cbor.encode(unsigned), frame_map["signature"])


async def test_a_client_that_binds_nothing_gets_the_hello_it_always_got(tmp_path: Path) -> None:
    """A CONNECT without ``bound_to`` (every other v2 client): no ``bound_to`` in the HELLO."""
    async with (
        Station(station_config(tmp_path / "s")) as station,
        raw_client(station, handshake=False) as raw,
    ):
        connect = Connect(
            **stamp(),
            node_id=raw.node_id,
            station_id=raw.node_id,
            puzzle_evidence=raw.identity.puzzle_evidence,
        )
        raw.control = raw.new_stream()
        raw.send(connect)
        hello = await raw.expect(lambda r: r.frame_type == "hello")
        assert hello.frame["accepted"] == "true" and "bound_to" not in hello.frame
        assert verifies_as_received(hello.frame, station.node_id)


async def test_an_unbound_raw_client_still_has_every_frame_verified(tmp_path: Path) -> None:
    async with (
        Station(station_config(tmp_path / "s")) as station,
        Node(new_identity(), [station.endpoint]) as subscriber,
        raw_client(station) as raw,
    ):
        assert not peer_of(station, raw.node_id).bound
        sub = await subscriber.subscribe(REALM, "raw.news")
        await subscriber.flush()

        def publish(seq: int, payload: bytes) -> Publish:
            fields = stamp()
            return Publish(
                **fields,
                topic="raw.news",
                realm=REALM,
                publisher=raw.node_id,
                seq=seq,
                payload=payload,
                published_at_ms=fields["sent_at_ms"],
            )

        forged = publish(1, b"forged")
        raw.send(forged, signer=new_identity())  # its own frame, badly signed
        raw.send(publish(2, b"genuine"))
        await raw.flush()
        delivery = await sub.next(5)
        assert (delivery.payload, delivery.authenticated) == (b"genuine", False)
        await eventually(lambda: station.core.stats["unverified_frame"] == 1)
