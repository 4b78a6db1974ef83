"""The station's house services, wired together: shared memory, station directory, agent
directory. Each is an ordinary realm-scoped procedure set (realm ``macula.house``) that the
station serves itself and announces with signed procedure_advertisement records, so clients
find them the way they find anything: resolve the realm in the DHT, then call.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macula.house import (
    AGENT_DIRECTORY_PROCEDURES,
    HOUSE_REALM,
    MEMORY_PROCEDURES,
    STATION_DIRECTORY_PROCEDURES,
)
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.house.agents import AgentDirectory, AgentDirectoryStore
from relay.house.memory import MemoryService, MemoryStore
from relay.house.stations import StationDirectory, StationInfo
from relay.outcome import Outcome

Handler = Callable[[str, object, bytes, int], Awaitable[Outcome]]


@dataclass(frozen=True)
class HouseConfig:
    memory: bool = True
    station_directory: bool = True
    agent_directory: bool = True
    city: str | None = None
    country: str | None = None
    continent: str | None = None
    lat: float | None = None
    lng: float | None = None


class HouseServices:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self.station_directory: StationDirectory | None = None

    @classmethod
    async def open(
        cls, config: HouseConfig, data_dir: Path, station_id: bytes, host: str, port: int
    ) -> HouseServices:
        house = cls()
        if config.memory:
            memory_store = await MemoryStore.open(data_dir / "memory.sqlite3")
            house._closers.append(memory_store.close)
            house._serve(MEMORY_PROCEDURES, MemoryService(memory_store).handle)
        if config.station_directory:
            info = StationInfo(
                host=host,
                port=port,
                city=config.city,
                country=config.country,
                continent=config.continent,
                lat=config.lat,
                lng=config.lng,
            )
            house.station_directory = StationDirectory(station_id, info)
            house._serve(STATION_DIRECTORY_PROCEDURES, house.station_directory.handle)
        if config.agent_directory:
            agent_store = await AgentDirectoryStore.open(data_dir / "agents.sqlite3")
            house._closers.append(agent_store.close)
            house._serve(AGENT_DIRECTORY_PROCEDURES, AgentDirectory(agent_store).handle)
        return house

    def _serve(self, procedures: frozenset[str], handler: Handler) -> None:
        for procedure in procedures:
            self._handlers[procedure] = handler

    @staticmethod
    def keys_for(config: HouseConfig) -> frozenset[tuple[bytes, str]]:
        """The ``(realm, procedure)`` pairs the router hands to the house."""
        procedures: set[str] = set()
        if config.memory:
            procedures |= MEMORY_PROCEDURES
        if config.station_directory:
            procedures |= STATION_DIRECTORY_PROCEDURES
        if config.agent_directory:
            procedures |= AGENT_DIRECTORY_PROCEDURES
        return frozenset((HOUSE_REALM, procedure) for procedure in procedures)

    async def handle(self, procedure: str, payload: Any, caller: bytes, now_ms: int) -> Outcome:
        handler = self._handlers.get(procedure)
        if handler is None:
            return Outcome.error(ErrorCode.UNKNOWN_NEXT_PEER)
        return await handler(procedure, payload, caller, now_ms)

    def records(self, identity: Identity, now_ms: int) -> list[Record]:
        """Signed records announcing the services (and the station itself, for directories)."""
        records = [
            new_record(
                identity,
                RecordType.PROCEDURE_ADVERTISEMENT,
                {
                    "procedure_uri": procedure,
                    "advertiser_node": identity.node_id,
                    "serving_station": identity.node_id,
                    "realm": HOUSE_REALM,
                },
                now_ms=now_ms,
                version=record_version(now_ms, os.urandom(10)),
            )
            for procedure in sorted(self._handlers)
        ]
        if self.station_directory is not None:
            records.append(
                new_record(
                    identity,
                    RecordType.NODE_RECORD,
                    self.station_directory.own_record_payload(),
                    now_ms=now_ms,
                    version=record_version(now_ms, os.urandom(10)),
                )
            )
        return records

    async def close(self) -> None:
        for close in self._closers:
            await close()
