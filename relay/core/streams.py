"""Dedicated streams (PROTOCOL.md §6.3, §8), a part of ``RouterCore``: content streams,
relayed stream RPC, and how a stream's end or reset is taken.

Sans-I/O, as the core, which builds one ``StreamHandling`` over its own tables; each method
returns its actions (the core's one convention). Rules:
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

from collections import Counter
from collections.abc import Callable
from typing import Any

from macula.services.refusals import MISPLACED_FRAME, REALM_REFUSED, STREAM_QUOTA
from macula.wire.frames import Call, StreamOpen
from relay.core.actions import Action, Close, EndStream
from relay.core.admission import Admitted, Rejected
from relay.core.calls import CallHandling
from relay.core.pacing import PublishPacer
from relay.core.peers import Peer, PeerState
from relay.core.policy import StationPolicy
from relay.core.routes import RouteTable
from relay.core.stream_relay import StreamRelay
from relay.realms.gate import RealmGate
from relay.realms.links import unvouched

__all__ = ["StreamHandling"]


class StreamHandling:
    def __init__(
        self,
        peers: dict[int, Peer],
        routes: RouteTable,
        streams: StreamRelay,
        call_handling: CallHandling,
        *,
        policy: StationPolicy,
        realms: RealmGate,
        pacer: PublishPacer,
        stats: Counter[str],
        admit: Callable[[Peer, dict[str, Any], int], Admitted | Rejected],
        refused: Callable[[Peer, int, Rejected, int], list[Action]],
        drop: Callable[[Peer, str, str], None],
        forget: Callable[[Peer, int], list[Action]],
    ) -> None:
        self.policy = policy  # replaced by ``RouterCore.reconfigure``
        self._peers = peers
        self._routes = routes
        self._streams = streams
        self._call_handling = call_handling
        self._realms = realms
        self._pacer = pacer
        self._stats = stats
        self._admit = admit
        self._refused = refused
        self._drop = drop
        self._forget = forget

    def dedicated(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
    ) -> list[Action]:
        """A frame on a stream other than ``peer``'s control stream (after its handshake)."""
        if stream in peer.ignored_streams:
            return []
        route = self._routes.by_leg(peer.conn, stream)
        if route is not None:
            verdict = self._admit(peer, frame_map, now_ms)
            if isinstance(verdict, Rejected):
                return self._refused(peer, stream, verdict, now_ms)
            return self._streams.relay(peer, stream, route, verdict.frame, now_ms)
        if stream not in peer.content_streams:
            opened = self._new_stream(peer, stream, frame_map, now_ms)
            if opened is not None:
                return opened
            peer.content_streams[stream] = 0
        verdict = self._admit(peer, frame_map, now_ms)
        if isinstance(verdict, Rejected):
            return self._refused(peer, stream, verdict, now_ms)
        frame = verdict.frame
        if isinstance(frame, Call):
            return self._call_handling.call(peer, stream, frame, now_ms, builtins_only=True)
        self._drop(peer, MISPLACED_FRAME, f"{frame.FRAME_TYPE} on a content stream")
        return []

    def _new_stream(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
    ) -> list[Action] | None:
        """The first frame of a new dedicated stream: what it did, or None for a new content
        stream (its CALL is taken next)."""
        quotas = self.policy.quotas
        limit = quotas.max_station_streams if peer.is_station else quotas.max_streams
        if len(peer.content_streams) + self._routes.count_for(peer.conn) >= limit:
            self._drop(peer, STREAM_QUOTA, "dedicated stream quota reached")
            msg = b"too many streams on this connection"
            return self._streams.refuse(peer, stream, frame_map, b"quota_exceeded", msg, now_ms)
        kind = frame_map.get("frame_type")
        if kind == "stream_open":
            return self._stream_open(peer, stream, frame_map, now_ms)
        if kind != "call":
            peer.ignored_streams.add(stream)  # §1.3: no route for such a stream
            self._stats["streams_ignored"] += 1
            return []
        return None

    def _stream_open(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
    ) -> list[Action]:
        verdict = self._admit(peer, frame_map, now_ms)
        if isinstance(verdict, Rejected):  # answered, and the stream refused (StreamRelay)
            out = self._refused(peer, stream, verdict, now_ms)
            return out + self._streams.open_route(peer, stream, None, frame_map, now_ms)
        opened, realms = verdict.frame, self._realms
        if isinstance(opened, StreamOpen) and (
            not realms.allows(peer.conn, peer.is_station, opened.realm, now_ms)
            or (peer.is_station and unvouched(realms, peer, opened.realm, opened.caller, now_ms))
        ):  # stream RPC in a protected realm: members only, as CALL
            self._drop(peer, REALM_REFUSED, "stream_open in a protected realm")
            msg = b"not a member of this protected realm"
            code = b"target_realm_refused"
            return self._streams.refuse(peer, stream, frame_map, code, msg, now_ms)
        return self._streams.open_route(peer, stream, opened, frame_map, now_ms)

    def stream_ended(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        """``stream`` of ``conn`` ended (FIN)."""
        peer = self._peers.get(conn)
        if peer is None:
            return []
        if stream == peer.control and self._pacer.paused(conn):
            self._pacer.ended.add(conn)  # the end comes after the frames held
            return []
        peer.ignored_streams.discard(stream)
        if stream == peer.control:
            # The client closed its control stream: the session is over.
            peer.state = PeerState.DRAINING
            return [Close(conn, "control stream ended"), *self._forget(peer, now_ms)]
        if stream in peer.content_streams:
            peer.finished_content.add(stream)
            if peer.content_streams[stream] == 0:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                return [EndStream(conn, stream)]
            return []
        return self._streams.leg_lost(
            conn, stream, "peer closed the stream before a terminal frame", now_ms
        )

    def stream_reset(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        """``stream`` of ``conn`` was reset by the peer."""
        peer = self._peers.get(conn)
        if peer is not None:
            if stream == peer.control and peer.state is not PeerState.DRAINING:
                return self.stream_ended(conn, stream, now_ms)  # the session is over
            peer.content_streams.pop(stream, None)
            peer.finished_content.discard(stream)
            peer.ignored_streams.discard(stream)
        return self._streams.leg_lost(conn, stream, "peer reset the stream", now_ms)
