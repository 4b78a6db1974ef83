"""``SqliteStore._atomically``: a transaction in one trip to the connection's thread.

Real SQLite files under ``tmp_path``. The thread is held still with a blocking call queued
first (aiosqlite runs its queue in order), so a caller can be cancelled while its trip waits or
runs, deterministically.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import ClassVar

import pytest

from macula.store.base import SqliteStore, StoreError, _on_thread
from support.storekit import hold
from support.storekit import trips as trips_of
from support.waiting import eventually


class Counters(SqliteStore):
    MIGRATIONS: ClassVar = (("CREATE TABLE n (k TEXT PRIMARY KEY, v INTEGER NOT NULL)",),)

    async def values(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in await self._fetchall("SELECT k, v FROM n")}


def _add(key: str, value: int) -> object:
    def work(connection: sqlite3.Connection) -> int:
        connection.execute("INSERT INTO n VALUES (?, ?)", (key, value))
        return value

    return work


def half_then_fail(connection: sqlite3.Connection) -> None:
    connection.execute("INSERT INTO n VALUES ('c', 3)")
    raise RuntimeError("changed my mind")


def test_work_commits_in_one_trip_and_an_error_rolls_all_of_it_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            trips = trips_of(store)

            def two(connection: sqlite3.Connection) -> int:
                connection.execute("INSERT INTO n VALUES ('a', 1)")
                connection.execute("INSERT INTO n VALUES ('b', 2)")
                return 3

            assert await store._atomically(two) == 3
            assert len(trips) == 1
            assert await store.values() == {"a": 1, "b": 2}

            with pytest.raises(RuntimeError, match="changed my mind"):
                await store._atomically(half_then_fail)

            def half_then_conflict(connection: sqlite3.Connection) -> None:
                connection.execute("INSERT INTO n VALUES ('d', 4)")
                connection.execute("INSERT INTO n VALUES ('a', 5)")  # 'a' exists

            with pytest.raises(StoreError, match="UNIQUE"):
                await store._atomically(half_then_conflict)
            assert await store.values() == {"a": 1, "b": 2}  # neither 'c' nor 'd'
            assert not store._db.in_transaction

    asyncio.run(scenario())


@pytest.mark.parametrize("with_undo", [0, 1])
def test_a_caller_cancelled_during_its_trip(tmp_path: Path, with_undo: int) -> None:
    """The trip cannot be stopped on the thread: without ``undo`` what it did stands; with
    ``undo`` it is undone in a second trip, queued behind it. The caller sees the cancel."""

    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            release, holding = await hold(store)
            seen = trips_of(store)

            def undo(connection: sqlite3.Connection, value: int) -> None:
                connection.execute("DELETE FROM n WHERE v = ?", (value,))

            caller = asyncio.ensure_future(
                store._atomically(_add("x", 7), undo if with_undo else None)  # type: ignore[arg-type]
            )
            await eventually(
                lambda: len(seen) == 1, interval=0
            )  # its trip is queued behind the held call
            caller.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await holding
            assert await store.values() == ({} if with_undo else {"x": 7})

    asyncio.run(scenario())


def test_a_cancelled_trip_that_failed_has_nothing_to_undo(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            await store._atomically(_add("x", 1))  # type: ignore[arg-type]
            release, holding = await hold(store)
            seen = trips_of(store)
            undone: list[int] = []
            caller = asyncio.ensure_future(
                store._atomically(
                    _add("x", 2),  # type: ignore[arg-type]
                    lambda connection, value: undone.append(value),
                )
            )
            await eventually(
                lambda: len(seen) == 1, interval=0
            )  # its trip is queued behind the held call
            caller.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await holding
            assert await store.values() == {"x": 1} and undone == []

    asyncio.run(scenario())


def test_aiosqlite_runs_its_queue_in_order(tmp_path: Path) -> None:
    """What ``_atomically``'s undo relies on: a call queued later runs after one queued
    earlier, even when the earlier caller was cancelled."""

    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            release, holding = await hold(store)
            seen = trips_of(store)
            order: list[str] = []
            first = asyncio.ensure_future(_on_thread(store._db, lambda: order.append("first")))
            await eventually(lambda: len(seen) == 1, interval=0)
            second = asyncio.ensure_future(_on_thread(store._db, lambda: order.append("second")))
            await eventually(lambda: len(seen) == 2, interval=0)  # both queued behind the held call
            first.cancel()
            release.set()
            await second
            await holding
            assert order == ["first", "second"]

    asyncio.run(scenario())


def test_inline_work_waits_for_what_a_cancelled_caller_left_on_the_thread(
    tmp_path: Path,
) -> None:
    """Inline work runs on the loop's thread only when nothing of ours is still queued on the
    connection's thread: after a cancelled call it lets that run out first (one empty trip),
    so the connection is never used from two threads at once."""

    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            release, holding = await hold(store)
            seen = trips_of(store)
            left = asyncio.ensure_future(store._atomically(_add("x", 1)))  # type: ignore[arg-type]
            await eventually(lambda: len(seen) == 1, interval=0)  # queued behind the held call
            left.cancel()
            with pytest.raises(asyncio.CancelledError):
                await left
            assert store._settled is False
            inline = asyncio.ensure_future(store._atomically(_add("y", 2), inline=True))  # type: ignore[arg-type]
            await eventually(
                lambda: len(seen) == 2, interval=0
            )  # the empty trip that lets the thread run out
            assert not inline.done()  # waiting for the thread, not running beside it
            release.set()
            assert await inline == 2
            await holding
            assert store._settled is True
            assert await store.values() == {"x": 1, "y": 2}

    asyncio.run(scenario())


def test_inline_work_rolls_back_on_error_like_the_thread(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await Counters.open(tmp_path / "n.sqlite3") as store:
            trips = trips_of(store)

            with pytest.raises(RuntimeError):
                await store._atomically(half_then_fail, inline=True)
            assert await store._atomically(_add("d", 4), inline=True) == 4  # type: ignore[arg-type]
            assert trips == []
            assert await store.values() == {"d": 4}
            assert not store._db.in_transaction

    asyncio.run(scenario())
