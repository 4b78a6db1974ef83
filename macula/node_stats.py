"""``NodeStats``: the counters a ``Node`` keeps, and the error its first connect fails with.

Invariant: plain data, no I/O; the event dedup window lives here so it is kept across
reconnects (the node hands the same ``EventDedup`` to every session).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from macula.errors import BrokenError, HandshakeError, MaculaError
from macula.intent import EventDedup
from macula.stations import StationAddress


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
    # the station's counters of what it refused on our current connection without telling us
    # in-band (from the latest ``flush``; they restart at 0 with every connection)
    refused: dict[str, int] = field(default_factory=dict)

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
