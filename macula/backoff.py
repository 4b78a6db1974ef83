"""Reconnect backoff: 1 s doubling to 30 s, with jitter (pure; randomness injected)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2  # each delay is scaled by a factor in [1 - jitter, 1 + jitter]
    # how many full passes over the station list ``Node.__aenter__`` tries before giving up
    first_connect_attempts: int = 3
    uniform: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0-based)."""
        base = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return base * self.uniform(1.0 - self.jitter, 1.0 + self.jitter)
