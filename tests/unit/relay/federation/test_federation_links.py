"""Station links and pub/sub across stations, sans-I/O: RouterCores joined in memory.

Bytes move only when the test pumps the network (real frame bytes through ``FrameDecoder``);
time moves only when the test steps the clock. Clients are raw: they sign the frames they
send, and what a station sends them is decoded and parsed as a client would.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from macula.wire.frames import (
    CAP_STATION,
    Connect,
    Event,
    Frame,
    Goodbye,
    Hello,
    Publish,
    Subscribe,
    Unsubscribe,
    new_frame_id,
    parse_frame,
)
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag
from relay.core.actions import Action, Close, LinkDown, LinkUp, Send
from relay.core.frames import DELIVERED_VIA_RELAYED, dht_port_of
from relay.core.policy import Quotas, StationPolicy
from relay.core.router import RouterCore
from relay.federation.dedup import RelayedEventDedup
from support.identities import hardened

NOW = 1_767_225_600_000
REALM = realm_tag("test.federation")
TOPIC = "news"


# three station identities in ascending node-id order (the duplicate rule compares them)
_STATIONS = sorted((hardened(200 + i) for i in range(3)), key=lambda i: i.node_id)
LOW, MID, HIGH = _STATIONS
ALICE, BOB, CAROL, DAVE = hardened(31), hardened(32), hardened(33), hardened(34)
_rng = random.Random(5)


class Clock:
    def __init__(self) -> None:
        self.now = NOW


def stamp(clock: Clock) -> dict[str, Any]:
    return {"frame_id": new_frame_id(clock.now, _rng.randbytes(10)), "sent_at_ms": clock.now}


@dataclass(eq=False)
class Router:
    name: str
    identity: Identity
    core: RouterCore
    actions: list[Action] = field(default_factory=list)  # every action it produced
    streams: dict[int, int] = field(default_factory=dict)

    def of(self, kind: type[Any]) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


@dataclass
class Client:
    identity: Identity
    router: Router
    conn: int
    received: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0

    def events(self) -> list[Event]:
        frames = [parse_frame(m) for m in self.received if m.get("frame_type") == "event"]
        return [f for f in frames if isinstance(f, Event)]


End = tuple[Router, int]


class Net:
    """Routers and raw clients; each pipe joins two ends (a router conn to a router conn, or
    a router conn to a client). Actions are carried out in FIFO order by ``pump``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.routers: dict[str, Router] = {}
        self.pipes: dict[End, End | Client] = {}
        self.decoders: dict[tuple[str, int, int], FrameDecoder] = {}
        self.client_decoders: dict[tuple[int, int], FrameDecoder] = {}
        self.queue: deque[tuple[Router, Action]] = deque()
        self._conns = iter(range(1, 10_000))

    def router(self, name: str, identity: Identity, **policy: Any) -> Router:
        streams: dict[int, int] = {}

        def open_stream(conn: int) -> int:
            stream = streams.get(conn, 0)
            streams[conn] = stream + 4
            return stream

        core = RouterCore(
            identity,
            StationPolicy(**policy),
            open_stream=open_stream,
            random_bytes=random.Random(name).randbytes,
        )
        router = self.routers[name] = Router(name, identity, core, streams=streams)
        return router

    # --- joining ------------------------------------------------------------------------

    def connect(self, dialler: Router, target: Router, expected: bytes | None = None) -> int:
        """``dialler`` dials ``target`` (not pumped); the dialler's conn id."""
        mine, theirs = next(self._conns), next(self._conns)
        self.pipes[(dialler, mine)] = (target, theirs)
        self.pipes[(target, theirs)] = (dialler, mine)
        self.run(target, target.core.connection_made(theirs, self.clock.now, "10.0.0.9"))
        node = target.identity.node_id if expected is None else expected
        self.run(dialler, dialler.core.dial(mine, node, self.clock.now, host=target.name))
        return mine

    def link(self, dialler: Router, target: Router) -> int:
        conn = self.connect(dialler, target)
        self.pump()
        return conn

    def client(self, identity: Identity, router: Router) -> Client:
        conn = next(self._conns)
        client = Client(identity, router, conn)
        self.pipes[(router, conn)] = client
        self.run(router, router.core.connection_made(conn, self.clock.now, "10.0.0.1"))
        self.send(
            client,
            Connect(
                **stamp(self.clock),
                node_id=identity.node_id,
                station_id=identity.node_id,
                puzzle_evidence=identity.puzzle_evidence,
            ),
        )
        assert client.received and client.received[0]["frame_type"] == "hello"
        return client

    # --- client helpers -----------------------------------------------------------------

    def send(self, client: Client, frame: Frame) -> None:
        self.client_bytes(client, frame.sign_and_encode(client.identity))

    def client_bytes(self, client: Client, data: bytes) -> None:
        decoder = self.decoders.setdefault((client.router.name, client.conn, 0), FrameDecoder())
        frames = decoder.feed(data)
        self.run(
            client.router,
            client.router.core.frames_received(client.conn, 0, frames, self.clock.now),
        )
        self.pump()

    def subscribe(self, client: Client, topic: str = TOPIC) -> None:
        me = client.identity.node_id
        self.send(client, Subscribe(**stamp(self.clock), topic=topic, realm=REALM, subscriber=me))

    def unsubscribe(self, client: Client, topic: str = TOPIC) -> None:
        me = client.identity.node_id
        self.send(client, Unsubscribe(**stamp(self.clock), topic=topic, realm=REALM, subscriber=me))

    def publication(self, client: Client, payload: Any, topic: str = TOPIC) -> Publish:
        client.seq += 1
        return Publish(
            **stamp(self.clock),
            topic=topic,
            realm=REALM,
            publisher=client.identity.node_id,
            seq=client.seq,
            payload=payload,
            published_at_ms=self.clock.now,
        )

    def publish(
        self, client: Client, payload: Any, topic: str = TOPIC, signed: bool = True
    ) -> None:
        frame = self.publication(client, payload, topic)
        self.send(client, frame.with_publisher_sig(client.identity) if signed else frame)

    def from_station(
        self, sender: Router, receiver: Router, frame: Frame, signer: Identity | None = None
    ) -> None:
        """Frames ``sender`` writes on its link with ``receiver`` (signed by ``signer``)."""
        conn = self.link_conn(sender, receiver)
        stream = sender.core.peers[conn].control
        assert stream is not None
        data = frame.sign_and_encode(signer or sender.identity)
        self.queue.append((sender, Send(conn, stream, data)))
        self.pump()

    def link_conn(self, router: Router, other: Router) -> int:
        return router.core.node_conn[other.identity.node_id]

    # --- moving bytes -------------------------------------------------------------------

    def run(self, router: Router, actions: list[Action]) -> None:
        self.queue.extend((router, a) for a in actions)

    def pump(self) -> None:
        while self.queue:
            router, action = self.queue.popleft()
            router.actions.append(action)
            other = self.pipes.get((router, action.conn))
            if isinstance(action, Send) and other is not None:
                if isinstance(other, Client):
                    key = (other.conn, action.stream)
                    decoded = self.client_decoders.setdefault(key, FrameDecoder()).feed(action.data)
                    other.received.extend(decoded)
                else:
                    peer, conn = other
                    key3 = (peer.name, conn, action.stream)
                    frames = self.decoders.setdefault(key3, FrameDecoder()).feed(action.data)
                    if conn in peer.core.peers:
                        self.run(
                            peer,
                            peer.core.frames_received(conn, action.stream, frames, self.clock.now),
                        )
            elif isinstance(action, Close):
                self.cut(router, action.conn)

    def cut(self, router: Router, conn: int) -> None:
        """The connection is gone, for both ends."""
        other = self.pipes.pop((router, conn), None)
        self.run(router, router.core.connection_lost(conn, self.clock.now))
        if isinstance(other, tuple):
            self.pipes.pop(other, None)
            peer, peer_conn = other
            self.run(peer, peer.core.connection_lost(peer_conn, self.clock.now))

    def step(self, ms: int) -> None:
        self.clock.now += ms
        for router in self.routers.values():
            self.run(router, router.core.tick(self.clock.now))
        self.pump()


