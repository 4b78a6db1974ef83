"""The station's routing core (PROTOCOL.md §5-§8, §13), sans-I/O: no sockets, no clock.

Every test builds a ``RouterCore`` over a fake link: clients are identities that sign frames
with fresh frame ids for a given ``now``; the test moves their frame maps into the core and
decodes the ``Send`` actions it answers with. Timers are tested by stepping ``now`` into
``tick``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import pytest

from macula.services.house import HOUSE_REALM, MEMORY_ADD
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError
from macula.wire.frames import (
    CAP_STATION,
    Error,
    Event,
    Frame,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Result,
    StreamData,
    StreamEnd,
    StreamError,
    StreamOpen,
)
from macula.wire.identity import Identity, puzzle_valid
from relay.builtins.outcome import Outcome
from relay.core.actions import (
    Action,
    Close,
    EndStream,
    PauseReading,
    ResumeReading,
    RunBuiltin,
    Send,
)
from relay.core.policy import PuzzleMode, Quotas, StationPolicy, restart_only_changes
from support.routerkit import (
    ALICE,
    BOB,
    CAROL,
    MALLORY,
    NOW,
    OTHER_REALM,
    PROVIDER,
    REALM,
    SKEW,
    STATION,
    UNHARDENED,
    ZERO_REALM,
    Client,
    Station,
    closed,
    decode,
    ended,
    envelope,
    forwarded_call,
    fresh_id,
    only,
    sent,
    sent_to,
    station_error,
)

# --- handshake (§5) ---------------------------------------------------------------------------


def test_handshake_answers_hello_true_signed_by_the_station() -> None:
    station = Station()
    alice = station.dial(ALICE)
    actions = alice.handshake()
    assert closed(actions) == {}
    hello = only(sent(actions, alice.conn, 0), Hello)
    assert hello.accepted is True
    assert hello.refusal_code is None
    assert hello.node_id == STATION.node_id == hello.station_id
    assert hello.capabilities & CAP_STATION
    assert hello.negotiated_capabilities & CAP_STATION
    assert hello.verifies(STATION.node_id)


def test_connect_with_a_bad_signature_is_refused_in_band_and_closed() -> None:
    station = Station()
    alice = station.dial(ALICE)
    actions = alice.send(alice.connect(), signer=MALLORY)
    hello = only(sent(actions, alice.conn, 0), Hello)
    assert hello.accepted is False
    assert hello.refusal_code == ErrorCode.SIGNATURE_INVALID
    assert hello.verifies(STATION.node_id)
    assert alice.conn in closed(actions)
    # the refused connection is draining: nothing it sends is handled any more
    assert alice.send(alice.call("_relay.ping", realm=ZERO_REALM)) == []


def test_frames_before_connect_are_ignored() -> None:
    station = Station()
    alice = station.dial(ALICE)
    assert alice.send(alice.call("_relay.ping", realm=ZERO_REALM)) == []
    assert alice.send(Ping(**envelope(NOW), nonce=fresh_id())) == []
    assert alice.send(alice.subscribe("news")) == []
    hello = only(sent(alice.handshake(), alice.conn, 0), Hello)
    assert hello.accepted is True


@pytest.mark.parametrize("mode", [PuzzleMode.OFF, PuzzleMode.LOG])
def test_puzzle_off_and_log_accept_an_unhardened_identity(mode: PuzzleMode) -> None:
    assert not puzzle_valid(UNHARDENED.node_id, 8)
    station = Station(StationPolicy(puzzle_mode=mode))
    client = station.dial(UNHARDENED)
    actions = client.handshake()
    assert only(sent(actions, client.conn, 0), Hello).accepted is True
    assert closed(actions) == {}


def test_puzzle_enforce_refuses_an_unhardened_identity_with_0x0a() -> None:
    station = Station(StationPolicy(puzzle_mode=PuzzleMode.ENFORCE))
    client = station.dial(UNHARDENED)
    actions = client.handshake()
    hello = only(sent(actions, client.conn, 0), Hello)
    assert hello.accepted is False
    assert hello.refusal_code == ErrorCode.CRYPTO_PUZZLE_INVALID
    assert client.conn in closed(actions)


def test_puzzle_enforce_accepts_a_hardened_identity() -> None:
    identity = Identity.generate(os.urandom, difficulty=8)
    station = Station(StationPolicy(puzzle_mode=PuzzleMode.ENFORCE))
    client = station.dial(identity)
    actions = client.handshake()
    assert only(sent(actions, client.conn, 0), Hello).accepted is True
    assert closed(actions) == {}


def test_handshake_timeout_closes_a_silent_connection_on_tick() -> None:
    policy = StationPolicy()
    station = Station(policy)
    silent = station.dial(ALICE)
    connected = station.join(BOB)
    assert closed(station.core.tick(NOW + policy.handshake_timeout_ms)) == {}
    actions = station.core.tick(NOW + policy.handshake_timeout_ms + 1)
    assert set(closed(actions)) == {silent.conn}
    # a CONNECT that arrives after the timeout finds no connection
    late = silent.handshake(now=NOW + policy.handshake_timeout_ms + 2)
    assert late == []
    assert closed(station.core.tick(NOW + 10 * policy.handshake_timeout_ms)) == {}
    assert connected.conn in station.core.peers


def test_same_identity_twice_replaces_the_older_connection() -> None:
    policy = StationPolicy()
    station = Station(policy)
    alice1 = station.join(ALICE)
    alice1.send(alice1.advertise("svc"))
    bob = station.join(BOB)
    call = bob.call("svc")
    assert forwarded_call(bob.send(call), alice1).call_id == call.call_id

    alice2 = station.dial(ALICE)
    actions = alice2.handshake(now=NOW + 1)
    assert only(sent_to(actions, alice2), Hello).accepted is True
    goodbye = only(sent_to(actions, alice1), Goodbye)
    assert goodbye.reason == "replaced_by_newer_handshake"
    assert goodbye.verifies(STATION.node_id)
    assert closed(actions)[alice1.conn].after_ms == policy.drain_ms
    assert alice2.conn not in closed(actions)
    # the call pending at the replaced connection is answered 0x01 at once
    error = station_error(actions, bob)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.UNKNOWN_NEXT_PEER)

    # its advertisements are purged ...
    again = bob.call("svc", now=NOW + 2)
    assert station_error(bob.send(again, now=NOW + 2), bob).code == ErrorCode.UNKNOWN_NEXT_PEER
    # ... it is not heard any more ...
    assert alice1.send(alice1.result(call.call_id, "late"), now=NOW + 2) == []
    # ... and the same node may advertise again from its new connection (tombstone is its own)
    alice2.send(alice2.advertise("svc", now=NOW + 3), now=NOW + 3)
    third = bob.call("svc", now=NOW + 4)
    assert forwarded_call(bob.send(third, now=NOW + 4), alice2).call_id == third.call_id


def test_ping_is_answered_with_a_station_signed_pong() -> None:
    station = Station()
    alice = station.join(ALICE)
    nonce = fresh_id()
    pong = only(sent_to(alice.send(Ping(**envelope(NOW), nonce=nonce)), alice), Pong)
    assert pong.nonce == nonce
    assert pong.verifies(STATION.node_id)


# --- pub/sub (§7) -----------------------------------------------------------------------------


def test_publish_fans_out_to_every_subscriber_including_the_publisher() -> None:
    station = Station()
    alice, bob, carol = station.join(ALICE), station.join(BOB), station.join(CAROL)
    for client in (alice, bob):
        assert client.send(client.subscribe("news")) == []
    actions = alice.send(alice.publish("news", b"hello", seq=7))
    for client in (alice, bob):
        event = only(sent_to(actions, client), Event)
        assert (event.topic, event.realm, event.publisher, event.seq, event.payload) == (
            "news",
            REALM,
            ALICE.node_id,
            7,
            b"hello",
        )
    assert sent(actions, carol.conn) == []


def test_publish_is_isolated_by_realm_and_exact_topic() -> None:
    station = Station()
    alice, bob, carol = station.join(ALICE), station.join(BOB), station.join(CAROL)
    bob.send(bob.subscribe("news", realm=REALM))
    carol.send(carol.subscribe("news", realm=OTHER_REALM))
    alice.send(alice.subscribe("news/sub", realm=REALM))

    actions = alice.send(alice.publish("news", realm=REALM))
    assert len(sent_to(actions, bob)) == 1
    assert sent(actions, carol.conn) == [] and sent(actions, alice.conn) == []
    actions = alice.send(alice.publish("news", realm=OTHER_REALM))
    assert only(sent_to(actions, carol), Event).realm == OTHER_REALM
    assert sent(actions, bob.conn) == []
    assert alice.send(alice.publish("new", realm=REALM)) == []


def test_event_is_signed_by_the_station_and_copies_publisher_sig() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    publish = alice.publish("news", {"n": 1}, seq=3).with_publisher_sig(ALICE)
    event = only(sent_to(alice.send(publish), bob), Event)
    assert event.verifies(STATION.node_id)
    assert not event.verifies(ALICE.node_id)
    assert event.publisher == ALICE.node_id
    assert event.publisher_sig == publish.publisher_sig
    assert event.publisher_sig_valid()
    assert event.delivered_via == "direct"
    assert event.frame_id != publish.frame_id
    # without publisher_sig the EVENT carries none (absence is not authentication)
    plain = only(sent_to(alice.send(alice.publish("news")), bob), Event)
    assert plain.publisher_sig is None and not plain.publisher_sig_valid()


def test_unsubscribe_stops_delivery() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    bob.send(bob.unsubscribe("news"))
    assert alice.send(alice.publish("news")) == []


def test_subscriptions_are_purged_when_the_nodes_last_connection_closes() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    assert station.core.connection_lost(bob.conn, NOW + 1) == []
    bob_again = station.join(BOB, now=NOW + 2)
    actions = alice.send(alice.publish("news", now=NOW + 3), now=NOW + 3)
    assert sent(actions, bob_again.conn) == []


def test_subscriptions_survive_when_a_replaced_older_connection_closes() -> None:
    station = Station()
    alice, bob1 = station.join(ALICE), station.join(BOB)
    bob1.send(bob1.subscribe("news"))
    bob2 = station.join(BOB, now=NOW + 1)
    station.core.connection_lost(bob1.conn, NOW + 2)
    actions = alice.send(alice.publish("news", now=NOW + 3), now=NOW + 3)
    assert only(sent_to(actions, bob2), Event).topic == "news"
    assert sent(actions, bob1.conn) == []


# --- §13 #1: replay and clock skew -----------------------------------------------------------


def test_replayed_call_is_answered_0x0e() -> None:
    station = Station()
    alice = station.join(ALICE)
    frame_map = alice.call("_relay.ping", realm=ZERO_REALM).signed_by(ALICE).to_map()
    [run] = alice.send_map(frame_map)
    assert isinstance(run, RunBuiltin)
    error = station_error(alice.send_map(frame_map, now=NOW + 1), alice)
    assert error.code == ErrorCode.SIGNATURE_INVALID
    assert error.call_id == frame_map["call_id"]


def test_replayed_subscribe_is_ignored() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    subscribe = bob.subscribe("news").signed_by(BOB).to_map()
    bob.send_map(subscribe)
    bob.send(bob.unsubscribe("news"))
    assert bob.send_map(subscribe) == []
    assert alice.send(alice.publish("news")) == []


@pytest.mark.parametrize("offset", [-SKEW - 1, SKEW + 1])
def test_call_with_sent_at_outside_the_clock_skew_is_answered_0x0e(offset: int) -> None:
    station = Station()
    alice = station.join(ALICE)
    call = alice.call("_relay.ping", realm=ZERO_REALM, now=NOW + offset, deadline_ms=NOW + 5_000)
    error = station_error(alice.send(call), alice)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.SIGNATURE_INVALID)


@pytest.mark.parametrize("offset", [-SKEW, SKEW])
def test_call_with_sent_at_at_the_skew_limit_is_accepted(offset: int) -> None:
    station = Station()
    alice = station.join(ALICE)
    call = alice.call("_relay.ping", realm=ZERO_REALM, now=NOW + offset, deadline_ms=NOW + 5_000)
    assert alice.send(call) == [RunBuiltin(alice.conn, 0, call.signed_by(ALICE))]


def test_skewed_subscribe_is_ignored() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    assert bob.send(bob.subscribe("news", now=NOW - SKEW - 1)) == []
    assert alice.send(alice.publish("news")) == []


def test_skewed_connect_is_refused_0x0e() -> None:
    station = Station()
    alice = station.dial(ALICE)
    actions = alice.send(alice.connect(now=NOW - SKEW - 1))
    hello = only(sent(actions, alice.conn, 0), Hello)
    assert (hello.accepted, hello.refusal_code) == (False, ErrorCode.SIGNATURE_INVALID)
    assert alice.conn in closed(actions)


def test_replayed_connect_cannot_evict_the_real_connection() -> None:
    station = Station()
    alice = station.dial(ALICE)
    connect = alice.connect().signed_by(ALICE).to_map()
    alice.send_map(connect)
    replayer = station.dial(ALICE)
    actions = replayer.send_map(connect, now=NOW + 1)
    assert only(sent(actions, replayer.conn, 0), Hello).accepted is False
    assert sent(actions, alice.conn) == []
    assert alice.conn not in closed(actions)


# --- RPC (§6, §13 #2, #3, #9, #10) ------------------------------------------------------------


def test_call_is_forwarded_verbatim_and_the_result_routed_back() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc", payload={"x": 1}).signed_by(ALICE)
    actions = alice.send_map(call.to_map())
    [send] = [a for a in actions if isinstance(a, Send)]
    assert (send.conn, send.stream, send.data) == (provider.conn, 0, call.encode())
    result = provider.result(call.call_id, "pong").signed_by(PROVIDER)
    [back] = provider.send_map(result.to_map())
    assert back == Send(alice.conn, 0, result.encode())
    # the slot is forgotten: a second reply is dropped
    assert provider.send(provider.result(call.call_id, "again")) == []


def test_call_to_an_unadvertised_procedure_is_answered_0x01() -> None:
    station = Station()
    alice = station.join(ALICE)
    call = alice.call("nobody.home")
    error = station_error(alice.send(call), alice)
    assert (error.call_id, error.code, error.detail) == (
        call.call_id,
        ErrorCode.UNKNOWN_NEXT_PEER,
        None,
    )


def test_call_whose_caller_is_another_identity_is_answered_0x0e() -> None:
    station = Station()
    provider, alice, mallory = (
        station.join(PROVIDER),
        station.join(ALICE),
        station.join(MALLORY),
    )
    provider.send(provider.advertise("svc"))
    alices_call = alice.call("svc").signed_by(ALICE).to_map()  # captured by mallory
    actions = mallory.send_map(alices_call)
    error = station_error(actions, mallory)
    assert (error.call_id, error.code) == (alices_call["call_id"], ErrorCode.SIGNATURE_INVALID)
    assert sent(actions, provider.conn) == []


def test_reply_from_a_connection_the_call_was_not_forwarded_to_is_dropped() -> None:
    station = Station()
    provider, alice, mallory = (
        station.join(PROVIDER),
        station.join(ALICE),
        station.join(MALLORY),
    )
    provider.send(provider.advertise("svc"))
    call = alice.call("svc")
    alice.send(call)
    assert mallory.send(mallory.result(call.call_id, "forged")) == []
    forged_error = Error(**envelope(NOW), call_id=call.call_id, code=1, reported_by=MALLORY.node_id)
    assert mallory.send(forged_error) == []
    # the provider itself cannot answer as somebody else
    assert provider.send(mallory.result(call.call_id, "x"), signer=MALLORY) == []
    # the real reply still routes
    result = only(sent_to(provider.send(provider.result(call.call_id, "real")), alice), Result)
    assert (result.payload, result.responded_by) == ("real", PROVIDER.node_id)
    assert result.verifies(PROVIDER.node_id)


def test_provider_error_is_routed_back_verbatim() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc")
    alice.send(call)
    error = Error(
        **envelope(NOW),
        call_id=call.call_id,
        code=ErrorCode.UNKNOWN_ERROR,
        reported_by=PROVIDER.node_id,
        detail=b"handler raised",
    ).signed_by(PROVIDER)
    assert provider.send_map(error.to_map()) == [Send(alice.conn, 0, error.encode())]


def test_provider_loss_answers_its_pending_calls_0x01() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc")
    alice.send(call)
    actions = station.core.connection_lost(provider.conn, NOW + 1)
    error = station_error(actions, alice)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.UNKNOWN_NEXT_PEER)


@pytest.mark.parametrize("deadline", [NOW - 1, NOW])
def test_call_with_a_deadline_in_the_past_is_answered_0x07(deadline: int) -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc", deadline_ms=deadline)
    actions = alice.send(call)
    error = station_error(actions, alice)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.EXPIRY_TOO_SOON)
    assert sent(actions, provider.conn) == []


def test_forwarded_call_whose_deadline_passes_is_answered_0x07_by_tick() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc", deadline_ms=NOW + 5_000)
    alice.send(call)
    assert station.core.tick(NOW + 4_999) == []
    error = station_error(station.core.tick(NOW + 5_000), alice)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.EXPIRY_TOO_SOON)
    # the provider's late reply goes nowhere, and the call is answered only once
    late = provider.result(call.call_id, "late", now=NOW + 5_001)
    assert provider.send(late, now=NOW + 5_001) == []
    assert station.core.tick(NOW + 6_000) == []


def test_unverifiable_call_is_answered_0x0e() -> None:
    station = Station()
    alice = station.join(ALICE)
    call = alice.call("_relay.ping", realm=ZERO_REALM)
    error = station_error(alice.send(call, signer=MALLORY), alice)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.SIGNATURE_INVALID)


def test_malformed_call_with_a_readable_call_id_is_answered_0x0f() -> None:
    station = Station()
    alice = station.join(ALICE)
    frame_map = alice.call("_relay.ping", realm=ZERO_REALM).signed_by(ALICE).to_map()
    frame_map["deadline_ms"] = "soon"
    error = station_error(alice.send_map(frame_map), alice)
    assert (error.call_id, error.code) == (frame_map["call_id"], ErrorCode.UNKNOWN_ERROR)
    assert error.detail is not None and error.detail.startswith(b"bad_request")


def test_malformed_call_without_a_readable_call_id_is_dropped() -> None:
    station = Station()
    alice = station.join(ALICE)
    frame_map = alice.call("_relay.ping", realm=ZERO_REALM).signed_by(ALICE).to_map()
    frame_map["call_id"] = b"short"
    assert alice.send_map(frame_map) == []


def test_unknown_frame_type_is_ignored() -> None:
    station = Station()
    alice = station.join(ALICE)
    frame_map = Ping(**envelope(NOW), nonce=fresh_id()).signed_by(ALICE).to_map()
    frame_map["frame_type"] = "swim_ping"
    assert alice.send_map(frame_map) == []


def test_framing_failure_sends_goodbye_protocol_error_and_closes() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    error = FramingError("bad_cbor", "truncated map")
    actions = station.core.framing_failed(provider.conn, 0, error, NOW + 1)
    goodbye = only(sent_to(actions, provider), Goodbye)
    assert goodbye.reason == "protocol_error"
    assert goodbye.verifies(STATION.node_id)
    assert provider.conn in closed(actions)
    # what the connection owned is purged
    reply = alice.send(alice.call("svc", now=NOW + 2), now=NOW + 2)
    assert station_error(reply, alice).code == ErrorCode.UNKNOWN_NEXT_PEER


def test_after_a_framing_failure_the_connection_is_not_heard() -> None:
    station = Station()
    alice = station.join(ALICE)
    station.core.framing_failed(alice.conn, 4, FramingError("bad_cbor", "x"), NOW + 1)
    ping = Ping(**envelope(NOW + 2), nonce=fresh_id())
    assert alice.send(ping, now=NOW + 2) == []


# --- advertise registry (§6.1, §13 #5) --------------------------------------------------------


def test_advertise_of_a_procedure_owned_by_another_connected_node_is_refused() -> None:
    station = Station()
    provider, mallory, alice = (
        station.join(PROVIDER),
        station.join(MALLORY),
        station.join(ALICE),
    )
    provider.send(provider.advertise("svc"))
    assert mallory.send(mallory.advertise("svc")) == []
    call = alice.call("svc")
    assert forwarded_call(alice.send(call), provider).call_id == call.call_id


def test_advertise_naming_another_advertiser_is_refused() -> None:
    station = Station()
    mallory, alice = station.join(MALLORY), station.join(ALICE)
    station.join(PROVIDER)
    mallory.send(mallory.advertise("svc", advertiser=PROVIDER.node_id))
    assert station_error(alice.send(alice.call("svc")), alice).code == ErrorCode.UNKNOWN_NEXT_PEER


def test_advertise_of_a_builtin_is_refused_and_the_builtin_still_answers() -> None:
    station = Station()
    mallory, alice = station.join(MALLORY), station.join(ALICE)
    mallory.send(mallory.advertise("_relay.ping", realm=ZERO_REALM))
    call = alice.call("_relay.ping", realm=ZERO_REALM)
    assert alice.send(call) == [RunBuiltin(alice.conn, 0, call.signed_by(ALICE))]


def test_advertise_of_a_house_procedure_in_any_realm_is_refused_and_counted() -> None:
    station = Station()
    mallory, provider, alice = station.join(MALLORY), station.join(PROVIDER), station.join(ALICE)
    for realm in (REALM, ZERO_REALM, HOUSE_REALM):
        assert mallory.send(mallory.advertise(MEMORY_ADD, realm=realm)) == []
    assert station.core.stats["reserved_advertise"] == 3
    call = alice.call(MEMORY_ADD)
    assert station_error(alice.send(call), alice).code == ErrorCode.UNKNOWN_NEXT_PEER
    provider.send(provider.advertise("svc"))  # an honest advertisement is unaffected
    assert len(sent_to(alice.send(alice.call("svc")), provider)) == 1


def test_unadvertise_by_a_non_owner_is_refused() -> None:
    station = Station()
    provider, mallory, alice = (
        station.join(PROVIDER),
        station.join(MALLORY),
        station.join(ALICE),
    )
    provider.send(provider.advertise("svc"))
    assert mallory.send(mallory.unadvertise("svc")) == []
    assert mallory.send(mallory.unadvertise("svc", advertiser=PROVIDER.node_id)) == []
    assert len(sent_to(alice.send(alice.call("svc")), provider)) == 1
    provider.send(provider.unadvertise("svc"))
    assert station_error(alice.send(alice.call("svc")), alice).code == ErrorCode.UNKNOWN_NEXT_PEER


def test_tombstone_blocks_other_advertisers_for_ten_seconds_then_expires() -> None:
    policy = StationPolicy()
    station = Station(policy)
    provider, mallory, alice = (
        station.join(PROVIDER),
        station.join(MALLORY),
        station.join(ALICE),
    )
    provider.send(provider.advertise("svc"))
    station.core.connection_lost(provider.conn, NOW)
    blocked_at = NOW + policy.advertise_tombstone_ms - 1
    mallory.send(mallory.advertise("svc", now=blocked_at), now=blocked_at)
    refused = alice.send(alice.call("svc", now=blocked_at), now=blocked_at)
    assert station_error(refused, alice).code == ErrorCode.UNKNOWN_NEXT_PEER

    free_at = NOW + policy.advertise_tombstone_ms
    mallory.send(mallory.advertise("svc", now=free_at), now=free_at)
    call = alice.call("svc", now=free_at)
    assert forwarded_call(alice.send(call, now=free_at), mallory).call_id == call.call_id


def test_tombstone_lets_the_same_advertiser_come_back_at_once() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    provider.send(provider.unadvertise("svc", now=NOW + 1), now=NOW + 1)
    provider.send(provider.advertise("svc", now=NOW + 2), now=NOW + 2)
    call = alice.call("svc", now=NOW + 3)
    assert forwarded_call(alice.send(call, now=NOW + 3), provider).call_id == call.call_id


def test_advertisement_is_realm_scoped() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc", realm=REALM))
    call = alice.call("svc", realm=OTHER_REALM)
    assert station_error(alice.send(call), alice).code == ErrorCode.UNKNOWN_NEXT_PEER


def test_expired_tombstones_are_forgotten_on_tick() -> None:
    """Inspects the core's table on purpose: unbounded growth has no other visible effect."""
    policy = StationPolicy()
    station = Station(policy)
    provider = station.join(PROVIDER)
    for n in range(3):
        provider.send(provider.advertise(f"svc{n}"))
        provider.send(provider.unadvertise(f"svc{n}"))
    station.core.tick(NOW + policy.advertise_tombstone_ms + 1)
    assert station.core.adverts.tombstones == {}


