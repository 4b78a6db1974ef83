"""The one token bucket of macula: rate limits on the station, in house services and in tools.

Pure: time is an argument (``now_ms``), never read here.
"""

from __future__ import annotations


class TokenBucket:
    """Classic token bucket: ``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("_at_ms", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now_ms: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at_ms = now_ms

    def take(self, now_ms: int, amount: float = 1.0) -> bool:
        elapsed = max(0, now_ms - self._at_ms)
        self._at_ms = max(self._at_ms, now_ms)
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate / 1000.0)
        if self._tokens >= amount:
            self._tokens -= amount
            return True
        return False

    def tokens(self, now_ms: int) -> float:
        """How many tokens are banked at ``now_ms`` (refilling first; nothing is taken)."""
        self.take(now_ms, 0.0)
        return self._tokens
