"""One client or station connection as the router sees it (PROTOCOL.md §5).

Invariants: a peer moves only forward through ``PeerState`` (HANDSHAKING -> CONNECTED ->
DRAINING -> CLOSED, any step may be skipped); ``node_id`` and ``capabilities`` are set once,
by an accepted CONNECT; ``control`` is the first stream the peer sent a frame on, and the one
its CONNECT must arrive on (any other stream before CONNECT closes the connection). What a
peer owns in the shared tables (advertisements, pending calls, routes) lives in those tables,
keyed by ``conn``; only per-stream bookkeeping stays here. A station link is a peer with
``is_station`` (capability bit 0); ``linked`` is True exactly between its LinkUp and LinkDown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

from macula.rate import TokenBucket
from macula.wire.frames import CAP_STATION
from relay.core.logbook import Refusals
from relay.core.policy import Quotas


class PeerState(Enum):
    HANDSHAKING = auto()  # waiting for CONNECT
    CONNECTED = auto()  # HELLO "true" sent; frames are routed
    DRAINING = auto()  # closing: nothing more from it is heard
    CLOSED = auto()  # the transport reported it lost


@dataclass(slots=True)
class Peer:
    conn: int
    opened_ms: int
    publish_bucket: TokenBucket
    call_bucket: TokenBucket
    refusals: Refusals
    address: str = ""  # source IP address ("" if unknown); connection caps count by it
    node_id: bytes = b""
    control: int | None = None
    capabilities: int = 0
    state: PeerState = PeerState.HANDSHAKING
    content_streams: dict[int, int] = field(default_factory=dict)  # stream -> builtins running
    finished_content: set[int] = field(default_factory=set)
    ignored_streams: set[int] = field(default_factory=set)
    # a client whose CONNECT named this station (``bound_to``, issue 27): a frame claiming its
    # node id is admitted on the id comparison, one claiming another is refused
    # (relay.core.admission)
    bound: bool = False
    # --- station links (docs/federation.md) ---
    dialled: bool = False  # this station dialled it: HELLO from ``expected_node_id`` awaited
    expected_node_id: bytes = b""
    link_host: str = ""  # the host this station dialled ("" on an accepted connection)
    dht_port: int = 0  # the peer station's DHT UDP port from its CONNECT/HELLO (0: unknown)
    linked: bool = False  # LinkUp was emitted (LinkDown is owed when it goes)

    @property
    def is_station(self) -> bool:
        return bool(self.capabilities & CAP_STATION)

    def retune(self, quotas: Quotas) -> None:
        """Take the rates of ``quotas`` (a reload); the buckets keep their tokens."""
        self.publish_bucket.rate = quotas.publish_rate
        self.publish_bucket.burst = quotas.publish_burst
        self.call_bucket.rate, self.call_bucket.burst = quotas.call_rate, quotas.call_burst


def accepted_peer(conn: int, address: str, quotas: Quotas, now_ms: int) -> Peer:
    """The peer entry of a connection from ``address``, before its CONNECT."""
    return Peer(
        conn=conn,
        opened_ms=now_ms,
        publish_bucket=TokenBucket(quotas.publish_rate, quotas.publish_burst, now_ms),
        call_bucket=TokenBucket(quotas.call_rate, quotas.call_burst, now_ms),
        refusals=Refusals(now_ms),
        address=address,
    )