# --- §13 #6, #7, #8 ---------------------------------------------------------------------------


def test_subscribe_for_another_subscriber_is_refused() -> None:
    station = Station()
    alice, bob, mallory = station.join(ALICE), station.join(BOB), station.join(MALLORY)
    assert mallory.send(mallory.subscribe("news", subscriber=BOB.node_id)) == []
    actions = alice.send(alice.publish("news"))
    assert sent(actions, bob.conn) == [] and sent(actions, mallory.conn) == []
    assert actions == []


def test_publish_with_a_foreign_publisher_is_refused() -> None:
    station = Station()
    bob, mallory = station.join(BOB), station.join(MALLORY)
    bob.send(bob.subscribe("news"))
    assert mallory.send(mallory.publish("news", publisher=ALICE.node_id)) == []


def test_a_bad_publisher_sig_to_local_subscribers_is_left_to_them() -> None:
    """Subscribers verify publisher_sig end to end (a client core drops a bad one: see
    test_signatures_per_hop); the station checks it only before a link."""
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    forged = alice.publish("news").with_publisher_sig(MALLORY)
    # a genuine publisher_sig moved onto other content does not verify either
    genuine = alice.publish("news", b"other", seq=1).with_publisher_sig(ALICE)
    moved = dataclasses.replace(
        alice.publish("news", b"this", seq=1), publisher_sig=genuine.publisher_sig
    )
    for frame in (forged, moved):
        event = only(sent(alice.send(frame), bob.conn), Event)
        assert event.publisher_sig == frame.publisher_sig and not event.publisher_sig_valid()
    short = dataclasses.replace(alice.publish("news", seq=2), publisher_sig=b"\x01" * 63)
    assert alice.send(short) == []  # never verifiable: refused at once
    assert station.core.stats["bad_publisher_sig"] == 1


