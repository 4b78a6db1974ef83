"""Each signature is checked once per hop, and a bad one still never reaches an application.

The station verifies a PUBLISH's frame signature (against its connection; on a connection bound
to it, issue 27, it compares the publisher with the connection instead) and its
``publisher_sig`` only where the station vouches for it further: before relaying the EVENT to a
peer station (docs/performance.md §2). Local subscribers verify ``publisher_sig`` end to end, so
a bad one that the station let through is dropped by the client core and never surfaces as an
``EventArrived``. Counts of Ed25519 calls are of the station's router only (PyNaCl patched
around ``RouterCore.frames_received``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import nacl.bindings
import pytest

from macula.client.events import EventArrived, Transmit
from macula.wire.frames import Event, Publish, new_frame_id
from macula.wire.identity import Identity, realm_tag
from relay.core.router import RouterCore
from support.identities import hardened
from support.stationmesh import Client, Mesh, MeshStation

REALM = realm_tag("test.signatures-per-hop")
TOPIC = "news"


X, Y = hardened(401), hardened(402)
ALICE, BOB, CAROL, DAVE, MALLORY = (hardened(410 + i) for i in range(5))


class Ed25519Calls:
    """Signs and verifies libsodium made while ``counting`` (patched on PyNaCl's bindings,
    which ``Identity`` and PyNaCl's key classes both call)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.signs = 0
        self.verifies = 0
        self.counting = False
        sign, verify = nacl.bindings.crypto_sign, nacl.bindings.crypto_sign_open

        def counted_sign(*args: Any, **kw: Any) -> Any:
            self.signs += self.counting
            return sign(*args, **kw)

        def counted_verify(*args: Any, **kw: Any) -> Any:
            self.verifies += self.counting
            return verify(*args, **kw)

        monkeypatch.setattr(nacl.bindings, "crypto_sign", counted_sign)
        monkeypatch.setattr(nacl.bindings, "crypto_sign_open", counted_verify)

    def watch(self, router: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
        """Count only while ``router`` handles received frames."""
        received = router.frames_received

        def counted(*args: Any) -> Any:
            with self.on():
                return received(*args)

        monkeypatch.setattr(router, "frames_received", counted)

    @contextmanager
    def on(self) -> Iterator[None]:
        outer, self.counting = self.counting, True
        try:
            yield
        finally:
            self.counting = outer


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Ed25519Calls:
    return Ed25519Calls(monkeypatch)


def subscribe(mesh: Mesh, station: MeshStation, client: Client) -> None:
    mesh.client_did(station, client, client.core.subscribe(REALM, TOPIC, mesh.clock.now))
    mesh.flush(station, client)


def publish(mesh: Mesh, station: MeshStation, client: Client, payload: Any, seq: int) -> None:
    mesh.client_did(
        station, client, client.core.publish(REALM, TOPIC, payload, seq, mesh.clock.now)
    )


def publication(mesh: Mesh, publisher: Identity, payload: Any, seq: int) -> Publish:
    return Publish(
        frame_id=new_frame_id(mesh.clock.now, random.Random(seq).randbytes(10)),
        sent_at_ms=mesh.clock.now,
        topic=TOPIC,
        realm=REALM,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        published_at_ms=mesh.clock.now,
    )


def send_raw(mesh: Mesh, station: MeshStation, client: Client, frame: Publish) -> None:
    """``frame`` signed by the client's identity, written on its control stream as is."""
    data = frame.sign_and_encode(client.core.identity)
    mesh.client_did(station, client, [Transmit(client.core.control, data)])


def forgeries(mesh: Mesh, publisher: Identity) -> list[Publish]:
    """A publisher_sig by someone else, and a genuine one moved onto other content."""
    forged = publication(mesh, publisher, b"forged", 7).with_publisher_sig(MALLORY)
    genuine = publication(mesh, publisher, b"other", 8).with_publisher_sig(publisher)
    moved = dataclasses.replace(
        publication(mesh, publisher, b"this", 8), publisher_sig=genuine.publisher_sig
    )
    return [forged, moved]


def payloads(client: Client) -> list[Any]:
    return [o.event.payload for o in client.take(EventArrived)]


# --- a bad publisher_sig ---------------------------------------------------------------------


def test_a_bad_publisher_sig_to_local_subscribers_is_dropped_by_each_client() -> None:
    mesh = Mesh()
    x = mesh.station(X)
    alice, bob, carol = (mesh.client(x, who) for who in (ALICE, BOB, CAROL))
    subscribe(mesh, x, bob)
    subscribe(mesh, x, carol)
    for frame in forgeries(mesh, ALICE):
        send_raw(mesh, x, alice, frame)
    for subscriber in (bob, carol):
        assert payloads(subscriber) == []  # never reaches the application
        assert subscriber.core.dropped["bad_publisher_sig"] == 2
    # the station left publisher_sig to the subscribers (end to end)
    assert x.router.stats["bad_publisher_sig"] == 0
    publish(mesh, x, alice, "honest", 9)
    assert payloads(bob) == payloads(carol) == ["honest"]


def test_a_bad_publisher_sig_is_refused_at_the_station_before_a_link() -> None:
    mesh = Mesh()
    x, y = mesh.station(X), mesh.station(Y)
    mesh.link(x, y)
    alice, dave = mesh.client(x, ALICE), mesh.client(x, DAVE)
    bob = mesh.client(y, BOB)
    subscribe(mesh, y, bob)  # y now follows the topic at x: x checks publisher_sig
    subscribe(mesh, x, dave)
    for frame in forgeries(mesh, ALICE):
        send_raw(mesh, x, alice, frame)
    assert x.router.stats["bad_publisher_sig"] == 2
    assert x.router.stats["events_to_stations"] == 0
    assert y.router.stats["bad_relayed_publisher_sig"] == 0  # nothing bad crossed the link
    assert payloads(bob) == payloads(dave) == []
    assert dave.core.dropped["bad_publisher_sig"] == 0  # refused whole, not sent at all
    publish(mesh, x, alice, "honest", 9)
    assert payloads(bob) == payloads(dave) == ["honest"]


@pytest.mark.parametrize("bound", [False, True])
def test_a_publisher_sig_of_the_wrong_length_is_refused_without_a_verify(
    calls: Ed25519Calls, monkeypatch: pytest.MonkeyPatch, bound: bool
) -> None:
    mesh = Mesh()
    x = mesh.station(X)
    alice, bob = mesh.client(x, ALICE, pinned=bound), mesh.client(x, BOB)
    subscribe(mesh, x, bob)
    calls.watch(x.router, monkeypatch)
    short = dataclasses.replace(publication(mesh, ALICE, b"x", 1), publisher_sig=b"\x01" * 63)
    send_raw(mesh, x, alice, short)
    assert x.router.stats["bad_publisher_sig"] == 1
    assert payloads(bob) == [] and bob.core.dropped["bad_publisher_sig"] == 0
    # the frame signature only, and on a bound connection not even that (issue 27)
    assert (calls.verifies, calls.signs) == (0 if bound else 1, 0)


def test_a_bad_frame_signature_is_still_refused_on_an_unbound_connection() -> None:
    mesh = Mesh()
    x = mesh.station(X)
    alice, bob = mesh.client(x, ALICE, pinned=False), mesh.client(x, BOB)
    subscribe(mesh, x, bob)
    frame = publication(mesh, ALICE, b"x", 1).with_publisher_sig(ALICE)
    data = frame.sign_and_encode(MALLORY)  # not the key of alice's connection
    mesh.client_did(x, alice, [Transmit(alice.core.control, data)])
    assert x.router.stats["unverified_frame"] == 1
    assert x.router.stats["publishes"] == 0
    assert payloads(bob) == []


# --- how many Ed25519 operations one publication costs the station -------------------------


@pytest.mark.parametrize("bound", [False, True])
def test_the_station_verifies_the_frame_once_and_signs_one_event_for_all_subscribers(
    calls: Ed25519Calls, monkeypatch: pytest.MonkeyPatch, bound: bool
) -> None:
    mesh = Mesh()
    x = mesh.station(X)
    alice = mesh.client(x, ALICE, pinned=bound)
    subscribers = [mesh.client(x, who) for who in (BOB, CAROL, DAVE)]
    for client in subscribers:
        subscribe(mesh, x, client)
    calls.watch(x.router, monkeypatch)
    publish(mesh, x, alice, "once", 1)
    assert [payloads(c) for c in subscribers] == [["once"]] * 3
    # a bound connection's PUBLISH: the id comparison, no verify (issue 27)
    assert (calls.verifies, calls.signs) == (0 if bound else 1, 1)


@pytest.mark.parametrize("bound", [False, True])
def test_across_a_link_each_station_checks_publisher_sig_once(
    calls: Ed25519Calls, monkeypatch: pytest.MonkeyPatch, bound: bool
) -> None:
    mesh = Mesh()
    x, y = mesh.station(X), mesh.station(Y)
    mesh.link(x, y)
    alice, bob = mesh.client(x, ALICE, pinned=bound), mesh.client(y, BOB)
    subscribe(mesh, y, bob)
    calls.watch(x.router, monkeypatch)
    calls.watch(y.router, monkeypatch)
    publish(mesh, x, alice, "over", 1)
    assert payloads(bob) == ["over"]
    # x: the frame (not on a bound connection: issue 27) and publisher_sig (before the link),
    # one EVENT signed; y: the link's frame and publisher_sig (its only authentication of the
    # content), one fresh EVENT signed
    assert (calls.verifies, calls.signs) == (3 if bound else 4, 2)


def test_the_history_hook_is_told_whether_publisher_sig_was_checked() -> None:
    mesh = Mesh()
    told: list[tuple[int, bool]] = []
    x = mesh.station(X, published=lambda frame, now_ms, checked: told.append((frame.seq, checked)))
    y = mesh.station(Y)
    alice, dave = mesh.client(x, ALICE), mesh.client(x, DAVE)
    subscribe(mesh, x, dave)
    publish(mesh, x, alice, "local only", 1)
    mesh.link(x, y)
    bob = mesh.client(y, BOB)
    subscribe(mesh, y, bob)
    publish(mesh, x, alice, "and a link", 2)
    assert told == [(1, False), (2, True)]


def test_an_unwanted_relayed_event_costs_no_publisher_sig_verify(
    calls: Ed25519Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    mesh = Mesh()
    x, y = mesh.station(X), mesh.station(Y)
    mesh.link(x, y)
    bob = mesh.client(y, BOB)
    cy = y.link_to(x)
    control = y.router.peers[cy].control
    assert control is not None

    def relayed(topic: str, seq: int, signer: Identity) -> dict[str, Any]:
        event = Event(
            frame_id=new_frame_id(mesh.clock.now, random.Random(seq).randbytes(10)),
            sent_at_ms=mesh.clock.now,
            topic=topic,
            realm=REALM,
            publisher=ALICE.node_id,
            seq=seq,
            payload=b"x",
            publisher_sig=MALLORY.sign(b"not the publication"),
        )
        return event.signed_by(signer).to_map()

    calls.watch(y.router, monkeypatch)
    y.router.frames_received(cy, control, [relayed("nobody.here", 1, X)], mesh.clock.now)
    assert y.router.stats["unwanted_relayed_event"] == 1
    assert calls.verifies == 1  # the link's frame signature only
    subscribe(mesh, y, bob)
    calls.verifies = 0
    y.router.frames_received(cy, control, [relayed(TOPIC, 2, X)], mesh.clock.now)
    assert y.router.stats["bad_relayed_publisher_sig"] == 1 and calls.verifies == 2
    assert payloads(bob) == []
