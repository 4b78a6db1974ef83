"""Helpers for monitor tests: a monitor on a station in this process, a raw HTTP/1.1 client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from relay.monitor.figures import Lifecycle
from relay.monitor.port import Monitor
from relay.station.station import Station


@asynccontextmanager
async def monitor_on(station: Station, **kwargs: Any) -> AsyncIterator[Monitor]:
    lifecycle = Lifecycle()
    lifecycle.ready = 1
    monitor = Monitor(station, lifecycle, **kwargs)
    await monitor.start("127.0.0.1", 0)
    try:
        yield monitor
    finally:
        await monitor.close()


async def exchange(address: tuple[str, int], raw: bytes, timeout: float = 5.0) -> bytes:
    """Send ``raw``, read until the server closes; the whole response."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


async def get(
    address: tuple[str, int], path: str, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    raw = f"{method} {path} HTTP/1.1\r\nHost: monitor\r\n\r\n".encode()
    return split(await exchange(address, raw))


async def get_json(address: tuple[str, int], path: str) -> Any:
    status, headers, body = await get(address, path)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)