def test_event_from_a_client_is_dropped() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    event = Event(
        **envelope(NOW),
        topic="news",
        realm=REALM,
        publisher=ALICE.node_id,
        seq=0,
        payload=b"spoof",
    )
    assert alice.send(event) == []


# --- quotas (§13 #19) -------------------------------------------------------------------------


def quota_station(**quotas: Any) -> Station:
    return Station(StationPolicy(quotas=Quotas(**quotas)))


def test_subscription_quota() -> None:
    station = quota_station(max_subscriptions=2)
    alice, bob = station.join(ALICE), station.join(BOB)
    for topic in ("a", "b", "c", "a"):
        bob.send(bob.subscribe(topic))
    assert len(sent_to(alice.send(alice.publish("b")), bob)) == 1
    assert alice.send(alice.publish("c")) == []
    bob.send(bob.unsubscribe("a"))
    bob.send(bob.subscribe("c"))
    assert len(sent_to(alice.send(alice.publish("c")), bob)) == 1


def test_advertisement_quota() -> None:
    station = quota_station(max_advertisements=1)
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("one"))
    provider.send(provider.advertise("two"))
    provider.send(provider.advertise("one"))  # re-advertising what it holds is not a new entry
    assert len(sent_to(alice.send(alice.call("one")), provider)) == 1
    assert station_error(alice.send(alice.call("two")), alice).code == ErrorCode.UNKNOWN_NEXT_PEER


