"""The client core and the station's router core, paired over an in-memory link, no sockets.

Bytes move only when the test pumps the link; time moves only when the test steps it. Each test
is one protocol story: handshake and refusal, same-identity replacement, pub/sub, call/reply,
a deadline passing, a station restart with the intent replayed, a forged frame refused.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from macula.client.core import ClientCore, CoreState
from macula.client.events import (
    CallArrived,
    CallSettled,
    ChannelData,
    ChannelFinished,
    ChannelOpened,
    Ended,
    Established,
    EventArrived,
    HandshakeFailed,
)
from macula.client.intent import EventDedup, Intent
from macula.errors import BrokenError, CallTimeout, ClosedError, HandshakeError, MeshError
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError
from macula.wire.frames import Event, Result, new_frame_id
from relay.core.policy import PuzzleMode
from support.pairkit import (
    ALICE,
    BOB,
    CAROL,
    OTHER_STATION,
    REALM,
    STATION,
    ZERO_REALM,
    Link,
    established,
)
from support.stationmesh import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def link(clock: Clock) -> Link:
    return Link(clock)


# --- handshake ----------------------------------------------------------------------------------


def test_handshake_is_accepted_and_names_the_station(link: Link) -> None:
    end = established(link, ALICE)
    assert end.core.station_key == STATION.node_id
    assert link.router.node_conn[ALICE.node_id] == end.conn
    assert end.outputs == []


def test_a_refusal_carries_its_code_and_ends_the_connection(clock: Clock) -> None:
    link = Link(clock, puzzle_mode=PuzzleMode.ENFORCE, puzzle_difficulty=30)
    end = link.dial(ALICE)
    (failed,) = end.take(HandshakeFailed)
    assert isinstance(failed.error, HandshakeError)
    assert failed.error.refusal_code is not None
    assert "refused" in str(failed.error)
    assert end.core.state is CoreState.ENDED
    assert end.of(Established) == []
    with pytest.raises(BrokenError):
        end.core.subscribe(REALM, "after.refusal", clock.now)


def test_a_hello_from_another_key_than_the_pinned_one_is_refused(clock: Clock) -> None:
    link = Link(clock, station=OTHER_STATION)  # someone else answers at the address
    end = link.dial(ALICE, pinned=STATION.node_id)
    (failed,) = end.take(HandshakeFailed)
    assert isinstance(failed.error, HandshakeError)
    assert "does not verify" in str(failed.error)
    assert end.core.station_key == b""


def test_control_frames_before_the_hello_are_ignored(link: Link, clock: Clock) -> None:
    core = ClientCore(ALICE, random.Random(1).randbytes, pinned=STATION.node_id)
    core.connect(clock.now)
    stray = Result(
        frame_id=new_frame_id(clock.now, bytes(10)),
        sent_at_ms=clock.now,
        call_id=bytes(16),
        payload="x",
        responded_by=STATION.node_id,
    ).signed_by(STATION)
    assert core.frames_received(0, [stray.to_map()], clock.now) == []
    assert core.state is CoreState.CONNECTING


def test_the_same_identity_connecting_again_replaces_the_older_connection(link: Link) -> None:
    first = established(link, ALICE)
    second = established(link, ALICE)
    (ended,) = first.take(Ended)
    assert ended.terminal and "replaced_by_newer_handshake" in ended.reason
    assert first.core.goodbye is not None
    assert link.router.node_conn[ALICE.node_id] == second.conn
    assert second.of(Ended) == []


# --- pub/sub -------------------------------------------------------------------------------------


def test_publish_reaches_a_subscriber_once_verified_end_to_end(link: Link) -> None:
    alice, bob = established(link, ALICE), established(link, BOB)
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)  # the SUBSCRIBE has taken effect at the station
    link.client_did(alice, alice.core.publish(REALM, "news", {"n": 1}, 41, link.clock.now))
    (arrived,) = bob.take(EventArrived)
    assert arrived.authenticated
    assert (arrived.event.publisher, arrived.event.seq) == (ALICE.node_id, 41)
    assert arrived.event.payload == {"n": 1}
    assert alice.of(EventArrived) == []  # not subscribed


def test_unsubscribe_then_flush_means_nothing_more_arrives(link: Link) -> None:
    alice, bob = established(link, ALICE), established(link, BOB)
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    link.client_did(bob, bob.core.unsubscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    link.client_did(alice, alice.core.publish(REALM, "news", 1, 1, link.clock.now))
    assert bob.of(EventArrived) == []


def test_a_duplicate_event_is_suppressed(link: Link) -> None:
    alice, bob = established(link, ALICE), established(link, BOB)
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    link.client_did(alice, alice.core.publish(REALM, "news", "a", 7, link.clock.now))
    (event,) = [o.event for o in bob.take(EventArrived)]
    # the station sends the same event again (a relay retry): same realm, publisher, seq
    again = Event(**{**_fields(event), "frame_id": new_frame_id(link.clock.now, b"\x09" * 10)})
    out = bob.core.frames_received(0, [again.signed_by(STATION).to_map()], link.clock.now)
    assert out == []
    assert bob.core.dedup.duplicates == 1


def _fields(event: Event) -> dict[str, Any]:
    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name != "sig"}


# --- call / reply --------------------------------------------------------------------------------


def test_a_call_is_forwarded_to_the_advertiser_and_its_result_comes_back(link: Link) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.add_v1", link.clock.now))
    link.flush(provider)
    call_id, out = caller.core.call(
        REALM, "org.example.add_v1", [2, 3], link.clock.now + 5_000, link.clock.now
    )
    link.client_did(caller, out)
    (arrived,) = provider.take(CallArrived)
    assert arrived.call.payload == [2, 3] and arrived.call.caller == ALICE.node_id
    reply = provider.core.reply(arrived.stream, arrived.call, 5, link.clock.now)
    link.client_did(provider, reply)
    assert caller.take(CallSettled) == [CallSettled(call_id, payload=5)]


def test_an_error_reply_becomes_a_mesh_error(link: Link) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.fail_v1", link.clock.now))
    link.flush(provider)
    _, out = caller.core.call(
        REALM, "org.example.fail_v1", 0, link.clock.now + 5_000, link.clock.now
    )
    link.client_did(caller, out)
    (arrived,) = provider.take(CallArrived)
    answer = provider.core.reply_error(
        arrived.stream, arrived.call, ErrorCode.UNKNOWN_ERROR, "handler_error", link.clock.now
    )
    link.client_did(provider, answer)
    (settled,) = caller.take(CallSettled)
    assert isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.UNKNOWN_ERROR
    assert settled.error.detail == "handler_error"


def test_a_call_nobody_serves_is_answered_by_the_station(link: Link) -> None:
    caller = established(link, ALICE)
    _, out = caller.core.call(
        REALM, "org.example.none_v1", 0, link.clock.now + 5_000, link.clock.now
    )
    link.client_did(caller, out)
    (settled,) = caller.take(CallSettled)
    assert isinstance(settled.error, MeshError)


def test_a_deadline_passing_settles_the_call_once(link: Link, clock: Clock) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.slow_v1", clock.now))
    link.flush(provider)
    call_id, out = caller.core.call(
        REALM, "org.example.slow_v1", 0, clock.now + 2_000, clock.now, expires_ms=clock.now + 1_000
    )
    link.client_did(caller, out)
    (arrived,) = provider.take(CallArrived)
    assert caller.core.next_deadline() == clock.now + 1_000
    clock.step(999)
    link.tick()
    assert caller.of(CallSettled) == []
    clock.step(1)
    link.tick()
    (settled,) = caller.take(CallSettled)
    assert settled.call_id == call_id and isinstance(settled.error, CallTimeout)
    assert caller.core.next_deadline() is None
    # the provider's late answer is ignored, counted
    link.client_did(provider, provider.core.reply(arrived.stream, arrived.call, 1, clock.now))
    assert caller.of(CallSettled) == []
    assert caller.core.dropped["unmatched_reply"] == 1


def test_the_station_answers_an_expired_deadline(link: Link, clock: Clock) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.slow_v1", clock.now))
    link.flush(provider)
    _, out = caller.core.call(
        REALM, "org.example.slow_v1", 0, clock.now + 1_000, clock.now, expires_ms=clock.now + 9_000
    )
    link.client_did(caller, out)
    clock.step(1_000)
    link.tick()  # the station's pending-call table expires first here
    (settled,) = caller.take(CallSettled)
    assert isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.EXPIRY_TOO_SOON


def test_our_own_deadline_passing_at_the_station_first_is_a_timeout(
    link: Link, clock: Clock
) -> None:
    """The station's pending-call expiry can beat the caller's own timer by a tick (CI saw
    ``test_call_timeout_is_typed`` get 0x07): when the CALL carries the caller's own deadline,
    its 0x07 settles the call as the same ``CallTimeout`` the caller's tick gives."""
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.slow_v1", clock.now))
    link.flush(provider)
    _, out = caller.core.call(REALM, "org.example.slow_v1", 0, clock.now + 1_000, clock.now)
    link.client_did(caller, out)
    clock.step(1_000)
    link.tick()  # the station first; the caller's core has not ticked yet
    (settled,) = caller.take(CallSettled)
    assert isinstance(settled.error, CallTimeout), settled.error
    assert "slow_v1: no answer before its deadline" in str(settled.error)
    assert caller.core.tick(clock.now) == []  # settled once


