"""Which station a ``Node`` dials next, and how long it waits first (sans-I/O).

Invariants:
- stations are tried round robin, starting with the one after the station that failed or was
  lost; a node prefers no station: while its station works it never moves back to an earlier
  one, and after a move it stays where it landed;
- there is no wait between stations inside a round; only when every station of the list has
  failed in a row does the node wait, ``backoff.delay(rounds_failed)`` (capped, jittered);
- a lost connection that had stayed up for ``settle_s`` or longer starts a fresh round (the
  count of failures and of failed rounds restarts, the lost station being the round's first
  failure); one lost sooner counts as one more failure of the current round, so a station
  that accepts and then drops at once cannot make the node spin;
- a connection the station ended with a stateless reset (it restarted: it is up, and lost us)
  is dialled again at once, to the same station, without counting a failure, when it had
  stayed up ``settle_s``; a reset sooner is handled as any loss, so a station restarting in a
  loop cannot make the node spin;
- time is the caller's: every method takes ``now`` (monotonic seconds); randomness is the
  ``Backoff``'s own (injected there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from macula.backoff import Backoff
from macula.errors import ConfigError, MaculaError
from macula.stations import StationAddress, parse_station

DEFAULT_SETTLE_S = 10.0


def station_list(
    stations: str | StationAddress | Sequence[str | StationAddress], *, source: str = "stations"
) -> list[StationAddress]:
    """One address or a list of them, parsed; ``ConfigError`` naming ``source`` and the entry
    for an empty list, a malformed entry, or one ``host:port`` given twice."""
    items = [stations] if isinstance(stations, (str, StationAddress)) else list(stations)
    if not items:
        raise ConfigError(f"{source}: a node needs at least one station address")
    parsed = [
        item if isinstance(item, StationAddress) else parse_station(item, source=source)
        for item in items
    ]
    seen: dict[tuple[str, int], int] = {}
    for number, address in enumerate(parsed, 1):
        where = (address.host.lower(), address.port)
        if where in seen:
            raise ConfigError(
                f"{source}: entry {number} ({address}) names the same station as entry "
                f"{seen[where]}; list each station once"
            )
        seen[where] = number
    return parsed


@dataclass(frozen=True, slots=True)
class StationInfo:
    """The station a node is on: the key it proved and the address it was dialled at."""

    node_id: bytes
    address: StationAddress  # as configured (without the pin when given as host:port)
    index: int  # its position in the node's station list

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what another client needs to dial and pin it."""
        pinned = StationAddress(self.address.host, self.address.port, self.node_id)
        return str(pinned)


@dataclass(frozen=True, slots=True)
class Step:
    """What to do after a failure or a loss: dial ``index`` after ``wait_s`` seconds."""

    index: int
    wait_s: float
    round_failed: int  # 0/1: this failure ended a round in which every station failed
    rounds_failed: int  # failed rounds in a row so far


class StationChoice:
    """The failover policy over ``count`` stations (see the module docstring)."""

    def __init__(self, count: int, backoff: Backoff, *, settle_s: float = DEFAULT_SETTLE_S) -> None:
        if count < 1:
            raise MaculaError("a station choice needs at least one station")
        if settle_s < 0:
            raise MaculaError(f"settle_s must be >= 0, not {settle_s}")
        self.count = count
        self.backoff = backoff
        self.settle_s = settle_s
        self.index = 0  # the station to dial next (or the one we are on)
        self.failures = 0  # failures in a row in the current round
        self.rounds_failed = 0  # whole rounds failed in a row
        self._up_since: float | None = None

    def connected(self, now: float) -> None:
        """The station at ``index`` accepted us."""
        self._up_since = now

    def failed(self, now: float) -> Step:
        """Dialling the station at ``index`` failed (unreachable, refused, wrong key)."""
        self._up_since = None
        return self._advance()

    def lost(self, now: float) -> Step:
        """The connection to the station at ``index`` ended (lost, GOODBYE, draining)."""
        up, self._up_since = self._up_since, None
        if up is not None and now - up >= self.settle_s:
            self.failures, self.rounds_failed = 0, 0
        return self._advance()

    def restarted(self, now: float) -> Step:
        """The station at ``index`` ended our connection with a stateless reset: it restarted.
        Dial it again at once if the connection had settled, else as ``lost``."""
        up = self._up_since
        if up is None or now - up < self.settle_s:
            return self.lost(now)
        self._up_since = None
        self.failures, self.rounds_failed = 0, 0
        return Step(self.index, 0.0, 0, 0)

    def _advance(self) -> Step:
        self.failures += 1
        self.index = (self.index + 1) % self.count
        if self.failures < self.count:
            return Step(self.index, 0.0, 0, self.rounds_failed)
        self.failures = 0
        wait = self.backoff.delay(self.rounds_failed)
        self.rounds_failed += 1
        return Step(self.index, wait, 1, self.rounds_failed)
