"""Which frames the station lets in (PROTOCOL.md §4.3, §5.2, §13 #1, #10): pure, no I/O.

Every frame is parsed and its signature verified before it may touch any router state, and
its ``sent_at_ms``/``frame_id`` are checked against the clock skew bound and the per-node
replay window. Invariants: an admitted frame is well-formed, names no topic or procedure
longer than ``max_name_bytes`` of UTF-8 (realms are exactly 32 bytes by the wire), verifies
against its expected signer (else the connection's node id) — on a connection bound to this
station (issue 27) names the connection's node id as that signer instead, unverified — and
was not seen before; a rejected CALL always names its ``call_id`` so the router can answer it;
the replay cache
holds, per node, only ids that could still pass the skew check, and nothing for a node that
has neither ids nor a connection.
A link to a peer station carries frames signed by many clients, interleaved and out of
``sent_at_ms`` order, so its window (``LinkReplayWindow``) keeps the link's frame ids in one
bounded table but the floor that replaces forgotten ids *per signer*: one client's late frames
are never refused because another client's clock runs ahead. Its memory is bounded whatever
the peer sends: at most ``replay_cache_per_link`` ids and ``replay_signers_per_link`` floors
(past that, the oldest floor becomes the link-wide floor: stricter, never looser).
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from macula.services.refusals import (
    FOREIGN_SIGNER,
    MALFORMED_FRAME,
    NAME_TOO_LONG,
    UNKNOWN_FRAME_TYPES,
    UNVERIFIED_FRAME,
)
from macula.wire.codes import ErrorCode
from macula.wire.errors import ProtocolError
from macula.wire.frames import (
    CAP_STATION,
    Advertise,
    Call,
    Connect,
    Event,
    Frame,
    Publish,
    StreamOpen,
    Subscribe,
    Unadvertise,
    UnknownFrameType,
    Unsubscribe,
    parse_frame,
)
from macula.wire.framing import ReceivedMap, unsigned_body
from macula.wire.identity import DOMAIN_FRAME, puzzle_valid, verify
from relay.core.peers import Peer
from relay.core.policy import PuzzleMode, ReplayWindow, StationPolicy

log = logging.getLogger("macula.relay")

NODE_ID_BYTES = 32


@dataclass(frozen=True, slots=True)
class Rejected:
    """A frame refused on arrival: count it under ``counter``; answer ``call_id`` if set."""

    counter: str
    why: str | None = None  # None: counted silently (an unknown frame type, §4.2)
    call_id: bytes | None = None
    code: int = ErrorCode.UNKNOWN_ERROR
    detail: bytes = b""


class Admitted(NamedTuple):
    """An admitted frame, and ``body``: the bytes it was received as when they are canonical
    (§2.2), else None. A canonical body *is* the canonical re-encoding of the decoded map
    (``macula.wire.framing``), so relaying ``body`` sends exactly what re-encoding would."""

    frame: Frame
    body: bytes | None


def _received_signable(frame: Frame, frame_map: dict[str, Any]) -> tuple[bytes | None, bytes]:
    """The canonical received body (or None) and the bytes the frame signature covers: cut
    from that body, else re-encoded from the decoded map (§4.2; the same bytes when both
    exist, so the verdict never depends on which is used: ``frames.received_signable``)."""
    if isinstance(frame_map, ReceivedMap):
        unsigned = unsigned_body(frame_map.body)
        if unsigned is not None:
            return frame_map.body, DOMAIN_FRAME + unsigned
    if type(frame.signature) is not bytes or len(frame.signature) != 64:
        return None, b""  # refused by ``verify`` without any signable bytes
    return None, frame.signable_bytes()


def _foreign_signer(frame: Frame) -> Rejected:
    """A frame on a bound connection claiming a signer that is not the connection: refused
    without a verify (a CALL answered 0x0E, as an unverifiable one)."""
    why = f"{frame.FRAME_TYPE}: claims another signer than this bound connection"
    if isinstance(frame, Call):
        detail = b"signer is not this connection"
        return Rejected(FOREIGN_SIGNER, why, frame.call_id, ErrorCode.SIGNATURE_INVALID, detail)
    return Rejected(FOREIGN_SIGNER, why)


class LinkReplayWindow:
    """Frame ids seen on one station link, with a replay floor per signer (see the top)."""

    __slots__ = ("capacity", "floor_ms", "floors", "max_floors", "seen")

    def __init__(self, capacity: int, max_floors: int) -> None:
        self.capacity = capacity
        self.max_floors = max_floors
        self.seen: dict[bytes, int] = {}  # signer + frame_id -> sent_at_ms, in arrival order
        self.floors: dict[bytes, int] = {}  # signer -> floor, least recently raised first
        self.floor_ms = -1  # link-wide: raised only when a signer's floor had to be forgotten

    def admit(self, signer: bytes, frame_id: bytes, sent_at_ms: int) -> bool:
        if len(signer) != NODE_ID_BYTES:  # the wire makes every node id 32 bytes
            raise ValueError("a signer is a 32-byte node id")
        key = signer + frame_id
        if sent_at_ms <= max(self.floor_ms, self.floors.get(signer, -1)) or key in self.seen:
            return False
        self.seen[key] = sent_at_ms
        if len(self.seen) > self.capacity:
            oldest = next(iter(self.seen))
            forgotten_at = self.seen.pop(oldest)
            owner = oldest[:NODE_ID_BYTES]
            floor = max(self.floors.pop(owner, -1), forgotten_at)
            self.floors[owner] = floor  # now the most recently raised
            if len(self.floors) > self.max_floors:
                first = next(iter(self.floors))
                self.floor_ms = max(self.floor_ms, self.floors.pop(first))
        return True

    def forget_before(self, oldest_ms: int) -> None:
        """Drop ids and floors below ``oldest_ms`` (the skew check refuses those anyway);
        the table is in arrival order, so a scan stops at the first one still needed."""
        for table in (self.seen, self.floors):
            while table:
                first = next(iter(table))
                if table[first] >= oldest_ms:
                    break
                del table[first]
        if self.floor_ms < oldest_ms:
            self.floor_ms = -1

    def __bool__(self) -> bool:
        return bool(self.seen or self.floors)


class FrameAdmission:
    def __init__(self, policy: StationPolicy) -> None:
        self.policy = policy
        self.seen_frames: dict[bytes, ReplayWindow] = {}
        self.link_frames: dict[bytes, LinkReplayWindow] = {}  # per peer station's node id

    def admit(
        self, frame_map: dict[str, Any], node_id: bytes, now_ms: int, *, station: bool = False
    ) -> Frame | Rejected:
        """Parse and verify one frame from the connection of ``node_id`` (a peer station's
        link when ``station``: its replay window is kept per signer)."""
        verdict = self.admit_received(frame_map, node_id, now_ms, station=station)
        return verdict if isinstance(verdict, Rejected) else verdict.frame

    def admit_received(
        self,
        frame_map: dict[str, Any],
        node_id: bytes,
        now_ms: int,
        *,
        station: bool = False,
        bound: bool = False,
    ) -> Admitted | Rejected:
        """``admit``, and the received body when it is canonical (``Admitted.body``). On a
        ``bound`` connection (issue 27) the claimed signer is compared, not verified: the
        connection's own frames pass without a verify, any other signer is refused."""
        try:
            frame = parse_frame(frame_map)
        except UnknownFrameType:
            return Rejected(UNKNOWN_FRAME_TYPES)
        except ProtocolError as exc:
            call_id = frame_map.get("call_id")
            if (
                frame_map.get("frame_type") == "call"
                and type(call_id) is bytes
                and len(call_id) == 16
            ):
                detail = f"bad_request: {exc.detail}".encode()
                return Rejected(MALFORMED_FRAME, exc.detail, call_id, detail=detail)
            return Rejected(MALFORMED_FRAME, exc.detail)
        if self.name_too_long(frame):
            why = f"{frame.FRAME_TYPE}: name longer than {self.policy.max_name_bytes} bytes"
            if isinstance(frame, Call):
                code, detail = ErrorCode.UNKNOWN_ERROR, b"bad_request: name too long"
                return Rejected(NAME_TOO_LONG, why, frame.call_id, code, detail)
            return Rejected(NAME_TOO_LONG, why)
        signer = frame.expected_signer() or node_id
        body, signable = _received_signable(frame, frame_map)
        if bound and signer != node_id:
            return _foreign_signer(frame)
        if not bound and not verify(signer, signable, frame.signature):  # the bytes received
            problem = "signature does not verify"
        elif not (
            self.fresh_on_link(frame, now_ms, node_id, signer)
            if station
            else self.fresh(frame, now_ms, node_id)
        ):
            problem = "frame is replayed or sent_at_ms is outside the allowed clock skew"
        else:
            return Admitted(frame, body)
        why = f"{frame.FRAME_TYPE}: {problem}"
        if isinstance(frame, Call):
            code = ErrorCode.SIGNATURE_INVALID
            return Rejected(UNVERIFIED_FRAME, why, frame.call_id, code, problem.encode())
        return Rejected(UNVERIFIED_FRAME, why)

    def name_too_long(self, frame: Frame) -> bool:
        """A topic or procedure name above ``max_name_bytes`` of UTF-8."""
        if isinstance(frame, (Call, Advertise, Unadvertise, StreamOpen)):
            name = frame.procedure
        elif isinstance(frame, (Subscribe, Unsubscribe, Publish, Event)):
            name = frame.topic
        else:
            return False
        limit = self.policy.max_name_bytes
        return len(name) > limit or len(name.encode("utf-8")) > limit

    def connect_refusal(self, connect: Connect, now_ms: int) -> tuple[int, str] | None:
        """Why a parsed CONNECT is refused (§5.2: a §9 code and a reason), or None."""
        if not connect.verifies(connect.node_id):
            return ErrorCode.SIGNATURE_INVALID, "CONNECT signature does not verify"
        if not self.fresh(connect, now_ms):
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

    def inbound_link_refusal(self, node_id: bytes, peers: Iterable[Peer]) -> tuple[int, str] | None:
        """Why station ``node_id`` may not link in now: ``max_inbound_links`` other stations
        already hold links they opened to this one (its own link, being replaced, does not
        count), or None."""
        limit = self.policy.max_inbound_links
        inbound = sum(
            1 for p in peers if p.is_station and p.linked and not p.dialled and p.node_id != node_id
        )
        if inbound < limit:
            return None
        return ErrorCode.UPSTREAM_CONGESTION, f"too many inbound links (max_inbound_links {limit})"

    def fresh(self, frame: Frame, now_ms: int, node_id: bytes | None = None) -> bool:
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

    def fresh_on_link(self, frame: Frame, now_ms: int, link_id: bytes, signer: bytes) -> bool:
        """``fresh`` for a frame a peer station ``link_id`` relayed, signed by ``signer``."""
        policy = self.policy
        if policy.max_clock_skew_ms <= 0:
            return True
        if abs(frame.sent_at_ms - now_ms) > policy.max_clock_skew_ms:
            return False
        window = self.link_frames.get(link_id)
        if window is None:
            window = self.link_frames[link_id] = LinkReplayWindow(
                policy.replay_cache_per_link, policy.replay_signers_per_link
            )
        return window.admit(signer, frame.frame_id, frame.sent_at_ms)

    def prune(self, now_ms: int, connected: Container[bytes]) -> None:
        """Forget frame ids whose ``sent_at_ms`` now fails the skew check on its own."""
        oldest = now_ms - self.policy.max_clock_skew_ms
        for node_id in list(self.seen_frames):
            window = self.seen_frames[node_id]
            window.forget_before(oldest)
            if not window.seen and node_id not in connected:
                del self.seen_frames[node_id]
        for link_id in list(self.link_frames):
            link = self.link_frames[link_id]
            link.forget_before(oldest)
            if not link and link_id not in connected:
                del self.link_frames[link_id]