def test_losing_the_connection_fails_every_pending_call_with_broken(link: Link) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.slow_v1", link.clock.now))
    link.flush(provider)
    _, out = caller.core.call(
        REALM, "org.example.slow_v1", 0, link.clock.now + 5_000, link.clock.now
    )
    link.client_did(caller, out)
    link.lose(caller, "network down")
    (settled,) = caller.take(CallSettled)
    assert isinstance(settled.error, BrokenError)
    (ended,) = caller.take(Ended)
    assert not ended.terminal and not ended.closed
    with pytest.raises(BrokenError):
        caller.core.publish(REALM, "t", 1, 1, link.clock.now)


def test_closing_fails_pending_calls_with_closed(link: Link) -> None:
    caller = established(link, ALICE)
    caller.core.call(REALM, "org.example.x_v1", 0, link.clock.now + 5_000, link.clock.now)
    out = caller.core.close()
    assert [type(o.error) for o in out if isinstance(o, CallSettled)] == [ClosedError]
    with pytest.raises(ClosedError):
        caller.core.subscribe(REALM, "t", link.clock.now)


# --- streams --------------------------------------------------------------------------------------


def test_a_streaming_call_carries_data_and_a_reply(link: Link, clock: Clock) -> None:
    provider, caller = established(link, BOB), established(link, ALICE)
    link.client_did(provider, provider.core.advertise(REALM, "org.example.count_v1", clock.now))
    link.flush(provider)
    stream = caller.new_stream()
    mine, out = caller.core.open_channel(
        stream, REALM, "org.example.count_v1", "server_stream", 3, clock.now + 5_000, clock.now
    )
    link.client_did(caller, out)
    (opened,) = provider.take(ChannelOpened)
    theirs = provider.core.channel(opened.stream)
    assert theirs is not None and opened.opening.args == 3
    for n in range(3):
        link.client_did(provider, provider.core.channel_send(theirs, bytes([n]), "raw", clock.now))
    link.client_did(provider, provider.core.channel_reply(theirs, "done", clock.now))
    assert [o.body for o in caller.take(ChannelData)] == [b"\x00", b"\x01", b"\x02"]
    assert caller.take(ChannelFinished) == [ChannelFinished(stream)]
    assert mine.replied and mine.reply == "done" and mine.closed
    assert caller.core.channel(stream) is None


