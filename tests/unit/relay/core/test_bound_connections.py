"""Each claim verified once (issue 27, SECURITY.md "Each claim verified once"): the station side.

A client whose CONNECT names this station in ``bound_to`` gets a *bound* connection: a frame
whose claimed signer is the connection's node id is admitted on the id comparison alone (no
Ed25519 verify at the station; the end that acts verifies it), a frame claiming another signer
is refused without a verify. A CONNECT bound to another station is refused (a replay of what
that station captured), as is a stale one. Unbound connections and station links keep the
per-frame verification, and a bound client's frame is verified before it goes onto a link.
Ed25519 calls are counted on PyNaCl's bindings, which ``macula.wire.identity`` calls.
"""

from __future__ import annotations

import dataclasses
import os

from macula.wire.codes import ErrorCode
from macula.wire.frames import CAP_STATION, Call, Connect, Event, Hello, Result
from macula.wire.identity import Identity
from relay.core.actions import Send
from relay.core.router import RouterCore
from support.identities import hardened
from support.routerkit import (
    ALICE,
    BOB,
    MALLORY,
    NOW,
    PROVIDER,
    REALM,
    SKEW,
    STATION,
    Client,
    Station,
    closed,
    envelope,
    fresh_id,
    only,
    sent,
    station_error,
)
from support.verifycount import Verifies

OTHER_STATION = Identity(bytes(range(140, 172)))
LINKED = hardened(30)


def bound_connect(client: Client, to: bytes = STATION.node_id, *, now: int = NOW) -> Connect:
    return dataclasses.replace(client.connect(now=now), bound_to=to)


def join_bound(station: Station, identity: Identity) -> Client:
    client = station.dial(identity)
    hello = only(sent(client.send(bound_connect(client)), client.conn, 0), Hello)
    assert hello.accepted
    return client


def join_station(station: Station, identity: Identity, *, bound_to: bytes | None = None) -> Client:
    """A peer station's link (CONNECT with the station bit), ``bound_to`` if given."""
    link = station.dial(identity)
    connect = dataclasses.replace(link.connect(), capabilities=CAP_STATION, bound_to=bound_to)
    hellos = [f for f in sent(link.send(connect), link.conn, 0) if isinstance(f, Hello)]
    assert only(hellos, Hello).accepted
    return link


# --- the CONNECT: bound to this station, fresh ----------------------------------------------


def test_a_connect_bound_to_this_station_is_accepted_and_binds_the_connection() -> None:
    station = Station()
    alice = join_bound(station, ALICE)
    assert station.core.peers[alice.conn].bound is True
    unbound = station.join(BOB)
    assert station.core.peers[unbound.conn].bound is False


def test_a_connect_replayed_to_another_station_is_refused_0x0e() -> None:
    """Station A captured Alice's CONNECT bound to A and replays it to B, within the skew."""
    station_a = Station()
    alice = station_a.dial(ALICE)
    captured = bound_connect(alice).signed_by(ALICE).to_map()
    assert only(sent(alice.send_map(captured), alice.conn, 0), Hello).accepted
    station_b = Station()
    station_b.core = RouterCore(
        OTHER_STATION, station_b.policy, open_stream=station_b.streams, random_bytes=os.urandom
    )
    replayer = station_b.dial(ALICE)
    actions = replayer.send_map(captured, now=NOW + 1_000)
    hello = only(sent(actions, replayer.conn, 0), Hello)
    assert (hello.accepted, hello.refusal_code) == (False, ErrorCode.SIGNATURE_INVALID)
    assert replayer.conn in closed(actions)
    assert station_b.core.stats["handshakes"] == 0


def test_a_stale_bound_connect_is_refused_0x0e() -> None:
    station = Station()
    alice = station.dial(ALICE)
    actions = alice.send(bound_connect(alice, now=NOW - SKEW - 1), now=NOW)
    hello = only(sent(actions, alice.conn, 0), Hello)
    assert (hello.accepted, hello.refusal_code) == (False, ErrorCode.SIGNATURE_INVALID)


