"""What the router core's handler modules see of it: ``RouterState``, a ``typing.Protocol``.

``relay.connect_handling``, ``relay.call_handling``, ``relay.stream_handling`` and
``relay.realm_routing`` are functions taking the core they act on; they type it with this
Protocol, not with ``relay.core.RouterCore``, so no handler imports the core back (issue 23:
no import cycle, lazy and ``TYPE_CHECKING`` imports counted). ``RouterCore`` satisfies it
structurally (mypy checks that where the core passes ``self``); nothing here exists at run
time beyond the class, so a handler call per frame costs what it did.

The members are the union of what the four handler modules use: the core's tables and helpers
(read, and mutated in place, never reassigned) and its reply and cleanup methods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from macula.realm.records import Endorsement
    from macula.wire.identity import Identity
    from relay.actions import Action, Send
    from relay.admission import Admitted, FrameAdmission, Rejected
    from relay.adverts import AdvertTable
    from relay.call_forwarding import CallForwarder
    from relay.federation.gossip import AdvertGossip
    from relay.federation.handshake import LinkHandshake
    from relay.interest import InterestRouter
    from relay.pacing import PublishPacer
    from relay.peers import Peer
    from relay.pending import PendingCalls
    from relay.policy import StationPolicy
    from relay.realm_admission import ConnectRule
    from relay.realm_links import RealmCalls
    from relay.realms import RealmGate
    from relay.routes import RouteTable
    from relay.station_frames import StationFrames
    from relay.stream_relay import StreamRelay

__all__ = ["RouterState"]


class RouterState(Protocol):
    """The router core as its handler modules use it (``relay.core.RouterCore`` is the one)."""

    identity: Identity
    policy: StationPolicy
    services: frozenset[tuple[bytes, str]]
    random_bytes: Callable[[int], bytes]
    stopping: bool
    dht_port: int
    # tables
    peers: dict[int, Peer]
    node_conn: dict[bytes, int]
    adverts: AdvertTable
    pending: PendingCalls
    routes: RouteTable
    stats: Counter[str]
    builtins_running: Counter[int]
    # helpers
    realms: RealmGate
    frames: StationFrames
    admission: FrameAdmission
    connect_rule: ConnectRule
    realm_calls: RealmCalls
    pacer: PublishPacer
    gossip: AdvertGossip
    streams: StreamRelay
    calls: CallForwarder
    interest: InterestRouter
    linking: LinkHandshake

    def admit(self, peer: Peer, frame_map: dict[str, Any], now_ms: int) -> Admitted | Rejected: ...

    def refused(self, peer: Peer, stream: int, verdict: Rejected, now_ms: int) -> list[Action]: ...

    def call_station(
        self,
        node_id: bytes,
        procedure: str,
        payload: Any,
        deadline_ms: int,
        now_ms: int,
        *,
        realm: bytes = ...,
    ) -> tuple[bytes, list[Action]]: ...

    def vouch(
        self, endorsements: list[Endorsement], now_ms: int, links: list[Peer] | None = None
    ) -> list[Action]: ...

    def remove(self, conn: int, now_ms: int) -> Peer | None: ...

    def forget_peer(self, peer: Peer, now_ms: int) -> list[Action]: ...

    def error(
        self, peer: Peer, stream: int, call_id: bytes, code: int, detail: bytes | None, now_ms: int
    ) -> Send: ...

    def goodbye(self, peer: Peer, reason: str, detail: str, now_ms: int) -> Send: ...

    def drop(self, peer: Peer, counter: str, why: str) -> None: ...

    def refusals_of(self, conn: int) -> tuple[tuple[str, int], ...]: ...
