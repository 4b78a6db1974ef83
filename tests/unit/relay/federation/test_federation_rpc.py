"""RPC across stations (docs/federation.md): advert gossip, CALL and streaming RPC over one
link, the station's own CALLs, and the bounds a peer station is held to.

Routers linked in memory (``stationmesh``): real frame bytes, a stepped clock.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from macula.client.events import (
    CallArrived,
    CallSettled,
    ChannelData,
    ChannelFinished,
    ChannelOpened,
)
from macula.errors import MeshError
from macula.wire.codes import ErrorCode
from macula.wire.frames import Call, Result, StreamOpen, Unadvertise, new_frame_id
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag
from relay.builtins.outcome import Outcome
from relay.core.actions import Action, Send, StationReplied
from relay.core.policy import Quotas
from support.identities import hardened
from support.stationmesh import Client, Mesh, MeshStation

REALM = realm_tag("test.federation-rpc")
ADD = "org.example.add_v1"
X_ID, Y_ID, Z_ID = (Identity(bytes(range(b, b + 32))) for b in (100, 140, 180))


ALICE, BOB, CAROL, DAVE = hardened(21), hardened(22), hardened(23), hardened(24)


def advertise(mesh: Mesh, station: MeshStation, client: Client, procedure: str = ADD) -> None:
    mesh.client_did(station, client, client.core.advertise(REALM, procedure, mesh.clock.now))
    mesh.flush(station, client)


def call(mesh: Mesh, station: MeshStation, client: Client, procedure: str = ADD) -> bytes:
    now = mesh.clock.now
    call_id, out = client.core.call(REALM, procedure, [2, 3], now + 5_000, now)
    mesh.client_did(station, client, out)
    return call_id


def serving(station: MeshStation, procedure: str = ADD) -> bytes | None:
    """Who ``station`` would send a client's CALL of ``procedure`` to (a node id)."""
    peer = station.router.gossip.serving((REALM, procedure), local_only=False)
    return None if peer is None else peer.node_id


def decoded(actions: list[Action]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    for action in actions:
        if isinstance(action, Send):
            frames += FrameDecoder().feed(action.data)
    return frames


def signed(
    kind: Any, signer: Identity, now: int, frame_id: bytes | None = None, **fields: Any
) -> Any:
    """A ``kind`` frame sent now, signed by ``signer``, as a map (frame id: zero randomness
    unless given)."""
    frame_id = frame_id or new_frame_id(now, bytes(10))
    return kind(frame_id=frame_id, sent_at_ms=now, **fields).signed_by(signer).to_map()


def signed_call(mesh: Mesh, signer: Identity, caller: Identity, procedure: str = ADD) -> Any:
    now = mesh.clock.now
    return signed(
        Call,
        signer,
        now,
        new_frame_id(now, random.Random(now).randbytes(10)),
        call_id=random.Random(signer.node_id).randbytes(16),
        procedure=procedure,
        realm=REALM,
        payload=1,
        deadline_ms=now + 5_000,
        caller=caller.node_id,
    )


@pytest.fixture
def mesh() -> Mesh:
    return Mesh()


def linked(mesh: Mesh) -> tuple[MeshStation, MeshStation]:
    """Stations X and Y on ``mesh``, linked."""
    x, y = mesh.station(X_ID), mesh.station(Y_ID)
    mesh.link(x, y)
    return x, y


@pytest.fixture
def xy(mesh: Mesh) -> tuple[MeshStation, MeshStation]:
    return linked(mesh)


Served = tuple[MeshStation, MeshStation, Client, Client]


def alice_to_bob(mesh: Mesh, procedure: str = ADD) -> Served:
    """X and Y linked, Alice on X, Bob on Y advertising ``procedure``."""
    x, y = linked(mesh)
    alice, bob = mesh.client(x, ALICE), mesh.client(y, BOB)
    advertise(mesh, y, bob, procedure)
    return x, y, alice, bob


@pytest.fixture
def served(mesh: Mesh) -> Served:
    return alice_to_bob(mesh)


# --- advert gossip ---------------------------------------------------------------------------


def test_adverts_are_gossiped_on_advertise_release_and_link_up(mesh: Mesh) -> None:
    x, y = mesh.station(X_ID), mesh.station(Y_ID)
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob, "org.example.early_v1")  # before the link: replayed at link-up
    mesh.link(x, y)
    assert serving(x, "org.example.early_v1") == Y_ID.node_id
    advertise(mesh, y, bob)  # after the link: gossiped at once
    assert serving(x) == Y_ID.node_id
    mesh.client_did(y, bob, bob.core.unadvertise(REALM, ADD, mesh.clock.now))
    assert serving(x) is None
    assert serving(x, "org.example.early_v1") == Y_ID.node_id
    mesh.lose(y, bob, "gone")  # its last advert released with its connection
    assert serving(x, "org.example.early_v1") is None
    assert len(x.router.gossip.remote) == 0
    assert x.router.stats["advertisements"] == 0  # nothing entered the clients' table