def test_pending_calls_quota_answers_0x08() -> None:
    station = quota_station(max_pending_calls=2)
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    first, second, third = alice.call("svc"), alice.call("svc"), alice.call("svc")
    assert len(sent_to(alice.send(first), provider)) == 1
    assert len(sent_to(alice.send(second), provider)) == 1
    error = station_error(alice.send(third), alice)
    assert (error.call_id, error.code) == (third.call_id, ErrorCode.UPSTREAM_CONGESTION)
    provider.send(provider.result(first.call_id, "done"))
    assert len(sent_to(alice.send(alice.call("svc")), provider)) == 1


def test_builtin_and_house_calls_count_as_pending_until_done() -> None:
    """Issue 11: a built-in or house-service call in flight holds a pending-call slot."""
    station = quota_station(max_pending_calls=2)
    station.core.services = frozenset({(REALM, "house_v1")})
    alice, bob = station.join(ALICE), station.join(BOB)
    ping = alice.call("_relay.ping", realm=ZERO_REALM)
    house = alice.call("house_v1")
    runs = [only_action(alice.send(ping)), only_action(alice.send(house))]
    assert all(isinstance(run, RunBuiltin) for run in runs)
    third = alice.call("_relay.ping", realm=ZERO_REALM)
    error = station_error(alice.send(third), alice)
    assert (error.call_id, error.code) == (third.call_id, ErrorCode.UPSTREAM_CONGESTION)
    # another connection's quota is its own
    assert isinstance(only_action(bob.send(bob.call("house_v1"))), RunBuiltin)
    station.core.builtin_done(alice.conn, 0, ping, Outcome.result({"ts": 1}), NOW)
    assert isinstance(only_action(alice.send(alice.call("house_v1"))), RunBuiltin)
    assert station_error(alice.send(alice.call("house_v1")), alice).code == (
        ErrorCode.UPSTREAM_CONGESTION
    )
    # a reply owed to a connection that went away frees nothing twice
    station.core.connection_lost(alice.conn, NOW)
    for call in (house, house):
        assert station.core.builtin_done(alice.conn, 0, call, Outcome.result("ok"), NOW) == []
    assert station.core.builtins_running[alice.conn] == 0
    assert station.core.builtins_running[bob.conn] == 1


