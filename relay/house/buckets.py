"""Per-identity rate limits for the house services: one ``macula.rate.TokenBucket`` per key.

Invariants:
- At most ``max_tracked`` buckets are held. A new key beyond that forgets buckets that have
  refilled (forgetting a full bucket changes nothing), looking at no more than
  ``FORGET_SCAN`` of the least recently used; if none of them has, the least recently used one
  goes. Work per ``take`` is therefore bounded whatever the number of identities.
- Pure: no clock (``now_ms`` is an argument), no I/O.
"""

from __future__ import annotations

import itertools
import math
from typing import Final

from macula.rate import TokenBucket
from macula.wire.codes import ErrorCode
from relay.builtins.outcome import Refused

__all__ = ["FORGET_SCAN", "MAX_TRACKED_KEYS", "TokenBuckets"]

MAX_TRACKED_KEYS: Final = 10_000
FORGET_SCAN: Final = 64


class TokenBuckets:
    """One ``TokenBucket`` per key: ``rate`` tokens a second, at most ``burst`` banked."""

    def __init__(self, rate: float, burst: float, *, max_tracked: int = MAX_TRACKED_KEYS) -> None:
        if not (rate > 0 and burst >= 1 and max_tracked > 0):
            raise ValueError("rate must be > 0, burst >= 1 and max_tracked > 0")
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_tracked = max_tracked
        self._buckets: dict[bytes, TokenBucket] = {}  # least recently used first

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: bytes, now_ms: int) -> int:
        """Spend one token of ``key``'s bucket: 0 if done, else the ms until one is available."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            if len(self._buckets) >= self.max_tracked:
                self._forget_full(now_ms)
            bucket = TokenBucket(self.rate, self.burst, now_ms)
        self._buckets[key] = bucket
        if bucket.take(now_ms):
            return 0
        return max(1, math.ceil((1.0 - bucket.tokens(now_ms)) / self.rate * 1000))

    def take_or_refuse(self, key: bytes, now_ms: int, what: str) -> None:
        """``take``, refusing with 0x08 ``rate_limited`` ("too many ``what`` from this node;
        retry in N ms") when ``key``'s bucket is empty."""
        wait_ms = self.take(key, now_ms)
        if wait_ms:
            raise Refused(
                ErrorCode.UPSTREAM_CONGESTION,
                "rate_limited",
                f"too many {what} from this node; retry in {wait_ms} ms",
            )

    def _forget_full(self, now_ms: int) -> None:
        """Drop refilled buckets among the oldest ``FORGET_SCAN``, else the oldest one."""
        oldest = list(itertools.islice(self._buckets.items(), FORGET_SCAN))
        full = [key for key, bucket in oldest if bucket.tokens(now_ms) >= self.burst]
        for key in full or [oldest[0][0]]:
            del self._buckets[key]