# --- reconnect ------------------------------------------------------------------------------------


def test_a_station_restart_replays_the_intent_before_established(clock: Clock) -> None:
    intent, dedup = Intent(), EventDedup()
    first = Link(clock)
    bob = established(first, BOB, intent=intent, dedup=dedup)
    assert intent.add_subscription(REALM, "news")
    assert intent.add_advertisement(REALM, "org.example.echo_v1")
    first.client_did(bob, bob.core.subscribe(REALM, "news", clock.now))
    first.client_did(bob, bob.core.advertise(REALM, "org.example.echo_v1", clock.now))
    first.lose(bob, "station restarted")

    clock.step(1_000)
    second = Link(clock)  # the restarted station knows nobody
    bob = second.dial(BOB, intent=intent, dedup=dedup)
    # the replay went out before Established: nothing to wait for
    assert bob.take(Established)
    alice = established(second, ALICE)
    link_call, out = alice.core.call(
        REALM, "org.example.echo_v1", "hi", clock.now + 5_000, clock.now
    )
    second.client_did(alice, out)
    (arrived,) = bob.take(CallArrived)
    second.client_did(bob, bob.core.reply(arrived.stream, arrived.call, "hi", clock.now))
    assert alice.take(CallSettled) == [CallSettled(link_call, payload="hi")]
    second.client_did(alice, alice.core.publish(REALM, "news", "back", 2, clock.now))
    assert [o.event.payload for o in bob.take(EventArrived)] == ["back"]


def test_dropped_intent_is_not_replayed(clock: Clock) -> None:
    intent = Intent()
    intent.add_subscription(REALM, "gone")
    assert intent.drop_subscription(REALM, "gone")
    assert not intent.drop_subscription(REALM, "gone")
    link = Link(clock)
    bob = established(link, BOB, intent=intent)
    alice = established(link, ALICE)
    link.client_did(alice, alice.core.publish(REALM, "gone", 1, 1, clock.now))
    assert bob.of(EventArrived) == []


# --- forged frames ------------------------------------------------------------------------------


def test_a_forged_event_is_refused_and_counted(link: Link) -> None:
    alice, bob = established(link, ALICE), established(link, BOB)
    link.client_did(bob, bob.core.subscribe(REALM, "news", link.clock.now))
    link.flush(bob)
    link.client_did(alice, alice.core.publish(REALM, "news", "real", 1, link.clock.now))
    (event,) = [o.event for o in bob.take(EventArrived)]
    forged_payload = Event(**{**_fields(event), "payload": "forged", "seq": 2})
    # signed by someone who is not the station: the frame signature fails
    by_mallory = forged_payload.signed_by(CAROL).to_map()
    # signed by the station, but the publisher_sig no longer covers the payload
    by_station = forged_payload.signed_by(STATION).to_map()
    assert bob.core.frames_received(0, [by_mallory, by_station], link.clock.now) == []
    assert bob.core.dropped["unverified"] == 1
    assert bob.core.dropped["bad_publisher_sig"] == 1