def test_call_rate_token_bucket_answers_0x08() -> None:
    station = quota_station(call_rate=1.0, call_burst=2.0)
    alice = station.join(ALICE)

    def ping(now: int) -> list[Action]:
        return alice.send(alice.call("_relay.ping", realm=ZERO_REALM, now=now), now=now)

    assert isinstance(only_action(ping(NOW)), RunBuiltin)
    assert isinstance(only_action(ping(NOW)), RunBuiltin)
    assert station_error(ping(NOW), alice).code == ErrorCode.UPSTREAM_CONGESTION
    assert station_error(ping(NOW + 999), alice).code == ErrorCode.UPSTREAM_CONGESTION
    assert isinstance(only_action(ping(NOW + 2_000)), RunBuiltin)


def only_action(actions: list[Action]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


def test_stream_quota_answers_stream_error_quota_exceeded() -> None:
    station = quota_station(max_streams=1)
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("feed"))
    first, second = alice.new_stream(), alice.new_stream()
    first_id, second_id = fresh_id(), fresh_id()
    alice.send(alice.stream_open("feed", "bidi", first_id), stream=first)
    actions = alice.send(alice.stream_open("feed", "bidi", second_id), stream=second)
    refusal = only(sent(actions, alice.conn, second), StreamError)
    assert (refusal.stream_id, refusal.code, refusal.signer) == (
        second_id,
        b"quota_exceeded",
        None,
    )
    assert refusal.verifies(STATION.node_id)
    assert ended(actions) == {(alice.conn, second)}
    assert sent(actions, provider.conn) == []
    # the refused stream stays ignored; a finished route frees its slot
    assert alice.send(alice.data(second_id, 0, b"x"), stream=second) == []
    alice.send(alice.end(first_id, "both"), stream=first)
    third = alice.new_stream()
    actions = alice.send(alice.stream_open("feed", "bidi", fresh_id()), stream=third)
    assert len(sent(actions, provider.conn)) == 1


def test_reconfigure_applies_new_quotas_to_the_open_connections() -> None:
    """A reload (relay.ops.reload) goes through ``reconfigure``: the quotas read per frame change
    for connections already open, whose token buckets keep their tokens at the new rate."""
    station = quota_station(
        max_subscriptions=1,
        max_advertisements=1,
        max_pending_calls=1,
        max_streams=1,
        call_rate=1.0,
        call_burst=1.0,
    )
    provider, alice, bob = station.join(PROVIDER), station.join(ALICE), station.join(BOB)
    for name in ("one", "two"):
        provider.send(provider.advertise(name))  # "two": over the advertisement quota
    for topic in ("a", "b"):
        bob.send(bob.subscribe(topic))  # "b": over the subscription quota
    assert alice.send(alice.publish("b")) == []
    assert len(sent_to(alice.send(alice.call("one")), provider)) == 1  # its one call token
    first = alice.new_stream()
    alice.send(alice.stream_open("one", "bidi", fresh_id()), stream=first)
    policy = station.core.policy
    quotas = dataclasses.replace(
        policy.quotas,
        max_subscriptions=2,
        max_advertisements=2,
        max_pending_calls=2,
        max_streams=2,
        call_rate=1_000.0,
        call_burst=1_000.0,
    )
    station.core.reconfigure(dataclasses.replace(policy, quotas=quotas, realm_sweep_ms=5_000))
    assert (station.core.policy.quotas, station.core.realms.sweep_ms) == (quotas, 5_000)
    bob.send(bob.subscribe("b"))
    assert len(sent_to(alice.send(alice.publish("b")), bob)) == 1
    provider.send(provider.advertise("two"))
    # the bucket kept its (spent) token: nothing more this millisecond, one the next
    refused = station_error(alice.send(alice.call("two")), alice)
    assert refused.code == ErrorCode.UPSTREAM_CONGESTION
    later = NOW + 1
    call = alice.call("two", now=later)
    assert len(sent_to(alice.send(call, now=later), provider)) == 1  # a second call in flight
    second = alice.new_stream()
    actions = alice.send(alice.stream_open("one", "bidi", fresh_id()), stream=second)
    assert len(sent(actions, provider.conn)) == 1  # a second stream


def test_reconfigure_refuses_what_needs_a_restart_and_changes_nothing() -> None:
    station = quota_station(max_subscriptions=1)
    before = station.core.policy
    quotas = dataclasses.replace(before.quotas, max_subscriptions=5, station_event_rate=1.0)
    wanted = dataclasses.replace(before, quotas=quotas, drain_ms=1, realm_sweep_ms=5)
    with pytest.raises(ValueError, match=r"restart.*: drain_ms, quotas\.station_event_rate$"):
        station.core.reconfigure(wanted)
    assert station.core.policy is before
    assert station.core.realms.sweep_ms != 5
    alice, bob = station.join(ALICE), station.join(BOB)
    for topic in ("a", "b"):
        bob.send(bob.subscribe(topic))
    assert alice.send(alice.publish("b")) == []  # still one subscription each


