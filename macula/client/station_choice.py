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
- a dial (or a connection) ended by ICMP "port unreachable" is *refused*: the host answered,
  the station's process is down, likely restarting. It is a failure like any (the node moves
  on to the next station at once), but a round in which every station was refused ends with
  the short wait (``backoff.redial_delay()``, 0.25-0.5 s) instead of the doubling one when
  that is longer, and without counting a failed round, while the redial window is open: from
  the first refusal after the node had been connected, for ``backoff.redial_window_s``
  (120 s). The window closes only when a settled connection is lost (a new outage opens a new
  one), so a station restarting in a loop gets short redials for 120 s at most; a round with
  one failure that was not a refusal (a silent timeout, a handshake refused) waits the
  doubling backoff; before the first connection every failure is handled alike
  (``Node.__aenter__`` gives up in time);
- time is the caller's: every method takes ``now`` (monotonic seconds); randomness is the
  ``Backoff``'s own (injected there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from macula.client.backoff import Backoff
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
    quick: int = 0  # 0/1: ``wait_s`` is the short redial of refused stations, not the backoff


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
        self._ever_up = False
        self._round_refused = True  # every failure of the current round so far was refused
        self._refused_since: float | None = None  # the redial window opened then

    def connected(self, now: float) -> None:
        """The station at ``index`` accepted us."""
        self._up_since = now
        self._ever_up = True

    def failed(self, now: float, *, refused: bool = False) -> Step:
        """Dialling the station at ``index`` failed (unreachable, wrong key; ``refused``: ICMP
        "port unreachable", its process is down)."""
        self._up_since = None
        return self._advance(now, refused)

    def lost(self, now: float, *, refused: bool = False) -> Step:
        """The connection to the station at ``index`` ended (lost, GOODBYE, draining;
        ``refused``: its packets met ICMP "port unreachable")."""
        up, self._up_since = self._up_since, None
        if up is not None and now - up >= self.settle_s:
            self.failures, self.rounds_failed = 0, 0
            self._refused_since = None  # a new outage: a new redial window
        return self._advance(now, refused)

    def ended(self, now: float, *, up: bool, restarted: bool, refused: bool) -> Step:
        """What follows a connection that ended (``up``: it had been up; ``restarted``: by a
        stateless reset; ``refused``: by ICMP) or a dial that failed (``up`` false)."""
        if restarted:
            return self.restarted(now)
        return (self.lost if up else self.failed)(now, refused=refused)

    def redialling(self, now: float) -> bool:
        """Whether the redial window is open (refused stations are redialled quickly)."""
        since = self._refused_since
        return since is not None and now - since < self.backoff.redial_window_s

    def restarted(self, now: float) -> Step:
        """The station at ``index`` ended our connection with a stateless reset: it restarted.
        Dial it again at once if the connection had settled, else as ``lost``."""
        up = self._up_since
        if up is None or now - up < self.settle_s:
            return self.lost(now)
        self._up_since = None
        self.failures, self.rounds_failed = 0, 0
        self._refused_since = None
        return Step(self.index, 0.0, 0, 0)

    def _advance(self, now: float, refused: bool) -> Step:
        if self.failures == 0:
            self._round_refused = True
        self._round_refused = self._round_refused and refused
        if refused and self._ever_up and self._refused_since is None:
            self._refused_since = now
        self.failures += 1
        self.index = (self.index + 1) % self.count
        if self.failures < self.count:
            return Step(self.index, 0.0, 0, self.rounds_failed)
        self.failures = 0
        wait = self.backoff.delay(self.rounds_failed)
        if self._round_refused and self.redialling(now):
            quick = self.backoff.redial_delay()
            if quick < wait:  # never slower than the backoff (a short one, as in tests)
                return Step(self.index, quick, 1, self.rounds_failed, 1)
        self.rounds_failed += 1
        return Step(self.index, wait, 1, self.rounds_failed)
