"""The station's QUIC shell: moves bytes between aioquic and ``RouterCore``.

``async with Station(config) as station:`` binds the UDP port (0 = any free port), creates the
station's key and certificate on first start, opens the stores, and serves until the block
ends; leaving it sends GOODBYE to every client, closes the connections and the stores.
Invariants: every resource is registered on one ``AsyncExitStack`` the moment it opens, so a
start that fails partway closes what it opened before the error propagates, and a stop undoes
the start in reverse; every background task (the ticker, built-ins, the station_endpoint
refresher) and every delayed close timer is owned by the station, and is cancelled (tasks also
awaited) before ``stop`` returns; once stopping, nothing new is spawned or scheduled.
Links to peer stations (``peers``, ``discover``) are QUIC *client* connections pinned to the
peer's node id, kept by ``relay.federation.links.LinkManager`` (which also dials, after a
restart, the stations remembered in ``known_peers.json``); their frames reach the core
through the same sink type, under the same connection numbering, as accepted connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macula.clock import now_ms, now_us
from macula.datagram_reader import bound_socket, open_draining
from macula.house import HOUSE_REALM
from macula.keyfile import load_or_create_identity
from macula.quic_backend import (
    QuicConfiguration,
    QuicConnection,
    QuicServer,
    lean_handshake,
    release_crypto_buffers,
)
from macula.transport import (
    ALPN,
    CONNECTION_WINDOW,
    IDLE_TIMEOUT_S,
    STREAM_WINDOW,
    FrameProtocol,
    StreamLimits,
    client_configuration,
    datagram_size,
    dial,
    enlarge_receive_buffer,
)
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError
from macula.wire.frames import Publish
from macula.wire.identity import Identity
from macula.wire.records import Record, RecordType, new_record, record_version
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
from relay.builtins import Builtins
from relay.core import BUILTINS, RouterCore
from relay.federation.content import peer_asker
from relay.federation.dht import DhtConfig, StationDht
from relay.federation.known_peers import FILE_NAME as KNOWN_PEERS_FILE
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkFailed, LinkManager, LinkTarget, StationLike
from relay.house.mesh import linked_asker
from relay.house.services import HouseConfig, HouseServices
from relay.logbook import clip
from relay.outcome import Outcome
from relay.policy import StationPolicy
from relay.realm_admission import AdmissionMode, ConnectRule
from relay.realm_files import Allowlist
from relay.realm_links import own_station_endorsements
from relay.realms import ProtectedRealm, RealmGate
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
    # --- links to peer stations (docs/federation.md) ---
    peers: list[LinkTarget] = field(default_factory=list)  # ``--peer NODE_ID@HOST:PORT``
    max_links: int = 64  # stations this one dials at most
    # more stations to link with (the DHT's ``stations()``); None: only ``peers``
    discover: Callable[[], Awaitable[Sequence[StationLike]]] | None = None
    discover_interval_s: float = 30.0
    link_backoff_s: float = 0.5  # first redial delay, doubling up to ``link_backoff_max_s``
    link_backoff_max_s: float = 30.0
    link_timeout_s: float = 10.0  # QUIC handshake with a peer station
    # stations linked with or discovered, remembered in the data dir and dialled again after
    # a restart (besides ``peers``); at most this many, 0: none remembered
    known_peers_max: int = 256
    # --- protected realms and admission (relay.realms, relay.realm_admission; issue 13) ---
    realms: list[ProtectedRealm] = field(default_factory=list)  # ``--realm NAME=KEY``
    # this station's station endorsements (``--realm-endorsement FILE``), shown on its links
    station_endorsements: list[Record] = field(default_factory=list)
    admission: AdmissionMode = AdmissionMode.OPEN
    allowlist: Path | None = None  # node ids, one a line; re-read when it changes


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
            release_crypto_buffers(connection._quic)  # 48 KiB an idle connection kept

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
        self._station_calls: dict[bytes, asyncio.Future[StationReplied]] = {}
        self.port = 0
        self.links: LinkManager | None = None
        self._link_lost: dict[int, asyncio.Event] = {}
        self._link_labels: dict[int, str] = {}  # conn -> "host:port" of a dialled link
        self._link_targets: dict[int, LinkTarget] = {}  # conn -> the station it dialled
        self.known_peers: KnownPeers | None = None
        # called as (node_id, host, dht_port) when a link comes up (e.g. a DHT bootstrap)
        self.link_up_hook: Callable[[bytes, str, int], None] | None = None
        self.allowlist: Allowlist | None = None
        self._revocations_checked_ms = 0

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
        realms, connect_rule = self._realm_rules()
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
            ask_peers=peer_asker(
                lambda: self.core.linked_stations(),
                self.call_station,
                fanout=config.policy.content_fanout,
                timeout_s=config.policy.content_fetch_timeout_ms / 1000,
            ),
            on_stored=lambda record, now: self.core.realms.learn(record, now),
        )
        self._core = RouterCore(
            self.identity,
            config.policy,
            open_stream=self._open_stream,
            random_bytes=os.urandom,
            services=HouseServices.keys_for(config.house),
            realms=realms,
            connect_rule=connect_rule,
            station_endorsements=own_station_endorsements(  # ValueError: not started
                config.station_endorsements, self.identity.node_id, realms.realms, now_ms()
            ),
            published=self._note_publish,  # the room history's feed, once the house is open
        )
        quic = QuicConfiguration(
            is_client=False,
            alpn_protocols=[ALPN],
            idle_timeout=IDLE_TIMEOUT_S,
            max_data=CONNECTION_WINDOW,
            max_stream_data=STREAM_WINDOW,
        )
        quic.max_datagram_size = datagram_size(config.host)  # larger when bound on loopback
        quic.load_cert_chain(cert_path, key_path)
        # aioquic's ``serve`` with a socket of our own, so the server reads every datagram
        # waiting at each readiness (macula.datagram_reader), not one per loop turn
        server = QuicServer(configuration=quic, create_protocol=self._protocol, retry=self.retry)
        sock = await bound_socket(config.host, config.port)
        await open_draining(sock, server)
        self._server = server
        stack.callback(self._close_server)
        enlarge_receive_buffer(sock)
        self.port = int(sock.getsockname()[1])
        await self._start_dht(stack)
        self._house = await HouseServices.open(
            config.house,
            data_dir,
            self.identity.node_id,
            config.host,
            self.port,
            ask_linked=linked_asker(
                lambda: self.core.linked_stations(),
                lambda node_id, procedure, payload, timeout_s: self.call_station(
                    node_id, procedure, payload, timeout_s, realm=HOUSE_REALM
                ),
                fanout=config.house.mesh_fanout,
                concurrency=config.house.mesh_concurrency,
                timeout_s=config.house.mesh_timeout_ms / 1000,
            ),
        )
        stack.push_async_callback(self._house.close)
        stack.push_async_callback(self._finish_tasks)
        stack.callback(self._cancel_timers)
        self.known_peers = KnownPeers(
            data_dir / KNOWN_PEERS_FILE,
            self.identity.node_id,
            max_count=config.known_peers_max,
            clock=now_ms,
        )
        named = {target.node_id for target in config.peers}
        remembered = [t for t in self.known_peers.load() if t.node_id not in named]
        if remembered:
            log.info("dialling %d stations remembered from before", len(remembered))
        self.links = LinkManager(
            self.identity.node_id,
            run_link=self._run_link,
            has_link=self._has_link,
            peers=config.peers,
            remembered=remembered,
            discover=self._noting(
                config.discover if config.discover is not None else self._discover
            ),
            max_links=config.max_links,
            discover_interval_s=config.discover_interval_s,
            backoff_base_s=config.link_backoff_s,
            backoff_max_s=config.link_backoff_max_s,
        )
        stack.push_async_callback(self.links.stop)  # after the drain: no redial meanwhile
        stack.push_async_callback(self._drain)
        self._spawn(self._ticker())
        self._spawn(self._endpoint_refresher())
        self.links.start()
        log.info(
            "station %s listening on %s:%d", self.identity.node_id.hex(), config.host, self.port
        )

    def _realm_rules(self) -> tuple[RealmGate, ConnectRule]:
        """The realms this station protects and who may connect (``ValueError`` if the
        admission mode lacks what it needs; ``AllowlistError`` for a bad allowlist file)."""
        config, policy = self.config, self.config.policy
        mode = config.admission
        if mode is AdmissionMode.ALLOWLIST and config.allowlist is None:
            raise ValueError("admission 'allowlist' needs an allowlist file")
        if mode is AdmissionMode.MEMBERS and not config.realms:
            raise ValueError("admission 'members' needs at least one protected realm")
        gate = RealmGate.protecting(
            config.realms,
            sweep_ms=policy.realm_sweep_ms,
            max_presented=policy.max_presented_endorsements,
            max_revocations=policy.max_realm_revocations,
        )
        self.allowlist = None if config.allowlist is None else Allowlist.load(config.allowlist)
        stations = frozenset(target.node_id for target in config.peers)
        return gate, ConnectRule(mode, self.allowlist, stations)

    async def sweep_revocations(self, now: int) -> int:
        """Look up revocations of the current memberships (record store and mesh), then end
        the revoked and expired ones; how many revocations were new. The ticker runs it every
        ``policy.realm_sweep_ms``."""
        assert self._builtins is not None
        self._revocations_checked_ms = now
        gate = self.core.realms
        learned = await self._builtins.learn_revocations(gate, gate.lookup_keys(), now)
        self._run(self.core.sweep_realms(now))
        return learned

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
        self.core.dht_started(bound)  # told to peer stations in CONNECT/HELLO
        log.info("DHT listening on udp %s:%d", config.host, bound)

    async def _drain(self) -> None:
        """GOODBYE to every client (§5.5), a moment for it to leave, then close them all."""
        if self.links is not None:
            self.links.halt()
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

    def connection_count(self) -> int:
        """Connections open now (clients and links)."""
        return len(self._connections)

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what a client needs to dial and pin this station."""
        return f"{self.node_id.hex()}@{self.config.host}:{self.port}"

    # -- aioquic plumbing --------------------------------------------------------------------

    def _protocol(self, quic: QuicConnection, **kwargs: Any) -> FrameProtocol:
        policy = self.config.policy
        lean_handshake(quic)  # one spare connection id, PADDING skipped natively
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
        waiter = self._link_lost.get(conn)
        if waiter is not None:
            waiter.set()

    # -- links to peer stations ------------------------------------------------------------

    async def _run_link(self, target: LinkTarget) -> None:
        """Dial ``target`` (pinned to its node id), hand the connection to the core, and
        return once it is lost; a connection that cannot be made raises."""
        configuration = client_configuration(server_name=target.host)
        address = f"{target.host}:{target.quic_port}"
        async with dial(
            target.host, target.quic_port, configuration, timeout=self.config.link_timeout_s
        ) as connection:
            key = connection.peer_certificate_key()
            if key != target.node_id:
                shown = key.hex()[:16] if key else "none"
                raise LinkFailed(f"{address} presented key {shown}, not the station dialled")
            if self._closing or self.core.stopping:
                return
            policy = self.config.policy
            connection.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
            connection.control_limits = StreamLimits(
                policy.max_control_frame_size, policy.max_control_frame_items
            )
            self._next_conn += 1
            conn = self._next_conn
            lost = self._link_lost[conn] = asyncio.Event()
            self._link_labels[conn] = address
            self._link_targets[conn] = target
            connection.sink = _Sink(self, conn)
            self._connections[conn] = connection
            try:
                self._run(self.core.dial(conn, target.node_id, now_ms(), host=target.host))
                await lost.wait()
            finally:
                if conn in self._connections:  # cancelled (the station stops): forget it now
                    self._lost(conn, "link closed")
                self._link_lost.pop(conn, None)
                self._link_labels.pop(conn, None)
                self._link_targets.pop(conn, None)

    def _has_link(self, node_id: bytes) -> bool:
        conn = self.core.node_conn.get(node_id)
        peer = self.core.peers.get(conn) if conn is not None else None
        return peer is not None and peer.linked

    async def _discover(self) -> Sequence[StationLike]:
        """The stations the DHT knows (FEDERATION.md): what the link manager dials; they
        are remembered for a restart."""
        found = [] if self._dht is None else await self._dht.stations()
        if self.known_peers is not None:
            self.known_peers.saw(found)
        return found

    def _noting(
        self, discover: Callable[[], Awaitable[Sequence[StationLike]]]
    ) -> Callable[[], Awaitable[Sequence[StationLike]]]:
        """``discover``, each round's stations also told to the station directory."""

        async def noted() -> Sequence[StationLike]:
            found = await discover()
            if self._house is not None:
                self._house.stations_discovered(found)
            return found

        return noted

    def _note_publish(self, frame: Publish, now: int, sig_checked: bool) -> None:
        """``RouterCore``'s publish hook: the room history hears each PUBLISH accepted."""
        if self._house is not None:
            self._house.note_publish(frame, now, sig_checked)

    def _house_learns(self, action: LinkUp | LinkDown, label: str | None) -> None:
        """The station directory hears of the link: a dialled one's address, or its loss."""
        if self._house is None:
            return
        if isinstance(action, LinkDown):
            self._house.station_unlinked(action.node_id)
            return
        host, _, port = (label or "").rpartition(":")
        dialled = (host, int(port)) if host and port.isdecimal() else None
        self._house.station_linked(action.node_id, dialled)

    def _link_changed(self, action: LinkUp | LinkDown) -> None:
        label = self._link_labels.get(action.conn)
        self._house_learns(action, label)
        if isinstance(action, LinkUp):
            where = label or action.host
            how = "dialled" if label else "accepted"
            log.info(
                "link up: %s %s (%s, dht port %d)",
                action.node_id.hex()[:16],
                where,
                how,
                action.dht_port,
            )
            target = self._link_targets.get(action.conn)
            if target is not None and self.known_peers is not None:
                self.known_peers.saw([target])  # a station we reached: remembered
            if self.link_up_hook is not None:
                self.link_up_hook(action.node_id, action.host, action.dht_port)
            if self._dht is not None:  # a linked station may STORE at this one's DHT
                self._dht.link_up(action.node_id, action.host, action.dht_port)
                self._spawn(self._dht.join_link(action.node_id, action.host, action.dht_port))
        else:
            if self._dht is not None:
                self._dht.link_down(action.node_id)
            connection = self._connections.get(action.conn)
            where = label or (connection.peer_host if connection is not None else None) or "?"
            log.info("link down: %s %s", action.node_id.hex()[:16], where)

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
        elif isinstance(action, StationReplied):
            future = self._station_calls.pop(action.call_id, None)
            if future is not None and not future.done():
                future.set_result(action)

        elif isinstance(action, (LinkUp, LinkDown)):
            self._link_changed(action)

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
        call_id, actions = self.core.call_station(
            node_id, procedure, payload, now + int(timeout_s * 1000), now, realm=realm
        )
        future: asyncio.Future[StationReplied] = asyncio.get_running_loop().create_future()
        self._station_calls[call_id] = future
        self._run(actions)  # may settle it at once (no link)
        try:  # the core settles it by the deadline (tick); the margin covers a stopped ticker
            return await asyncio.wait_for(future, timeout_s + 2 * self.config.tick_interval_s)
        except TimeoutError:
            code = ErrorCode.TEMPORARY_RELAY_FAILURE
            return StationReplied(call_id, False, "no reply in time", code)
        finally:
            self._station_calls.pop(call_id, None)

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
        peer = self.core.peers.get(action.conn)
        from_station = int(peer is not None and peer.is_station)  # the link says, not the CALL
        if call.procedure == "_realm.present":
            realms = self.core.realms
            outcome = await self._builtins.present(
                realms, action.conn, call.caller, call.payload, now
            )
        elif call.procedure in BUILTINS:
            outcome = await self._builtins.run(call.procedure, call.payload, now, now_us())
            if call.procedure == "_relay.ping" and isinstance(outcome.payload, dict):
                # the refusals this connection was not told in-band (counted by the core)
                outcome = Outcome.result({**outcome.payload, "refused": dict(action.refused)})
        elif self._house is None:
            outcome = Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)  # still starting
        else:
            try:
                outcome = await self._house.handle(
                    call.procedure, call.payload, call.caller, now, from_station=from_station
                )
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
            now = now_ms()
            self._run(self.core.tick(now))
            if self.allowlist is not None:
                self.allowlist.reload()  # a changed file is re-read (mtime and size)
            due = now - self._revocations_checked_ms >= self.config.policy.realm_sweep_ms
            if self.core.realms.realms and due:
                self._revocations_checked_ms = now
                self._spawn(self._sweep_quietly(now))

    async def _sweep_quietly(self, now: int) -> None:
        try:
            await self.sweep_revocations(now)
        except Exception:
            log.exception("could not look up realm revocations")

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
