"""Waiting in tests without fixed sleeps.

What a node sent is settled at the station by ``await node.flush()``. State nothing
acknowledges (presence heard, a background task's effect, a stream forgotten) is polled with
``eventually``: the predicate is re-checked every ``interval`` until it holds or ``timeout``
passes; the interval sleep is polling a condition, not a wait for the mesh to settle.
``entered`` starts a call and returns once it is inside a given method (a waiter that must
be waiting before the event it waits for happens).
"""

from __future__ import annotations

import asyncio
import inspect
from asyncio import Task
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], object],
    timeout: float = 5.0,
    *,
    interval: float = 0.02,
    message: str = "condition not met in time",
) -> Any:
    """Until ``check()`` (sync, or returning an awaitable) is truthy, and that value;
    AssertionError after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(message)
        await asyncio.sleep(interval)  # polling interval: re-check the condition


async def entered(owner: type, method: str, work: Awaitable[T], timeout: float = 5.0) -> Task[T]:
    """Start ``work`` as a task; return it once it has called ``owner.method``.

    The method runs on from there without yielding to this caller until its first real
    suspension, so state it records on entry (a ``since`` time, a counter) is already set."""
    original = getattr(owner, method)
    called = asyncio.Event()

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        called.set()
        return await original(*args, **kwargs)

    setattr(owner, method, wrapper)
    try:
        task = asyncio.ensure_future(work)
        await asyncio.wait_for(called.wait(), timeout)
    finally:
        setattr(owner, method, original)
    return task
