"""The station's QUIC shell: moves bytes between aioquic and ``RouterCore``.

``async with Station(config) as station:`` binds the UDP port (0 = any free port), creates the
station's key and certificate on first start, opens the stores, and serves until the block
ends; leaving it sends GOODBYE to every client, closes the connections and the stores.
Invariants: every resource is registered on one ``AsyncExitStack`` the moment it opens, so a
start that fails partway closes what it opened before the error propagates, and a stop undoes
the start in reverse; every background task (the ticker, built-ins, the station_endpoint
refresher) and every delayed close timer is owned by the station, and is cancelled (tasks also
awaited) before ``stop`` returns; once stopping, nothing new is spawned or scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from macula.clock import now_ms, now_us
from macula.keyfile import load_or_create_identity
from macula.transport import (
    ALPN,
    CONNECTION_WINDOW,
    IDLE_TIMEOUT_S,
    STREAM_WINDOW,
    FrameProtocol,
    StreamLimits,
    enlarge_receive_buffer,
)
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError
from macula.wire.identity import Identity
from macula.wire.records import RecordType, new_record, record_version
from relay.actions import (
    Action,
    Close,
    EndStream,
    PauseReading,
    ResumeReading,
    RunBuiltin,
    Send,
)
from relay.builtins import Builtins
from relay.core import BUILTINS, RouterCore
from relay.federation.dht import DhtConfig, StationDht
from relay.house.services import HouseConfig, HouseServices
from relay.logbook import clip
from relay.outcome import Outcome
from relay.policy import StationPolicy
from relay.store import ContentStore, RecordStore, StoreLimits
from relay.tls import ensure_certificate

log = logging.getLogger("macula.relay")


@dataclass
class StationConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 4433
    # the DHT among stations (UDP): None = port + 1, or any free port when port is 0
    dht_port: int | None = None
    dht: DhtConfig = field(default_factory=DhtConfig)
    # names and addresses clients may dial (certificate SANs, station_endpoint record)
    advertised_hosts: list[str] = field(default_factory=list)
    policy: StationPolicy = field(default_factory=StationPolicy)
    tick_interval_s: float = 0.2
    endpoint_refresh_s: float = 60.0
    house: HouseConfig = field(default_factory=HouseConfig)
    store_limits: StoreLimits = field(default_factory=StoreLimits)


class _Sink:
    """Reports of one client connection, forwarded to the core under its number."""

    def __init__(self, station: Station, conn: int) -> None:
        self.station = station
        self.conn = conn

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        core = self.station.core
        self.station._run(core.frames_received(self.conn, stream_id, frames, now_ms()))
        connection = self.station._connections.get(self.conn)
        gated = connection is not None and connection.pre_open_bytes is not None
        if gated and connection is not None and core.is_connected(self.conn):
            connection.open_gate()  # CONNECT accepted: any stream, no byte budget

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.station._run(self.station.core.framing_failed(self.conn, stream_id, error, now_ms()))

    def stream_ended(self, stream_id: int) -> None:
        self.station._run(self.station.core.stream_ended(self.conn, stream_id, now_ms()))

    def stream_reset(self, stream_id: int) -> None:
        self.station._run(self.station.core.stream_reset(self.conn, stream_id, now_ms()))

    def connection_lost(self, reason: str) -> None:
        self.station._lost(self.conn, reason)


class Station:
    def __init__(self, config: StationConfig) -> None:
        self.config = config
        self.identity: Identity | None = None
        self._core: RouterCore | None = None
        self._connections: dict[int, FrameProtocol] = {}
        self._next_conn = 0
        self._server: QuicServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._closing = False
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._records: RecordStore | None = None
        self._content: ContentStore | None = None
        self._builtins: Builtins | None = None
        self._house: HouseServices | None = None
        self._dht: StationDht | None = None
        self.port = 0

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

        At exit the stack runs them in reverse: drain the connections, cancel the timers,
        finish the tasks, close the house services, the QUIC server, then the stores.
        """
        config = self.config
        data_dir = config.data_dir
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)
        self.identity = load_or_create_identity(data_dir / "station.key")
        hosts = list(dict.fromkeys([*config.advertised_hosts, config.host, "localhost"]))
        cert_path, key_path = ensure_certificate(data_dir, self.identity, hosts)
        self._records = await RecordStore.open(data_dir / "records.sqlite3")
        stack.push_async_callback(self._records.close)
        self._content = await ContentStore.open(data_dir / "content.sqlite3")
        stack.push_async_callback(self._content.close)
        self._builtins = Builtins(
            self._records,
            self._content,
            station_id=self.identity.node_id,
            limits=config.store_limits,
            max_clock_skew_ms=config.policy.max_clock_skew_ms,
        )
        self._core = RouterCore(
            self.identity,
            config.policy,
            open_stream=self._open_stream,
            random_bytes=os.urandom,
            services=HouseServices.keys_for(config.house),
        )
        quic = QuicConfiguration(
            is_client=False,
            alpn_protocols=[ALPN],
            idle_timeout=IDLE_TIMEOUT_S,
            max_data=CONNECTION_WINDOW,
            max_stream_data=STREAM_WINDOW,
        )
        quic.load_cert_chain(cert_path, key_path)
        self._server = await serve(
            config.host,
            config.port,
            configuration=quic,
            create_protocol=self._protocol,
            retry=self.retry,
        )
        stack.callback(self._close_server)
        transport = self._server._transport
        sockname = transport.get_extra_info("sockname") if transport else None
        if transport is not None:
            enlarge_receive_buffer(transport.get_extra_info("socket"))
        self.port = int(sockname[1]) if sockname else config.port
        await self._start_dht(stack)
        self._house = await HouseServices.open(
            config.house, data_dir, self.identity.node_id, config.host, self.port
        )
        stack.push_async_callback(self._house.close)
        self._core.interest.published = self._house.note_publish  # the room history's feed
        stack.push_async_callback(self._finish_tasks)
        stack.callback(self._cancel_timers)
        stack.push_async_callback(self._drain)
        self._spawn(self._ticker())
        self._spawn(self._endpoint_refresher())
        log.info(
            "station %s listening on %s:%d", self.identity.node_id.hex(), config.host, self.port
        )

    async def _start_dht(self, stack: contextlib.AsyncExitStack) -> None:
        config, port = self.config, self.config.dht_port
        if port is None:
            port = config.port + 1 if 0 < config.port < 0xFFFF else 0
        hosts = [*config.advertised_hosts, config.host]
        assert self.identity is not None and self._builtins is not None
        dht = StationDht(self.identity, quic_port=self.port, hosts=hosts, config=config.dht)
        try:
            bound = await dht.start(config.host, port)
        except OSError as exc:
            raise OSError(exc.errno, f"DHT udp port {port}: {exc.strerror}") from exc
        stack.push_async_callback(dht.stop)
        self._dht = self._builtins.dht = dht
        log.info("DHT listening on udp %s:%d", config.host, bound)

    async def _drain(self) -> None:
        """GOODBYE to every client (§5.5), a moment for it to leave, then close them all."""
        self._run(self.core.shutdown(now_ms()))
        if self._connections:
            await asyncio.sleep(0.15)  # let GOODBYEs leave before the connections close
        for connection in list(self._connections.values()):
            connection.close_connection("station stopped")

    def _cancel_timers(self) -> None:
        self._closing = True  # from now on a Close is carried out at once and nothing spawns
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    async def _finish_tasks(self) -> None:
        self._closing = True
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)

    def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()

    # -- properties ------------------------------------------------------------------------

    @property
    def core(self) -> RouterCore:
        assert self._core is not None, "station not started"
        return self._core

    @property
    def dht(self) -> StationDht:
        assert self._dht is not None, "station not started"
        return self._dht

    @property
    def node_id(self) -> bytes:
        assert self.identity is not None, "station not started"
        return self.identity.node_id

    @property
    def retry(self) -> bool:
        """QUIC address validation (Retry): on unless turned off or bound to loopback."""
        return self.config.policy.quic_retry and not _is_loopback(self.config.host)

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what a client needs to dial and pin this station."""
        return f"{self.node_id.hex()}@{self.config.host}:{self.port}"

    # -- aioquic plumbing --------------------------------------------------------------------

    def _protocol(self, quic: QuicConnection, **kwargs: Any) -> FrameProtocol:
        policy = self.config.policy
        connection = FrameProtocol(quic, **kwargs)
        connection.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
        connection.control_limits = StreamLimits(
            policy.max_control_frame_size, policy.max_control_frame_items
        )
        connection.pre_open_bytes = policy.max_pre_handshake_bytes
        self._next_conn += 1
        conn = self._next_conn
        connection.sink = _Sink(self, conn)
        self._connections[conn] = connection

        def first_datagram(host: str) -> None:  # the source address is known from here on
            for action in self.core.connection_made(conn, now_ms(), host):
                if isinstance(action, Close):  # over a connection cap: no handshake at all
                    connection.refuse(action.reason)

        connection.on_first_datagram = first_datagram
        return connection

    def _open_stream(self, conn: int) -> int:
        return self._connections[conn].new_stream()

    def _lost(self, conn: int, reason: str) -> None:
        log.debug("conn %d lost: %s", conn, clip(reason))
        self._run(self.core.connection_lost(conn, now_ms()))
        self._connections.pop(conn, None)

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            try:
                self._do(action)
            except Exception:  # one failed action must not cost the others (or the caller)
                log.exception("station action %s failed", type(action).__name__)

    def _do(self, action: Action) -> None:
        if isinstance(action, Send):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.send(action.stream, action.data)
                # what was already waiting when this frame came (one large frame is no backlog)
                queued = connection.queued_bytes(action.stream) - len(action.data)
                if queued > self.config.policy.quotas.max_outbound_bytes:
                    self._run(self.core.outbound_full(action.conn, action.stream, queued, now_ms()))
        elif isinstance(action, EndStream):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.end_stream(action.stream)
        elif isinstance(action, Close):
            self._close_later(action)
        elif isinstance(action, RunBuiltin):
            self._spawn(self._builtin(action))
        elif isinstance(action, PauseReading):
            self._pause(action)
        elif isinstance(action, ResumeReading):
            connection = self._connections.get(action.conn)
            if connection is not None:
                connection.resume_reading(action.stream)

    def _pause(self, action: PauseReading) -> None:
        """Stop reading the stream (its bytes wait unread in QUIC's window) until ``until_ms``,
        then let the core catch up."""
        connection = self._connections.get(action.conn)
        if connection is None or self._closing:
            return
        connection.pause_reading(action.stream)

        def resume() -> None:
            self._timers.discard(handle)
            self._run(self.core.resume(action.conn, now_ms()))

        delay = max(0, action.until_ms - now_ms()) / 1000
        handle = asyncio.get_running_loop().call_later(delay, resume)
        self._timers.add(handle)

    def _close_later(self, action: Close) -> None:
        connection = self._connections.get(action.conn)
        if connection is None:
            return
        if self._closing:
            connection.close_connection(action.reason)
            return

        def close() -> None:
            self._timers.discard(handle)
            connection.close_connection(action.reason)

        handle = asyncio.get_running_loop().call_later(action.after_ms / 1000, close)
        self._timers.add(handle)

    async def _builtin(self, action: RunBuiltin) -> None:
        """A built-in (§6.6) or a house service: the router sent both here."""
        assert self._builtins is not None
        now = now_ms()
        call = action.call
        if call.procedure in BUILTINS:
            outcome = await self._builtins.run(call.procedure, call.payload, now, now_us())
            if call.procedure == "_relay.ping" and isinstance(outcome.payload, dict):
                # the refusals this connection was not told in-band (counted by the core)
                outcome = Outcome.result({**outcome.payload, "refused": dict(action.refused)})
        elif self._house is None:
            outcome = Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)  # still starting
        else:
            try:
                outcome = await self._house.handle(call.procedure, call.payload, call.caller, now)
            except Exception:
                log.exception("house service %s failed", call.procedure)
                outcome = Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)
        self._run(self.core.builtin_done(action.conn, action.stream, call, outcome, now_ms()))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if self._closing:
            coroutine.close()  # the station is stopping: no new work
            return
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("station task failed", exc_info=task.exception())

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_interval_s)
            self._run(self.core.tick(now_ms()))

    async def _endpoint_refresher(self) -> None:
        """Keep this station's own ``station_endpoint`` record fresh (§10.6, TTL 5 min)."""
        assert self.identity is not None and self._records is not None
        hosts = [h for h in dict.fromkeys([*self.config.advertised_hosts, self.config.host])]
        while True:
            now = now_ms()
            record = new_record(
                self.identity,
                RecordType.STATION_ENDPOINT,
                {
                    "quic_port": self.port,
                    "host_advertised": [h.encode() for h in hosts],
                    "alpn": ALPN,
                    "dht_port": self._dht.port if self._dht else 0,
                },
                now_ms=now,
                version=record_version(now, os.urandom(10)),
            )
            announced = self._house.records(self.identity, now) if self._house else []
            try:
                for signed in [record, *announced]:
                    await self._records.put(signed, signed.storage_key(), now)
                for signed in announced if self._dht else []:  # its endpoint: StationDht's own
                    await self.dht.put(signed)
                await self._records.reap(now)  # §13 #12: expired records also leave the disk
            except Exception:
                log.exception("could not refresh this station's records")
            await asyncio.sleep(self.config.endpoint_refresh_s)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
