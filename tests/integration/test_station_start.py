"""A station's start (issue 38): every part is open before a datagram is read.

The QUIC socket is bound early (its port goes into the DHT's and the house's records), but
read only once every part a frame may reach (core, DHT, built-ins, house, links, upkeep) is
open: a client that dials while the start is still opening the house waits, unanswered, and is
served once the start is done.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import termios
from pathlib import Path
from typing import Any

import pytest

from relay.station import build as station_build
from relay.station.station import Station
from support.meshkit import station_config
from support.rawclient import raw_client
from support.waiting import eventually

pytestmark = pytest.mark.anyio


def waiting_bytes(sock: socket.socket) -> int:
    """The size of the datagram waiting unread in ``sock`` (0: none)."""
    size = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, size)
    return size[0]


async def test_a_client_dialling_during_the_start_is_read_once_every_part_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound: list[socket.socket] = []
    house_asked, house_may_open = asyncio.Event(), asyncio.Event()
    bind_quic, open_house = station_build.bind_quic, station_build.open_house

    async def binding(*args: Any) -> socket.socket:
        bound.append(await bind_quic(*args))
        return bound[0]

    async def opening_house(*args: Any) -> Any:
        house_asked.set()
        await house_may_open.wait()
        return await open_house(*args)

    monkeypatch.setattr(station_build, "bind_quic", binding)
    monkeypatch.setattr(station_build, "open_house", opening_house)
    station = Station(station_config(tmp_path / "station"))
    starting = asyncio.create_task(station.__aenter__())
    try:
        await house_asked.wait()  # bound (its port known), the house not open yet
        assert station.port != 0 and station.links is None

        async def connected() -> int:
            async with raw_client(station):  # CONNECT/HELLO answered
                return station.connection_count()

        dialling = asyncio.create_task(connected())
        await eventually(lambda: waiting_bytes(bound[0]) > 0)  # the client's Initial
        assert station.connection_count() == 0  # nothing read: no part met it half-made
        house_may_open.set()
        await starting
        assert station.house is not None and station.links is not None
        assert await asyncio.wait_for(dialling, 10) == 1
    finally:
        house_may_open.set()
        if not starting.done():
            await asyncio.wait([starting])
        await station.stop()
