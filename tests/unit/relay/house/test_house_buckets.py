"""Per-identity token buckets (relay.house.buckets): bounded memory and bounded work."""

from __future__ import annotations

import pytest

from macula.rate import TokenBucket
from relay.house import buckets as buckets_module
from relay.house.buckets import FORGET_SCAN, TokenBuckets


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


class CountedBucket(TokenBucket):
    """A ``TokenBucket`` that counts how often any bucket's tokens were read."""

    __slots__ = ()
    reads = 0

    def tokens(self, now_ms: int) -> float:
        CountedBucket.reads += 1
        return super().tokens(now_ms)


def test_many_drained_identities_cost_bounded_memory_and_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(buckets_module, "TokenBucket", CountedBucket)
    monkeypatch.setattr(CountedBucket, "reads", 0)
    buckets = TokenBuckets(rate=1.0, burst=1.0, max_tracked=2_000)
    honest = key(10**9)
    assert buckets.take(honest, 0) == 0
    new_keys = 10_000
    for i in range(new_keys):  # each identity drains its bucket: none is ever full again
        assert buckets.take(key(i), 0) == 0
    assert len(buckets) == 2_000
    # at most FORGET_SCAN bucket reads per new key (and per refused take, one more); a full
    # scan per new key would be 8,000 x 2,000 reads
    assert CountedBucket.reads <= new_keys * (FORGET_SCAN + 1)
    assert CountedBucket.reads >= (new_keys - 2_000) * FORGET_SCAN  # the scan did happen
    assert buckets.take(honest, 1000) == 0  # forgotten or refilled: never wrongly refused


def test_refilled_buckets_among_the_oldest_are_forgotten_first() -> None:
    buckets = TokenBuckets(rate=1.0, burst=2.0, max_tracked=FORGET_SCAN + 1)
    for i in range(FORGET_SCAN + 1):
        buckets.take(key(i), 0)
        buckets.take(key(i), 0)  # drained
    buckets.take(key(0), 0)  # refused, but now the most recently used
    assert buckets.take(key(1000), 0) == 0  # nothing full among the oldest: the oldest goes
    assert len(buckets) == FORGET_SCAN + 1
    assert buckets.take(key(2), 0) > 0  # key 2 was kept, still drained
    assert buckets.take(key(1), 0) == 0  # key 1 was the oldest: forgotten, a fresh bucket
    assert buckets.take(key(2000), 10_000) == 0  # every bucket refilled: the oldest 64 go
    assert len(buckets) == 2
