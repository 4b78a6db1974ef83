"""``dial`` takes an IP literal as it is and resolves only names (no resolver thread per
connect to a station given by address)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from macula.quic.transport import _resolved


def test_an_ipv4_literal_is_not_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: object, **kwargs: object) -> object:
        raise AssertionError("getaddrinfo called for a literal")

    async def run() -> tuple[int, tuple[object, ...]]:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(loop, "getaddrinfo", never)
        return await _resolved(loop, "127.0.0.1", 4433)

    assert asyncio.run(run()) == (socket.AF_INET, ("127.0.0.1", 4433))


def test_an_ipv6_literal_is_taken_as_it_is() -> None:
    async def run() -> tuple[int, tuple[object, ...]]:
        return await _resolved(asyncio.get_running_loop(), "::1", 7)

    assert asyncio.run(run()) == (socket.AF_INET6, ("::1", 7, 0, 0))


def test_a_name_goes_through_the_resolver() -> None:
    async def run() -> tuple[int, tuple[object, ...]]:
        return await _resolved(asyncio.get_running_loop(), "localhost", 9)

    family, address = asyncio.run(run())
    assert family in (socket.AF_INET, socket.AF_INET6) and address[1] == 9
