"""The station's QUIC shell: moves bytes between aioquic and ``RouterCore``.

``async with Station(config) as station:`` binds the UDP port (0 = any free port), creates the
station's key and certificate on first start, opens the stores, and serves until the block
ends; leaving it sends GOODBYE to every client, closes the connections and the stores.
Invariants: every resource is registered on one ``AsyncExitStack`` the moment it opens
(``relay.station.build`` makes the parts), so a start that fails partway closes what it opened
before the error propagates, and a stop undoes the start in reverse; the QUIC socket is read
only once every part a frame may reach is open, so each part is made with the parts it uses
(no part is handed the station itself); every relay-side
background task (the upkeep of ``relay.station.upkeep``, built-ins, a DHT join, and through
the ``spawn`` each is given: the link manager, the station DHT, the history writer, the
monitor's clients) runs in the station's one ``asyncio.TaskGroup`` (``relay.station.group``)
and every delayed close or resume is a timer the station owns: before ``stop`` returns the
timers are cancelled and the group's tasks cancelled and awaited; once stopping, nothing new
is spawned or scheduled. A stop drains first (``relay.station.drain``): GOODBYE to every
connected peer, then a wait (bounded by ``DRAIN_DEADLINE_S``) until each acknowledged a QUIC
PING sent behind its GOODBYE or its connection ended, then every connection is closed.
The parts a start opened are read through properties that say "station not started" instead
of handing out None; a built-in call is answered by ``relay.builtins.calls``.
Links to peer stations are QUIC *client* connections kept by
``relay.federation.links.LinkManager`` through ``relay.station.links.StationLinks`` (given the
station's ``ConnectionTable``); their frames reach the core through the same sink type, under
the same connection numbering, as accepted connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from macula.clock import now_ms
from macula.quic.backend import QuicConnection, QuicServer, lean_handshake
from macula.quic.resets import StatelessResets
from macula.quic.transport import FrameProtocol, StreamLimits
from macula.stations import is_loopback_host
from macula.wire.errors import FramingError
from macula.wire.frames import Publish
from macula.wire.identity import Identity
from relay.builtins.calls import run_builtin
from relay.builtins.procedures import Builtins
from relay.core.actions import (
    Action,
    Close,
    EndStream,
    LinkDown,
    LinkUp,
    PauseReading,
    ResumeReading,
    RunBuiltin,
    Send,
    StationReplied,
)
from relay.core.logbook import clip
from relay.core.router import RouterCore
from relay.federation.dht.station import StationDht
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkManager, LinkTarget
from relay.federation.mesh_roster import MESH_PROCEDURE
from relay.house.services import HouseServices
from relay.station import build
from relay.station.config import StationConfig
from relay.station.drain import drain
from relay.station.group import StationGroup
from relay.station.links import ConnectionTable, StationLinks
from relay.station.realm_files import Allowlist
from relay.station.upkeep import OwnRecords, Ticker
from relay.station.waits import StationCalls, Timers
from relay.stores.records import ContentStore, RecordStore

__all__ = ["DRAIN_DEADLINE_S", "Station", "StationConfig"]

log = logging.getLogger("macula.relay")

DRAIN_DEADLINE_S = 0.5  # a stop waits at most this long for the GOODBYEs to be acknowledged

T = TypeVar("T")


class _Sink:
    """Reports of one connection, forwarded to the core under its number."""

    def __init__(
        self,
        conn: int,
        connection: FrameProtocol,
        core: RouterCore,
        run: Callable[[list[Action]], None],
        lost: Callable[[int, str], None],
    ) -> None:
        self.conn = conn
        self.connection = connection
        self.core = core
        self.run = run
        self.lost = lost

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        core, connection = self.core, self.connection
        self.run(core.frames_received(self.conn, stream_id, frames, now_ms()))
        if connection.pre_open_bytes is not None and core.is_connected(self.conn):
            connection.open_gate()  # CONNECT accepted: any stream, no byte budget
            connection.release_handshake_buffers()  # 48 KiB an idle connection kept

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.run(self.core.framing_failed(self.conn, stream_id, error, now_ms()))

    def stream_ended(self, stream_id: int) -> None:
        self.run(self.core.stream_ended(self.conn, stream_id, now_ms()))

    def stream_reset(self, stream_id: int) -> None:
        self.run(self.core.stream_reset(self.conn, stream_id, now_ms()))

    def connection_lost(self, reason: str) -> None:
        self.lost(self.conn, reason)


class Station:
    """The QUIC shell: what a start opens, the connections it numbers, the action executor."""

    def __init__(self, config: StationConfig) -> None:
        self.config = config
        # the parts a start opens (``relay.station.build``), read through the properties below
        self.identity: Identity | None = None
        self.port = 0
        self._core: RouterCore | None = None
        self._records: RecordStore | None = None
        self._content: ContentStore | None = None
        self._builtins: Builtins | None = None
        self._house: HouseServices | None = None
        self._dht: StationDht | None = None
        self.known_peers: KnownPeers | None = None
        self.allowlist: Allowlist | None = None
        self.resets: StatelessResets | None = None  # answers a previous run's connections
        self._server: QuicServer | None = None
        self._links: StationLinks | None = None
        self._ticker: Ticker | None = None
        # called as (node_id, host, dht_port) when a link comes up (e.g. a DHT bootstrap)
        self.link_up_hook: Callable[[bytes, str, int], None] | None = None
        # the connections it numbered (clients and links)
        self._connections: dict[int, FrameProtocol] = {}
        self._next_conn = 0
        self._closing = False  # stopping: a Close is carried out at once, nothing new spawns
        self._group = StationGroup()
        self._timers = Timers()
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._station_calls = StationCalls()

    # -- what a start opened -----------------------------------------------------------------

    @property
    def core(self) -> RouterCore:
        assert self._core is not None, "station not started"
        return self._core

    @property
    def dht(self) -> StationDht:
        assert self._dht is not None, "station not started"
        return self._dht

    @property
    def dht_or_none(self) -> StationDht | None:
        return self._dht

    @property
    def records(self) -> RecordStore | None:
        return self._records

    @property
    def content(self) -> ContentStore | None:
        return self._content

    @property
    def builtins(self) -> Builtins | None:
        return self._builtins

    @property
    def house(self) -> HouseServices | None:
        return self._house

    @property
    def links(self) -> LinkManager | None:
        """The link manager (``relay.federation.links``) of a started station."""
        return self._links.manager if self._links is not None else None

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def node_id(self) -> bytes:
        assert self.identity is not None, "station not started"
        return self.identity.node_id

    @property
    def retry(self) -> bool:
        """QUIC address validation (Retry): on unless turned off or bound to loopback."""
        return self.config.policy.quic_retry and not is_loopback_host(self.config.host)

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what a client needs to dial and pin this station."""
        return f"{self.node_id.hex()}@{self.config.host}:{self.port}"

    def connection_count(self) -> int:
        """Connections open now (clients and links)."""
        return len(self._connections)

    def connection(self, conn: int) -> FrameProtocol | None:
        return self._connections.get(conn)

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Station:
        async with contextlib.AsyncExitStack() as stack:
            await self._start(stack)  # a failure here closes what was opened, then re-raises
            self._exit_stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Say GOODBYE, close the connections, then undo ``_start`` step by step; idempotent."""
        stack, self._exit_stack = self._exit_stack, None
        if stack is None:
            return
        await stack.aclose()
        log.info("station stopped")

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        """Open everything in order, registering each closer on ``stack`` as soon as it opens;
        the QUIC socket is bound early (its port is in the DHT's and the house's records) but
        read only once every part a frame may reach is open and the upkeep runs.

        At exit the stack runs them in reverse: drain the connections, stop the links, cancel
        the timers, finish the tasks, close the house services, the DHT, the QUIC server, then
        the stores.
        """
        config = self.config
        await self._group.open()
        stack.push_async_callback(self._finish_tasks)  # a failed start: nothing left running
        self.identity, *certificate = build.identity_and_certificate(config)
        gate, rule, self.allowlist = build.realm_rules(config)
        self._records = await build.open_records(config.data_dir, stack)
        self._content = await build.open_content(config.data_dir, stack)
        self._core = build.router_for(
            config, self.identity, (gate, rule), self._open_stream, self._note_publish
        )
        self.resets = build.stateless_resets(self.identity)
        sock = await build.bind_quic(config, stack)
        stack.callback(self._close_server)
        self.port = int(sock.getsockname()[1])
        self._dht = await build.start_dht(config, self.identity, self.port, stack, self.spawn)
        self.core.dht_started(self._dht.port)  # told to peer stations in CONNECT/HELLO
        self._builtins = build.builtins_for(
            config,
            self.identity,
            (self._records, self._content),
            self._core,
            self._dht,
            self.call_station,
        )
        self._house = await build.open_house(
            config,
            self.identity,
            self.port,
            self.core.linked_stations,
            self.call_station,
            stack,
            self.spawn,
        )
        stack.push_async_callback(self._finish_tasks)
        stack.callback(self._cancel_timers)
        self._links = self._station_links(*build.known_peers_for(config, self.identity))
        await self._keep_up()
        await self._serve((certificate[0], certificate[1]), sock, stack)
        stack.push_async_callback(self._links.manager.stop)  # after the drain: no redial
        stack.push_async_callback(self._drain)
        self._links.manager.start()
        log.info(
            "station %s listening on %s:%d", self.identity.node_id.hex(), config.host, self.port
        )

    def _station_links(self, known: KnownPeers, remembered: list[LinkTarget]) -> StationLinks:
        """The links' side of the station, given the parts it uses (all open by now)."""
        self.known_peers = known
        table = ConnectionTable(self.adopt, self.forget, self.connection)
        return StationLinks(
            self.config,
            self.core,
            table,
            run=self.run,
            spawn=self.spawn,
            call_station=self.call_station,
            parts=(self.dht, self._open(self._house), known),
            remembered=remembered,
            on_up=self._link_came_up,
        )

    async def _serve(
        self,
        certificate: tuple[Path, Path],
        sock: socket.socket,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        """Read the QUIC socket from now on; a worker's sibling listener too."""
        config = self.config
        self._server, _ = await build.serve_quic(
            config, certificate, self._protocol, self.retry, self.resets, sock
        )
        await build.serve_sibling_links(config, certificate, self._protocol, stack, self.resets)

    async def _keep_up(self) -> None:
        """Start the ticker and the refresh of this station's own records (stored once
        before the socket is read, so a client connecting at once resolves them)."""
        config, builtins = self.config, self._open(self._builtins)
        self._ticker = Ticker(
            self.core,
            self.run,
            self.spawn,
            builtins,
            self.allowlist,
            interval_s=config.tick_interval_s,
            sweep_ms=config.policy.realm_sweep_ms,
        )
        own = OwnRecords(
            self._open(self.identity),
            (list(dict.fromkeys([*config.advertised_hosts, config.host])), self.port),
            self._open(self._records),
            self._open(self._house),
            self.dht,
            interval_s=config.endpoint_refresh_s,
        )
        self.spawn(self._ticker.tick_forever())
        await own.refresh_once(publish=False)  # resolvable before the first datagram is read
        self.spawn(own.refresh_forever())

    @staticmethod
    def _open(part: T | None) -> T:
        assert part is not None, "station not started"
        return part

    def _link_came_up(self, node_id: bytes, host: str, dht_port: int) -> None:
        if self.link_up_hook is not None:
            self.link_up_hook(node_id, host, dht_port)

    async def sweep_revocations(self, now: int) -> int:
        """Look up revocations of the current memberships (record store and mesh), then end
        the revoked and expired ones; how many revocations were new. The ticker runs it every
        ``policy.realm_sweep_ms``."""
        return await self._open(self._ticker).sweep_revocations(now)

    async def _drain(self) -> None:
        """GOODBYE to every peer (§5.5); once each acknowledged it (or left, or the deadline
        passed), close every connection."""
        if self._links is not None:
            self._links.manager.halt()
        await drain(self._connections, self.core, self.run, DRAIN_DEADLINE_S)

    def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _cancel_timers(self) -> None:
        self._closing = True  # from now on a Close is carried out at once and nothing spawns
        self._group.close_to_new()
        self._timers.cancel_all()

    # -- background work: one task group -----------------------------------------------------

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Run ``coroutine`` in the station's one task group (a failure is logged, never
        spreads); its task, or None once the station stops. The station's
        ``macula.task_scope.Spawner``: every relay-side component spawns through it."""
        return self._group.spawn(coroutine)

    async def _finish_tasks(self) -> None:
        self._closing = True
        await self._group.finish()

    def background(self) -> tuple[int, int]:
        """(tasks running, timers pending) of the station's own background work."""
        return len(self._group), len(self._timers)

    def tasks(self) -> frozenset[asyncio.Task[None]]:
        """The tasks running in the station's group now (every component's included)."""
        return self._group.tasks()

    # -- connections -------------------------------------------------------------------------

    def _protocol(self, quic: QuicConnection, **kwargs: Any) -> FrameProtocol:
        policy = self.config.policy
        lean_handshake(quic)  # one spare connection id, PADDING skipped natively
        connection = FrameProtocol(quic, **kwargs)
        connection.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
        connection.control_limits = StreamLimits(
            policy.max_control_frame_size, policy.max_control_frame_items
        )
        connection.pre_open_bytes = policy.max_pre_handshake_bytes
        conn = self.adopt(connection)

        def first_datagram(host: str) -> None:  # the source address is known from here on
            for action in self.core.connection_made(conn, now_ms(), host):
                if isinstance(action, Close):  # over a connection cap: no handshake at all
                    connection.refuse(action.reason)

        connection.on_first_datagram = first_datagram
        return connection

    def adopt(self, connection: FrameProtocol) -> int:
        """Number ``connection`` and route its reports to the core; its number."""
        self._next_conn += 1
        conn = self._next_conn
        connection.sink = _Sink(conn, connection, self.core, self.run, self.forget)
        self._connections[conn] = connection
        return conn

    def _open_stream(self, conn: int) -> int:
        return self._connections[conn].new_stream()

    def forget(self, conn: int, reason: str) -> None:
        """Connection ``conn`` is lost: the core hears of it, a link's dialler returns."""
        log.debug("conn %d lost: %s", conn, clip(reason))
        self.run(self.core.connection_lost(conn, now_ms()))
        self._connections.pop(conn, None)
        if self._links is not None:
            self._links.lost(conn)

    def _note_publish(self, frame: Publish, now: int, sig_checked: bool) -> None:
        """``RouterCore``'s publish hook: the room history hears each PUBLISH accepted."""
        if self._house is not None:
            self._house.note_publish(frame, now, sig_checked)

    # -- the action executor -----------------------------------------------------------------

    def run(self, actions: list[Action]) -> None:
        for action in actions:
            try:
                self._do(action)
            except Exception:  # one failed action must not cost the others (or the caller)
                log.exception("station action %s failed", type(action).__name__)

    def _do(self, action: Action) -> None:
        if isinstance(action, Send):
            self._send(action)
        elif isinstance(action, EndStream):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.end_stream(action.stream)
        elif isinstance(action, Close):
            self._close_later(action)
        elif isinstance(action, RunBuiltin) and action.call.procedure == MESH_PROCEDURE:
            assert self._links is not None  # (no datagram is read before the links exist)
            self._links.answer(action)  # a linked station introduces itself (issue 37)
        elif isinstance(action, RunBuiltin):
            assert self._builtins is not None
            self.spawn(run_builtin(action, self.core, self._builtins, self._house, self.run))
        elif isinstance(action, PauseReading):
            self._pause(action)
        elif isinstance(action, ResumeReading):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.resume_reading(action.stream)
        elif isinstance(action, StationReplied):
            self._station_calls.settled(action)
        elif isinstance(action, (LinkUp, LinkDown)):
            assert self._links is not None
            self._links.changed(action)

    def _send(self, action: Send) -> None:
        connection = self._connections.get(action.conn)
        if connection is None:
            return
        connection.send(action.stream, action.data)
        # what was already waiting when this frame came (one large frame is no backlog)
        queued = connection.queued_bytes(action.stream) - len(action.data)
        if queued > self.config.policy.quotas.max_outbound_bytes:
            self.run(self.core.outbound_full(action.conn, action.stream, queued, now_ms()))

    async def call_station(
        self,
        node_id: bytes,
        procedure: str,
        payload: Any,
        timeout_s: float,
        *,
        realm: bytes = bytes(32),
    ) -> StationReplied:
        """CALL ``procedure`` (in ``realm``) at the linked station ``node_id``, signed by this
        station; how it settled (``ok`` False: no such link, the link lost, no reply within
        ``timeout_s``)."""
        call = (node_id, procedure, payload, realm)
        margin_s = 2 * self.config.tick_interval_s  # a stopped ticker settles nothing
        return await self._station_calls.ask(self.core, self.run, call, timeout_s, margin_s)

    def _pause(self, action: PauseReading) -> None:
        """Stop reading the stream (its bytes wait unread in QUIC's window) until ``until_ms``,
        then let the core catch up."""
        connection = self._connections.get(action.conn)
        if connection is None or self._closing:
            return
        connection.pause_reading(action.stream)
        delay_s = max(0, action.until_ms - now_ms()) / 1000
        self._timers.later(delay_s, lambda: self.run(self.core.resume(action.conn, now_ms())))

    def _close_later(self, action: Close) -> None:
        connection = self._connections.get(action.conn)
        if connection is None:
            return
        if self._closing:
            connection.close_connection(action.reason)
            return
        self._timers.later(
            action.after_ms / 1000, lambda: connection.close_connection(action.reason)
        )