def test_a_link_coming_up_replays_only_local_clients_adverts(mesh: Mesh) -> None:
    x, y, z = mesh.station(X_ID), mesh.station(Y_ID), mesh.station(Z_ID)
    mesh.link(y, z)
    carol = mesh.client(z, CAROL)
    advertise(mesh, z, carol)
    assert serving(y) == Z_ID.node_id
    mesh.link(x, y)
    assert serving(x) is None  # Y never passes on what Z told it (one hop)
    alice = mesh.client(x, ALICE)
    call_id = call(mesh, x, alice)
    (settled,) = alice.take(CallSettled)
    assert settled.call_id == call_id and isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.UNKNOWN_NEXT_PEER


def test_a_local_client_wins_over_a_station_and_the_first_station_wins(mesh: Mesh) -> None:
    x, y, z = mesh.station(X_ID), mesh.station(Y_ID), mesh.station(Z_ID)
    mesh.link(x, y)
    mesh.link(x, z)
    bob, carol = mesh.client(y, BOB), mesh.client(z, CAROL)
    advertise(mesh, y, bob)
    advertise(mesh, z, carol)
    assert serving(x) == Y_ID.node_id  # first station wins
    alice = mesh.client(x, ALICE)
    advertise(mesh, x, alice)  # a local client takes it
    assert serving(x) == ALICE.node_id
    mesh.client_did(x, alice, alice.core.unadvertise(REALM, ADD, mesh.clock.now))
    assert serving(x) == Y_ID.node_id  # the stations' adverts were kept apart
    mesh.client_did(z, carol, carol.core.unadvertise(REALM, ADD, mesh.clock.now))
    assert serving(x) == Y_ID.node_id  # Z's UNADVERTISE removed only Z's entry
    mesh.unlink(x, y)  # a link's loss removes its adverts
    assert serving(x) is None


def test_a_station_unadvertise_of_what_it_never_advertised_is_counted(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob)
    cx = x.link_to(y)
    now = mesh.clock.now
    other = signed(
        Unadvertise,
        Y_ID,
        now,
        realm=REALM,
        procedure="org.example.other_v1",
        advertiser=Y_ID.node_id,
    )
    assert x.router.frames_received(cx, 0, [other], now) == []
    assert x.router.stats["unknown_unadvertise"] == 1
    assert serving(x) == Y_ID.node_id


def test_a_station_is_held_to_its_advertisement_quota() -> None:
    mesh = Mesh(quotas=_quotas(max_station_advertisements=2))
    x, y = linked(mesh)
    bob = mesh.client(y, BOB)
    for n in range(3):
        advertise(mesh, y, bob, f"org.example.p{n}_v1")
    assert x.router.gossip.remote.count_for(x.link_to(y)) == 2
    assert x.router.stats["station_advertise_quota"] == 1
    assert serving(x, "org.example.p2_v1") is None


def test_gossip_never_goes_to_clients(mesh: Mesh, xy: tuple[MeshStation, MeshStation]) -> None:
    x, y = xy
    alice = mesh.client(x, ALICE)
    mesh.client(y, BOB)
    out = y.router.gossip.local_added((REALM, ADD), mesh.clock.now)
    assert [a.conn for a in out if isinstance(a, Send)] == [y.link_to(x)]
    assert alice.outputs == []


# --- CALL across a link --------------------------------------------------------------------


def test_a_call_crosses_the_link_and_its_result_comes_back(mesh: Mesh, served: Served) -> None:
    x, y, alice, bob = served
    call_id = call(mesh, x, alice)
    (arrived,) = bob.take(CallArrived)
    assert arrived.call.caller == ALICE.node_id and arrived.call.payload == [2, 3]
    mesh.client_did(y, bob, bob.core.reply(arrived.stream, arrived.call, 5, mesh.clock.now))
    assert alice.take(CallSettled) == [CallSettled(call_id, payload=5)]
    assert x.router.stats["calls_forwarded_to_station"] == 1
    assert y.router.stats["calls_forwarded"] == 1
    assert len(x.router.pending) == len(y.router.pending) == 0


