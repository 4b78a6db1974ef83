"""``NodeStats``: the counters a ``Node`` keeps; ``Refusals``: what the station refused
without an answer on the wire, as the node learns it; the error its first connect fails with.

Invariants:
- plain data, no I/O; the event dedup window lives here so it is kept across reconnects (the
  node hands the same ``EventDedup`` to every session);
- ``Refusals.total`` only grows: a rise in a station counter is added once, whichever
  connection it was counted on (the counters restart at 0 with every connection); each rise
  is told to every ``on_refusal`` listener (a listener that raises is logged, not re-raised).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from macula.client.intent import EventDedup
from macula.errors import BrokenError, HandshakeError, MaculaError
from macula.stations import StationAddress

log = logging.getLogger("macula.node.node")


@dataclass(frozen=True, slots=True)
class Refusal:
    """The station refused ``count`` more frames of this node for ``reason`` (a name of
    ``macula.services.refusals``) without an answer on the wire."""

    reason: str
    count: int


class Refusals:
    """What the station refused on the node's connections without an in-band answer. The
    station says so only when asked (``_relay.ping``: ``Node.flush``, ``publish_confirmed``),
    so a refusal is known from the first such answer after it."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}  # this connection's counters, as last answered
        self.total: Counter[str] = Counter()  # every refusal since the node started
        self._listeners: list[Callable[[Refusal], None]] = []

    def on_refusal(self, listener: Callable[[Refusal], None]) -> None:
        """Call ``listener(Refusal)`` for each rise the node learns of from now on."""
        self._listeners.append(listener)

    def risen(self, since: Counter[str], reasons: frozenset[str] | None = None) -> list[str]:
        """The reasons (of ``reasons``, or any) counted since ``since`` (a copy of ``total``)."""
        return sorted(
            reason
            for reason, count in self.total.items()
            if count > since.get(reason, 0) and (reasons is None or reason in reasons)
        )

    def learned(self, answer: object, *, current: bool = True) -> dict[str, int]:
        """The counters in a ``_relay.ping`` answer; kept (and their rises told) when they
        come from the connection the node is on now (``current``)."""
        refused = answer.get("refused") if isinstance(answer, dict) else None
        counts = {
            str(name): count
            for name, count in (refused.items() if isinstance(refused, dict) else ())
            if type(count) is int
        }
        if current:
            for reason, count in counts.items():
                rise = count - self.current.get(reason, 0)
                if rise > 0:
                    self.total[reason] += rise
                    self._tell(Refusal(reason, rise))
            self.current = counts
        return counts

    def reconnecting(self) -> None:
        """The connection ended: the next one's counters start at 0."""
        self.current = {}

    def _tell(self, refusal: Refusal) -> None:
        for listener in list(self._listeners):
            try:
                listener(refusal)
            except Exception:
                log.exception("refusal listener failed")


@dataclass(slots=True)
class NodeStats:
    dedup: EventDedup = field(default_factory=EventDedup)  # kept across reconnects
    reconnects: int = 0
    events_unauthenticated: int = 0
    calls_served: int = 0
    handler_errors: int = 0
    calls_refused_busy: int = 0  # answered 0x08: ``max_handlers`` were already running
    slow_consumer: int = 0  # times the station closed us for not keeping up (events were lost)
    probes_acknowledged: int = 0  # liveness pings (QUIC PING) a quiet station acknowledged
    # connections a restarted station ended with a QUIC stateless reset (each redialled at once)
    stateless_resets: int = 0
    # dials refused by ICMP "port unreachable" (the host is up, the station's process is not),
    # and the short redials (0.25-0.5 s) that followed a round of such refusals
    dials_refused: int = 0
    quick_redials: int = 0
    # what the station refused without telling us in-band (``Node.refusals`` is this)
    refusals: Refusals = field(default_factory=Refusals)

    @property
    def refused(self) -> dict[str, int]:
        """The station's counters for our current connection, from the latest ``flush`` (they
        restart at 0 with every connection)."""
        return self.refusals.current

    @property
    def events_duplicate(self) -> int:
        return self.dedup.duplicates


def first_connect_error(
    stations: Sequence[StationAddress], last: MaculaError | OSError | None
) -> MaculaError:
    """What ``async with Node(...)`` raises when no station of the list could be reached."""
    if isinstance(last, HandshakeError):
        return last
    names = ", ".join(map(str, stations))
    return BrokenError(f"no station reachable: {names} (last error: {last})")
