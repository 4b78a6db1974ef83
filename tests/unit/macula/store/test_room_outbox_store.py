"""The room outbox (issue 37): its store on a real SQLite file (schema, order, bounds, rows
that survive reopening) and its delivery rules against a node stand-in (the mesh is not what
these tests are about; tests/integration/test_room_outbox.py runs it over a real station)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from macula.agent.room.outbox import RETRY_INITIAL_MS, RETRY_MAX_MS, RoomOutbox
from macula.errors import BrokenError, CallTimeout
from macula.node.node import Node
from macula.store import StoreError
from macula.store.room_outbox import (
    OutboxBounds,
    OutboxEntry,
    OutboxFullError,
    RoomOutboxStore,
    room_outbox_path,
)
from support.running import run

T = TypeVar("T")
ME = bytes(range(1, 33))
OTHER = bytes(range(33, 65))
ROOM = "agents.room.0123456789abcdef0123456789abcdef"
ROOM2 = "agents.room.fedcba9876543210fedcba9876543210"
REALM = bytes(32)
NOW = 1_767_225_600_000
ROOMY = OutboxBounds(max_messages=100, max_bytes=1_000_000)


def entry(room: str, message_id: str, payload: str = '{"text":"hi"}') -> OutboxEntry:
    return OutboxEntry(0, room, REALM, message_id, payload, 0, NOW, 0, NOW)


# -- the store ----------------------------------------------------------------------------------


def test_path_is_beside_the_transcript(tmp_path: Path) -> None:
    assert room_outbox_path(tmp_path / "t.sqlite3") == tmp_path / "t.room_outbox.sqlite3"


def test_rows_keep_their_order_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"

    async def queue() -> None:
        async with await RoomOutboxStore.open(path) as store:
            assert await store.schema_version() == 1
            for n, room in enumerate([ROOM, ROOM2, ROOM]):
                assert await store.enqueue(ME, entry(room, f"m{n}"), ROOMY) == n + 1
            assert await store.enqueue(ME, entry(ROOM, "m0"), ROOMY) == 3  # again: kept once
            assert await store.enqueue(OTHER, entry(ROOM, "m0"), ROOMY) == 1  # its own owner

    async def reopen() -> None:
        async with await RoomOutboxStore.open(path) as store:
            mine = await store.entries(ME)
            assert [(e.room_topic, e.message_id) for e in mine] == [
                (ROOM, "m0"),
                (ROOM2, "m1"),
                (ROOM, "m2"),
            ]
            assert [e.message_id for e in await store.entries(ME, ROOM)] == ["m0", "m2"]
            assert mine[0].size == len(b'{"text":"hi"}') and mine[0].realm == REALM
            await store.retry_later(mine[0].entry_id, NOW + 5_000, "not connected")
            [first, *_] = await store.entries(ME)
            assert (first.attempts, first.due_ms) == (1, NOW + 5_000)
            assert await store.retry_now(ME, NOW) == 1
            assert (await store.entries(ME))[0].due_ms == NOW
            await store.delivered(first.entry_id)
            assert await store.drop(ME, ROOM) == 1  # m2
            assert await store.drop(ME) == 1  # m1
            assert await store.entries(ME) == [] and len(await store.entries(OTHER)) == 1

    run(queue())
    run(reopen())


def test_bounds_refuse_and_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RoomOutboxStore.open(tmp_path / "o.sqlite3") as store:
            two = OutboxBounds(max_messages=2, max_bytes=1_000)
            await store.enqueue(ME, entry(ROOM, "a"), two)
            await store.enqueue(ME, entry(ROOM, "b"), two)
            with pytest.raises(OutboxFullError, match="2 messages") as full:
                await store.enqueue(ME, entry(ROOM, "c"), two)
            assert full.value.retryable and full.value.messages == 2
            small = OutboxBounds(max_messages=10, max_bytes=40)
            with pytest.raises(OutboxFullError, match="bytes"):
                await store.enqueue(ME, entry(ROOM, "d", '{"text":"' + "x" * 20 + '"}'), small)
            assert [e.message_id for e in await store.entries(ME)] == ["a", "b"]

    run(main())


@pytest.mark.parametrize(("messages", "size"), [(0, 1), (1, 0), (-1, 5)])
def test_bounds_are_positive(messages: int, size: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        OutboxBounds(max_messages=messages, max_bytes=size)


def test_a_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"

    async def create() -> None:
        async with await RoomOutboxStore.open(path) as store:
            assert await store.schema_version() == 1

    run(create())
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 7")
    with pytest.raises(StoreError, match="newer macula"):
        run(RoomOutboxStore.open(path))
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7


# -- delivery, against a node stand-in ----------------------------------------------------------


class FakeIdentity:
    node_id = ME


class FakeNode:
    """What the outbox uses of ``Node``: ``connected``, ``publish_confirmed``, ``on_state``."""

    def __init__(self) -> None:
        self.identity = FakeIdentity()
        self.connected = True
        self.published: list[tuple[str, str]] = []
        self.failures: list[Exception] = []  # raised by the next publishes, in order
        self.listeners: list[Callable[[str], None]] = []
        self.sent = asyncio.Event()

    async def publish_confirmed(
        self, realm: bytes, topic: str, payload: dict[str, Any], *, timeout: float
    ) -> int:
        if self.failures:
            raise self.failures.pop(0)
        self.published.append((topic, payload["message_id"]))
        self.sent.set()
        return len(self.published)

    def on_state(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)

    def announce(self, state: str) -> None:
        for listener in self.listeners:
            listener(state)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def payload(message_id: str) -> dict[str, Any]:
    return {"message_id": message_id, "room_topic": ROOM, "text": message_id}


async def with_outbox(
    tmp_path: Path, work: Callable[[RoomOutbox, FakeNode, Clock, list[str]], Awaitable[None]]
) -> None:
    node, clock, recorded = FakeNode(), Clock(), []
    async with await RoomOutboxStore.open(tmp_path / "o.sqlite3") as store:
        outbox = RoomOutbox(cast(Node, node), store, clock)
        await work(outbox, node, clock, recorded)


def recorder(recorded: list[str], message_id: str) -> Callable[[], Awaitable[None]]:
    async def record() -> None:
        recorded.append(message_id)

    return record


async def say(outbox: RoomOutbox, recorded: list[str], message_id: str, room: str = ROOM) -> int:
    sent = await outbox.send(
        room, REALM, message_id, payload(message_id), recorder(recorded, message_id)
    )
    return sent.delivered


def test_unconfirmed_or_disconnected_says_queue_and_a_room_keeps_its_order(tmp_path: Path) -> None:
    async def work(outbox: RoomOutbox, node: FakeNode, clock: Clock, recorded: list[str]) -> None:
        assert await say(outbox, recorded, "m0") == 1  # connected, confirmed
        node.failures = [CallTimeout("no answer")]
        assert await say(outbox, recorded, "m1") == 0  # unconfirmed: queued, retried in 1 s
        assert await say(outbox, recorded, "m2") == 0  # behind m1: queued, not even tried
        node.connected = False
        assert await say(outbox, recorded, "x0", ROOM2) == 0  # not connected: not tried
        assert recorded == ["m0", "m1", "m2", "x0"]  # every say recorded at once
        assert node.published == [(ROOM, "m0")] and outbox.queued == 3
        node.connected = True
        assert await say(outbox, recorded, "x1", ROOM2) == 0  # behind x0
        assert await outbox._round() == NOW + RETRY_INITIAL_MS  # x0, x1 went; m1 not due
        clock.now += RETRY_INITIAL_MS
        assert await outbox._round() is None  # m1, m2: the room's order holds
        assert await say(outbox, recorded, "m3") == 1  # nothing queued: at once again
        assert node.published == [
            (ROOM, "m0"),
            (ROOM2, "x0"),
            (ROOM2, "x1"),
            (ROOM, "m1"),
            (ROOM, "m2"),
            (ROOM, "m3"),
        ]
        assert outbox.queued == 0 and outbox.stats["delivered"] == 4  # from the outbox

    run(with_outbox(tmp_path, work))


def test_a_full_outbox_refuses_before_recording(tmp_path: Path) -> None:
    async def work(outbox: RoomOutbox, node: FakeNode, clock: Clock, recorded: list[str]) -> None:
        outbox.bounds = OutboxBounds(max_messages=1, max_bytes=10_000)
        node.connected = False
        assert await say(outbox, recorded, "m0") == 0
        with pytest.raises(OutboxFullError):
            await say(outbox, recorded, "m1")
        node.connected = True
        with pytest.raises(OutboxFullError):  # full refuses even a say that could go now
            await say(outbox, recorded, "x0", ROOM2)
        assert recorded == ["m0"] and outbox.stats["refused_full"] == 2

    run(with_outbox(tmp_path, work))


def test_retries_back_off_and_a_reconnect_makes_them_due(tmp_path: Path) -> None:
    async def work(outbox: RoomOutbox, node: FakeNode, clock: Clock, recorded: list[str]) -> None:
        node.connected = False
        await say(outbox, recorded, "m0")
        node.connected = True
        node.failures = [BrokenError("lost")] * 7
        delays = []
        for _ in range(7):
            assert await outbox.flush_room(ROOM) == set()
            [head] = await outbox.store.entries(ME)
            delays.append(head.due_ms - clock.now)
        assert delays == [
            min(RETRY_MAX_MS, RETRY_INITIAL_MS * 2**n) for n in range(7)
        ]  # 1 s doubling, capped at 30 s
        assert await outbox._round() == clock.now + RETRY_MAX_MS  # not due: nothing sent
        assert node.published == []
        outbox.connection_changed("reconnected")  # the connection is back: all due now
        assert await outbox._round() is None  # sent; nothing left to wait for
        assert node.published == [(ROOM, "m0")]

    run(with_outbox(tmp_path, work))


def test_the_pump_sleeps_while_disconnected_and_wakes_on_connect(tmp_path: Path) -> None:
    async def work(outbox: RoomOutbox, node: FakeNode, clock: Clock, recorded: list[str]) -> None:
        node.connected = False
        await say(outbox, recorded, "m0")
        async with asyncio.TaskGroup() as group:
            await outbox.start(group)
            await outbox.store.entries(ME)  # a trip to the store's thread: the pump ran
            assert node.published == [] and node.failures == []  # nothing tried
            assert not outbox.kick.is_set()  # asleep until a kick, with no timer
            node.connected = True
            node.announce("reconnected")
            await asyncio.wait_for(node.sent.wait(), 5)
            for _ in range(1000):  # until its row is gone (each look is a trip to the store)
                if not await outbox.store.entries(ME):
                    break
            await outbox.stop()
        assert node.published == [(ROOM, "m0")] and outbox.queued == 0

    run(with_outbox(tmp_path, work))


def test_settle_sends_first_when_connected_else_drops_and_counts(tmp_path: Path) -> None:
    async def work(outbox: RoomOutbox, node: FakeNode, clock: Clock, recorded: list[str]) -> None:
        node.connected = False
        await say(outbox, recorded, "m0")
        await say(outbox, recorded, "x0", ROOM2)
        assert await outbox.settle(ROOM2, drop=0) == 0  # shutting down: kept for next run
        assert outbox.queued == 2
        assert await outbox.settle(ROOM2) == 1  # cannot go: dropped, counted
        assert outbox.stats["dropped"] == 1 and outbox.queued == 1
        node.connected = True
        assert await outbox.settle(ROOM) == 0  # sent before leaving
        assert node.published == [(ROOM, "m0")] and outbox.queued == 0

    run(with_outbox(tmp_path, work))
