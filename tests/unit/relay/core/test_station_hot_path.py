"""The station's hot paths do less work and send the very same bytes (docs/performance.md §8).

- A forwarded CALL and its RESULT/ERROR go out as the very bytes received when those are
  canonical (nothing re-encoded); a non-canonical one goes out canonically re-encoded, as
  before, and still verifies at the receiver (§4.5).
- The EVENT built from a PUBLISH is byte for byte what ``event_from_publish`` + ``sign_and_
  encode`` gives (Ed25519 is deterministic, the frame id is fixed by the random source).
- A fan-out counts each delivery as before.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.frames import (
    CAP_STATION,
    Advertise,
    Call,
    Connect,
    Error,
    Frame,
    Publish,
    Result,
    Subscribe,
    event_from_publish,
    new_frame_id,
    parse_frame,
)
from macula.wire.framing import FrameDecoder, frame_bytes, unsigned_body
from macula.wire.identity import Identity, puzzle_evidence, realm_tag
from relay.core.actions import Send
from relay.core.frames import StationFrames
from relay.core.policy import StationPolicy
from relay.core.router import RouterCore

REALM = realm_tag("test.station-hot-path")
T0 = 1_767_225_600_000
CALLER, PROVIDER = (Identity.generate(random.Random(n).randbytes) for n in (501, 502))
SUBSCRIBERS = [Identity.generate(random.Random(600 + n).randbytes) for n in range(5)]


def fid(at: int) -> bytes:
    return new_frame_id(at, os.urandom(10))


def received(wire: bytes) -> list[dict[str, Any]]:
    return FrameDecoder().feed(wire)


class Station:
    def __init__(self) -> None:
        self.core = RouterCore(
            Identity(os.urandom(32)),
            StationPolicy(),
            open_stream=lambda conn: 1,
            random_bytes=os.urandom,
        )
        self.conns: dict[bytes, int] = {}

    def join(self, identity: Identity, capabilities: int = 0) -> int:
        conn = len(self.conns) + 1
        self.conns[identity.node_id] = conn
        self.core.connection_made(conn, T0)
        connect = Connect(
            frame_id=fid(T0),
            sent_at_ms=T0,
            capabilities=capabilities,
            node_id=identity.node_id,
            station_id=identity.node_id,
            puzzle_evidence=puzzle_evidence(identity.node_id),
        )
        self.send(identity, connect.sign_and_encode(identity), T0)
        return conn

    def send(self, identity: Identity, wire: bytes, now_ms: int) -> list[Any]:
        return self.core.frames_received(self.conns[identity.node_id], 0, received(wire), now_ms)


def rpc_station() -> Station:
    station = Station()
    station.join(CALLER)
    station.join(PROVIDER)
    advert = Advertise(
        frame_id=fid(T0), sent_at_ms=T0, realm=REALM, procedure="echo", advertiser=PROVIDER.node_id
    )
    assert station.send(PROVIDER, advert.sign_and_encode(PROVIDER), T0) == []
    return station


def call(call_id: bytes, payload: Any, at: int) -> Call:
    return Call(
        frame_id=fid(at),
        sent_at_ms=at,
        call_id=call_id,
        procedure="echo",
        realm=REALM,
        payload=payload,
        deadline_ms=at + 10_000,
        caller=CALLER.node_id,
    )


def published(who: Identity, topic: str) -> bytes:
    """``who``'s signed PUBLISH of ``b"x"`` on ``topic`` (seq 1, at T0 + 1), as framed bytes."""
    return (
        Publish(
            frame_id=fid(T0 + 1),
            sent_at_ms=T0 + 1,
            topic=topic,
            realm=REALM,
            publisher=who.node_id,
            seq=1,
            payload=b"x",
            published_at_ms=T0 + 1,
        )
        .with_publisher_sig(who)
        .sign_and_encode(who)
    )


def only_send(actions: list[Any]) -> Send:
    assert len(actions) == 1 and isinstance(actions[0], Send), actions
    return actions[0]


def test_a_canonical_call_and_result_are_relayed_as_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    station = rpc_station()
    call_id = os.urandom(16)
    call_wire = call(call_id, {"text": "hi", "n": [1, 2.5, None]}, T0 + 1).sign_and_encode(CALLER)
    result = Result(
        frame_id=fid(T0 + 2),
        sent_at_ms=T0 + 2,
        call_id=call_id,
        payload={"echo": "hi"},
        responded_by=PROVIDER.node_id,
    )
    result_wire = result.sign_and_encode(PROVIDER)

    def no_encoding(*args: Any, **kw: Any) -> bytes:
        raise AssertionError("re-encoded a frame the station only relays")

    monkeypatch.setattr("relay.core.frames.cbor.encode", no_encoding)
    forwarded = only_send(station.send(CALLER, call_wire, T0 + 1))
    assert (forwarded.conn, forwarded.data) == (station.conns[PROVIDER.node_id], call_wire)
    back = only_send(station.send(PROVIDER, result_wire, T0 + 2))
    assert (back.conn, back.data) == (station.conns[CALLER.node_id], result_wire)


def test_an_error_reply_is_relayed_as_received() -> None:
    station = rpc_station()
    call_id = os.urandom(16)
    station.send(CALLER, call(call_id, 1, T0 + 1).sign_and_encode(CALLER), T0 + 1)
    error = Error(
        frame_id=fid(T0 + 2),
        sent_at_ms=T0 + 2,
        call_id=call_id,
        code=1,
        reported_by=PROVIDER.node_id,
    )
    wire = error.sign_and_encode(PROVIDER)
    assert only_send(station.send(PROVIDER, wire, T0 + 2)).data == wire


