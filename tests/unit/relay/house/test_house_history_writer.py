"""The room history's writer task (relay.house.history): it runs through the injected spawner
(the station's task group), and a writer cancelled mid-write (the station stopping) loses
nothing: ``close`` stores the batch it held. Real SQLite files under ``tmp_path``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from relay.house.history import HistoryBounds, HistoryService, HistoryStore
from support.housekit import ALICE, fetch, ok, publish
from support.running import run


class Owner:
    def __init__(self) -> None:
        self.ran: list[asyncio.Task[None]] = []

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.ran.append(task)
        return task


def test_the_writer_runs_through_the_injected_spawner(tmp_path: Path) -> None:
    async def go() -> None:
        owner = Owner()
        store = await HistoryStore.open(tmp_path / "history.sqlite3")
        history = HistoryService(store, HistoryBounds(), spawn=owner.spawn)
        history.note(publish(ALICE, 1), 0)
        assert len(owner.ran) == 1  # the writer is the owner's task
        await asyncio.wait(owner.ran)
        assert history.stats["stored"] == 1
        await history.close()
        await store.close()

    run(go())


def test_a_writer_cancelled_mid_write_loses_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        owner = Owner()
        store = await HistoryStore.open(tmp_path / "history.sqlite3")
        history = HistoryService(store, HistoryBounds(), spawn=owner.spawn)
        keep = store.keep
        writing = asyncio.Event()

        async def held_keep(*args: Any) -> int:
            writing.set()
            await asyncio.Event().wait()  # until cancelled
            return await keep(*args)

        store.keep = held_keep  # type: ignore[method-assign]
        history.note(publish(ALICE, 1), 0)
        history.note(publish(ALICE, 2), 0)
        await writing.wait()
        [writer] = owner.ran
        writer.cancel()  # the station's group cancelled it: the station is stopping
        store.keep = keep  # type: ignore[method-assign]
        await history.close()  # stores what the cancelled writer held
        page = ok(await fetch(history))
        assert [e["seq"] for e in page["events"]] == [1, 2]
        await store.close()

    run(go())


def test_what_was_noted_before_a_ping_is_stored_when_the_ping_answers(tmp_path: Path) -> None:
    """A publisher's confirmation (``_relay.ping``) waits for ``HouseServices.settled``: its room
    message is on disk then, so a station SIGKILLed right after still has it for catch-up."""
    from relay.house.services import HouseServices

    async def go() -> None:
        def never(coroutine: Coroutine[Any, Any, None]) -> None:  # the writer does not get to run
            coroutine.close()

        house = HouseServices()
        store = await HistoryStore.open(tmp_path / "history.sqlite3")
        house.history = HistoryService(store, HistoryBounds(), spawn=never)
        house.note_publish(publish(ALICE, 1), 0)
        house.note_publish(publish(ALICE, 2), 0)
        assert await store.count() == 0  # noted, not yet stored
        await house.settled()
        assert await store.count() == 2
        await house.settled()  # nothing pending: nothing to do
        await house.history.close()
        await store.close()

    run(go())