def test_a_bound_connect_replayed_to_the_same_station_is_refused() -> None:
    station = Station()
    alice = station.dial(ALICE)
    captured = bound_connect(alice).signed_by(ALICE).to_map()
    alice.send_map(captured)
    replayer = station.dial(ALICE)
    hello = only(sent(replayer.send_map(captured, now=NOW + 1), replayer.conn, 0), Hello)
    assert hello.accepted is False


def test_a_station_link_is_never_bound() -> None:
    station = Station()
    link = join_station(station, LINKED, bound_to=STATION.node_id)
    assert station.core.peers[link.conn].bound is False


# --- frames on a bound connection -----------------------------------------------------------


def test_rpc_between_bound_clients_costs_the_station_no_verify(verifies: Verifies) -> None:
    station = Station()
    provider, alice = join_bound(station, PROVIDER), join_bound(station, ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc", payload={"x": 1}).signed_by(ALICE)
    with verifies.on():
        [send] = [a for a in alice.send_map(call.to_map()) if isinstance(a, Send)]
        result = provider.result(call.call_id, "pong").signed_by(PROVIDER)
        [back] = provider.send_map(result.to_map())
    assert (send.conn, send.data) == (provider.conn, call.encode())
    assert back == Send(alice.conn, 0, result.encode())
    assert verifies.n == 0


def test_rpc_between_unbound_clients_is_verified_per_frame(verifies: Verifies) -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc").signed_by(ALICE)
    with verifies.on():
        alice.send_map(call.to_map())
        provider.send(provider.result(call.call_id, "pong"))
    assert verifies.n == 2


def test_a_publish_on_a_bound_connection_costs_no_verify(verifies: Verifies) -> None:
    station = Station()
    alice, bob = join_bound(station, ALICE), join_bound(station, BOB)
    bob.send(bob.subscribe("news"))
    with verifies.on():
        actions = alice.send(alice.publish("news"))
    assert [type(f) for f in sent(actions, bob.conn)] == [Event]
    assert verifies.n == 0


def test_a_forged_caller_on_a_bound_connection_is_refused_without_a_verify(
    verifies: Verifies,
) -> None:
    station = Station()
    provider, alice = join_bound(station, PROVIDER), join_bound(station, ALICE)
    mallory = join_bound(station, MALLORY)
    provider.send(provider.advertise("svc"))
    alices_call = alice.call("svc").signed_by(ALICE).to_map()  # genuine, captured
    with verifies.on():
        actions = mallory.send_map(alices_call)
    error = station_error(actions, mallory)
    assert (error.call_id, error.code) == (alices_call["call_id"], ErrorCode.SIGNATURE_INVALID)
    assert sent(actions, provider.conn) == []
    assert verifies.n == 0
    assert station.core.stats["foreign_signer"] == 1


def test_a_forged_responder_on_a_bound_connection_is_refused_without_a_verify(
    verifies: Verifies,
) -> None:
    station = Station()
    provider, alice = join_bound(station, PROVIDER), join_bound(station, ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc")
    alice.send(call)
    forged = Result(
        **envelope(NOW), call_id=call.call_id, payload="forged", responded_by=BOB.node_id
    ).signed_by(BOB)
    with verifies.on():
        assert provider.send_map(forged.to_map()) == []
    assert verifies.n == 0
    assert station.core.stats["foreign_signer"] == 1


def test_a_forged_stream_signer_on_a_bound_connection_is_refused() -> None:
    station = Station()
    provider, alice = join_bound(station, PROVIDER), join_bound(station, ALICE)
    provider.send(provider.advertise("svc"))
    stream, stream_id = alice.new_stream(), fresh_id()
    opened = alice.send(alice.stream_open("svc", "client_stream", stream_id), stream=stream)
    assert sent(opened, provider.conn)
    data = dataclasses.replace(alice.data(stream_id, 0, b"x"), signer=BOB.node_id)
    actions = alice.send(data, stream=stream, signer=BOB)
    assert sent(actions, provider.conn) == []
    assert station.core.stats["foreign_signer"] == 1


def test_a_bad_signature_claiming_the_connection_is_the_acting_ends_to_refuse() -> None:
    """On a bound connection the station compares ids; the provider verifies the CALL."""
    station = Station()
    provider, alice = join_bound(station, PROVIDER), join_bound(station, ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc").signed_by(MALLORY)  # Alice's own frame, spoilt
    [send] = [a for a in alice.send_map(call.to_map()) if isinstance(a, Send)]
    assert send.conn == provider.conn
    [forwarded] = sent([send], provider.conn)
    assert isinstance(forwarded, Call) and forwarded.caller == ALICE.node_id
    assert not forwarded.verifies(ALICE.node_id)  # what the provider's core refuses


# --- unbound connections and links: verified as before ------------------------------------


def test_an_unbound_client_still_has_every_frame_verified() -> None:
    station = Station()
    provider, alice = station.join(PROVIDER), station.join(ALICE)
    provider.send(provider.advertise("svc"))
    call = alice.call("svc")
    actions = alice.send(call, signer=MALLORY)
    assert station_error(actions, alice).code == ErrorCode.SIGNATURE_INVALID
    assert sent(actions, provider.conn) == []
    bob = station.join(BOB)
    bob.send(bob.subscribe("news"))
    assert sent(alice.send(alice.publish("news"), signer=MALLORY), bob.conn) == []
    assert station.core.stats["unverified_frame"] == 2


def test_a_hostile_linked_stations_frames_are_still_verified() -> None:
    station = Station()
    bob = join_bound(station, BOB)
    bob.send(bob.subscribe("news"))
    link = join_station(station, LINKED, bound_to=STATION.node_id)
    event = Event(
        **envelope(NOW), topic="news", realm=REALM, publisher=ALICE.node_id, seq=1, payload=b"x"
    )
    assert sent(link.send(event, signer=MALLORY), bob.conn) == []
    assert station.core.stats["unverified_frame"] == 1


def test_a_bound_clients_call_is_verified_before_it_crosses_a_link(verifies: Verifies) -> None:
    station = Station()
    link = join_station(station, LINKED)
    link.send(link.advertise("far.svc", advertiser=LINKED.node_id))
    alice = join_bound(station, ALICE)
    spoilt = alice.call("far.svc").signed_by(MALLORY)
    actions = alice.send_map(spoilt.to_map())
    assert sent(actions, link.conn) == []
    assert station_error(actions, alice).code == ErrorCode.SIGNATURE_INVALID
    good = alice.call("far.svc").signed_by(ALICE)
    with verifies.on():
        actions = alice.send_map(good.to_map())
    assert [f.FRAME_TYPE for f in sent(actions, link.conn)] == ["call"]
    assert verifies.n == 1


def test_a_bound_providers_result_is_verified_before_it_crosses_a_link() -> None:
    station = Station()
    link = join_station(station, LINKED)
    provider = join_bound(station, PROVIDER)
    provider.send(provider.advertise("svc"))
    call = Call(
        **envelope(NOW),
        call_id=fresh_id(),
        procedure="svc",
        realm=REALM,
        payload={},
        deadline_ms=NOW + 30_000,
        caller=ALICE.node_id,  # a client of the linked station
    )
    assert sent(link.send(call, signer=ALICE), provider.conn)
    spoilt = provider.result(call.call_id, "pong").signed_by(MALLORY)
    assert sent(provider.send_map(spoilt.to_map()), link.conn) == []
    good = provider.result(call.call_id, "pong").signed_by(PROVIDER)
    assert [f.FRAME_TYPE for f in sent(provider.send_map(good.to_map()), link.conn)] == ["result"]