def test_restart_only_changes_names_each_field_once_in_order() -> None:
    old = StationPolicy()
    assert restart_only_changes(old, old) == []
    live = dataclasses.replace(old.quotas, publish_rate=1.0, max_streams=3)
    assert restart_only_changes(old, dataclasses.replace(old, quotas=live, realm_sweep_ms=1)) == []
    quotas = dataclasses.replace(old.quotas, max_station_advertisements=1)
    new = dataclasses.replace(old, max_connections=3, quotas=quotas, quic_retry=False)
    assert restart_only_changes(old, new) == [
        "max_connections",
        "quic_retry",
        "quotas.max_station_advertisements",
    ]


def test_publish_over_the_rate_pauses_the_control_stream_instead_of_dropping() -> None:
    """Backpressure, not loss: the PUBLISH without a token waits with everything after it."""
    station = quota_station(publish_rate=100.0, publish_burst=1.0)
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    assert len(sent_to(alice.send(alice.publish("news", seq=0)), bob)) == 1
    frames = [alice.publish("news", seq=1), alice.subscribe("later"), alice.publish("news", seq=2)]
    maps = [frame.signed_by(ALICE).to_map() for frame in frames]
    actions = station.core.frames_received(alice.conn, 0, maps, NOW)
    [pause] = actions
    assert pause == PauseReading(alice.conn, 0, NOW + 10)  # one token at 100/s
    assert station.core.pacer.paused(alice.conn)
    # what arrives meanwhile (the shell should not deliver it, but order holds if it does)
    late = alice.publish("news", seq=3).signed_by(ALICE).to_map()
    assert station.core.frames_received(alice.conn, 0, [late], NOW + 5) == []
    actions = station.core.resume(alice.conn, NOW + 10)
    assert [e.seq for e in sent_to(actions, bob) if isinstance(e, Event)] == [1]
    assert isinstance(actions[-1], PauseReading)  # seq 2 waits for its own token
    actions = station.core.resume(alice.conn, actions[-1].until_ms)
    assert isinstance(actions[-1], PauseReading)
    actions = station.core.resume(alice.conn, actions[-1].until_ms)
    assert [e.seq for e in sent_to(actions, bob) if isinstance(e, Event)] == [3]
    assert actions[-1] == ResumeReading(alice.conn, 0)
    assert not station.core.pacer.paused(alice.conn)
    assert station.core.stats["publish_rate_limited"] == 0
    # the honest subscriber's own control stream was never paused
    assert station.core.refusals_of(bob.conn) == ()
    assert dict(station.core.refusals_of(alice.conn))["publish_slowed"] >= 1


def test_resume_waits_for_a_batch_of_tokens_not_one() -> None:
    station = quota_station(publish_rate=2000.0, publish_burst=1.0)
    alice = station.join(ALICE)
    alice.send(alice.publish("news", seq=0))
    [pause] = alice.send(alice.publish("news", seq=1))
    assert isinstance(pause, PauseReading)
    assert pause.until_ms == NOW + 1  # the burst (1) caps the batch


def test_control_stream_ending_while_paused_ends_after_the_backlog() -> None:
    station = quota_station(publish_rate=1.0, publish_burst=1.0)
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    alice.send(alice.publish("news", seq=0))
    [pause] = alice.send(alice.publish("news", seq=1))
    assert isinstance(pause, PauseReading)
    assert station.core.stream_ended(alice.conn, 0, NOW) == []
    actions = station.core.resume(alice.conn, pause.until_ms)
    assert only(sent_to(actions, bob), Event).seq == 1
    assert alice.conn in closed(actions)
    assert not station.core.pacer.paused(alice.conn)


def test_slow_consumer_gets_goodbye_and_is_closed_at_once() -> None:
    station = quota_station(max_outbound_bytes=1000)
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.subscribe("news"))
    assert station.core.outbound_full(bob.conn, 0, 1000, NOW) == []  # at the bound: fine
    assert station.core.outbound_full(bob.conn, 4, 5000, NOW) == []  # not the control stream
    actions = station.core.outbound_full(bob.conn, 0, 1001, NOW)
    goodbye = only(sent_to(actions, bob), Goodbye)
    assert goodbye.reason == "slow_consumer"
    assert closed(actions)[bob.conn] == Close(bob.conn, "slow_consumer")
    assert station.core.outbound_full(bob.conn, 0, 9999, NOW) == []  # once
    # its subscriptions are gone; the publisher is unaffected
    assert sent_to(alice.send(alice.publish("news")), bob) == []
    assert station.core.stats["slow_consumers"] == 1


def test_refusals_without_an_in_band_answer_are_counted_for_that_connection_only() -> None:
    station = quota_station(max_subscriptions=1, max_advertisements=1)
    alice, bob = station.join(ALICE), station.join(BOB)
    bob.send(bob.advertise("svc"))
    for topic in ("a", "b", "c"):
        alice.send(alice.subscribe(topic))
    alice.send(alice.advertise("svc"))  # taken by bob
    alice.send(alice.advertise("mine"))
    alice.send(alice.advertise("more"))  # over the quota
    [run] = alice.send(alice.call("_relay.ping", realm=ZERO_REALM))
    assert isinstance(run, RunBuiltin)
    assert dict(run.refused) == {
        "subscription_quota": 2,
        "advertise_taken": 1,
        "advertise_quota": 1,
    }
    [run] = bob.send(bob.call("_relay.ping", realm=ZERO_REALM))
    assert isinstance(run, RunBuiltin) and run.refused == ()
    station.core.connection_lost(alice.conn, NOW)
    assert station.core.refusals_of(alice.conn) == ()


# --- built-ins (§6.2 step 2, §6.3) -----------------------------------------------------------


def test_builtin_call_runs_and_its_result_and_error_go_back_on_the_control_stream() -> None:
    station = Station()
    alice = station.join(ALICE)
    call = alice.call("_relay.ping", realm=ZERO_REALM)
    [run] = alice.send(call)
    assert run == RunBuiltin(alice.conn, 0, call.signed_by(ALICE))

    done = station.core.builtin_done(alice.conn, 0, run.call, Outcome.result({"ts": 1}), NOW)
    result = only(sent_to(done, alice), Result)
    assert (result.call_id, result.payload, result.responded_by) == (
        call.call_id,
        {"ts": 1},
        STATION.node_id,
    )
    assert result.verifies(STATION.node_id)
    assert ended(done) == set()

    failed = Outcome.error(ErrorCode.UNKNOWN_ERROR, b"bad_request: key")
    error = station_error(station.core.builtin_done(alice.conn, 0, run.call, failed, NOW), alice)
    assert (error.call_id, error.code, error.detail) == (
        call.call_id,
        ErrorCode.UNKNOWN_ERROR,
        b"bad_request: key",
    )


