"""The station's routing core (PROTOCOL.md §5-§8), sans-I/O.

``RouterCore`` is fed decoded frame maps with the connection and stream they arrived on and the
current time, and answers with actions (send these bytes, end that stream, close that
connection, run that built-in). The QUIC shell (``relay.station``) only moves bytes. Rules:
- handshake (§5): the first CONNECT, verified against its ``node_id``, makes its stream the
  control stream; HELLO ``"true"`` or an in-band refusal (HELLO ``"false"`` + §9 code); the
  newest connection of a node id wins, the older gets GOODBYE ``replaced_by_newer_handshake``;
- every frame after that is parsed and verified per §4.3 before it touches any state, and the
  §13 weaknesses an honest client cannot notice are closed: replayed frame ids and skewed clocks
  (#1), CALL/STREAM_OPEN ``caller`` must be the connection (#2), replies only from the
  connection a CALL was forwarded to (#3), foreign ADVERTISE/UNADVERTISE refused (#5),
  SUBSCRIBE ``subscriber`` and PUBLISH ``publisher`` must be the connection (#6, #7), a bad
  ``publisher_sig`` refused, EVENT only from stations (#8), expired deadlines answered 0x07
  (#9), unverifiable CALLs answered 0x0E and framing errors closing the connection (#10),
  gossip never sent to clients (#16), subscriptions purged with the node's last connection
  (#17), per-connection quotas (#19);
- a refusal never raises: it is an ERROR/STREAM_ERROR where the protocol has a reply, else a
  counted, logged drop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError, ProtocolError
from macula.wire.frames import (
    CAP_STATION,
    Advertise,
    Call,
    Connect,
    Error,
    Event,
    Frame,
    Goodbye,
    Hello,
    Ping,
    Pong,
    Publish,
    Result,
    StreamData,
    StreamEnd,
    StreamError,
    StreamOpen,
    StreamReply,
    Subscribe,
    Unadvertise,
    UnknownFrameType,
    Unsubscribe,
    event_from_publish,
    new_frame_id,
    parse_frame,
    publisher_sig_valid,
)
from macula.wire.framing import frame_bytes
from macula.wire.identity import Identity, puzzle_valid
from relay.outcome import Outcome
from relay.policy import PuzzleMode, ReplayWindow, StationPolicy, TokenBucket
from relay.routes import Leg, Route, RouteTable

log = logging.getLogger("macula.relay")

BUILTINS = frozenset(
    {
        "_dht.put_record",
        "_dht.find_record",
        "_dht.find_records",
        "_dht.find_records_by_type",
        "_content.put_block",
        "_content.get_block",
        "_content.put_manifest",
        "_content.get_manifest",
        "_relay.ping",
    }
)


# --- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    conn: int
    stream: int
    data: bytes  # one or more complete, length-prefixed frames


@dataclass(frozen=True, slots=True)
class EndStream:
    conn: int
    stream: int


@dataclass(frozen=True, slots=True)
class Close:
    conn: int
    reason: str
    after_ms: int = 0


@dataclass(frozen=True, slots=True)
class RunBuiltin:
    conn: int
    stream: int
    call: Call


Action = Send | EndStream | Close | RunBuiltin


# --- state -------------------------------------------------------------------------------------


@dataclass(slots=True)
class Peer:
    conn: int
    opened_ms: int
    publish_bucket: TokenBucket
    call_bucket: TokenBucket
    node_id: bytes = b""
    control: int | None = None
    capabilities: int = 0
    state: str = "handshaking"  # connected | draining | closed
    advertisements: set[tuple[bytes, str]] = field(default_factory=set)
    calls_in_flight: set[bytes] = field(default_factory=set)
    content_streams: dict[int, int] = field(default_factory=dict)  # stream -> builtins running
    finished_content: set[int] = field(default_factory=set)
    ignored_streams: set[int] = field(default_factory=set)

    @property
    def is_station(self) -> bool:
        return bool(self.capabilities & CAP_STATION)


@dataclass(slots=True)
class Pending:
    """A CALL forwarded to an advertiser, waiting for its reply (§6.2)."""

    call_id: bytes
    caller_conn: int
    caller_stream: int
    provider_conn: int
    provider_node: bytes
    answer_by_ms: int
    slot_only: bool = False  # answer_by is the 60 s forwarding slot, not the caller's deadline


@dataclass(slots=True)
class Advertisement:
    node_id: bytes
    conn: int


class RouterCore:
    def __init__(
        self,
        identity: Identity,
        policy: StationPolicy,
        *,
        open_stream: Callable[[int], int],
        random_bytes: Callable[[int], bytes],
        services: frozenset[tuple[bytes, str]] = frozenset(),
    ) -> None:
        self.identity = identity
        self.services = services  # (realm, procedure) served by the station itself
        self.policy = policy
        self._open_stream = open_stream
        self._random = random_bytes
        self.peers: dict[int, Peer] = {}
        self.node_conn: dict[bytes, int] = {}
        self.subscriptions: dict[tuple[bytes, bytes], set[bytes]] = {}
        self.node_subscriptions: dict[bytes, set[tuple[bytes, bytes]]] = {}
        self.advertisements: dict[tuple[bytes, str], Advertisement] = {}
        self.tombstones: dict[tuple[bytes, str], tuple[bytes, int]] = {}
        self.pending: dict[bytes, Pending] = {}
        self.routes = RouteTable()
        self.seen_frames: dict[bytes, ReplayWindow] = {}
        self.stats: Counter[str] = Counter()

    # --- entry points ---------------------------------------------------------------------

    def connection_made(self, conn: int, now_ms: int) -> None:
        quotas = self.policy.quotas
        self.peers[conn] = Peer(
            conn=conn,
            opened_ms=now_ms,
            publish_bucket=TokenBucket(quotas.publish_rate, quotas.publish_burst, now_ms),
            call_bucket=TokenBucket(quotas.call_rate, quotas.call_burst, now_ms),
        )

    def frames_received(
        self, conn: int, stream: int, frames: list[dict[str, Any]], now_ms: int
    ) -> list[Action]:
        out: list[Action] = []
        for frame_map in frames:
            peer = self.peers.get(conn)
            if peer is None or peer.state in ("draining", "closed"):
                break
            if peer.state == "handshaking":
                self._handshake(peer, stream, frame_map, now_ms, out)
            elif stream == peer.control:
                self._control(peer, frame_map, now_ms, out)
            else:
                self._dedicated(peer, stream, frame_map, now_ms, out)
        return out

    def framing_failed(
        self, conn: int, stream: int, error: FramingError, now_ms: int
    ) -> list[Action]:
        """§13 #10: a broken stream closes its connection (with a GOODBYE saying why)."""
        peer = self.peers.get(conn)
        self.stats["framing_errors"] += 1
        log.warning("framing error on conn %d stream %d: %s", conn, stream, error)
        if peer is None:
            return []
        out: list[Action] = []
        if peer.control is not None and peer.state == "connected":
            detail = f"framing error on stream {stream}: {error.detail}"
            out.append(self._goodbye(peer, "protocol_error", detail, now_ms))
        out.append(Close(conn, f"protocol_error: {error.reason}", after_ms=50))
        peer.state = "draining"  # nothing more from this connection is heard
        out += self._forget_peer(peer, now_ms)
        return out

    def stream_ended(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        peer = self.peers.get(conn)
        if peer is None:
            return []
        peer.ignored_streams.discard(stream)
        if stream == peer.control:
            # The client closed its control stream: the session is over.
            peer.state = "draining"
            return [Close(conn, "control stream ended"), *self._forget_peer(peer, now_ms)]
        if stream in peer.content_streams:
            peer.finished_content.add(stream)
            if peer.content_streams[stream] == 0:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                return [EndStream(conn, stream)]
            return []
        return self._leg_lost(
            conn, stream, "peer closed the stream before a terminal frame", now_ms
        )

    def stream_reset(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        peer = self.peers.get(conn)
        if peer is not None:
            if stream == peer.control and peer.state != "draining":
                return self.stream_ended(conn, stream, now_ms)  # the session is over
            peer.content_streams.pop(stream, None)
            peer.finished_content.discard(stream)
            peer.ignored_streams.discard(stream)
        return self._leg_lost(conn, stream, "peer reset the stream", now_ms)

    def connection_lost(self, conn: int, now_ms: int) -> list[Action]:
        peer = self.peers.pop(conn, None)
        if peer is None:
            return []
        peer.state = "closed"
        return self._forget_peer(peer, now_ms)

    def builtin_done(
        self, conn: int, stream: int, call: Call, outcome: Outcome, now_ms: int
    ) -> list[Action]:
        """Reply to a built-in CALL (or a house service's) with its ``Outcome``."""
        peer = self.peers.get(conn)
        if peer is None or peer.state == "closed":
            return []
        out: list[Action] = []
        if outcome.code is not None:
            out.append(
                self._error(peer, stream, call.call_id, outcome.code, outcome.detail, now_ms)
            )
        else:
            reply = Result(
                **self._stamp(now_ms),
                call_id=call.call_id,
                payload=outcome.payload,
                responded_by=self.identity.node_id,
            )
            out.append(Send(conn, stream, self._sign(reply)))
        running = peer.content_streams.get(stream)
        if running is not None:
            peer.content_streams[stream] = running - 1
            if running == 1 and stream in peer.finished_content:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                out.append(EndStream(conn, stream))
        return out

    def tick(self, now_ms: int) -> list[Action]:
        """Timers: handshake timeouts, forwarded-call deadlines, route TTLs, replay cache."""
        out: list[Action] = []
        for peer in list(self.peers.values()):
            if (
                peer.state == "handshaking"
                and now_ms - peer.opened_ms > self.policy.handshake_timeout_ms
            ):
                out.append(Close(peer.conn, "handshake timeout"))
                self.peers.pop(peer.conn, None)
        for call_id, pending in list(self.pending.items()):
            if now_ms >= pending.answer_by_ms:
                if pending.slot_only:
                    code, why = ErrorCode.TEMPORARY_RELAY_FAILURE, "provider did not reply in time"
                else:
                    code, why = (
                        ErrorCode.EXPIRY_TOO_SOON,
                        "deadline passed before the provider replied",
                    )
                out += self._fail_pending(call_id, code, why, now_ms)
        for route in self.routes.expired(now_ms):
            out += self._teardown(route, now_ms, error=(b"deadline", b"stream route expired"))
        self._prune_seen(now_ms)
        for key, (_, until) in list(self.tombstones.items()):
            if until <= now_ms:
                del self.tombstones[key]
        return out

    def shutdown(self, now_ms: int) -> list[Action]:
        out: list[Action] = []
        for peer in list(self.peers.values()):
            if peer.state == "connected":
                out.append(self._goodbye(peer, "operator_stop", "station is shutting down", now_ms))
            out.append(Close(peer.conn, "station shutting down", after_ms=100))
            peer.state = "draining"
        return out

    # --- handshake (§5) -------------------------------------------------------------------

    def _handshake(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        if frame_map.get("frame_type") != "connect":
            self.stats["dropped_before_connect"] += 1
            return
        try:
            connect = parse_frame(frame_map)
        except ProtocolError as exc:
            log.info("conn %d: malformed CONNECT: %s", peer.conn, exc)
            out.append(Close(peer.conn, f"malformed CONNECT: {exc.detail}"))
            self.peers.pop(peer.conn, None)
            return
        assert isinstance(connect, Connect)
        peer.control = stream
        refusal = self._connect_refusal(connect, now_ms)
        if refusal is not None:
            code, why = refusal
            log.info("conn %d: refused %s: %s", peer.conn, connect.node_id.hex()[:16], why)
            self.stats["handshakes_refused"] += 1
            out.append(Send(peer.conn, stream, self._hello(False, code, now_ms)))
            out.append(Close(peer.conn, f"handshake refused: {why}", after_ms=200))
            peer.state = "draining"
            return
        peer.node_id = connect.node_id
        peer.capabilities = connect.capabilities
        peer.state = "connected"
        self.stats["handshakes"] += 1
        out.append(Send(peer.conn, stream, self._hello(True, None, now_ms)))
        older = self.node_conn.get(peer.node_id)
        self.node_conn[peer.node_id] = peer.conn
        if older is not None and older in self.peers:
            out += self._replace(self.peers[older], now_ms)

    def _connect_refusal(self, connect: Connect, now_ms: int) -> tuple[int, str] | None:
        if not connect.verifies(connect.node_id):
            return ErrorCode.SIGNATURE_INVALID, "CONNECT signature does not verify"
        if not self._fresh(connect, now_ms):
            return ErrorCode.SIGNATURE_INVALID, "CONNECT is replayed or its clock is skewed"
        if connect.capabilities & ~CAP_STATION:
            return ErrorCode.UNKNOWN_ERROR, "unassigned capability bits set"
        mode = self.policy.puzzle_mode
        if mode != PuzzleMode.OFF and not puzzle_valid(
            connect.node_id, self.policy.puzzle_difficulty
        ):
            if mode == PuzzleMode.ENFORCE:
                return ErrorCode.CRYPTO_PUZZLE_INVALID, "identity fails the S/Kademlia puzzle"
            log.warning("node %s fails the puzzle (log-only)", connect.node_id.hex()[:16])
        return None

    def _replace(self, older: Peer, now_ms: int) -> list[Action]:
        """Same identity, newer handshake: the older connection is told and closed (§5.4)."""
        out: list[Action] = [
            self._goodbye(
                older, "replaced_by_newer_handshake", "a newer connection took over", now_ms
            ),
            Close(older.conn, "replaced by newer handshake", after_ms=self.policy.drain_ms),
        ]
        older.state = "draining"
        out += self._forget_peer(older, now_ms)
        return out

    def _hello(self, accepted: bool, refusal: int | None, now_ms: int) -> bytes:
        hello = Hello(
            **self._stamp(now_ms),
            capabilities=CAP_STATION,
            node_id=self.identity.node_id,
            station_id=self.identity.node_id,
            accepted=accepted,
            negotiated_capabilities=CAP_STATION,
            refusal_code=refusal,
        )
        return self._sign(hello)

    # --- control stream -------------------------------------------------------------------

    def _control(
        self, peer: Peer, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        frame = self._accept(peer, peer.control or 0, frame_map, now_ms, out)
        if frame is None:
            return
        if isinstance(frame, Call):
            self._call(peer, peer.control or 0, frame, now_ms, out, builtins_only=False)
        elif isinstance(frame, (Result, Error)):
            self._reply(peer, frame, now_ms, out)
        elif isinstance(frame, Publish):
            self._publish(peer, frame, now_ms, out)
        elif isinstance(frame, Subscribe):
            self._subscribe(peer, frame)
        elif isinstance(frame, Unsubscribe):
            self._unsubscribe(peer, frame)
        elif isinstance(frame, Advertise):
            self._advertise(peer, frame, now_ms)
        elif isinstance(frame, Unadvertise):
            self._unadvertise(peer, frame, now_ms)
        elif isinstance(frame, Ping):
            pong = Pong(**self._stamp(now_ms), nonce=frame.nonce)
            out.append(Send(peer.conn, peer.control or 0, self._sign(pong)))
        elif isinstance(frame, Event):
            self._drop(peer, "event_from_client", "EVENT from a peer without the station bit")
        elif isinstance(frame, Goodbye):
            self.stats["goodbyes_received"] += 1
        else:
            self._drop(peer, "misplaced_frame", f"{frame.FRAME_TYPE} on the control stream")

    def _accept(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> Frame | None:
        """Parse and verify one frame (§4.3, §13 #1, #10); answer CALLs that fail."""
        try:
            frame = parse_frame(frame_map)
        except UnknownFrameType:
            self.stats["unknown_frame_types"] += 1
            return None
        except ProtocolError as exc:
            self._drop(peer, "malformed_frame", exc.detail)
            call_id = frame_map.get("call_id")
            if (
                frame_map.get("frame_type") == "call"
                and type(call_id) is bytes
                and len(call_id) == 16
            ):
                out.append(
                    self._error(
                        peer,
                        stream,
                        call_id,
                        ErrorCode.UNKNOWN_ERROR,
                        f"bad_request: {exc.detail}".encode(),
                        now_ms,
                    )
                )
            return None
        signer = frame.expected_signer() or peer.node_id
        problem = None
        if not frame.verifies(signer):
            problem = "signature does not verify"
        elif not self._fresh(frame, now_ms, peer.node_id):
            problem = "frame is replayed or sent_at_ms is outside the allowed clock skew"
        if problem is None:
            return frame
        self._drop(peer, "unverified_frame", f"{frame.FRAME_TYPE}: {problem}")
        if isinstance(frame, Call):
            out.append(
                self._error(
                    peer,
                    stream,
                    frame.call_id,
                    ErrorCode.SIGNATURE_INVALID,
                    problem.encode(),
                    now_ms,
                )
            )
        return None

    def _fresh(self, frame: Frame, now_ms: int, node_id: bytes | None = None) -> bool:
        """§13 #1: ``sent_at_ms`` within the skew bound and ``frame_id`` not seen before."""
        skew = self.policy.max_clock_skew_ms
        if skew <= 0:
            return True
        if abs(frame.sent_at_ms - now_ms) > skew:
            return False
        key = node_id or frame.expected_signer() or b""
        window = self.seen_frames.get(key)
        if window is None:
            window = self.seen_frames[key] = ReplayWindow(self.policy.replay_cache_per_node)
        return window.admit(frame.frame_id, frame.sent_at_ms)

    def _prune_seen(self, now_ms: int) -> None:
        """Forget frame ids whose ``sent_at_ms`` now fails the skew check on its own."""
        oldest = now_ms - self.policy.max_clock_skew_ms
        for node_id in list(self.seen_frames):
            window = self.seen_frames[node_id]
            window.forget_before(oldest)
            if not window.seen and node_id not in self.node_conn:
                del self.seen_frames[node_id]

    # --- RPC (§6) ---------------------------------------------------------------------------

    def _call(
        self,
        peer: Peer,
        stream: int,
        call: Call,
        now_ms: int,
        out: list[Action],
        *,
        builtins_only: bool,
    ) -> None:
        refusal = self._call_refusal(peer, call, now_ms)
        if refusal is not None:
            code, detail = refusal
            out.append(self._error(peer, stream, call.call_id, code, detail.encode(), now_ms))
            return
        if call.procedure in BUILTINS:
            self.stats["builtin_calls"] += 1
            if stream in peer.content_streams:
                peer.content_streams[stream] += 1
            out.append(RunBuiltin(peer.conn, stream, call))
            return
        if not builtins_only and (call.realm, call.procedure) in self.services:
            self.stats["service_calls"] += 1
            out.append(RunBuiltin(peer.conn, stream, call))  # a house service: same path
            return
        ad = None if builtins_only else self.advertisements.get((call.realm, call.procedure))
        provider = self.peers.get(ad.conn) if ad is not None else None
        if ad is None or provider is None or provider.state != "connected":
            self.stats["calls_no_route"] += 1
            out.append(
                self._error(peer, stream, call.call_id, ErrorCode.UNKNOWN_NEXT_PEER, None, now_ms)
            )
            return
        if call.call_id in self.pending:
            out.append(
                self._error(
                    peer,
                    stream,
                    call.call_id,
                    ErrorCode.UNKNOWN_ERROR,
                    b"bad_request: this call_id is already in flight",
                    now_ms,
                )
            )
            return
        slot_end = now_ms + self.policy.forward_slot_ms
        self.pending[call.call_id] = Pending(
            call.call_id,
            peer.conn,
            stream,
            provider.conn,
            provider.node_id,
            min(call.deadline_ms, slot_end),
            slot_only=slot_end < call.deadline_ms,
        )
        peer.calls_in_flight.add(call.call_id)
        self.stats["calls_forwarded"] += 1
        out.append(Send(provider.conn, provider.control or 0, self._encode(call)))

    def _call_refusal(self, peer: Peer, call: Call, now_ms: int) -> tuple[int, str] | None:
        quotas = self.policy.quotas
        if call.caller != peer.node_id:
            return ErrorCode.SIGNATURE_INVALID, "caller is not this connection's identity"
        if not peer.call_bucket.take(now_ms):
            self.stats["calls_rate_limited"] += 1
            return ErrorCode.UPSTREAM_CONGESTION, f"call rate above {quotas.call_rate:g}/s"
        if call.deadline_ms <= now_ms:
            return ErrorCode.EXPIRY_TOO_SOON, "deadline_ms has already passed"
        if len(peer.calls_in_flight) >= quotas.max_pending_calls:
            return ErrorCode.UPSTREAM_CONGESTION, (
                f"more than {quotas.max_pending_calls} calls in flight on this connection"
            )
        return None

    def _reply(self, peer: Peer, reply: Result | Error, now_ms: int, out: list[Action]) -> None:
        pending = self.pending.get(reply.call_id)
        responder = reply.responded_by if isinstance(reply, Result) else reply.reported_by
        if (
            pending is None
            or pending.provider_conn != peer.conn
            or responder != pending.provider_node
        ):
            self._drop(peer, "unexpected_reply", "reply to a call not forwarded to this connection")
            return
        del self.pending[reply.call_id]
        caller = self.peers.get(pending.caller_conn)
        if caller is None:
            return
        caller.calls_in_flight.discard(reply.call_id)
        out.append(Send(caller.conn, pending.caller_stream, self._encode(reply)))

    def _fail_pending(self, call_id: bytes, code: int, detail: str, now_ms: int) -> list[Action]:
        pending = self.pending.pop(call_id, None)
        if pending is None:
            return []
        caller = self.peers.get(pending.caller_conn)
        if caller is None or caller.state != "connected":
            return []
        caller.calls_in_flight.discard(call_id)
        return [self._error(caller, pending.caller_stream, call_id, code, detail.encode(), now_ms)]

    def _advertise(self, peer: Peer, frame: Advertise, now_ms: int) -> None:
        key = (frame.realm, frame.procedure)
        if frame.advertiser != peer.node_id:
            return self._drop(peer, "foreign_advertise", "advertiser is not this connection")
        if frame.procedure in BUILTINS or key in self.services:
            return self._drop(peer, "builtin_advertise", f"{frame.procedure} is the station's")
        current = self.advertisements.get(key)
        if current is not None and current.node_id != peer.node_id and current.conn in self.peers:
            return self._drop(
                peer, "advertise_taken", f"{frame.procedure} is served by another node"
            )
        tomb = self.tombstones.get(key)
        if tomb is not None and tomb[1] > now_ms and tomb[0] != peer.node_id:
            return self._drop(peer, "advertise_tombstoned", f"{frame.procedure} was just released")
        if peer.is_station and current is not None:
            return None  # gossip is first-write-wins (§6.1)
        if (
            key not in peer.advertisements
            and len(peer.advertisements) >= self.policy.quotas.max_advertisements
        ):
            return self._drop(peer, "advertise_quota", "advertisement quota reached")
        if current is not None and current.conn != peer.conn and current.conn in self.peers:
            self.peers[current.conn].advertisements.discard(key)
        self.advertisements[key] = Advertisement(peer.node_id, peer.conn)
        peer.advertisements.add(key)
        self.stats["advertisements"] += 1
        return None

    def _unadvertise(self, peer: Peer, frame: Unadvertise, now_ms: int) -> None:
        key = (frame.realm, frame.procedure)
        current = self.advertisements.get(key)
        if frame.advertiser != peer.node_id or current is None or current.node_id != peer.node_id:
            return self._drop(peer, "foreign_unadvertise", "only the owner may unadvertise")
        self._remove_ad(key, now_ms)
        return None

    def _remove_ad(self, key: tuple[bytes, str], now_ms: int) -> None:
        ad = self.advertisements.pop(key, None)
        if ad is None:
            return
        owner = self.peers.get(ad.conn)
        if owner is not None:
            owner.advertisements.discard(key)
        self.tombstones[key] = (ad.node_id, now_ms + self.policy.advertise_tombstone_ms)

    # --- pub/sub (§7) -------------------------------------------------------------------------

    def _subscribe(self, peer: Peer, frame: Subscribe) -> None:
        if frame.subscriber != peer.node_id:
            return self._drop(peer, "foreign_subscribe", "subscriber is not this connection")
        key = (frame.realm, frame.topic.encode())
        mine = self.node_subscriptions.setdefault(peer.node_id, set())
        if key not in mine and len(mine) >= self.policy.quotas.max_subscriptions:
            return self._drop(peer, "subscription_quota", "subscription quota reached")
        mine.add(key)
        self.subscriptions.setdefault(key, set()).add(peer.node_id)
        return None

    def _unsubscribe(self, peer: Peer, frame: Unsubscribe) -> None:
        if frame.subscriber != peer.node_id:
            return self._drop(peer, "foreign_unsubscribe", "subscriber is not this connection")
        self._remove_subscription(peer.node_id, (frame.realm, frame.topic.encode()))
        return None

    def _remove_subscription(self, node_id: bytes, key: tuple[bytes, bytes]) -> None:
        subscribers = self.subscriptions.get(key)
        if subscribers is not None:
            subscribers.discard(node_id)
            if not subscribers:
                del self.subscriptions[key]
        mine = self.node_subscriptions.get(node_id)
        if mine is not None:
            mine.discard(key)

    def _publish(self, peer: Peer, frame: Publish, now_ms: int, out: list[Action]) -> None:
        if frame.publisher != peer.node_id:
            return self._drop(peer, "foreign_publish", "publisher is not this connection")
        if frame.publisher_sig is not None and not publisher_sig_valid(frame):
            return self._drop(peer, "bad_publisher_sig", "publisher_sig does not verify")
        if not peer.publish_bucket.take(now_ms):
            return self._drop(peer, "publish_rate_limited", "publish rate above quota")
        self.stats["publishes"] += 1
        subscribers = self.subscriptions.get((frame.realm, frame.topic.encode()))
        if not subscribers:
            return None
        event = event_from_publish(frame, **self._stamp(now_ms))
        data = self._sign(event)
        for node_id in subscribers:
            conn = self.node_conn.get(node_id)
            target = self.peers.get(conn) if conn is not None else None
            if target is not None and target.state == "connected" and target.control is not None:
                out.append(Send(target.conn, target.control, data))
                self.stats["events_delivered"] += 1
        return None

    # --- dedicated streams (§6.3, §8) ---------------------------------------------------------

    def _dedicated(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        if stream in peer.ignored_streams:
            return
        route = self.routes.by_leg(peer.conn, stream)
        if route is not None:
            self._relay(peer, stream, route, frame_map, now_ms, out)
            return
        if stream not in peer.content_streams:
            if (
                len(peer.content_streams) + self.routes.count_for(peer.conn)
                >= self.policy.quotas.max_streams
            ):
                self._drop(peer, "stream_quota", "dedicated stream quota reached")
                msg = b"too many streams on this connection"
                out += self._refuse_stream(peer, stream, frame_map, b"quota_exceeded", msg, now_ms)
                return
            kind = frame_map.get("frame_type")
            if kind == "stream_open":
                self._open_route(peer, stream, frame_map, now_ms, out)
                return
            if kind != "call":
                peer.ignored_streams.add(stream)  # §1.3: no route for such a stream
                self.stats["streams_ignored"] += 1
                return
            peer.content_streams[stream] = 0
        frame = self._accept(peer, stream, frame_map, now_ms, out)
        if isinstance(frame, Call):
            self._call(peer, stream, frame, now_ms, out, builtins_only=True)
        elif frame is not None:
            self._drop(peer, "misplaced_frame", f"{frame.FRAME_TYPE} on a content stream")

    def _open_route(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        frame = self._accept(peer, stream, frame_map, now_ms, out)
        if not isinstance(frame, StreamOpen) or frame.caller != peer.node_id:
            if frame is not None:
                self._drop(peer, "foreign_stream_open", "caller is not this connection")
            peer.ignored_streams.add(stream)
            out.append(EndStream(peer.conn, stream))
            return
        ad = self.advertisements.get((frame.realm, frame.procedure))
        provider = self.peers.get(ad.conn) if ad is not None else None
        if provider is None or provider.state != "connected":
            msg = b"procedure not advertised"
            out += self._refuse_stream(peer, stream, frame_map, b"unknown_next_peer", msg, now_ms)
            return
        try:
            provider_stream = self._open_stream(provider.conn)
        except Exception as exc:  # the provider's connection cannot take a new stream
            log.warning("cannot open a relay stream to conn %d: %s", provider.conn, exc)
            msg = b"failed to open relay stream"
            out += self._refuse_stream(peer, stream, frame_map, b"unavailable", msg, now_ms)
            return
        route = Route(
            stream_id=frame.stream_id,
            mode=frame.mode,
            caller=Leg(peer.conn, stream, peer.node_id),
            provider=Leg(provider.conn, provider_stream, provider.node_id),
            expires_ms=now_ms + self.policy.stream_route_ttl_ms,
        )
        self.routes.add(route)
        self.stats["streams_routed"] += 1
        out.append(Send(provider.conn, provider_stream, self._encode(frame)))

    def _relay(
        self,
        peer: Peer,
        stream: int,
        route: Route,
        frame_map: dict[str, Any],
        now_ms: int,
        out: list[Action],
    ) -> None:
        frame = self._accept(peer, stream, frame_map, now_ms, out)
        if frame is None:
            return
        leg, other = route.legs_from(peer.conn, stream)
        signer = getattr(frame, "signer", None) or getattr(frame, "responded_by", None)
        if not isinstance(frame, (StreamData, StreamEnd, StreamError, StreamReply)) or (
            signer is not None and signer != leg.node_id
        ):
            return self._drop(
                peer, "bad_stream_frame", f"{frame.FRAME_TYPE} not accepted on a route"
            )
        if getattr(frame, "stream_id", None) != route.stream_id:
            return self._drop(peer, "bad_stream_frame", "stream_id does not match the route")
        out.append(Send(other.conn, other.stream, self._encode(frame)))
        if route.after_frame(leg, frame):
            out += self._teardown(route, now_ms)
        return None

    def _leg_lost(self, conn: int, stream: int, why: str, now_ms: int) -> list[Action]:
        route = self.routes.by_leg(conn, stream)
        if route is None:
            return []
        leg, _ = route.legs_from(conn, stream)
        if route.half_closed(leg):
            return []  # a FIN after STREAM_END(send) is the normal end of that direction
        return self._teardown(route, now_ms, error=(b"unavailable", why.encode()), lost=leg)

    def _teardown(
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
            peer = self.peers.get(leg.conn)
            if peer is None:
                continue
            peer.ignored_streams.add(leg.stream)  # an ended stream takes no new work
            if error is not None and leg is not lost:
                out.append(
                    self._stream_error(
                        leg.conn, leg.stream, None, error[0], error[1], now_ms, route.stream_id
                    )
                )
            out.append(EndStream(leg.conn, leg.stream))
        return out

    # --- cleanup -----------------------------------------------------------------------------

    def _forget_peer(self, peer: Peer, now_ms: int) -> list[Action]:
        """Purge what a closing (or replaced) connection owned (§6.1, §7.5, §8.4)."""
        out: list[Action] = []
        for key in list(peer.advertisements):
            self._remove_ad(key, now_ms)
        for call_id, pending in list(self.pending.items()):
            if pending.provider_conn == peer.conn:
                out += self._fail_pending(
                    call_id,
                    ErrorCode.UNKNOWN_NEXT_PEER,
                    "provider disconnected before replying",
                    now_ms,
                )
            elif pending.caller_conn == peer.conn:
                del self.pending[call_id]
        for route in self.routes.for_conn(peer.conn):
            out += self._teardown(route, now_ms, error=(b"unavailable", b"peer connection lost"))
        if peer.node_id and self.node_conn.get(peer.node_id) == peer.conn:
            del self.node_conn[peer.node_id]
            for topic_key in list(self.node_subscriptions.pop(peer.node_id, ())):
                self._remove_subscription(peer.node_id, topic_key)
        return out

    # --- frame building ----------------------------------------------------------------------

    def _stamp(self, now_ms: int) -> dict[str, Any]:
        return {"frame_id": new_frame_id(now_ms, self._random(10)), "sent_at_ms": now_ms}

    def _sign(self, frame: Frame) -> bytes:
        return frame.sign_and_encode(self.identity)

    @staticmethod
    def _encode(frame: Frame) -> bytes:
        """Relay a verified frame as received (its own signature kept, §4.5)."""
        return frame_bytes(cbor.encode(frame.to_map()))

    def _error(
        self, peer: Peer, stream: int, call_id: bytes, code: int, detail: bytes | None, now_ms: int
    ) -> Send:
        error = Error(
            **self._stamp(now_ms),
            call_id=call_id,
            code=code,
            reported_by=self.identity.node_id,
            detail=detail,
        )
        return Send(peer.conn, stream, self._sign(error))

    def _goodbye(self, peer: Peer, reason: str, detail: str, now_ms: int) -> Send:
        goodbye = Goodbye(**self._stamp(now_ms), reason=reason, detail=detail.encode())
        return Send(peer.conn, peer.control or 0, self._sign(goodbye))

    def _stream_error(
        self,
        conn: int,
        stream: int,
        frame_map: dict[str, Any] | None,
        code: bytes,
        message: bytes,
        now_ms: int,
        stream_id: bytes | None = None,
    ) -> Send:
        if stream_id is None:
            candidate = (frame_map or {}).get("stream_id")
            stream_id = (
                candidate if type(candidate) is bytes and len(candidate) == 16 else bytes(16)
            )
        error = StreamError(**self._stamp(now_ms), stream_id=stream_id, code=code, message=message)
        return Send(conn, stream, self._sign(error))

    def _refuse_stream(
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
        error = self._stream_error(peer.conn, stream, frame_map, code, message, now_ms)
        return [error, EndStream(peer.conn, stream)]

    def _drop(self, peer: Peer, counter: str, why: str) -> None:
        self.stats[counter] += 1
        log.info("conn %d (%s): dropped: %s", peer.conn, peer.node_id.hex()[:16], why)
