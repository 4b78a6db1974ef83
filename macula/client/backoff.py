"""Reconnect backoff: 1 s doubling to 30 s, with jitter; and the short redial of a station
whose host refused the dial (pure; randomness injected).

A dial refused by ICMP "port unreachable" proves the host is there and nothing listens on the
port: the station's process is down, most likely restarting. Such a station is dialled again
every ``redial_min_s``-``redial_max_s`` (jittered) for at most ``redial_window_s``, instead of
the doubling wait (``macula.client.station_choice`` decides when).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from macula.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2  # each delay is scaled by a factor in [1 - jitter, 1 + jitter]
    # how many full passes over the station list ``Node.__aenter__`` tries before giving up
    first_connect_attempts: int = 3
    # a refused station (its process down, host up) is redialled this often, this long
    redial_min_s: float = 0.25
    redial_max_s: float = 0.5
    redial_window_s: float = 120.0
    uniform: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.redial_min_s <= self.redial_max_s:
            raise ConfigError(
                f"backoff: redial_min_s ({self.redial_min_s}) must be > 0 and <= redial_max_s "
                f"({self.redial_max_s})"
            )
        if self.redial_window_s < 0:
            raise ConfigError(f"backoff: redial_window_s must be >= 0, not {self.redial_window_s}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0-based)."""
        base = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return base * self.uniform(1.0 - self.jitter, 1.0 + self.jitter)

    def redial_delay(self) -> float:
        """Seconds to wait before dialling a refused station again (jittered, bounded)."""
        wait = self.uniform(self.redial_min_s, self.redial_max_s)
        return min(self.redial_max_s, max(self.redial_min_s, wait))
