"""Streaming-RPC routes (PROTOCOL.md §8): two physical streams paired by the station.

A route pairs the caller's stream with the stream the station opened on the provider's
connection. Teardown is mode-aware (§8.4): STREAM_ERROR, STREAM_REPLY and STREAM_END(both) end
it at once; STREAM_END(send) only records that its sender finished — it ends a
``server_stream`` when the provider sends it and a ``bidi`` once both sides have; a
``client_stream`` waits for the provider's REPLY/ERROR/END(both). Pure state, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from macula.wire.frames import Frame, StreamEnd, StreamError, StreamReply


@dataclass(frozen=True, slots=True)
class Leg:
    conn: int
    stream: int
    node_id: bytes
    # a station link: its frames are signed by the nodes behind it (each verified against its
    # own ``signer``), not by ``node_id``
    via_link: bool = False


@dataclass(slots=True)
class Route:
    stream_id: bytes
    mode: str
    caller: Leg
    provider: Leg
    expires_ms: int
    finished: set[str] = field(default_factory=set)  # "caller" / "provider" sent END(send)

    def legs_from(self, conn: int, stream: int) -> tuple[Leg, Leg]:
        """(the leg a frame arrived on, the leg it is relayed to)."""
        if (conn, stream) == (self.caller.conn, self.caller.stream):
            return self.caller, self.provider
        return self.provider, self.caller

    def _side(self, leg: Leg) -> str:
        return "caller" if leg == self.caller else "provider"

    def half_closed(self, leg: Leg) -> bool:
        return self._side(leg) in self.finished

    def after_frame(self, leg: Leg, frame: Frame) -> bool:
        """Record ``frame`` (already relayed); True when the route must now be torn down."""
        if isinstance(frame, (StreamError, StreamReply)):
            return True
        if not isinstance(frame, StreamEnd):
            return False
        if frame.role == "both":
            return True
        side = self._side(leg)
        self.finished.add(side)
        if self.mode == "server_stream":
            return side == "provider"
        if self.mode == "bidi":
            return self.finished == {"caller", "provider"}
        return False  # client_stream: the provider's REPLY ends it


class RouteTable:
    def __init__(self) -> None:
        self._by_leg: dict[tuple[int, int], Route] = {}

    def add(self, route: Route) -> None:
        self._by_leg[(route.caller.conn, route.caller.stream)] = route
        self._by_leg[(route.provider.conn, route.provider.stream)] = route

    def remove(self, route: Route) -> None:
        for leg in (route.caller, route.provider):
            if self._by_leg.get((leg.conn, leg.stream)) is route:
                del self._by_leg[(leg.conn, leg.stream)]

    def by_leg(self, conn: int, stream: int) -> Route | None:
        return self._by_leg.get((conn, stream))

    def for_conn(self, conn: int) -> list[Route]:
        return list({id(r): r for (c, _), r in self._by_leg.items() if c == conn}.values())

    def count_for(self, conn: int) -> int:
        return sum(1 for (c, _) in self._by_leg if c == conn)

    def expired(self, now_ms: int) -> list[Route]:
        return list({id(r): r for r in self._by_leg.values() if r.expires_ms <= now_ms}.values())

    def __len__(self) -> int:
        return len({id(r) for r in self._by_leg.values()})
