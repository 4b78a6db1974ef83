"""The station's QUIC shell: moves bytes between aioquic and ``RouterCore``.

``async with Station(config) as station:`` binds the UDP port (0 = any free port), creates the
station's key and certificate on first start, opens the stores, and serves until the block
ends; leaving it sends GOODBYE to every client, closes the connections and the stores.
Invariants: every resource is registered on one ``AsyncExitStack`` the moment it opens
(``relay.station_build`` makes the parts), so a start that fails partway closes what it opened
before the error propagates, and a stop undoes the start in reverse; every background task
(the upkeep of ``relay.station_upkeep``, built-ins, a DHT join) runs in the station's one
``asyncio.TaskGroup`` and every delayed close or resume is a timer the station owns: before
``stop`` returns the timers are cancelled and the group's tasks cancelled and awaited; once
stopping, nothing new is spawned or scheduled. A stop drains first: GOODBYE to every
connected peer, then a wait (bounded by ``DRAIN_DEADLINE_S``) until each acknowledged a QUIC
PING sent behind its GOODBYE or its connection ended, then every connection is closed.
Links to peer stations are QUIC *client* connections kept by
``relay.federation.links.LinkManager`` through ``relay.station_links.StationLinks``; their
frames reach the core through the same sink type, under the same connection numbering, as
accepted connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from macula.clock import now_ms, now_us
from macula.quic_backend import QuicConnection, QuicServer, lean_handshake
from macula.transport import FrameProtocol, StreamLimits
from macula.wire.errors import FramingError
from macula.wire.frames import Publish
from macula.wire.identity import Identity
from relay import station_build as build
from relay.actions import (
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
from relay.builtin_calls import answer
from relay.builtins import Builtins
from relay.core import RouterCore
from relay.federation.dht import StationDht
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkManager
from relay.house.services import HouseServices
from relay.logbook import clip
from relay.realm_files import Allowlist
from relay.station_config import StationConfig
from relay.station_links import StationLinks
from relay.station_upkeep import Upkeep
from relay.station_waits import StationCalls, Timers
from relay.store import ContentStore, RecordStore

__all__ = ["DRAIN_DEADLINE_S", "Station", "StationConfig"]

log = logging.getLogger("macula.relay")

DRAIN_DEADLINE_S = 0.5  # a stop waits at most this long for the GOODBYEs to be acknowledged


class _Sink:
    """Reports of one connection, forwarded to the core under its number."""

    def __init__(self, station: Station, conn: int) -> None:
        self.station = station
        self.conn = conn

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        core = self.station.core
        self.station.run(core.frames_received(self.conn, stream_id, frames, now_ms()))
        connection = self.station.connection(self.conn)
        gated = connection is not None and connection.pre_open_bytes is not None
        if gated and connection is not None and core.is_connected(self.conn):
            connection.open_gate()  # CONNECT accepted: any stream, no byte budget
            connection.release_handshake_buffers()  # 48 KiB an idle connection kept

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.station.run(self.station.core.framing_failed(self.conn, stream_id, error, now_ms()))

    def stream_ended(self, stream_id: int) -> None:
        self.station.run(self.station.core.stream_ended(self.conn, stream_id, now_ms()))

    def stream_reset(self, stream_id: int) -> None:
        self.station.run(self.station.core.stream_reset(self.conn, stream_id, now_ms()))

    def connection_lost(self, reason: str) -> None:
        self.station.forget(self.conn, reason)


class Station:
    def __init__(self, config: StationConfig) -> None:
        self.config = config
        self.identity: Identity | None = None
        self._core: RouterCore | None = None
        self._connections: dict[int, FrameProtocol] = {}
        self._next_conn = 0
        self._server: QuicServer | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None
        self._running = 0  # tasks spawned into the group and not yet done
        self._timers = Timers()
        self._closing = False
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._records: RecordStore | None = None
        self._content: ContentStore | None = None
        self._builtins: Builtins | None = None
        self._house: HouseServices | None = None
        self._dht: StationDht | None = None
        self._station_calls = StationCalls()
        self.port = 0
        self.links: LinkManager | None = None
        self._links = StationLinks(self)
        self.upkeep = Upkeep(self)
        self.known_peers: KnownPeers | None = None
        # called as (node_id, host, dht_port) when a link comes up (e.g. a DHT bootstrap)
        self.link_up_hook: Callable[[bytes, str, int], None] | None = None
        self.allowlist: Allowlist | None = None

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
        """Open everything in order, registering each closer on ``stack`` as soon as it opens.

        At exit the stack runs them in reverse: drain the connections, stop the links, cancel
        the timers, finish the tasks, close the house services, the DHT, the QUIC server, then
        the stores.
        """
        config = self.config
        await self._open_group()
        stack.push_async_callback(self._finish_tasks)  # a failed start: nothing left running
        self.identity, *certificate = build.identity_and_certificate(config)
        gate, rule, self.allowlist = build.realm_rules(config)
        self._records = await build.open_records(config.data_dir, stack)
        self._content = await build.open_content(config.data_dir, stack)
        self._builtins = build.builtins_for(
            config,
            self.identity,
            (self._records, self._content),
            lambda: self.core,
            self.call_station,
        )
        self._core = build.router_for(
            config, self.identity, (gate, rule), self._open_stream, self._note_publish
        )
        self._server, self.port = await build.serve_quic(
            config, (certificate[0], certificate[1]), self._protocol, self.retry
        )
        stack.callback(self._close_server)
        await build.serve_sibling_links(
            config, (certificate[0], certificate[1]), self._protocol, stack
        )
        self._dht = self._builtins.dht = await build.start_dht(
            config, self.identity, self.port, stack
        )
        self.core.dht_started(self._dht.port)  # told to peer stations in CONNECT/HELLO
        self._house = await build.open_house(
            config, self.identity, self.port, self.core.linked_stations, self.call_station, stack
        )
        stack.push_async_callback(self._finish_tasks)
        stack.callback(self._cancel_timers)
        self.known_peers, remembered = build.known_peers_for(config, self.identity)
        self.links = build.link_manager_for(config, self.identity, self._links, remembered)
        stack.push_async_callback(self.links.stop)  # after the drain: no redial meanwhile
        stack.push_async_callback(self._drain)
        self.spawn(self.upkeep.tick_forever())
        self.spawn(self.upkeep.refresh_forever())
        self.links.start()
        log.info(
            "station %s listening on %s:%d", self.identity.node_id.hex(), config.host, self.port
        )

    async def sweep_revocations(self, now: int) -> int:
        """Look up revocations of the current memberships (record store and mesh), then end
        the revoked and expired ones; how many revocations were new. The ticker runs it every
        ``policy.realm_sweep_ms``."""
        return await self.upkeep.sweep_revocations(now)

    async def _drain(self) -> None:
        """GOODBYE to every peer (§5.5); once each acknowledged it (or left, or the deadline
        passed), close every connection."""
        if self.links is not None:
            self.links.halt()
        told = [c for n, c in self._connections.items() if self.core.is_connected(n)]
        self.run(self.core.shutdown(now_ms()))
        await asyncio.gather(*(_acknowledged(c, DRAIN_DEADLINE_S) for c in told))
        for connection in list(self._connections.values()):
            connection.close_connection("station stopped")

    def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def _cancel_timers(self) -> None:
        self._closing = True  # from now on a Close is carried out at once and nothing spawns
        self._timers.cancel_all()

    # -- background work: one task group -----------------------------------------------------

    async def _open_group(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(ready))
        await ready

    async def _supervise(self, ready: asyncio.Future[None]) -> None:
        """Hold the station's task group open until ``_finish_tasks`` cancels this task; the
        group then cancels and awaits every task in it."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            ready.set_result(None)
            await asyncio.Event().wait()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` in the station's task group (a failure is logged, never spreads);
        once the station stops, nothing new runs."""
        if self._closing or self._group is None:
            coroutine.close()  # the station is stopping: no new work
            return
        try:
            task = self._group.create_task(_logged(coroutine))
        except RuntimeError:  # the group was cancelled from outside (the loop shutting down)
            coroutine.close()
            return
        self._running += 1
        task.add_done_callback(lambda _: self._ended(coroutine))

    def _ended(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self._running -= 1
        coroutine.close()  # a task cancelled before it ran: its coroutine never started

    async def _finish_tasks(self) -> None:
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.wait([supervisor])  # the group cancelled and awaited its tasks
        self._group = None

    def background(self) -> tuple[int, int]:
        """(tasks running, timers pending) of the station's own background work."""
        return self._running, len(self._timers)

    # -- read accessors ----------------------------------------------------------------------

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
    def closing(self) -> bool:
        return self._closing

    @property
    def node_id(self) -> bytes:
        assert self.identity is not None, "station not started"
        return self.identity.node_id

    @property
    def retry(self) -> bool:
        """QUIC address validation (Retry): on unless turned off or bound to loopback."""
        return self.config.policy.quic_retry and not _is_loopback(self.config.host)

    def connection_count(self) -> int:
        """Connections open now (clients and links)."""
        return len(self._connections)

    def connection(self, conn: int) -> FrameProtocol | None:
        return self._connections.get(conn)

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what a client needs to dial and pin this station."""
        return f"{self.node_id.hex()}@{self.config.host}:{self.port}"

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
        connection.sink = _Sink(self, conn)
        self._connections[conn] = connection
        return conn

    def _open_stream(self, conn: int) -> int:
        return self._connections[conn].new_stream()

    def forget(self, conn: int, reason: str) -> None:
        """Connection ``conn`` is lost: the core hears of it, a link's dialler returns."""
        log.debug("conn %d lost: %s", conn, clip(reason))
        self.run(self.core.connection_lost(conn, now_ms()))
        self._connections.pop(conn, None)
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
        elif isinstance(action, RunBuiltin):
            self.spawn(self._builtin(action))
        elif isinstance(action, PauseReading):
            self._pause(action)
        elif isinstance(action, ResumeReading):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.resume_reading(action.stream)
        elif isinstance(action, StationReplied):
            self._station_calls.settled(action)
        elif isinstance(action, (LinkUp, LinkDown)):
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
        now = now_ms()
        started = self.core.call_station(
            node_id, procedure, payload, now + int(timeout_s * 1000), now, realm=realm
        )
        # the core settles it by the deadline (tick); the margin covers a stopped ticker
        margin_s = 2 * self.config.tick_interval_s
        return await self._station_calls.call(started, self.run, timeout_s + margin_s)

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

    async def _builtin(self, action: RunBuiltin) -> None:
        """A built-in (§6.6) or a house service (``relay.builtin_calls``): its outcome goes
        back to the core."""
        assert self._builtins is not None
        outcome = await answer(action, self.core, self._builtins, self._house, now_ms(), now_us())
        self.run(self.core.builtin_done(action.conn, action.stream, action.call, outcome, now_ms()))


async def _logged(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        await coroutine
    except Exception:
        log.exception("station task failed")


async def _acknowledged(connection: FrameProtocol, timeout_s: float) -> None:
    """Until the peer acknowledged a QUIC PING sent now (behind what was queued), its
    connection ended, or ``timeout_s`` passed."""
    if connection.lost:
        return
    with contextlib.suppress(ConnectionError):
        await connection.acknowledged(timeout_s)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