def test_content_stream_is_finished_after_the_last_reply() -> None:
    station = Station()
    alice = station.join(ALICE)
    stream = alice.new_stream()
    calls = [alice.call("_content.get_block", realm=ZERO_REALM) for _ in range(2)]
    runs = [only_action(alice.send(call, stream=stream)) for call in calls]
    assert all(isinstance(run, RunBuiltin) and run.stream == stream for run in runs)
    assert station.core.stream_ended(alice.conn, stream, NOW) == []  # replies still owed
    first = station.core.builtin_done(alice.conn, stream, calls[0], Outcome.result("ok"), NOW)
    assert only(sent(first, alice.conn, stream), Result).call_id == calls[0].call_id
    assert ended(first) == set()
    last = station.core.builtin_done(alice.conn, stream, calls[1], Outcome.result(b"x"), NOW)
    assert only(sent(last, alice.conn, stream), Result).call_id == calls[1].call_id
    assert ended(last) == {(alice.conn, stream)}
    assert last[-1] == EndStream(alice.conn, stream)


def test_content_stream_fin_after_every_reply_ends_the_stream_at_once() -> None:
    station = Station()
    alice = station.join(ALICE)
    stream = alice.new_stream()
    call = alice.call("_content.get_block", realm=ZERO_REALM)
    alice.send(call, stream=stream)
    station.core.builtin_done(alice.conn, stream, call, Outcome.result("not_found"), NOW)
    assert station.core.stream_ended(alice.conn, stream, NOW) == [EndStream(alice.conn, stream)]


def test_call_on_a_content_stream_for_a_non_builtin_is_answered_0x01_there() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    stream = alice.new_stream()
    call = alice.call("svc")
    actions = alice.send(call, stream=stream)
    error = station_error(actions, alice, stream)
    assert (error.call_id, error.code) == (call.call_id, ErrorCode.UNKNOWN_NEXT_PEER)
    assert sent(actions, provider.conn) == []


def test_first_frame_other_than_call_or_stream_open_leaves_the_stream_ignored() -> None:
    station = Station()
    alice = station.join(ALICE)
    stream = alice.new_stream()
    assert alice.send(alice.subscribe("news"), stream=stream) == []
    assert alice.send(alice.call("_relay.ping", realm=ZERO_REALM), stream=stream) == []


def test_an_ignored_stream_is_forgotten_when_it_ends() -> None:
    """Inspects the core's peer state on purpose: the growth has no other visible effect."""
    station = Station()
    alice = station.join(ALICE)
    for _ in range(3):
        stream = alice.new_stream()
        alice.send(alice.subscribe("news"), stream=stream)
        station.core.stream_ended(alice.conn, stream, NOW)
    assert station.core.peers[alice.conn].ignored_streams == set()


# --- streaming routes (§8) --------------------------------------------------------------------


@dataclass
class Route:
    stream_id: bytes
    caller: Client
    caller_stream: int
    provider: Client
    provider_stream: int

    def from_caller(self, frame: Frame, *, now: int = NOW) -> list[Action]:
        return self.caller.send(frame, stream=self.caller_stream, now=now)

    def from_provider(self, frame: Frame, *, now: int = NOW) -> list[Action]:
        return self.provider.send(frame, stream=self.provider_stream, now=now)

    def to_caller(self, actions: list[Action]) -> list[Frame]:
        return sent(actions, self.caller.conn, self.caller_stream)

    def to_provider(self, actions: list[Action]) -> list[Frame]:
        return sent(actions, self.provider.conn, self.provider_stream)

    @property
    def legs(self) -> set[tuple[int, int]]:
        return {
            (self.caller.conn, self.caller_stream),
            (self.provider.conn, self.provider_stream),
        }


def open_route(station: Station, mode: str) -> Route:
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("feed"))
    stream, stream_id = alice.new_stream(), fresh_id()
    actions = alice.send(alice.stream_open("feed", mode, stream_id), stream=stream)
    [send] = [a for a in actions if isinstance(a, Send)]
    assert send.conn == provider.conn
    return Route(stream_id, alice, stream, provider, send.stream)


def test_stream_open_opens_a_provider_stream_and_relays_the_open_verbatim() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("feed"))
    opened = []
    for _ in range(2):
        stream = alice.new_stream()
        opening = alice.stream_open("feed", "server_stream", fresh_id()).signed_by(ALICE)
        [send] = alice.send_map(opening.to_map(), stream=stream)
        assert isinstance(send, Send)
        assert (send.conn, send.data) == (provider.conn, opening.encode())
        assert only(decode(send.data), StreamOpen).verifies(ALICE.node_id)
        opened.append(send.stream)
    assert opened == [1, 5]


def test_stream_open_for_an_unknown_procedure_answers_unknown_next_peer() -> None:
    station = Station()
    alice = station.join(ALICE)
    stream, stream_id = alice.new_stream(), fresh_id()
    actions = alice.send(alice.stream_open("nobody.home", "bidi", stream_id), stream=stream)
    error = only(sent(actions, alice.conn, stream), StreamError)
    assert (error.stream_id, error.code, error.message, error.signer) == (
        stream_id,
        b"unknown_next_peer",
        b"procedure not advertised",
        None,
    )
    assert error.verifies(STATION.node_id)
    assert ended(actions) == {(alice.conn, stream)}


def test_stream_open_naming_another_caller_is_refused() -> None:
    station = Station()
    provider, mallory = station.join(PROVIDER), station.join(MALLORY)
    provider.send(provider.advertise("feed"))
    alice = Client(station.core, mallory.conn, ALICE)
    stream = mallory.new_stream()
    opening = alice.stream_open("feed", "bidi", fresh_id()).signed_by(ALICE).to_map()
    actions = mallory.send_map(opening, stream=stream)
    assert sent(actions, provider.conn) == []
    assert ended(actions) == {(mallory.conn, stream)}


def test_server_stream_ends_on_the_providers_end_send() -> None:
    route = open_route(Station(), "server_stream")
    sid = route.stream_id
    for seq in range(2):
        data = route.provider.data(sid, seq, b"chunk")
        actions = route.from_provider(data)
        assert route.to_caller(actions) == [data.signed_by(PROVIDER)]
        assert ended(actions) == set()
    # the caller half-closing does not end a server stream
    actions = route.from_caller(route.caller.end(sid, "send"))
    assert len(route.to_provider(actions)) == 1 and ended(actions) == set()
    actions = route.from_provider(route.provider.end(sid, "send"))
    assert only(route.to_caller(actions), StreamEnd).role == "send"
    assert ended(actions) == route.legs
    assert route.from_provider(route.provider.data(sid, 2, b"late")) == []


def test_client_stream_keeps_the_route_after_the_callers_end_send() -> None:
    station = Station()
    route = open_route(station, "client_stream")
    sid = route.stream_id
    actions = route.from_caller(route.caller.data(sid, 0, b"up"))
    assert only(route.to_provider(actions), StreamData).body == b"up"
    actions = route.from_caller(route.caller.end(sid, "send"))
    assert only(route.to_provider(actions), StreamEnd).role == "send"
    assert ended(actions) == set()
    # the caller's FIN after END(send) is the normal end of its direction
    assert station.core.stream_ended(route.caller.conn, route.caller_stream, NOW) == []
    reply = route.provider.stream_reply(sid, {"total": 2})
    actions = route.from_provider(reply)
    assert route.to_caller(actions) == [reply.signed_by(PROVIDER)]
    assert ended(actions) == route.legs


