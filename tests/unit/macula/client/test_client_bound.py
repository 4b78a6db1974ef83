"""Each claim verified once (issue 27): the client side, paired with a real router core.

Our client names the station it pinned in its CONNECT (``bound_to``), so the station admits its
frames on the id comparison; on a connection whose TLS proved the pinned key (``tls_pinned``)
it does not verify what only the station can have sent (HELLO, a built-in's RESULT, EVENT
frames), and still verifies ``publisher_sig`` once and every frame another node signed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from macula.client.core import ClientCore
from macula.client.events import EventArrived, HandshakeFailed, Transmit
from macula.wire.frames import Hello, new_frame_id
from macula.wire.framing import FrameDecoder
from support.pairkit import ALICE, BOB, REALM, STATION, Link, established
from support.stationmesh import Clock
from support.verifycount import Verifies


def connect_map(core: ClientCore) -> dict[str, Any]:
    [out] = core.connect(1_767_225_600_000)
    assert isinstance(out, Transmit)
    [frame_map] = FrameDecoder().feed(out.data)
    return dict(frame_map)


def station_hello(signer: Any = STATION, **extras: Any) -> dict[str, Any]:
    """An accepted HELLO naming STATION, signed by ``signer``, with ``extras``, as a map."""
    return (
        Hello(
            frame_id=new_frame_id(1_767_225_600_000, bytes(10)),
            sent_at_ms=1_767_225_600_000,
            node_id=STATION.node_id,
            station_id=STATION.node_id,
            accepted=True,
            negotiated_capabilities=0,
            extras=extras,
        )
        .signed_by(signer)
        .to_map()
    )


def test_a_pinned_client_binds_its_connect_to_the_station() -> None:
    core = ClientCore(ALICE, random.Random(1).randbytes, pinned=STATION.node_id)
    assert connect_map(core)["bound_to"] == STATION.node_id


def test_an_unpinned_client_sends_the_connect_it_always_sent() -> None:
    core = ClientCore(ALICE, random.Random(1).randbytes)
    assert "bound_to" not in connect_map(core)


def test_the_station_binds_a_pinned_clients_connection() -> None:
    link = Link(Clock())
    alice = established(link, ALICE)
    assert link.router.peers[alice.conn].bound is True


def test_a_tls_pinned_client_does_not_verify_the_stations_hello(verifies: Verifies) -> None:
    link = Link(Clock())
    with verifies.on():
        established(link, ALICE, tls_pinned=True)
    assert verifies.n == 1  # the station's verify of the CONNECT, nothing at the client


def test_a_client_without_tls_proof_still_verifies_the_hello(verifies: Verifies) -> None:
    link = Link(Clock())
    with verifies.on():
        established(link, ALICE)
    assert verifies.n == 2


def test_a_builtins_result_on_a_tls_pinned_connection_costs_no_verify(
    verifies: Verifies,
) -> None:
    link = Link(Clock())
    alice = established(link, ALICE, tls_pinned=True)
    with verifies.on():
        link.flush(alice)  # _relay.ping: CALL, RESULT signed by the station
    assert verifies.n == 0


def test_without_tls_proof_a_builtins_result_is_verified(verifies: Verifies) -> None:
    link = Link(Clock())
    alice = established(link, ALICE)
    with verifies.on():
        link.flush(alice)
    assert verifies.n == 1


def test_a_delivery_costs_one_verify_end_to_end(verifies: Verifies) -> None:
    link = Link(Clock())
    alice, bob = established(link, ALICE, tls_pinned=True), established(link, BOB, tls_pinned=True)
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    with verifies.on():
        link.client_did(alice, alice.core.publish(REALM, "news", "hi", 1, link.clock.now))
    assert [o.authenticated for o in bob.take(EventArrived)] == [True]
    assert verifies.n == 1  # bob's publisher_sig, nothing at the station


def test_tls_pinned_without_a_pinned_key_still_verifies_the_hello() -> None:
    """``tls_pinned`` means TLS proved *the pinned* key: with none pinned it proves nothing."""
    core = ClientCore(ALICE, random.Random(1).randbytes, tls_pinned=True)
    core.connect(1_767_225_600_000)
    hello = station_hello(signer=BOB)  # not the key it names
    out = core.frames_received(0, [hello], 1_767_225_600_000)
    assert [type(o) for o in out if isinstance(o, HandshakeFailed)] == [HandshakeFailed]


def _published(end: Any, link: Link, seq: int) -> dict[str, Any]:
    """The PUBLISH ``end`` sends (decoded), after it went to the station."""
    out = end.core.publish(REALM, "news", "hi", seq, link.clock.now)
    [transmit] = [o for o in out if isinstance(o, Transmit)]
    [frame_map] = FrameDecoder().feed(transmit.data)
    link.client_did(end, out)
    return dict(frame_map)


def test_a_station_that_binds_us_gets_our_publish_without_its_frame_signature(
    verifies: Verifies,
) -> None:
    """Its HELLO names us back (``bound_to``): the station checks our frames by id, so the
    PUBLISH's frame signature would be verified by nobody and is not made; ``publisher_sig``,
    end to end, is, and the subscriber verifies it."""
    link = Link(Clock())
    alice, bob = established(link, ALICE, tls_pinned=True), established(link, BOB, tls_pinned=True)
    assert alice.core.station_binds is True
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    with verifies.on():
        sent = _published(alice, link, 1)
    assert "signature" not in sent and len(sent["publisher_sig"]) == 64
    assert [(o.event.payload, o.authenticated) for o in bob.take(EventArrived)] == [("hi", True)]
    assert verifies.n == 1  # bob's publisher_sig


@pytest.mark.parametrize("how", ["unpinned", "hello_not_proven_by_tls"])
def test_otherwise_every_publish_is_signed(how: str) -> None:
    """No binding (nothing pinned: no ``bound_to`` either way), or a HELLO that TLS did not
    prove (verified by its signature instead): the client signs as it always did."""
    link = Link(Clock())
    kw = {"tls_pinned": True, "unpinned": True} if how == "unpinned" else {"tls_pinned": False}
    alice = established(link, ALICE, **kw)
    assert alice.core.station_binds is False
    sent = _published(alice, link, 1)
    assert len(sent["signature"]) == 64 and len(sent["publisher_sig"]) == 64


def test_a_hello_that_names_another_node_binds_nothing() -> None:
    core = ClientCore(ALICE, random.Random(1).randbytes, pinned=STATION.node_id, tls_pinned=True)
    core.connect(1_767_225_600_000)
    core.frames_received(0, [station_hello(bound_to=BOB.node_id)], 1_767_225_600_000)
    assert core.state.name == "ESTABLISHED" and core.station_binds is False


def test_an_unbound_connections_publish_without_a_signature_is_dropped() -> None:
    """A PUBLISH without its frame signature is admitted only on a connection bound to this
    station; anywhere else it is dropped as any frame that does not verify."""
    link = Link(Clock())
    alice = established(link, ALICE, tls_pinned=True, unpinned=True)  # unbound
    bob = established(link, BOB, tls_pinned=True)
    assert link.router.peers[alice.conn].bound is False
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    alice.core.station_binds = True  # a client that leaves it out anyway
    sent = _published(alice, link, 1)
    assert "signature" not in sent
    assert bob.take(EventArrived) == []
    assert link.router.stats["publishes"] == 0
