"""What the house-service unit tests share: running a coroutine, reading an ``Outcome``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from macula.wire.codes import ErrorCode
from relay.outcome import Outcome

T = TypeVar("T")
BAD = ErrorCode.UNKNOWN_ERROR


def run(coro: Awaitable[T]) -> T:
    async def wrapper() -> T:
        return await coro

    return asyncio.run(wrapper())


def ok(outcome: Outcome) -> Any:
    assert not outcome.is_error, outcome.detail
    return outcome.payload


def refused(outcome: Outcome, reason: str) -> str:
    """The refusal's text after ``<reason>: ``; the code must be 0x0F."""
    assert outcome.code == BAD, outcome
    assert outcome.detail is not None
    detail = outcome.detail.decode()
    assert detail.startswith(f"{reason}: "), detail
    return detail


def walk(value: object) -> Iterator[object]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


def assert_no_booleans(value: object) -> None:
    assert not [item for item in walk(value) if type(item) is bool]
