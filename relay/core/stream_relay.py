"""Streaming RPC through the station (PROTOCOL.md §8): open a route, relay, tear it down.

Sans-I/O like ``RouterCore``, which owns it and hands it only admitted frames (verified, or on a
bound connection, claiming its node id: issue 27; such a frame is verified before it goes onto a
link, ``relay.core.bound_claims``). Invariants: a
route exists only between two CONNECTED peers when it is opened; its provider is a local client
advertiser, else (for a local caller only: one hop) a linked station that gossiped the
procedure, whose leg is a stream the station opens on that link; a frame is relayed only if it
is a stream frame for the route's ``stream_id``, signed by the node of the leg it came on (on a
link leg: by a node that names itself ``signer``; a STREAM_ERROR the far station wrote itself
is re-signed by this one, anything else unsigned from a link is dropped); teardown (§8.4)
forgets the route, marks both streams as taking no new work, tells a surviving leg why with a
station-signed STREAM_ERROR when there is an error, and FINs both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from macula.services.refusals import BAD_STREAM_FRAME, FOREIGN_STREAM_OPEN, UNVERIFIED_FRAME
from macula.wire.frames import Frame, StreamData, StreamEnd, StreamError, StreamOpen, StreamReply
from relay.core.actions import Action, EndStream, Send
from relay.core.bound_claims import crossing_verified
from relay.core.frames import StationFrames
from relay.core.peers import Peer
from relay.core.routes import Leg, Route, RouteTable
from relay.federation.gossip import AdvertGossip

log = logging.getLogger("macula.relay")


class StreamRelay:
    def __init__(
        self,
        peers: dict[int, Peer],
        gossip: AdvertGossip,
        routes: RouteTable,
        frames: StationFrames,
        *,
        route_ttl_ms: int,
        open_stream: Callable[[int], int],
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
    ) -> None:
        self._peers = peers
        self._gossip = gossip
        self.routes = routes
        self._frames = frames
        self._route_ttl_ms = route_ttl_ms
        self._open_stream = open_stream
        self._drop = drop
        self._count = count

    def open_route(
        self,
        peer: Peer,
        stream: int,
        frame: Frame | None,
        frame_map: dict[str, Any],
        now_ms: int,
    ) -> list[Action]:
        """The first frame of a new dedicated stream was a STREAM_OPEN (``frame``, verified)."""
        # over a link the caller is whoever signed it (admission verified it against ``caller``)
        if not isinstance(frame, StreamOpen) or (
            frame.caller != peer.node_id and not peer.is_station
        ):
            if frame is not None:
                self._drop(peer, FOREIGN_STREAM_OPEN, "caller is not this connection")
            peer.ignored_streams.add(stream)
            return [EndStream(peer.conn, stream)]
        key = (frame.realm, frame.procedure)
        provider = self._gossip.serving(key, local_only=peer.is_station)
        if provider is None:
            msg = b"procedure not advertised"
            return self.refuse(peer, stream, frame_map, b"unknown_next_peer", msg, now_ms)
        if provider.is_station and not crossing_verified(peer, frame):
            self._drop(peer, UNVERIFIED_FRAME, "stream_open: signature does not verify")
            msg = b"signature does not verify"
            return self.refuse(peer, stream, frame_map, b"signature_invalid", msg, now_ms)
        try:
            provider_stream = self._open_stream(provider.conn)
        except Exception as exc:  # the provider's connection cannot take a new stream
            log.warning("cannot open a relay stream to conn %d: %s", provider.conn, exc)
            msg = b"failed to open relay stream"
            return self.refuse(peer, stream, frame_map, b"unavailable", msg, now_ms)
        route = Route(
            stream_id=frame.stream_id,
            mode=frame.mode,
            caller=Leg(peer.conn, stream, peer.node_id, peer.is_station),
            provider=Leg(provider.conn, provider_stream, provider.node_id, provider.is_station),
            expires_ms=now_ms + self._route_ttl_ms,
        )
        self.routes.add(route)
        self._count("streams_routed")
        return [Send(provider.conn, provider_stream, self._frames.relayed(frame))]

    def relay(
        self, peer: Peer, stream: int, route: Route, frame: Frame, now_ms: int
    ) -> list[Action]:
        """Pass a verified frame from one leg of ``route`` to the other."""
        leg, other = route.legs_from(peer.conn, stream)
        signer = getattr(frame, "signer", None) or getattr(frame, "responded_by", None)
        if not isinstance(frame, (StreamData, StreamEnd, StreamError, StreamReply)) or (
            signer is not None and signer != leg.node_id and not leg.via_link
        ):
            self._drop(peer, BAD_STREAM_FRAME, f"{frame.FRAME_TYPE} not accepted on a route")
            return []
        if getattr(frame, "stream_id", None) != route.stream_id:
            self._drop(peer, BAD_STREAM_FRAME, "stream_id does not match the route")
            return []
        if leg.via_link and signer is None:
            # written by the far station itself: only its STREAM_ERROR passes, signed by us
            if not isinstance(frame, StreamError):
                self._drop(peer, BAD_STREAM_FRAME, f"unsigned {frame.FRAME_TYPE} from a link")
                return []
            error = self._frames.stream_error(
                other.conn, other.stream, None, frame.code, frame.message, now_ms, route.stream_id
            )
            return [error, *self.teardown(route, now_ms)]
        if other.via_link and not crossing_verified(peer, frame):
            self._drop(peer, UNVERIFIED_FRAME, f"{frame.FRAME_TYPE}: signature does not verify")
            return []
        out: list[Action] = [Send(other.conn, other.stream, self._frames.relayed(frame))]
        if route.after_frame(leg, frame):
            out += self.teardown(route, now_ms)
        return out

    def leg_lost(self, conn: int, stream: int, why: str, now_ms: int) -> list[Action]:
        """A stream ended or was reset: if it was a route's leg, the route may be over."""
        route = self.routes.by_leg(conn, stream)
        if route is None:
            return []
        leg, _ = route.legs_from(conn, stream)
        if route.half_closed(leg):
            return []  # a FIN after STREAM_END(send) is the normal end of that direction
        return self.teardown(route, now_ms, error=(b"unavailable", why.encode()), lost=leg)

    def expire(self, now_ms: int) -> list[Action]:
        out: list[Action] = []
        for route in self.routes.expired(now_ms):
            out += self.teardown(route, now_ms, error=(b"deadline", b"stream route expired"))
        return out

    def forget_conn(self, conn: int, now_ms: int) -> list[Action]:
        out: list[Action] = []
        for route in self.routes.for_conn(conn):
            out += self.teardown(route, now_ms, error=(b"unavailable", b"peer connection lost"))
        return out

    def teardown(
        self,
        route: Route,
        now_ms: int,
        *,
        error: tuple[bytes, bytes] | None = None,
        lost: Leg | None = None,
    ) -> list[Action]:
        """Forget the route and FIN both legs (§8.4), telling a surviving leg why."""
        self.routes.remove(route)
        out: list[Action] = []
        for leg in (route.caller, route.provider):
            peer = self._peers.get(leg.conn)
            if peer is None:
                continue
            peer.ignored_streams.add(leg.stream)  # an ended stream takes no new work
            if error is not None and leg is not lost:
                out.append(
                    self._frames.stream_error(
                        leg.conn, leg.stream, None, error[0], error[1], now_ms, route.stream_id
                    )
                )
            out.append(EndStream(leg.conn, leg.stream))
        return out

    def refuse(
        self,
        peer: Peer,
        stream: int,
        frame_map: dict[str, Any],
        code: bytes,
        message: bytes,
        now_ms: int,
    ) -> list[Action]:
        """STREAM_ERROR (station-signed, no signer) then FIN; the stream takes no more work."""
        peer.ignored_streams.add(stream)
        error = self._frames.stream_error(peer.conn, stream, frame_map, code, message, now_ms)
        return [error, EndStream(peer.conn, stream)]
