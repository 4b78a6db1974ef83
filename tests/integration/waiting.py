"""Waiting in tests without fixed sleeps.

What a node sent is settled at the station by ``await node.flush()``. State nothing
acknowledges (presence heard, a background task's effect, a stream forgotten) is polled with
``eventually``: the predicate is re-checked every ``interval`` until it holds or ``timeout``
passes; the interval sleep is polling a condition, not a wait for the mesh to settle.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable


async def eventually(
    check: Callable[[], object],
    timeout: float = 5.0,
    *,
    interval: float = 0.02,
    message: str = "condition not met in time",
) -> None:
    """Until ``check()`` (sync, or returning an awaitable) is truthy; AssertionError after
    ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(message)
        await asyncio.sleep(interval)  # polling interval: re-check the condition
