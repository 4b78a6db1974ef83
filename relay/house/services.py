"""The station's house services, wired together: shared memory, station directory, agent
directory, room history (fed by ``note_publish``, the station's publish hook), path
reservations. Each is an
ordinary realm-scoped procedure set (realm ``macula.house``) that the station serves itself
and announces with signed procedure_advertisement records, so clients find them the way they
find anything: resolve the realm in the DHT, then call.

Across stations (``relay.house.mesh``): a client's ``macula.agents.list_v1`` merges this
station's entries with every linked station's (``ask_linked``); a station peer's gets this
station's only (``from_station``, told by the shell from the connection). The station
directory learns a dialled link's address when it comes up (``station_linked``), what each
linked station says of itself when a client lists stations (asked with ``ask_linked``, one
hop, like the agents), and the mesh's live stations from discovery (``stations_discovered``).
Nothing is asked of a link merely because it came up. Shared memory, room history and path
reservations stay per station.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macula.services.house import (
    AGENT_DIRECTORY_PROCEDURES,
    AGENTS_LIST,
    HISTORY_PROCEDURES,
    HOUSE_REALM,
    LIST_STATIONS,
    MEMORY_PROCEDURES,
    RESERVATION_PROCEDURES,
    STATION_DIRECTORY_PROCEDURES,
)
from macula.task_scope import Spawner
from macula.wire.codes import ErrorCode
from macula.wire.frames import Publish
from macula.wire.identity import DEFAULT_PUZZLE_DIFFICULTY, Identity
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.builtins.outcome import Outcome
from relay.federation.links import StationLike
from relay.house.agents import MAX_AGENTS, AgentDirectory, AgentDirectoryStore
from relay.house.history import HistoryBounds, HistoryService, HistoryStore
from relay.house.memory import (
    DEFAULT_DEPOSIT_RATE,
    DEFAULT_MAX_CHUNKS_PER_DEPOSITOR,
    DEFAULT_MAX_TOTAL_BYTES,
    DEFAULT_QUERY_RATE,
    MemoryService,
    MemoryStore,
)
from relay.house.mesh import (
    DEFAULT_CONCURRENCY,
    DEFAULT_FANOUT,
    DEFAULT_TIMEOUT_MS,
    AskLinked,
    MeshAgentList,
    station_entry,
)
from relay.house.reservations import DEFAULT_MAX_TOTAL, ReservationService, ReservationStore
from relay.house.stations import StationDirectory, StationEntry, StationInfo

Handler = Callable[[str, object, bytes, int], Awaitable[Outcome]]

log = logging.getLogger("macula.relay.house")

BURST_FACTOR = 4.0  # a house rate's burst, in seconds of its rate


@dataclass(frozen=True)
class HouseConfig:
    """Which house services run, and their limits (each a ``macula-relay`` flag)."""

    memory: bool = True
    station_directory: bool = True
    agent_directory: bool = True
    city: str | None = None
    country: str | None = None
    continent: str | None = None
    lat: float | None = None
    lng: float | None = None
    # shared memory: total stored bytes (text + label + topics, per chunk) for all depositors,
    # chunks per depositor, and per-identity rates a second (the burst is four times the rate)
    memory_max_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    memory_max_chunks_per_node: int = DEFAULT_MAX_CHUNKS_PER_DEPOSITOR
    memory_deposit_rate: float = DEFAULT_DEPOSIT_RATE
    memory_query_rate: float = DEFAULT_QUERY_RATE
    # agent directory: live entries, and the identity puzzle a registrant must meet (0: none)
    directory_max_agents: int = MAX_AGENTS
    directory_puzzle_difficulty: int = DEFAULT_PUZZLE_DIFFICULTY
    # across stations: linked stations asked per client listing of agents or stations (0: this
    # station's own only), how many at once, and the time for all of them together
    mesh_fanout: int = DEFAULT_FANOUT
    mesh_concurrency: int = DEFAULT_CONCURRENCY
    mesh_timeout_ms: int = DEFAULT_TIMEOUT_MS
    # room history: signed room and central EVENTs kept for catch-up (relay.house.history)
    history: bool = True
    history_bounds: HistoryBounds = field(default_factory=HistoryBounds)
    # path reservations (relay.house.reservations; per station, docs/reservations.md)
    reservations: bool = True
    reservations_max_total: int = DEFAULT_MAX_TOTAL

    def __post_init__(self) -> None:
        if type(self.mesh_fanout) is not int or self.mesh_fanout < 0:
            raise ValueError(f"HouseConfig.mesh_fanout must be >= 0, got {self.mesh_fanout!r}")
        positive = {
            "mesh_concurrency": self.mesh_concurrency,
            "mesh_timeout_ms": self.mesh_timeout_ms,
            "memory_max_bytes": self.memory_max_bytes,
            "memory_max_chunks_per_node": self.memory_max_chunks_per_node,
            "memory_deposit_rate": self.memory_deposit_rate,
            "memory_query_rate": self.memory_query_rate,
            "directory_max_agents": self.directory_max_agents,
            "reservations_max_total": self.reservations_max_total,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"HouseConfig.{name} must be positive, got {value!r}")
        if not 0 <= self.directory_puzzle_difficulty <= 64:
            raise ValueError("HouseConfig.directory_puzzle_difficulty must be 0..64")


class HouseServices:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self.station_directory: StationDirectory | None = None
        self.mesh_agents: MeshAgentList | None = None
        self.agent_store: AgentDirectoryStore | None = None  # read by the status page
        self._ask_linked: AskLinked | None = None
        self.history: HistoryService | None = None
        self._spawn: Spawner | None = None  # the station's task group (the history writer)

    @classmethod
    async def open(
        cls,
        config: HouseConfig,
        data_dir: Path,
        station_id: bytes,
        host: str,
        port: int,
        *,
        ask_linked: AskLinked | None = None,
        spawn: Spawner | None = None,
    ) -> HouseServices:
        """The services ``config`` turns on; ``ask_linked`` (the linked stations) makes the
        directories mesh-wide (unless ``config.mesh_fanout`` is 0)."""
        house = cls()
        house._spawn = spawn
        if config.mesh_fanout > 0:
            house._ask_linked = ask_linked
        try:
            await house._open(config, data_dir, station_id, host, port)
            if house._ask_linked is not None and config.agent_directory:
                local = house._handlers[AGENTS_LIST]
                house.mesh_agents = MeshAgentList(station_id, local, house._ask_linked)
        except BaseException:
            await house.close()  # a store that failed to open must not leak the ones before it
            raise
        return house

    async def _open(
        self, config: HouseConfig, data_dir: Path, station_id: bytes, host: str, port: int
    ) -> None:
        house = self
        if config.memory:
            memory_store = await MemoryStore.open(data_dir / "memory.sqlite3")
            house._closers.append(memory_store.close)
            memory = MemoryService(
                memory_store,
                max_chunks_per_depositor=config.memory_max_chunks_per_node,
                max_total_bytes=config.memory_max_bytes,
                rate=config.memory_deposit_rate,
                burst=config.memory_deposit_rate * BURST_FACTOR,
                query_rate=config.memory_query_rate,
                query_burst=config.memory_query_rate * BURST_FACTOR,
            )
            house._serve(MEMORY_PROCEDURES, memory.handle)
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
            house.agent_store = agent_store
            agents = AgentDirectory(
                agent_store,
                max_agents=config.directory_max_agents,
                puzzle_difficulty=config.directory_puzzle_difficulty,
                station_id=station_id,
            )
            house._serve(AGENT_DIRECTORY_PROCEDURES, agents.handle)
        if config.history:
            await house._open_history(config, data_dir)
        if config.reservations:
            store = await ReservationStore.open(data_dir / "reservations.sqlite3")
            house._closers.append(store.close)
            service = ReservationService(store, max_total=config.reservations_max_total)
            house._serve(RESERVATION_PROCEDURES, service.handle)

    async def _open_history(self, config: HouseConfig, data_dir: Path) -> None:
        store = await HistoryStore.open(data_dir / "history.sqlite3")
        self._closers.append(store.close)
        self.history = HistoryService(store, config.history_bounds, spawn=self._spawn)
        self._closers.append(self.history.close)
        self._serve(HISTORY_PROCEDURES, self.history.handle)

    def note_publish(self, frame: Publish, now_ms: int, sig_checked: bool = False) -> None:
        """The station's publish hook: a PUBLISH it accepted, for the room history
        (``sig_checked``: relay.core.interest verified its publisher_sig; else history does)."""
        if self.history is not None:
            self.history.note(frame, now_ms, sig_checked=sig_checked)

    async def settled(self) -> None:
        """Every PUBLISH noted so far is stored in the room history. A ``_relay.ping`` answers
        only after this, so a publisher told its message took effect (``Node.flush``,
        ``publish_confirmed``) is told it is kept too: a station SIGKILLed right after still
        has it for the catch-up of whoever was away. A failed write is logged and counted
        (``write_failed``), not raised: the ping still answers."""
        if self.history is None:
            return
        try:
            await self.history.write_pending()
        except Exception:
            log.exception("history: could not store what was noted before a ping")

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
        if config.history:
            procedures |= HISTORY_PROCEDURES
        if config.reservations:
            procedures |= RESERVATION_PROCEDURES
        return frozenset((HOUSE_REALM, procedure) for procedure in procedures)

    async def handle(
        self, procedure: str, payload: Any, caller: bytes, now_ms: int, *, from_station: int = 0
    ) -> Outcome:
        """Answer one call; ``from_station`` 1 when it came over a station link (then an agent
        listing is this station's own: it never fans out again)."""
        handler = self._handlers.get(procedure)
        if handler is None:
            return Outcome.error(ErrorCode.UNKNOWN_NEXT_PEER)
        if procedure == AGENTS_LIST and self.mesh_agents is not None and not from_station:
            return await self.mesh_agents.list(payload, caller, now_ms)
        if procedure == LIST_STATIONS and not from_station:
            await self._describe_linked()
        return await handler(procedure, payload, caller, now_ms)

    # -- learning the mesh's stations --------------------------------------------------------

    def station_linked(self, node_id: bytes, dialled: tuple[str, int] | None) -> int:
        """A link to ``node_id`` came up: list it at the address we dialled (an accepted link's
        listening port is unknown: a listing or discovery tells it). 1 if listed now."""
        directory = self.station_directory
        if directory is None or dialled is None or directory.knows(node_id):
            return 0
        try:
            entry = StationEntry(node_id, StationInfo(*dialled))
        except ValueError:
            return 0
        return int(directory.linked(entry))

    async def _describe_linked(self) -> None:
        """Ask the linked stations who they are (their own first directory entry, over the
        authenticated link); a station that cannot say keeps what is known of it."""
        directory = self.station_directory
        if directory is None or self._ask_linked is None:
            return
        try:
            replies = await self._ask_linked(LIST_STATIONS, {})
        except Exception:  # best effort: what is known is still listed
            log.exception("asking the linked stations who they are failed")
            return
        for reply in replies:
            stations = reply.payload.get("stations") if isinstance(reply.payload, dict) else None
            entry = None
            if reply.ok and isinstance(stations, list) and stations:
                entry = station_entry(stations[0], reply.station)
            if entry is None:
                directory.stats["linked_station_undescribed"] += 1
            else:
                directory.linked(entry)

    def station_unlinked(self, node_id: bytes) -> None:
        if self.station_directory is not None:
            self.station_directory.unlinked(node_id)

    def stations_discovered(self, found: Iterable[StationLike]) -> None:
        """One discovery round (the DHT's live stations) for the station directory."""
        directory = self.station_directory
        if directory is None:
            return
        entries = []
        for address in found:
            try:
                entries.append(
                    StationEntry(address.node_id, StationInfo(address.host, address.quic_port))
                )
            except (TypeError, ValueError):
                directory.stats["discovered_station_invalid"] += 1
        directory.discovered(entries)

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
        closers, self._closers = self._closers, []
        for close in reversed(closers):
            await close()