def linked(router: Router) -> dict[bytes, int]:
    """node id -> conn of the links ``router`` holds now."""
    return {p.node_id: p.conn for p in router.core.peers.values() if p.linked}


def goodbyes(client_or_frames: list[dict[str, Any]]) -> list[str]:
    return [m["reason"] for m in client_or_frames if m.get("frame_type") == "goodbye"]


@pytest.fixture
def net() -> Net:
    return Net(Clock())


def three(net: Net, **policy: Any) -> tuple[Router, Router, Router]:
    a, b, c = (net.router(n, i, **policy) for n, i in (("a", LOW), ("b", MID), ("c", HIGH)))
    net.link(a, b)
    net.link(a, c)
    net.link(b, c)
    return a, b, c


# --- links ----------------------------------------------------------------------------------


def test_dial_and_hello_bring_the_link_up_on_both_sides(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    a.core.dht_started(7001)
    b.core.dht_started(7002)
    conn = net.link(a, b)
    (up_a,) = a.of(LinkUp)
    (up_b,) = b.of(LinkUp)
    assert up_a == LinkUp(conn, MID.node_id, "b", 7002)
    assert (up_b.node_id, up_b.host, up_b.dht_port) == (LOW.node_id, "10.0.0.9", 7001)
    assert a.core.peers[conn].is_station and b.core.peers[up_b.conn].is_station
    assert a.core.stats["links_up"] == b.core.stats["links_up"] == 1
    # the CONNECT a sent carried the station bit and its DHT port
    connect = parse_frame(FrameDecoder().feed(a.of(Send)[0].data)[0])
    assert isinstance(connect, Connect) and connect.capabilities & CAP_STATION
    assert connect.addresses == [{"proto": "dht", "port": 7001}]


def test_a_station_without_dht_says_no_address(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    assert [u.dht_port for u in a.of(LinkUp) + b.of(LinkUp)] == [0, 0]
    connect = parse_frame(FrameDecoder().feed(a.of(Send)[0].data)[0])
    assert isinstance(connect, Connect) and connect.addresses == []


def test_the_loss_of_a_link_is_told_on_both_sides_once(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    conn = net.link(a, b)
    net.cut(a, conn)
    net.pump()
    assert a.of(LinkDown) == [LinkDown(conn, MID.node_id)]
    assert [d.node_id for d in b.of(LinkDown)] == [LOW.node_id]
    net.run(a, a.core.connection_lost(conn, net.clock.now))  # reported twice: no second one
    net.pump()
    assert len(a.of(LinkDown)) == 1
    assert linked(a) == {} and linked(b) == {}


def test_a_refused_hello_closes_the_link_with_a_reason(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    b.core.stopping = True  # b refuses every handshake (retryably)
    conn = net.link(a, b)
    (close,) = [c for c in a.of(Close) if c.conn == conn]
    assert "refused by the station" in close.reason
    assert a.core.stats["links_refused"] == 1
    assert a.of(LinkUp) == [] and b.of(LinkUp) == []


def test_a_hello_from_another_station_key_is_refused(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    conn = net.connect(a, b, expected=HIGH.node_id)  # a believes b is HIGH
    net.pump()
    (close,) = [c for c in a.of(Close) if c.conn == conn]
    assert "HELLO from" in close.reason
    assert a.core.stats["link_hello_invalid"] == 1
    assert a.of(LinkUp) == []


def test_a_forged_hello_signature_is_refused(net: Net) -> None:
    a = net.router("a", LOW)
    conn = 99
    net.run(a, a.core.dial(conn, MID.node_id, net.clock.now, host="b"))
    net.pump()
    hello = Hello(
        **stamp(net.clock),
        capabilities=CAP_STATION,
        node_id=MID.node_id,
        station_id=MID.node_id,
        accepted=True,
        negotiated_capabilities=CAP_STATION,
    )
    forged = FrameDecoder().feed(hello.sign_and_encode(HIGH))  # the right id, another key
    net.run(a, a.core.frames_received(conn, 0, forged, net.clock.now))
    net.pump()
    (close,) = a.of(Close)
    assert "signature" in close.reason
    assert a.core.stats["link_hello_invalid"] == 1 and a.of(LinkUp) == []


def test_a_dialled_station_that_never_answers_times_out(net: Net) -> None:
    a = net.router("a", LOW)
    net.run(a, a.core.dial(5, MID.node_id, net.clock.now))
    net.step(StationPolicy().handshake_timeout_ms + 1)
    assert [c.reason for c in a.of(Close)] == ["handshake timeout"]
    assert 5 not in a.core.peers


def test_bad_dht_addresses_are_ignored() -> None:
    assert dht_port_of([{"proto": "dht", "port": 4000}]) == 4000
    for bad in (
        None,
        "x",
        [1],
        [{"proto": "dht"}],
        [{"proto": "dht", "port": 70000}],
        [{"proto": "dht", "port": "80"}],
        [{"proto": "dht", "port": True}],
        [{"proto": "quic", "port": 80}],
        {"proto": "dht", "port": 1},
    ):
        assert dht_port_of(bad) == 0


def test_a_connect_with_odd_addresses_still_links(net: Net) -> None:
    b = net.router("b", MID)
    net.run(b, b.core.connection_made(7, net.clock.now, "10.0.0.3"))
    connect = Connect(
        **stamp(net.clock),
        capabilities=CAP_STATION,
        node_id=LOW.node_id,
        station_id=LOW.node_id,
        puzzle_evidence=LOW.puzzle_evidence,
        addresses=[{"proto": "dht", "port": -1}, "junk", {1: 2}],
    )
    net.run(
        b,
        b.core.frames_received(
            7, 0, FrameDecoder().feed(connect.sign_and_encode(LOW)), net.clock.now
        ),
    )
    net.pump()
    assert b.of(LinkUp) == [LinkUp(7, LOW.node_id, "10.0.0.3", 0)]


def test_of_two_simultaneous_links_the_lower_ids_dial_wins(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    by_a = net.connect(a, b)
    by_b = net.connect(b, a)
    net.pump()
    winner_at_b = b.core.peers[net.pipes[(a, by_a)][1]]  # type: ignore[index]
    assert linked(a) == {MID.node_id: by_a}
    assert linked(b) == {LOW.node_id: winner_at_b.conn}
    assert a.core.stats["duplicate_links"] + b.core.stats["duplicate_links"] >= 1
    # the connection b dialled is gone on both sides, with GOODBYE duplicate_link
    assert by_b not in b.core.peers or not b.core.peers[by_b].linked
    sent = [f for s in a.of(Send) + b.of(Send) for f in FrameDecoder().feed(s.data)]
    assert "duplicate_link" in goodbyes(sent)
    # pub/sub runs over the winner
    alice, bob = net.client(ALICE, a), net.client(BOB, b)
    net.subscribe(bob)
    net.publish(alice, "once")
    assert [e.payload for e in bob.events()] == ["once"]


def test_a_redial_by_the_same_station_replaces_the_old_link(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    first = net.link(a, b)
    second = net.link(a, b)
    assert linked(a) == {MID.node_id: second}
    assert [d.conn for d in a.of(LinkDown)] == [first]
    assert len(b.of(LinkUp)) == 2 and len(b.of(LinkDown)) == 1


# --- interest -----------------------------------------------------------------------------


def test_interest_is_told_on_first_subscriber_and_withdrawn_on_the_last(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    key = (REALM, TOPIC.encode())
    bob, carol = net.client(BOB, b), net.client(CAROL, b)
    net.subscribe(bob)
    assert a.core.subscriptions.subscribers(key) == {MID.node_id}
    net.subscribe(carol)
    assert b.core.stats["interest_announced"] == 1  # not told twice
    net.unsubscribe(bob)
    assert a.core.subscriptions.subscribers(key) == {MID.node_id}
    net.cut(b, carol.conn)  # the last local subscriber leaves by disconnecting
    net.pump()
    assert a.core.subscriptions.subscribers(key) == set()
    assert b.core.stats["interest_withdrawn"] == 1


def test_interest_is_replayed_when_a_link_comes_up(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    bob = net.client(BOB, b)
    net.subscribe(bob, "one")
    net.subscribe(bob, "two")
    net.link(a, b)
    assert set(a.core.subscriptions.keys_for(MID.node_id)) == {(REALM, b"one"), (REALM, b"two")}
    # the loss of the link forgets b's interest at a
    net.cut(a, net.link_conn(a, b))
    net.pump()
    assert a.core.subscriptions.keys_for(MID.node_id) == []


def test_a_station_peers_subscriptions_have_their_own_quota(net: Net) -> None:
    quotas = Quotas(max_subscriptions=5, max_station_subscriptions=2)
    a, b = net.router("a", LOW, quotas=quotas), net.router("b", MID, quotas=quotas)
    net.link(a, b)
    bob = net.client(BOB, b)
    for topic in ("t1", "t2", "t3"):
        net.subscribe(bob, topic)
    assert b.core.subscriptions.count_for(BOB.node_id) == 3  # a client: 5 allowed
    assert a.core.subscriptions.count_for(MID.node_id) == 2
    assert a.core.stats["subscription_quota"] == 1


# --- events -------------------------------------------------------------------------------


def test_an_event_crosses_exactly_once_and_only_towards_subscribers(net: Net) -> None:
    a, b, c = three(net)
    alice, carol = net.client(ALICE, a), net.client(CAROL, c)
    local = net.client(DAVE, a)
    net.subscribe(carol)
    net.subscribe(local)
    net.publish(alice, {"n": 1})
    (event,) = carol.events()
    assert (event.payload, event.publisher, event.delivered_via) == (
        {"n": 1},
        ALICE.node_id,
        DELIVERED_VIA_RELAYED,
    )
    assert event.publisher_sig_valid() and event.verifies(HIGH.node_id)  # c signed it
    assert [e.delivered_via for e in local.events()] == ["direct"]
    assert a.core.stats["events_to_stations"] == 1
    assert c.core.stats["relayed_events_received"] == 1
    assert b.core.stats["relayed_events_received"] == 0
    assert not any(
        f.get("frame_type") == "event"
        for s in a.of(Send)
        if s.conn == net.link_conn(a, b)
        for f in FrameDecoder().feed(s.data)
    )


def test_an_unsigned_publication_goes_to_stations_attested_by_its_station(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    alice, bob = net.client(ALICE, a), net.client(BOB, b)
    net.subscribe(bob)
    net.publish(alice, "plain", signed=False)
    (event,) = bob.events()
    assert (event.payload, event.publisher, event.publisher_sig) == ("plain", ALICE.node_id, None)
    assert event.attested_by == LOW.node_id and event.verifies(MID.node_id)  # b signed it
    assert a.core.stats["unsigned_events_not_relayed"] == 0
    assert b.core.stats["relayed_attested_events_received"] == 1


def test_an_unsigned_publication_of_a_protected_realm_is_not_sent_to_stations(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    alice, bob = net.client(ALICE, a), net.client(BOB, b)
    net.subscribe(bob)
    a.core.interest.federation._protects = lambda realm: realm == REALM  # as realms.py would say
    net.publish(alice, "plain", signed=False)
    assert bob.events() == []
    assert a.core.stats["unsigned_events_not_relayed"] == 1


def relayed(net: Net, publisher: Identity, seq: int, payload: Any, sig: bytes | None) -> Event:
    return Event(
        **stamp(net.clock),
        topic=TOPIC,
        realm=REALM,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        publisher_sig=sig,
    )


def signature(publisher: Identity, seq: int, payload: Any) -> bytes:
    publish = Publish(
        frame_id=bytes(16),
        sent_at_ms=NOW,
        topic=TOPIC,
        realm=REALM,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        published_at_ms=NOW,
    ).with_publisher_sig(publisher)
    assert publish.publisher_sig is not None
    return publish.publisher_sig


def test_a_replayed_event_is_delivered_once_within_the_window(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    bob = net.client(BOB, b)
    net.subscribe(bob)
    sig = signature(ALICE, 7, "x")
    net.from_station(a, b, relayed(net, ALICE, 7, "x", sig))
    net.from_station(a, b, relayed(net, ALICE, 7, "x", sig))  # a fresh frame, same event
    assert [e.payload for e in bob.events()] == ["x"]
    assert b.core.stats["duplicate_relayed_event"] == 1
    net.step(StationPolicy().relayed_event_dedup_ms + 1)  # the window passed: new again
    net.from_station(a, b, relayed(net, ALICE, 7, "x", sig))
    assert len(bob.events()) == 2


def test_an_event_without_publisher_sig_from_a_station_is_delivered_as_its_attestation(
    net: Net,
) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    bob = net.client(BOB, b)
    net.subscribe(bob)
    net.from_station(a, b, relayed(net, ALICE, 1, "unsigned", None))
    net.from_station(a, b, relayed(net, ALICE, 1, "unsigned", None))  # the same again
    (event,) = bob.events()
    assert (event.payload, event.attested_by, event.delivered_via) == (
        "unsigned",
        LOW.node_id,
        DELIVERED_VIA_RELAYED,
    )
    assert b.core.stats["duplicate_relayed_event"] == 1


def test_unsigned_events_never_shadow_a_signed_one_or_another_stations(net: Net) -> None:
    a, b, c = net.router("a", LOW), net.router("b", MID), net.router("c", HIGH)
    net.link(a, b)
    net.link(c, b)
    bob = net.client(BOB, b)
    net.subscribe(bob)
    net.from_station(c, b, relayed(net, ALICE, 5, "c says", None))  # first, unsigned
    net.from_station(a, b, relayed(net, ALICE, 5, "a says", None))
    net.from_station(a, b, relayed(net, ALICE, 5, "x", signature(ALICE, 5, "x")))
    assert [(e.payload, e.attested_by) for e in bob.events()] == [
        ("c says", HIGH.node_id),
        ("a says", LOW.node_id),
        ("x", None),
    ]


def test_an_event_claiming_another_stations_attestation_is_refused(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    bob = net.client(BOB, b)
    net.subscribe(bob)
    forged = relayed(net, ALICE, 1, "unsigned", None)
    net.from_station(a, b, dataclasses.replace(forged, attested_by=HIGH.node_id))
    signed = relayed(net, ALICE, 2, "x", signature(ALICE, 2, "x"))
    net.from_station(a, b, dataclasses.replace(signed, attested_by=HIGH.node_id))
    assert bob.events() == []
    assert dict(b.core.refusals_of(net.link_conn(b, a))) == {"forged_attestation": 2}


def test_an_unsigned_event_of_a_protected_realm_from_a_station_is_dropped(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    bob = net.client(BOB, b)
    net.subscribe(bob)
    b.core.interest.federation._protects = lambda realm: realm == REALM
    net.from_station(a, b, relayed(net, ALICE, 1, "unsigned", None))
    assert bob.events() == []
    assert b.core.stats["unsigned_relayed_event"] == 1
    assert dict(b.core.refusals_of(net.link_conn(b, a))) == {"unsigned_relayed_event": 1}


def test_a_forged_publisher_sig_is_dropped_and_honest_delivery_goes_on(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    alice, bob = net.client(ALICE, a), net.client(BOB, b)
    net.subscribe(bob)
    # a (now hostile) claims Alice published this: signed by a itself, not by Alice
    net.from_station(a, b, relayed(net, ALICE, 50, "forged", signature(CAROL, 50, "forged")))
    net.from_station(a, b, relayed(net, ALICE, 51, "forged", bytes(64)))
    assert b.core.stats["bad_relayed_publisher_sig"] == 2
    net.publish(alice, "honest")
    assert [e.payload for e in bob.events()] == ["honest"]


def test_an_event_from_a_station_that_nobody_here_wants_is_dropped(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    net.from_station(a, b, relayed(net, ALICE, 3, "x", signature(ALICE, 3, "x")))
    assert b.core.stats["unwanted_relayed_event"] == 1


def test_an_event_from_a_station_never_goes_on_to_another_station(net: Net) -> None:
    a, b, c = three(net)
    carol = net.client(CAROL, c)
    net.subscribe(carol)  # c's interest is at a and at b
    # a hands b an event: b must not pass it to c (b has no client that wants it)
    net.from_station(a, b, relayed(net, ALICE, 4, "x", signature(ALICE, 4, "x")))
    assert carol.events() == []
    assert b.core.stats["unwanted_relayed_event"] == 1


def test_a_publish_from_a_station_reaches_local_clients_but_no_other_station(net: Net) -> None:
    a, b, c = three(net)
    bob, carol = net.client(BOB, b), net.client(CAROL, c)
    net.subscribe(bob)
    net.subscribe(carol)
    publish = Publish(
        **stamp(net.clock),
        topic=TOPIC,
        realm=REALM,
        publisher=LOW.node_id,
        seq=1,
        payload="as a station",
        published_at_ms=net.clock.now,
    ).with_publisher_sig(LOW)
    net.from_station(a, b, publish)
    assert [e.payload for e in bob.events()] == ["as a station"]
    assert carol.events() == [] and b.core.stats["events_to_stations"] == 0


def test_an_event_from_a_client_is_still_refused(net: Net) -> None:
    b = net.router("b", MID)
    bob, mallory = net.client(BOB, b), net.client(DAVE, b)
    net.subscribe(bob)
    net.send(mallory, relayed(net, ALICE, 3, "x", signature(ALICE, 3, "x")))
    assert bob.events() == [] and b.core.stats["event_from_client"] == 1


def test_the_dedup_table_is_bounded_and_clock_driven() -> None:
    dedup = RelayedEventDedup(window_ms=1_000, capacity=3)
    keys = [(REALM, ALICE.node_id, n) for n in range(5)]
    assert all(dedup.first_sighting(k, NOW) for k in keys)
    assert len(dedup) == 3 and dedup.evicted == 2
    assert not dedup.first_sighting(keys[4], NOW + 999)
    assert dedup.first_sighting(keys[4], NOW + 1_000)  # the window passed
    assert len(dedup) == 1


def test_a_goodbye_on_a_link_is_only_counted(net: Net) -> None:
    a, b = net.router("a", LOW), net.router("b", MID)
    net.link(a, b)
    net.from_station(a, b, Goodbye(**stamp(net.clock), reason="operator_stop"))
    assert b.core.stats["goodbyes_received"] == 1
