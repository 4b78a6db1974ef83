"""``run(coro)``: a coroutine run to its end from a synchronous test, on a fresh event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    """``coro``'s result (``asyncio.run`` takes coroutines only; this takes any awaitable)."""

    async def wrapper() -> T:
        return await coro

    return asyncio.run(wrapper())
