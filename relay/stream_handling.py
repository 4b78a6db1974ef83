"""Dedicated streams (PROTOCOL.md §6.3, §8), for ``RouterCore``: content streams, relayed
stream RPC, and how a stream's end or reset is taken.

Sans-I/O, as the core: each function takes the core and returns the actions (the core's one
convention). Rules:
- a stream that is a leg of a relayed stream RPC (``RouteTable``) has its frames admitted and
  relayed (``StreamRelay``);
- a new dedicated stream counts against ``max_streams`` (``max_station_streams`` for a link);
  over it, the opening frame is refused (STREAM_ERROR ``quota_exceeded``);
- STREAM_OPEN opens a route (in a protected realm: members only, as CALL; over a link, only a
  caller the link vouched for); CALL makes a content stream, which carries built-ins only; a
  stream opened with anything else is ignored (§1.3), counted;
- the control stream's end is the end of the session (closed; what it owned is purged); a
  content stream ends once its built-ins have answered; a route's leg that ends or resets before
  its terminal frame ends the route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from macula.wire.frames import Call, StreamOpen
from relay.actions import Action, Close, EndStream
from relay.admission import Rejected
from relay.call_handling import call
from relay.peers import Peer, PeerState
from relay.realm_links import unvouched

if TYPE_CHECKING:
    from relay.router_state import RouterState


def dedicated(
    core: RouterState, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
) -> list[Action]:
    """A frame on a stream other than ``peer``'s control stream (after its handshake)."""
    if stream in peer.ignored_streams:
        return []
    route = core.routes.by_leg(peer.conn, stream)
    if route is not None:
        verdict = core.admit(peer, frame_map, now_ms)
        if isinstance(verdict, Rejected):
            return core.refused(peer, stream, verdict, now_ms)
        return core.streams.relay(peer, stream, route, verdict.frame, now_ms)
    if stream not in peer.content_streams:
        opened = _new_stream(core, peer, stream, frame_map, now_ms)
        if opened is not None:
            return opened
        peer.content_streams[stream] = 0
    verdict = core.admit(peer, frame_map, now_ms)
    if isinstance(verdict, Rejected):
        return core.refused(peer, stream, verdict, now_ms)
    frame = verdict.frame
    if isinstance(frame, Call):
        return call(core, peer, stream, frame, now_ms, builtins_only=True)
    core.drop(peer, "misplaced_frame", f"{frame.FRAME_TYPE} on a content stream")
    return []


def _new_stream(
    core: RouterState, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
) -> list[Action] | None:
    """The first frame of a new dedicated stream: what it did, or None for a new content
    stream (its CALL is taken next)."""
    quotas = core.policy.quotas
    limit = quotas.max_station_streams if peer.is_station else quotas.max_streams
    if len(peer.content_streams) + core.routes.count_for(peer.conn) >= limit:
        core.drop(peer, "stream_quota", "dedicated stream quota reached")
        msg = b"too many streams on this connection"
        return core.streams.refuse(peer, stream, frame_map, b"quota_exceeded", msg, now_ms)
    kind = frame_map.get("frame_type")
    if kind == "stream_open":
        return _stream_open(core, peer, stream, frame_map, now_ms)
    if kind != "call":
        peer.ignored_streams.add(stream)  # §1.3: no route for such a stream
        core.stats["streams_ignored"] += 1
        return []
    return None


def _stream_open(
    core: RouterState, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
) -> list[Action]:
    verdict = core.admit(peer, frame_map, now_ms)
    if isinstance(verdict, Rejected):  # answered, and the stream refused (StreamRelay)
        out = core.refused(peer, stream, verdict, now_ms)
        return out + core.streams.open_route(peer, stream, None, frame_map, now_ms)
    opened = verdict.frame
    if isinstance(opened, StreamOpen) and (
        not core.realms.allows(peer.conn, peer.is_station, opened.realm, now_ms)
        or (peer.is_station and unvouched(core.realms, peer, opened.realm, opened.caller, now_ms))
    ):  # stream RPC in a protected realm: members only, as CALL
        core.drop(peer, "realm_refused", "stream_open in a protected realm")
        msg = b"not a member of this protected realm"
        code = b"target_realm_refused"
        return core.streams.refuse(peer, stream, frame_map, code, msg, now_ms)
    return core.streams.open_route(peer, stream, opened, frame_map, now_ms)


def stream_ended(core: RouterState, conn: int, stream: int, now_ms: int) -> list[Action]:
    """``stream`` of ``conn`` ended (FIN)."""
    peer = core.peers.get(conn)
    if peer is None:
        return []
    if stream == peer.control and core.pacer.paused(conn):
        core.pacer.ended.add(conn)  # the end comes after the frames held
        return []
    peer.ignored_streams.discard(stream)
    if stream == peer.control:
        # The client closed its control stream: the session is over.
        peer.state = PeerState.DRAINING
        return [Close(conn, "control stream ended"), *core.forget_peer(peer, now_ms)]
    if stream in peer.content_streams:
        peer.finished_content.add(stream)
        if peer.content_streams[stream] == 0:
            del peer.content_streams[stream]
            peer.finished_content.discard(stream)
            return [EndStream(conn, stream)]
        return []
    return core.streams.leg_lost(
        conn, stream, "peer closed the stream before a terminal frame", now_ms
    )


def stream_reset(core: RouterState, conn: int, stream: int, now_ms: int) -> list[Action]:
    """``stream`` of ``conn`` was reset by the peer."""
    peer = core.peers.get(conn)
    if peer is not None:
        if stream == peer.control and peer.state is not PeerState.DRAINING:
            return stream_ended(core, conn, stream, now_ms)  # the session is over
        peer.content_streams.pop(stream, None)
        peer.finished_content.discard(stream)
        peer.ignored_streams.discard(stream)
    return core.streams.leg_lost(conn, stream, "peer reset the stream", now_ms)
