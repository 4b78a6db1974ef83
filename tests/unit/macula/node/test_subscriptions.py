"""``Subscription``: bounded buffer, oldest dropped, and an end every reader sees."""

from __future__ import annotations

import asyncio

import pytest

from macula.node.subscriptions import Delivery, LocalSubscriptions, Subscription

pytestmark = pytest.mark.anyio
REALM = b"\x01" * 32


def delivery(seq: int, topic: str = "t") -> Delivery:
    return Delivery(REALM, topic, b"\x02" * 32, seq, seq, True)


async def drain(sub: Subscription) -> list[int]:
    return [d.seq async for d in sub]


async def _nothing(sub: Subscription) -> None:
    return None


async def test_a_full_buffer_drops_the_oldest_and_still_ends() -> None:
    closed: list[Subscription] = []

    async def on_close(sub: Subscription) -> None:
        closed.append(sub)

    sub = Subscription(REALM, "t", 2, on_close)
    for seq in range(3):
        sub._offer(delivery(seq))
    await sub.close()
    await sub.close()  # idempotent
    assert closed == [sub] and sub.dropped == 1 and sub.delivered == 3
    assert await asyncio.wait_for(drain(sub), 1) == [1, 2]
    assert await asyncio.wait_for(drain(sub), 1) == []  # stays ended
    sub._offer(delivery(9))  # an ended subscription takes nothing more
    assert await asyncio.wait_for(drain(sub), 1) == [] and sub.delivered == 3


async def test_the_end_wakes_every_waiting_reader() -> None:
    sub = Subscription(REALM, "t", 1, _nothing)
    sub._offer(delivery(1))
    readers = [asyncio.create_task(drain(sub)) for _ in range(3)]
    await asyncio.sleep(0)  # sleep: one scheduler step, so every reader is blocked on the queue
    sub._end()
    results = await asyncio.wait_for(asyncio.gather(*readers), 1)
    assert sorted(map(len, results)) == [0, 0, 1]


async def test_the_table_fans_out_and_says_when_the_station_must_hear() -> None:
    table = LocalSubscriptions()
    a, b = Subscription(REALM, "t", 4, _nothing), Subscription(REALM, "t", 4, _nothing)
    other = Subscription(REALM, "u", 4, _nothing)
    assert table.add(a) and not table.add(b) and table.add(other)
    assert sorted(table) == [(REALM, "t"), (REALM, "u")]
    table.deliver(delivery(7))
    assert (a.delivered, b.delivered, other.delivered) == (1, 1, 0)
    assert not table.discard(a) and not table.discard(a) and table.discard(b)
    assert list(table) == [(REALM, "u")]
    table.end_all()
    assert await asyncio.wait_for(drain(other), 1) == []


async def test_missed_counts_local_drops_and_gaps_count_broken_sessions() -> None:
    table = LocalSubscriptions()
    live = Subscription(REALM, "t", 1, _nothing)
    ended = Subscription(REALM, "u", 1, _nothing)
    table.add(live)
    table.add(ended)
    live._offer(delivery(0))
    live._offer(delivery(1))
    assert (live.missed, live.gaps, live.slow_consumer_gaps) == (1, 0, 0)
    await ended.close()
    table.gap_all(slow_consumer=False)
    table.gap_all(slow_consumer=True)
    assert (live.missed, live.gaps, live.slow_consumer_gaps) == (1, 2, 1)
    assert (ended.gaps, ended.slow_consumer_gaps) == (0, 0)  # an ended one misses nothing more
