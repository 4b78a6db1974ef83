"""Helpers for the store tests: what runs on a store's aiosqlite thread, and holding that
thread still so a caller can be cancelled while its call waits there."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from macula.store.base import SqliteStore, _on_thread

from .waiting import eventually


def trips(store: SqliteStore) -> list[object]:
    """Every call run on ``store``'s aiosqlite thread from now on (each a wake-up of that thread
    and of the event loop), in order; a call is listed the moment it is queued there."""
    seen: list[object] = []
    db = store._db
    run_there = db._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(fn)
        return await run_there(fn, *args, **kwargs)

    db._execute = counted  # type: ignore[method-assign]
    return seen


async def hold(store: SqliteStore) -> tuple[threading.Event, asyncio.Task[None]]:
    """``store``'s thread blocked, running a call queued before anything else, until the
    returned event is set (returned once the call runs there)."""
    running, release = threading.Event(), threading.Event()

    def blocked() -> None:
        running.set()
        release.wait(10)

    holding = asyncio.ensure_future(_on_thread(store._db, blocked))
    await eventually(running.is_set, interval=0)
    return release, holding
