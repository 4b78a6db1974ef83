"""A realm's join service running on a station, as ``macula-realm serve`` runs it, for the tests
that join a realm or approve a join."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from macula.node.node import Node
from macula.realm.authority import Realm
from macula.realm.service import JoinService
from relay.station.station import Station


@contextlib.asynccontextmanager
async def join_service(station: Station, home: Path, name: str) -> AsyncIterator[JoinService]:
    """The realm ``name`` created in ``home``; its join service on ``station`` until leaving."""
    realm = Realm(home, name)
    realm.create(difficulty=0)
    async with Node(realm.authority, [station.endpoint]) as node:
        service = JoinService(realm, node, publish_every_s=0.05)
        await service.start()
        stop = asyncio.Event()
        running = asyncio.create_task(service.run(stop))
        try:
            yield service
        finally:
            stop.set()
            await running