def test_an_error_reply_crosses_back(mesh: Mesh, served: Served) -> None:
    x, y, alice, bob = served
    call(mesh, x, alice)
    (arrived,) = bob.take(CallArrived)
    answer = bob.core.reply_error(
        arrived.stream, arrived.call, ErrorCode.UNKNOWN_ERROR, "handler_error", mesh.clock.now
    )
    mesh.client_did(y, bob, answer)
    (settled,) = alice.take(CallSettled)
    assert isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.UNKNOWN_ERROR and settled.error.detail == "handler_error"


def test_a_reply_from_a_node_that_was_not_asked_is_not_relayed_over_the_link(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    alice, bob, dave = mesh.client(x, ALICE), mesh.client(y, BOB), mesh.client(y, DAVE)
    advertise(mesh, y, bob)
    call_id = call(mesh, x, alice)
    now = mesh.clock.now
    forged = signed(Result, DAVE, now, call_id=call_id, payload="forged", responded_by=DAVE.node_id)
    # Dave is not who Y forwarded the call to: §13 #3 holds at Y, nothing reaches X
    assert y.router.frames_received(dave.conn, 0, [forged], now) == []
    assert y.router.stats["unexpected_reply"] == 1
    assert alice.of(CallSettled) == []


def test_a_forged_caller_over_a_link_is_refused(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob)
    cy = y.link_to(x)
    # station X claims Alice called, but signs the CALL itself
    out = y.router.frames_received(cy, 0, [signed_call(mesh, X_ID, ALICE)], mesh.clock.now)
    (error,) = decoded(out)
    assert error["frame_type"] == "error" and error["code"] == ErrorCode.SIGNATURE_INVALID
    assert bob.of(CallArrived) == []
    # a CALL signed by its caller is forwarded, whoever the caller is
    out = y.router.frames_received(cy, 0, [signed_call(mesh, CAROL, CAROL)], mesh.clock.now)
    mesh.do(y, out)
    (arrived,) = bob.take(CallArrived)
    assert arrived.call.caller == CAROL.node_id


def test_a_client_still_may_not_call_in_anothers_name(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, _ = xy
    alice = mesh.client(x, ALICE)
    out = x.router.frames_received(alice.conn, 0, [signed_call(mesh, CAROL, CAROL)], mesh.clock.now)
    (error,) = decoded(out)
    assert error["code"] == ErrorCode.SIGNATURE_INVALID


def test_a_call_from_a_station_is_never_forwarded_to_another_station(mesh: Mesh) -> None:
    x, y, z = mesh.station(X_ID), mesh.station(Y_ID), mesh.station(Z_ID)
    mesh.link(x, y)
    mesh.link(y, z)
    carol = mesh.client(z, CAROL)
    advertise(mesh, z, carol)
    assert serving(y) == Z_ID.node_id
    out = y.router.frames_received(
        y.link_to(x), 0, [signed_call(mesh, ALICE, ALICE)], mesh.clock.now
    )
    (error,) = decoded(out)
    assert error["code"] == ErrorCode.UNKNOWN_NEXT_PEER
    assert y.router.stats["calls_second_hop_refused"] == 1
    assert carol.of(CallArrived) == []
    assert len(y.router.pending) == 0


def test_a_station_is_held_to_its_in_flight_call_quota() -> None:
    mesh = Mesh(quotas=_quotas(max_station_pending_calls=2, max_pending_calls=10))
    x, _, alice, bob = alice_to_bob(mesh)
    ids = [call(mesh, x, alice) for _ in range(3)]
    assert len(bob.take(CallArrived)) == 2
    (settled,) = alice.take(CallSettled)
    assert settled.call_id == ids[2] and isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.UPSTREAM_CONGESTION


def test_the_station_quota_is_larger_than_a_clients_by_default() -> None:
    quotas = _quotas()
    assert quotas.max_station_pending_calls > quotas.max_pending_calls
    assert quotas.max_station_advertisements > quotas.max_advertisements
    assert quotas.max_station_streams > quotas.max_streams


def test_the_deadline_holds_across_the_link(mesh: Mesh, served: Served) -> None:
    x, y, alice, bob = served
    call_id = call(mesh, x, alice)
    assert bob.take(CallArrived)
    mesh.clock.step(5_001)
    mesh.tick()
    settled = [s for s in alice.take(CallSettled) if s.call_id == call_id]
    assert len(settled) == 1 and settled[0].error is not None
    assert len(x.router.pending) == len(y.router.pending) == 0


def test_losing_the_link_settles_the_calls_forwarded_over_it(mesh: Mesh, served: Served) -> None:
    x, y, alice, bob = served
    call_id = call(mesh, x, alice)
    (arrived,) = bob.take(CallArrived)
    mesh.unlink(x, y)
    (settled,) = alice.take(CallSettled)
    assert settled.call_id == call_id and isinstance(settled.error, MeshError)
    assert settled.error.code == ErrorCode.UNKNOWN_NEXT_PEER
    assert len(x.router.pending) == len(y.router.pending) == 0
    assert serving(x) is None
    # Bob's late reply has nowhere to go
    mesh.client_did(y, bob, bob.core.reply(arrived.stream, arrived.call, 5, mesh.clock.now))
    assert y.router.stats["unexpected_reply"] == 1


# --- the station's own CALLs ----------------------------------------------------------------


def station_call(mesh: Mesh, x: MeshStation, to: bytes, procedure: str = ADD, **kw: Any) -> bytes:
    now = mesh.clock.now
    call_id, out = x.router.call_station(
        to, procedure, {"n": 1}, now + kw.pop("ms", 5_000), now, realm=kw.pop("realm", REALM)
    )
    mesh.do(x, out)
    return call_id


def test_a_station_call_is_answered_by_a_client_behind_the_link(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob)
    call_id = station_call(mesh, x, Y_ID.node_id)
    (arrived,) = bob.take(CallArrived)
    assert arrived.call.caller == X_ID.node_id
    mesh.client_did(y, bob, bob.core.reply(arrived.stream, arrived.call, "ok", mesh.clock.now))
    assert x.replied == [StationReplied(call_id, True, "ok")]
    call_id = station_call(mesh, x, Y_ID.node_id)
    (arrived,) = bob.take(CallArrived)
    refusal = bob.core.reply_error(arrived.stream, arrived.call, 0x0F, "nope", mesh.clock.now)
    mesh.client_did(y, bob, refusal)
    assert x.replied[-1] == StationReplied(call_id, False, "nope", 0x0F)


def test_a_station_call_to_a_builtin_is_answered_by_the_far_station(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, _ = xy
    call_id = station_call(mesh, x, Y_ID.node_id, "_relay.ping", realm=bytes(32))
    (replied,) = x.replied
    assert replied.call_id == call_id and replied.ok and "ts" in replied.payload


def test_a_station_call_without_a_link_settles_at_once(mesh: Mesh) -> None:
    x = mesh.station(X_ID)
    bob = mesh.client(x, BOB)  # a client is no link
    call_id = station_call(mesh, x, Y_ID.node_id)
    assert x.replied == [StationReplied(call_id, False, "no link to that station", 0x01)]
    call_id = station_call(mesh, x, BOB.node_id)
    assert x.replied[-1].call_id == call_id and not x.replied[-1].ok
    assert bob.outputs == []


def test_a_station_call_settles_at_its_deadline_and_on_link_loss(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob)
    late = station_call(mesh, x, Y_ID.node_id, ms=1_000)
    lost = station_call(mesh, x, Y_ID.node_id, ms=30_000)
    assert len(bob.take(CallArrived)) == 2
    mesh.clock.step(1_000)
    mesh.do(x, x.router.tick(mesh.clock.now))  # only X's timers: Y's would answer first
    assert [(r.call_id, r.ok, r.code) for r in x.replied] == [
        (late, False, ErrorCode.EXPIRY_TOO_SOON)
    ]
    mesh.unlink(x, y)
    assert [(r.call_id, r.ok, r.code) for r in x.replied[1:]] == [
        (lost, False, ErrorCode.UNKNOWN_NEXT_PEER)
    ]
    assert len(x.router.pending) == 0


def test_station_calls_in_flight_are_bounded() -> None:
    mesh = Mesh(max_station_calls=1)
    x, y = linked(mesh)
    bob = mesh.client(y, BOB)
    advertise(mesh, y, bob)
    station_call(mesh, x, Y_ID.node_id)
    second = station_call(mesh, x, Y_ID.node_id)
    (replied,) = x.replied
    assert replied.call_id == second and replied.code == ErrorCode.UPSTREAM_CONGESTION


# --- streaming RPC across a link -------------------------------------------------------------


def test_a_streaming_call_crosses_the_link(mesh: Mesh) -> None:
    x, y, alice, bob = alice_to_bob(mesh, "org.example.count_v1")
    now = mesh.clock.now
    stream = alice.new_stream()
    mine, out = alice.core.open_channel(
        stream, REALM, "org.example.count_v1", "server_stream", 3, now + 5_000, now
    )
    mesh.client_did(x, alice, out)
    (opened,) = bob.take(ChannelOpened)
    assert opened.opening.caller == ALICE.node_id and opened.opening.args == 3
    theirs = bob.core.channel(opened.stream)
    assert theirs is not None
    for n in range(3):
        mesh.client_did(y, bob, bob.core.channel_send(theirs, bytes([n]), "raw", now))
    mesh.client_did(y, bob, bob.core.channel_reply(theirs, "done", now))
    assert [o.body for o in alice.take(ChannelData)] == [b"\x00", b"\x01", b"\x02"]
    assert alice.take(ChannelFinished) == [ChannelFinished(stream)]
    assert mine.replied and mine.reply == "done"
    assert len(x.router.routes) == len(y.router.routes) == 0


def test_a_stream_refused_behind_the_link_reaches_the_caller_signed_by_its_station(
    mesh: Mesh,
) -> None:
    x, y, alice, bob = alice_to_bob(mesh, "org.example.count_v1")
    # Y forgets Bob's advert behind X's back (X still believes Y serves it)
    y.router.adverts.remove((REALM, "org.example.count_v1"), mesh.clock.now)
    now = mesh.clock.now
    stream = alice.new_stream()
    mine, out = alice.core.open_channel(
        stream, REALM, "org.example.count_v1", "server_stream", 3, now + 5_000, now
    )
    mesh.client_did(x, alice, out)
    assert bob.of(ChannelOpened) == []
    assert mine.closed and mine.error is not None
    assert len(x.router.routes) == 0


def test_a_stream_from_a_station_is_not_routed_to_another_station(mesh: Mesh) -> None:
    x, y, z = mesh.station(X_ID), mesh.station(Y_ID), mesh.station(Z_ID)
    mesh.link(x, y)
    mesh.link(y, z)
    carol = mesh.client(z, CAROL)
    advertise(mesh, z, carol, "org.example.count_v1")
    assert serving(y, "org.example.count_v1") == Z_ID.node_id
    now = mesh.clock.now
    opening = signed(
        StreamOpen,
        ALICE,
        now,
        stream_id=bytes(range(16)),
        procedure="org.example.count_v1",
        realm=REALM,
        mode="server_stream",
        args=3,
        deadline_ms=now + 5_000,
        caller=ALICE.node_id,
    )
    # X opens a dedicated stream on the link (an even one: X dialled Y)
    out = y.router.frames_received(y.link_to(x), 8, [opening], now)
    (refused,) = decoded(out)
    assert refused["frame_type"] == "stream_error" and refused["code"] == b"unknown_next_peer"
    assert carol.of(ChannelOpened) == [] and len(y.router.routes) == 0


# --- content gets: the hops_remaining rules ------------------------------------------------


def content_call(mesh: Mesh, signer: Identity, payload: Any) -> Any:
    now = mesh.clock.now
    return signed(
        Call,
        signer,
        now,
        new_frame_id(now, random.Random(repr(payload)).randbytes(10)),
        call_id=random.Random(repr(payload)).randbytes(16),
        procedure="_content.get_block",
        realm=bytes(32),
        payload=payload,
        deadline_ms=now + 5_000,
        caller=signer.node_id,
    )


def test_a_client_may_not_set_hops_remaining(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, _ = xy
    alice = mesh.client(x, ALICE)
    out = x.router.frames_received(
        alice.conn,
        0,
        [content_call(mesh, ALICE, {"mcid": b"m", "hops_remaining": 0})],
        mesh.clock.now,
    )
    (error,) = decoded(out)
    assert error["code"] == ErrorCode.UNKNOWN_ERROR
    assert b"hops_remaining" in error["detail"] and x.builtins_run == []


def test_a_station_content_get_must_carry_hops_remaining_zero(
    mesh: Mesh, xy: tuple[MeshStation, MeshStation]
) -> None:
    x, y = xy
    cy = y.link_to(x)
    y.builtin = lambda action: Outcome.result("not_found")
    for bad in ({"mcid": b"a"}, {"mcid": b"b", "hops_remaining": 1}):
        out = y.router.frames_received(cy, 0, [content_call(mesh, X_ID, bad)], mesh.clock.now)
        (error,) = decoded(out)
        assert error["frame_type"] == "error" and b"hops_remaining" in error["detail"]
    assert y.builtins_run == []
    good = content_call(mesh, X_ID, {"mcid": b"c", "hops_remaining": 0})
    mesh.do(y, y.router.frames_received(cy, 0, [good], mesh.clock.now))
    assert [a.call.procedure for a in y.builtins_run] == ["_content.get_block"]
    assert y.router.stats["hops_refused"] == 2


def _quotas(**kw: Any) -> Quotas:
    return Quotas(**kw)