def test_a_forged_result_does_not_settle_a_call(link: Link) -> None:
    caller = established(link, ALICE)
    call_id, _ = caller.core.call(
        REALM, "org.example.x_v1", 0, link.clock.now + 5_000, link.clock.now
    )
    forged = Result(
        frame_id=new_frame_id(link.clock.now, b"\x01" * 10),
        sent_at_ms=link.clock.now,
        call_id=call_id,
        payload="forged",
        responded_by=CAROL.node_id,
    ).signed_by(CAROL)
    # changed after signing: the signature no longer covers it, so it settles nothing
    mangled = {**forged.to_map(), "payload": "changed after signing"}
    assert caller.core.frames_received(0, [mangled], link.clock.now) == []
    assert caller.core.dropped["unverified"] == 1
    assert caller.core.next_deadline() is not None  # still pending


def test_garbage_on_a_stream_ends_the_connection(link: Link) -> None:
    end = established(link, ALICE)
    out = end.core.framing_failed(0, FramingError("oversize", "frame too large"))
    assert [type(o) for o in out] == [Ended]
    assert not end.core.alive


def test_sync_intent_tells_the_station_only_the_difference(link: Link, clock: Clock) -> None:
    intent = Intent()
    bob = established(link, BOB, intent=intent)
    assert bob.core.sync_intent(clock.now) == []  # nothing wanted, nothing told
    intent.add_subscription(REALM, "a")
    intent.add_advertisement(REALM, "org.example.a_v1")
    first = bob.core.sync_intent(clock.now)
    assert len(first) == 2 and bob.core.sync_intent(clock.now) == []  # idempotent
    link.client_did(bob, first)
    intent.drop_subscription(REALM, "a")
    link.client_did(bob, bob.core.sync_intent(clock.now))  # one UNSUBSCRIBE
    link.flush(bob)
    assert bob.core.told_subscriptions == set()
    assert bob.core.told_advertisements == {(REALM, "org.example.a_v1")}
    alice = established(link, ALICE)
    link.client_did(alice, alice.core.publish(REALM, "a", 1, 1, clock.now))
    assert bob.of(EventArrived) == []


def test_intent_gained_before_the_hello_is_replayed_not_sent_early(clock: Clock) -> None:
    link = Link(clock)
    intent = Intent()
    core = ClientCore(BOB, random.Random(3).randbytes, intent=intent, pinned=STATION.node_id)
    core.connect(clock.now)
    intent.add_subscription(REALM, "early")
    assert core.sync_intent(clock.now) == []  # not established: the replay will carry it
    bob = link.dial(BOB, intent=intent)
    assert bob.take(Established)
    assert bob.core.told_subscriptions == {(REALM, "early")}


def test_a_station_shutting_down_refuses_new_handshakes_retryably(link: Link) -> None:
    old = established(link, ALICE)
    link.router_did(link.router.shutdown(link.clock.now))
    (ended,) = old.take(Ended)
    assert "operator_stop" in ended.reason and not ended.terminal
    again = link.dial(ALICE)  # the client reconnects at once, while the station drains
    (failed,) = again.take(HandshakeFailed)
    assert isinstance(failed.error, HandshakeError)
    assert failed.error.refusal_code == ErrorCode.TEMPORARY_RELAY_FAILURE
    assert failed.error.retryable
    assert again.of(Established) == []


def test_a_control_frame_over_the_station_limit_is_refused_locally(link: Link) -> None:
    alice, bob = established(link, ALICE), established(link, BOB)
    link.client_did(bob, bob.core.subscribe(REALM, "big", link.clock.now))
    link.flush(bob)
    with pytest.raises(MeshError) as refused:
        alice.core.publish(REALM, "big", b"x" * (1 << 20), 1, link.clock.now)
    assert refused.value.code == ErrorCode.PAYLOAD_TOO_LARGE and "put_content" in str(refused.value)
    assert alice.core.alive  # nothing was sent: the connection stays up
    stream = alice.new_stream()  # the same bytes are fine on a content stream
    alice.core.open_content(stream)
    _, out = alice.core.call(
        ZERO_REALM,
        "_relay.ping",
        b"x" * (1 << 20),
        link.clock.now + 5_000,
        link.clock.now,
        stream=stream,
    )
    assert len(out) == 1
    link.client_did(alice, alice.core.publish(REALM, "big", b"small", 2, link.clock.now))
    assert [o.event.payload for o in bob.take(EventArrived)] == [b"small"]