def test_a_non_canonical_call_is_relayed_re_encoded_and_still_verifies() -> None:
    station = rpc_station()
    frame = call(os.urandom(16), {"n": 1}, T0 + 1).signed_by(CALLER)  # signed canonically
    pairs = cbor.encode_pairs(frame.to_map())
    unsorted = frame_bytes(cbor.join_pairs(pairs[::-1]))  # same map, keys out of order
    assert unsigned_body(unsorted[4:]) is None
    forwarded = only_send(station.send(CALLER, unsorted, T0 + 1))
    assert forwarded.data == frame.encode() != unsorted  # the canonical re-encoding, as before
    relayed_map = received(forwarded.data)[0]
    assert parse_frame(relayed_map).verifies(CALLER.node_id)


def test_a_forged_call_is_not_relayed() -> None:
    station = rpc_station()
    frame = call(os.urandom(16), {"n": 1}, T0 + 1).signed_by(PROVIDER)  # not the caller's key
    actions = station.send(CALLER, frame.encode(), T0 + 1)
    reply = only_send(actions)
    assert reply.conn == station.conns[CALLER.node_id]  # an ERROR back, nothing forwarded
    answer = parse_frame(received(reply.data)[0])
    assert isinstance(answer, Error) and answer.code == 0x0E
    assert station.core.stats["unverified_frame"] == 1


# --- EVENT built from a PUBLISH ------------------------------------------------------------

values = st.recursive(
    st.none()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=40)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None)
@given(
    payload=values,
    topic=st.text(min_size=1, max_size=40),
    seq=st.integers(min_value=0, max_value=2**64 - 1),
    signed=st.booleans(),
    now_ms=st.integers(min_value=0, max_value=2**48 - 1),
)
def test_the_event_is_byte_for_byte_the_generic_encoding(
    payload: Any, topic: str, seq: int, signed: bool, now_ms: int
) -> None:
    publisher = SUBSCRIBERS[0]
    publish = Publish(
        frame_id=fid(T0),
        sent_at_ms=T0,
        topic=topic,
        realm=REALM,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        published_at_ms=T0,
        ttl_ms=5,
    )
    if signed:
        publish = publish.with_publisher_sig(publisher)
    station_key = PROVIDER
    random10 = os.urandom(10)
    fast = StationFrames(station_key, lambda n: random10).event(publish, now_ms)
    event = event_from_publish(publish, frame_id=new_frame_id(now_ms, random10), sent_at_ms=now_ms)
    assert fast == event.sign_and_encode(station_key)
    parsed: Frame = parse_frame(received(fast)[0])
    assert parsed.verifies(station_key.node_id)


# --- fan-out --------------------------------------------------------------------------------


def test_a_fan_out_sends_one_signed_event_to_each_subscriber_and_counts_them() -> None:
    station = Station()
    publisher = CALLER
    station.join(publisher)
    for subscriber in SUBSCRIBERS:
        station.join(subscriber)
        subscribe = Subscribe(
            frame_id=fid(T0),
            sent_at_ms=T0,
            topic="news",
            realm=REALM,
            subscriber=subscriber.node_id,
        )
        station.send(subscriber, subscribe.sign_and_encode(subscriber), T0)
    sends = station.send(publisher, published(publisher, "news"), T0 + 1)
    assert sorted(s.conn for s in sends) == sorted(station.conns[s.node_id] for s in SUBSCRIBERS)
    assert len({s.data for s in sends}) == 1  # one EVENT for all
    event = parse_frame(received(sends[0].data)[0])
    assert event.verifies(station.core.identity.node_id)
    assert station.core.stats["events_delivered"] == len(SUBSCRIBERS)
    assert station.core.stats["events_to_stations"] == 0
    assert station.core.stats["publishes"] == 1


def test_the_publisher_s_own_copy_of_its_event_is_sent_last() -> None:
    """A room's members all follow its topic, the speaker too: its echo goes after everyone
    else's copy (each connection's packets are flushed in the order of its first send), so the
    listeners do not wait behind the speaker's own copy. Each member speaks once: whatever
    order the subscriber set iterates in, only one of them could come last by chance."""
    station = Station()
    members = (CALLER, *SUBSCRIBERS)
    for identity in members:
        station.join(identity)
        subscribe = Subscribe(
            frame_id=fid(T0), sent_at_ms=T0, topic="room", realm=REALM, subscriber=identity.node_id
        )
        station.send(identity, subscribe.sign_and_encode(identity), T0)
    for speaker in members:
        sends = station.send(speaker, published(speaker, "room"), T0 + 1)
        assert sorted(s.conn for s in sends) == sorted(station.conns.values())
        assert sends[-1].conn == station.conns[speaker.node_id]


def test_a_publish_from_a_linked_station_is_never_echoed_back_to_it() -> None:
    """Only a client's own copy is deferred to the end: a station that follows the topic (on
    behalf of its clients) and sends a PUBLISH itself gets nothing back, as before."""
    station = Station()
    peer_station = Identity.generate(random.Random(777).randbytes)
    station.join(peer_station, capabilities=CAP_STATION)
    listener = SUBSCRIBERS[0]
    station.join(listener)
    for who in (peer_station, listener):
        subscribe = Subscribe(
            frame_id=fid(T0), sent_at_ms=T0, topic="room", realm=REALM, subscriber=who.node_id
        )
        station.send(who, subscribe.sign_and_encode(who), T0)
    sends = station.send(peer_station, published(peer_station, "room"), T0 + 1)
    assert [s.conn for s in sends if isinstance(s, Send)] == [station.conns[listener.node_id]]