@pytest.mark.parametrize("first", ["caller", "provider"])
def test_bidi_ends_once_both_sides_sent_end_send(first: str) -> None:
    station = Station()
    route = open_route(station, "bidi")
    sid = route.stream_id
    caller_end, provider_end = route.caller.end(sid, "send"), route.provider.end(sid, "send")
    if first == "caller":
        actions = route.from_caller(caller_end)
        assert len(route.to_provider(actions)) == 1 and ended(actions) == set()
        actions = route.from_provider(route.provider.data(sid, 0, b"down"))
        assert only(route.to_caller(actions), StreamData).body == b"down"
        actions = route.from_provider(provider_end)
        assert len(route.to_caller(actions)) == 1
    else:
        actions = route.from_provider(provider_end)
        assert len(route.to_caller(actions)) == 1 and ended(actions) == set()
        actions = route.from_caller(route.caller.data(sid, 0, b"up"))
        assert only(route.to_provider(actions), StreamData).body == b"up"
        actions = route.from_caller(caller_end)
        assert len(route.to_provider(actions)) == 1
    assert ended(actions) == route.legs


TERMINALS = [
    ("provider", "reply"),
    ("provider", "error"),
    ("provider", "end_both"),
    ("caller", "error"),
    ("caller", "end_both"),
]


def terminal_frame(sender: Client, stream_id: bytes, kind: str) -> Frame:
    if kind == "reply":
        return sender.stream_reply(stream_id, "done")
    if kind == "error":
        return sender.stream_error(stream_id)
    return sender.end(stream_id, "both")


@pytest.mark.parametrize("mode", ["server_stream", "client_stream", "bidi"])
@pytest.mark.parametrize(("side", "kind"), TERMINALS)
def test_reply_error_and_end_both_end_the_route_at_once(mode: str, side: str, kind: str) -> None:
    route = open_route(Station(), mode)
    sender = route.provider if side == "provider" else route.caller
    sid = route.stream_id
    terminal = terminal_frame(sender, sid, kind)
    if side == "provider":
        actions = route.from_provider(terminal)
        relayed = route.to_caller(actions)
    else:
        actions = route.from_caller(terminal)
        relayed = route.to_provider(actions)
    assert relayed == [terminal.signed_by(sender.identity)]
    assert ended(actions) == route.legs
    assert route.from_caller(route.caller.data(sid, 0, b"late")) == []


def test_route_frames_with_a_foreign_signer_or_stream_id_are_dropped() -> None:
    route = open_route(Station(), "bidi")
    sid = route.stream_id
    mallory = Client(route.caller.core, route.caller.conn, MALLORY)
    assert route.from_caller(mallory.data(sid, 0, b"x")) == []
    assert route.from_caller(route.caller.data(fresh_id(), 0, b"x")) == []
    assert route.from_caller(route.caller.stream_open("feed", "bidi", sid)) == []


@pytest.mark.parametrize("side", ["caller", "provider"])
def test_fin_before_a_terminal_frame_sends_stream_error_to_the_other_leg(side: str) -> None:
    station = Station()
    route = open_route(station, "bidi")
    if side == "caller":
        lost, other = (route.caller.conn, route.caller_stream), route.provider
        other_stream = route.provider_stream
    else:
        lost, other = (route.provider.conn, route.provider_stream), route.caller
        other_stream = route.caller_stream
    actions = station.core.stream_ended(*lost, NOW + 1)
    error = only(sent(actions, other.conn, other_stream), StreamError)
    assert (error.stream_id, error.code, error.signer) == (route.stream_id, b"unavailable", None)
    assert error.verifies(STATION.node_id)
    assert (other.conn, other_stream) in ended(actions)
    assert sent(actions, lost[0], lost[1]) == []
    assert route.from_provider(route.provider.data(route.stream_id, 0, b"late")) == []


def test_fin_before_a_terminal_frame_also_finishes_the_station_side_of_that_leg() -> None:
    station = Station()
    route = open_route(station, "bidi")
    actions = station.core.stream_ended(route.caller.conn, route.caller_stream, NOW + 1)
    assert ended(actions) == route.legs


def test_stream_reset_sends_stream_error_to_the_other_leg() -> None:
    station = Station()
    route = open_route(station, "client_stream")
    actions = station.core.stream_reset(route.provider.conn, route.provider_stream, NOW + 1)
    error = only(route.to_caller(actions), StreamError)
    assert (error.stream_id, error.code) == (route.stream_id, b"unavailable")
    assert (route.caller.conn, route.caller_stream) in ended(actions)


@pytest.mark.parametrize("lost", ["caller", "provider"])
def test_connection_loss_sends_stream_error_to_the_surviving_leg(lost: str) -> None:
    station = Station()
    route = open_route(station, "bidi")
    if lost == "provider":
        gone, survivor, survivor_stream = route.provider, route.caller, route.caller_stream
    else:
        gone, survivor, survivor_stream = route.caller, route.provider, route.provider_stream
    actions = station.core.connection_lost(gone.conn, NOW + 1)
    error = only(sent(actions, survivor.conn, survivor_stream), StreamError)
    assert (error.stream_id, error.code, error.signer) == (route.stream_id, b"unavailable", None)
    assert ended(actions) == {(survivor.conn, survivor_stream)}
    assert sent(actions, gone.conn) == []


def test_route_ttl_tears_the_route_down_on_tick() -> None:
    policy = StationPolicy()
    station = Station(policy)
    route = open_route(station, "bidi")
    assert station.core.tick(NOW + policy.stream_route_ttl_ms - 1) == []
    actions = station.core.tick(NOW + policy.stream_route_ttl_ms)
    for frames in (route.to_caller(actions), route.to_provider(actions)):
        error = only(frames, StreamError)
        assert error.stream_id == route.stream_id and error.signer is None
    assert ended(actions) == route.legs
    assert station.core.tick(NOW + policy.stream_route_ttl_ms + 1) == []


# --- shutdown ---------------------------------------------------------------------------------


def test_shutdown_says_goodbye_operator_stop_to_every_connected_peer() -> None:
    station = Station()
    alice, bob = station.join(ALICE), station.join(BOB)
    handshaking = station.dial(CAROL)
    actions = station.core.shutdown(NOW + 1)
    for client in (alice, bob):
        goodbye = only(sent_to(actions, client), Goodbye)
        assert goodbye.reason == "operator_stop"
        assert goodbye.verifies(STATION.node_id)
    assert sent(actions, handshaking.conn) == []
    assert set(closed(actions)) == {alice.conn, bob.conn, handshaking.conn}
    assert alice.send(alice.call("_relay.ping", realm=ZERO_REALM), now=NOW + 2) == []
