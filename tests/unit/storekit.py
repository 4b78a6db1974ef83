"""Helpers for the store tests: what runs on a store's aiosqlite thread."""

from __future__ import annotations

from typing import Any

from macula.store.base import SqliteStore


def trips(store: SqliteStore) -> list[object]:
    """Every call run on ``store``'s aiosqlite thread from now on (each a wake-up of that thread
    and of the event loop), in order."""
    seen: list[object] = []
    db = store._db
    run_there = db._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(fn)
        return await run_there(fn, *args, **kwargs)

    db._execute = counted  # type: ignore[method-assign]
    return seen
