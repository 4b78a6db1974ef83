"""The content store's puts and gets in fewer SQLite round trips (issue 15) keep their meaning:
a put's INSERT OR IGNORE is rolled back with a refused quota, a repeated put marks the first copy
used, a get marks what it read with one UPDATE statement."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from macula.wire.content import digest
from relay.stores.content import ContentStore
from relay.stores.limits import QuotaExceeded, StoreLimits


def usage(path: Path) -> list[tuple[int, bytes, int, int]]:
    with sqlite3.connect(path) as raw:
        return [tuple(row) for row in raw.execute("SELECT * FROM usage ORDER BY digest")]


def blocks(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        return int(raw.execute("SELECT count(*) FROM blocks").fetchone()[0])


def test_a_refused_put_leaves_no_block_and_no_usage_row(tmp_path: Path) -> None:
    path = tmp_path / "content.sqlite3"
    limits = StoreLimits(content_bytes_total=1500, content_keep_ms=60_000)

    async def body() -> None:
        async with await ContentStore.open(path) as store:
            a, b, huge = b"a" * 1000, b"b" * 1000, b"h" * 2000
            assert await store.put_block(digest(a), a, 1_000, limits)
            with pytest.raises(QuotaExceeded):  # a is recent: nothing may be collected
                await store.put_block(digest(b), b, 2_000, limits)
            with pytest.raises(QuotaExceeded):  # bigger than the whole cap
                await store.put_block(digest(huge), huge, 3_000, limits)
            assert await store.get_block(digest(b)) is None
            assert await store.get_block(digest(huge)) is None
            assert await store.held() == 1000
            # the cached byte count was dropped with the rollback and counts right again
            c = b"c" * 400
            assert await store.put_block(digest(c), c, 4_000, limits)
            assert await store.held() == 1400

    asyncio.run(body())
    assert blocks(path) == 2
    assert sorted(row[2] for row in usage(path)) == [400, 1000]


def test_a_repeated_put_keeps_the_first_copy_and_marks_it_used(tmp_path: Path) -> None:
    path = tmp_path / "content.sqlite3"

    async def body() -> None:
        async with await ContentStore.open(path) as store:
            assert await store.put_block(digest(b"x"), b"x", 1_000)
            assert not await store.put_block(digest(b"x"), b"x", 5_000)
            assert not await store.put_block(digest(b"x"), b"x", 3_000)  # never moves back
            assert await store.held() == 1

    asyncio.run(body())
    assert usage(path) == [(0, digest(b"x"), 1, 5_000)]


def test_a_get_marks_the_block_used_and_a_get_without_a_time_does_not(tmp_path: Path) -> None:
    path = tmp_path / "content.sqlite3"

    async def body() -> None:
        async with await ContentStore.open(path) as store:
            assert await store.put_block(digest(b"y"), b"y", 1_000)
            assert await store.get_block(digest(b"y"), 7_000) == b"y"
            assert await store.get_block(digest(b"y")) == b"y"
            assert await store.get_block(digest(b"y"), 2_000) == b"y"  # never moves back
            assert await store.get_block(digest(b"z"), 9_000) is None

    asyncio.run(body())
    assert usage(path) == [(0, digest(b"y"), 1, 7_000)]
