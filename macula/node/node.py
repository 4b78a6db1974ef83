"""``Node``: one identity on the mesh, one connection, desired state replayed on reconnect.

``async with Node(identity, stations=[...]) as node:`` connects to the first reachable station
of the list (one address alone is a list of one) and keeps exactly one ``Session`` for this
identity. Subscriptions and advertisements are *intent*: kept here, sent on every (re)connect.
When the session breaks (lost, GOODBYE, refused as draining) the supervisor fails over to the
next station of the list, round robin, waiting (``macula.client.backoff``) only after every station
failed in a row (briefly when each was refused by ICMP: ``macula.client.station_choice``), and keeps
trying until closed; it replays the intent, then tells listeners ``reconnected``, and
``on_station`` listeners when the station is another one. Closing the node never reconnects,
and no task outlives the ``async with`` (all tasks belong to the node's task group). With
``known_stations`` (``from_env`` passes ``$MACULA_HOME/known_stations``) a station given
without a node id is pinned on first use (``macula.known_stations``).

Each other concern has its own module: ``subscriptions``, ``serving`` (handlers),
``content_client`` (§11), ``direct`` (direct dial), ``dht``, ``config`` (the environment),
``node_rejoin`` (what follows each handshake), ``node_stats`` (the counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from macula.client.backoff import Backoff
from macula.client.intent import EventDedup, Key
from macula.client.station_choice import DEFAULT_SETTLE_S, StationChoice, StationInfo, station_list
from macula.config import identity_from_env, known_stations_from_env, mesh_stations_from_env
from macula.errors import (
    BrokenError,
    ClosedError,
    ConfigError,
    HandshakeError,
    MaculaError,
)
from macula.known_stations import KnownStations
from macula.node.direct import DirectDialer
from macula.node.liveness import until_ended
from macula.node.rejoin import present, reannounce
from macula.node.serving import DEFAULT_MAX_IN_FLIGHT, Handler, Server, StreamHandler
from macula.node.session import Session, StreamChannel
from macula.node.stats import NodeStats, first_connect_error
from macula.node.subscriptions import Delivery, LocalSubscriptions, Subscription
from macula.services.content import ContentClient
from macula.services.dht import DhtClient
from macula.stations import StationAddress
from macula.wire.frames import Call, Event, StreamOpen
from macula.wire.identity import Identity

log = logging.getLogger("macula.node.node")

# presents realm endorsements on a new connection; returns the realms it presented
Presenter = Callable[["Node", Session], Awaitable[Iterable[bytes]]]
SLOW_CONSUMER = "slow_consumer"  # the GOODBYE / close reason of a station we did not keep up with
# a station that dies without a word (crash, network gone) is noticed by unanswered pings:
# a QUIC PING after each interval of silence, the connection lost when none of the attempts
# (waited the timeout, then 2x, 4x: 10.5 s in all) is acknowledged (macula.node.liveness)
DEFAULT_PROBE_INTERVAL_S = 1.0  # of silence from the station before a ping
DEFAULT_PROBE_TIMEOUT_S = 1.5
DEFAULT_PROBE_ATTEMPTS = 3


class Node:
    def __init__(
        self,
        identity: Identity,
        stations: str | StationAddress | Sequence[str | StationAddress],
        *,
        connect_timeout: float = 10.0,
        backoff: Backoff | None = None,
        dedup_window: int = 4096,
        known_stations: KnownStations | None = None,
        max_handlers: int = DEFAULT_MAX_IN_FLIGHT,
        settle_s: float = DEFAULT_SETTLE_S,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        probe_attempts: int = DEFAULT_PROBE_ATTEMPTS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        presenter: Presenter | None = None,
    ) -> None:
        self.identity = identity
        self.stations = station_list(stations)
        self.connect_timeout = connect_timeout
        self.backoff = backoff or Backoff()
        self._choice = StationChoice(len(self.stations), self.backoff, settle_s=settle_s)
        if probe_interval_s < 0 or probe_timeout_s < 0 or probe_attempts < 1:
            raise ConfigError("probe_interval_s, probe_timeout_s >= 0 (0: no probe), attempts >= 1")
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.probe_attempts = probe_attempts
        self._clock = clock  # monotonic seconds, for the failover policy
        self._sleep = sleep  # the wait after a round in which every station failed
        self._station_info: StationInfo | None = None
        self._station_listeners: list[Callable[[StationInfo], None]] = []
        self.known_stations = known_stations  # pins of stations given without a node id
        self.stats = NodeStats(EventDedup(dedup_window))
        # what the station refused without an answer on the wire (``on_refusal``, ``total``)
        self.refusals = self.stats.refusals
        self._session: Session | None = None
        self._connected = asyncio.Event()
        self._subscriptions = LocalSubscriptions()
        self._served = Server(self.stats, self._spawn_handler, max_handlers)
        self._seq = 0
        self._listeners: list[Callable[[str], None]] = []
        self._group: asyncio.TaskGroup | None = None
        self._closing = False
        self._terminal: MaculaError | None = None
        self._wake = asyncio.Event()
        self.station_index = 0
        self._was_up = False  # announce "disconnected" once per outage
        self.dht = DhtClient(self, identity)
        self._announced: set[tuple[bytes, str]] = set()
        self._direct = DirectDialer(identity, self, self.dht, self.session, self._spawn_task)
        self._content = ContentClient(self.session)
        self._handlers: set[asyncio.Task[None]] = set()
        self.presenter = presenter  # realm endorsements, presented after each handshake

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Node:
        """A node configured like every macula tool: ``MACULA_MESH_STATIONS`` (comma-separated
        station addresses, required) and the identity ``macula.config.identity_path`` chooses
        (the same as ``macula-mcp``'s; created puzzle-hardened if missing). Stations given
        without a node id are pinned on first use in ``$MACULA_HOME/known_stations``."""
        stations = mesh_stations_from_env(environ)
        kwargs.setdefault("known_stations", known_stations_from_env(environ))
        return cls(identity_from_env(environ), stations, **kwargs)

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        first = asyncio.get_running_loop().create_future()
        self._group.create_task(self._supervise(first))
        try:
            await first
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing = True
        self._wake.set()
        self._connected.clear()
        for session in [self._session, *self._direct.sessions()]:
            if session is not None:
                session.ended.set()
        for task in list(self._handlers):
            task.cancel()  # in-flight handlers end with the node
        self._subscriptions.end_all()
        if self._group is not None:
            group, self._group = self._group, None
            await group.__aexit__(None, None, None)

    def on_state(self, listener: Callable[[str], None]) -> None:
        """``listener("connected" | "reconnected" | "disconnected")`` on every change."""
        self._listeners.append(listener)

    def on_station(self, listener: Callable[[StationInfo], None]) -> None:
        """``listener(info)`` when the node is on a station other than the last one: the first
        connection, and every failover (not a reconnect to the same station)."""
        self._station_listeners.append(listener)

    def _announce(self, state: str) -> None:
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.exception("state listener failed")

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """Own the session: connect, replay intent, wait for it to break, fail over, repeat.
        Which station comes next and how long to wait first is ``StationChoice``'s call."""
        choice = self._choice
        ever_connected = False
        last_error: MaculaError | OSError | None = None
        while not self._closing:
            index = choice.index
            address = dialled = self.stations[index]
            known = self.known_stations
            up = restarted = refused = False
            try:
                dialled = known.pin(address) if known else address
                async with Session.connect(
                    self.identity,
                    dialled,
                    self,
                    timeout=self.connect_timeout,
                    intent=self,
                    dedup=self.stats.dedup,
                ) as session:
                    if known and dialled.node_id is None:
                        tls_key = session.protocol.peer_certificate_key()
                        known.record(address, session.station_key, tls_key)
                    # the core replayed the intent right after the HELLO; this catches what
                    # changed between then and now
                    self._session = session
                    session.sync_intent()
                    up = True
                    info = StationInfo(session.station_key, address, index)
                    self._went_up(session, info, first, ever_connected)
                    ever_connected = True
                    probe = self.probe_interval_s, self.probe_timeout_s
                    acked = self._probe_acknowledged
                    await until_ended(session, *probe, self._group, acked, self.probe_attempts)
                    restarted = session.protocol.reset_by_peer  # the station came back already
                    refused = session.protocol.refused.done()  # ICMP: its process is down
                    # let go at once: leaving the ``with`` waits for QUIC's close to finish
                    self._session = None
                    self._connected.clear()
            except (BrokenError, HandshakeError, OSError) as exc:
                last_error = exc
                refused = isinstance(exc.__cause__ or exc, ConnectionRefusedError)
                if known and isinstance(exc, HandshakeError):
                    last_error = known.refused(address, dialled, exc)
                log.info("station %s unavailable: %s", address, last_error)
            finally:
                self._session = None
                self._connected.clear()
            if self._closing:
                break
            ended = (up, restarted, refused)
            if not await self._went_down(first, ended, ever_connected, last_error):
                return
        self._fail_first(first, ClosedError("node closed"))

    def _went_up(
        self, session: Session, info: StationInfo, first: asyncio.Future[None], again: bool
    ) -> None:
        """The session is up and its intent replayed: note the station, re-announce and
        present in the background, release ``__aenter__`` and tell the state listeners."""
        self._choice.connected(self._clock())
        self._arrived(info)
        if self._announced and self._group is not None:
            self._group.create_task(reannounce(self.dht, self._announced, session.station_key))
        if self.presenter is not None and self._group is not None:
            presented = functools.partial(self.presenter, self, session)
            work = present(presented, session, self._subscriptions, self._served)
            self._group.create_task(work)
        self._connected.set()
        if not first.done():
            first.set_result(None)
        if again:
            self.stats.reconnects += 1
        self._announce("reconnected" if again else "connected")
        self._was_up = True

    async def _went_down(
        self,
        first: asyncio.Future[None],
        ended: tuple[bool, bool, bool],
        ever_connected: bool,
        last_error: MaculaError | OSError | None,
    ) -> bool:
        """The session ended (``ended``: was up, by a stateless reset, by ICMP) or never came
        up: tell listeners, ask ``StationChoice`` what next, wait. False: stop (gave up)."""
        if self._terminal is not None:
            self._fail_first(first, self._terminal)
            self._announce("disconnected")
            return False
        if ever_connected and self._was_up:
            self._announce("disconnected")
        self._was_up = False
        up, restarted, refused = ended
        self.stats.stateless_resets += restarted  # it restarted: there to be dialled again
        self.stats.dials_refused += refused and not up
        step = self._choice.ended(self._clock(), up=up, restarted=restarted, refused=refused)
        self.stats.quick_redials += step.quick
        self.station_index = step.index
        if not ever_connected and step.round_failed:
            unrecoverable = isinstance(last_error, HandshakeError) and not last_error.retryable
            if unrecoverable or step.rounds_failed >= self.backoff.first_connect_attempts:
                self._fail_first(first, first_connect_error(self.stations, last_error))
                return False
        if step.wait_s > 0:
            level = logging.DEBUG if step.quick else logging.INFO  # quick: one per 0.25-0.5 s
            how = "refused" if step.quick else f"failed ({step.rounds_failed} rounds)"
            log.log(level, "every station %s: next try in %.2f s", how, step.wait_s)
            await self._pause(step.wait_s)
        return True

    def _probe_acknowledged(self) -> None:
        self.stats.probes_acknowledged += 1

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (the injected ``sleep``), or less when ``wake`` or closing."""
        if self._closing:
            return
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, woken):
                task.cancel()
            await asyncio.wait({sleeper, woken})

    def _arrived(self, info: StationInfo) -> None:
        """Note the station we are on; tell ``on_station`` listeners when it is another one."""
        previous, self._station_info = self._station_info, info
        if previous is not None and previous.node_id == info.node_id:
            return
        if previous is not None:
            log.info("moved from station %s to %s", previous.endpoint, info.endpoint)
        for listener in self._station_listeners:
            try:
                listener(info)
            except Exception:
                log.exception("station listener failed")

    @staticmethod
    def _fail_first(first: asyncio.Future[None], error: Exception) -> None:
        if not first.done():
            first.set_exception(error)

    # -- SessionOwner ------------------------------------------------------------------------

    def session_broken(self, session: Session, reason: str, terminal: bool) -> None:
        if session is not self._session:
            return
        if terminal:
            self._terminal = ClosedError(f"this identity connected elsewhere: {reason}")
        log.info("session broken: %s", reason)
        slow = SLOW_CONSUMER in reason
        if slow:
            self.stats.slow_consumer += 1
        self._subscriptions.gap_all(slow)
        self.refusals.reconnecting()
        self._connected.clear()
        self._wake.set()

    def event_received(self, session: Session, event: Event) -> None:
        authenticated = event.publisher_sig is not None  # verified (and deduplicated) by the core
        attested_by = None
        if not authenticated:
            self.stats.events_unauthenticated += 1
            attested_by = event.attested_by or session.station_key  # who vouches instead
        self._subscriptions.deliver(
            Delivery(
                event.realm,
                event.topic,
                event.publisher,
                event.seq,
                event.payload,
                authenticated,
                attested_by,
            )
        )

    def call_received(self, session: Session, stream: int, call: Call) -> None:
        if not self._closing:  # a closing node runs no handler (``macula.node.serving``)
            self._served.call_received(session, stream, call)

    def stream_opened(self, session: Session, channel: StreamChannel, opening: StreamOpen) -> None:
        self._served.stream_opened(channel, opening)

    def _spawn_handler(self, work: Coroutine[Any, Any, None]) -> None:
        if self._group is None or self._closing:
            work.close()
            return
        task = self._group.create_task(work)
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def _spawn_task(self, work: Coroutine[Any, Any, None]) -> None:
        """A task of the node's group that is not a handler (``ClosedError`` once closed)."""
        if self._group is None:
            work.close()
            raise ClosedError("node closed")
        self._group.create_task(work)

    # the intent every station we connect to is told (``macula.client.intent.Wanted``): a view of
    # the node's own tables, replayed by the client core after each HELLO
    @property
    def subscriptions(self) -> Iterable[Key]:
        return iter(self._subscriptions)

    @property
    def advertisements(self) -> Iterable[Key]:
        return iter(self._served)

    def _tell(self, say: Callable[[Session], None]) -> None:
        """Tell the station a change of intent now when connected; otherwise the replay after
        the next HELLO carries it."""
        if self._session is not None and self._session.alive:
            with contextlib.suppress(MaculaError):
                say(self._session)

    # -- using the mesh ------------------------------------------------------------------------

    def _live(self) -> Session | None:
        """The live session when there is one and nothing stands in the way (``session``'s
        fast path, without a coroutine per message)."""
        session = self._session
        if self._closing or self._terminal is not None or session is None or not session.alive:
            return None
        return session

    async def session(self, timeout: float | None = None) -> Session:
        """The live session, waiting for a reconnect if one is under way."""
        if self._closing:
            raise ClosedError("node closed")
        if self._terminal is not None:
            raise self._terminal
        session = self._session
        if session is not None and session.alive:
            return session
        started = time.monotonic()
        if session is not None:  # ending: the supervisor lets go of it once it has ended
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.ended.wait(), timeout)
            for _ in range(100):  # it does so a turn or two after ``ended``
                if self._session is not session:
                    break
                await asyncio.sleep(0)
            if timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except TimeoutError:
            raise BrokenError("not connected to any station") from None
        if self._session is None:
            raise BrokenError("not connected to any station")
        return self._session

    async def flush(self, timeout: float = 10.0) -> dict[str, int]:
        """Return once the station has processed every frame this node sent before the call.

        One ``_relay.ping`` round trip on the control stream: the stream is ordered and the
        station handles its frames in order, so its answer comes after every SUBSCRIBE,
        ADVERTISE, UNSUBSCRIBE and PUBLISH sent earlier has taken effect at the station.
        Returns what the station refused on this connection without an in-band answer, by
        reason (``macula.services.refusals``), counted since this connection was made; each
        new one is told to ``refusals.on_refusal`` listeners and added to ``refusals.total``.
        """
        session = await self.session(timeout)
        answer = await session.builtin("_relay.ping", None, timeout)
        return self.refusals.learned(answer, current=session is self._session)

    @property
    def connected(self) -> bool:
        return self._session is not None and self._session.alive

    @property
    def station(self) -> StationAddress | None:
        """The address of the station we are connected to now (as dialled), else None."""
        return self._session.address if self._session else None

    @property
    def station_info(self) -> StationInfo | None:
        """The station we are connected to now (its node id, address, place in the list)."""
        return self._station_info if self.connected else None

    def _next_seq(self) -> int:
        """Unique per publisher across restarts: never below the clock in microseconds."""
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    async def publish(
        self, realm: bytes, topic: str, payload: Any, *, timeout: float = 10.0
    ) -> int:
        """Publish with a fresh ``seq`` and a ``publisher_sig``; returns the seq."""
        session = self._live() or await self.session(timeout)
        seq = self._next_seq()
        session.publish(realm, topic, payload, seq)
        return seq

    async def publish_confirmed(
        self, realm: bytes, topic: str, payload: Any, *, timeout: float = 10.0, attempts: int = 3
    ) -> int:
        """Publish, and return (the seq) once the station has handled the PUBLISH: a
        ``_relay.ping`` on the same connection answers only after every frame sent before it on
        the ordered control stream took effect (see :meth:`flush`). A connection that breaks
        before that answer may have lost the PUBLISH in flight (a station stopped, a path gone):
        it is published again on the next connection, with a fresh seq, up to ``attempts``
        times, so a receiver may see it twice and must dedupe on its own ids (rooms do, by
        ``message_id``). ``BrokenError`` when no attempt was confirmed; ``CallTimeout`` when
        the station took longer than ``timeout`` (the PUBLISH may have taken effect). A refusal
        of it (``macula.services.refusals``) is in ``refusals`` on return."""
        deadline = time.monotonic() + timeout
        broken: BrokenError | None = None
        for _ in range(max(1, attempts)):
            session = await self.session(max(0.001, deadline - time.monotonic()))
            seq = self._next_seq()
            try:
                session.publish(realm, topic, payload, seq)
                answer = await session.builtin(
                    "_relay.ping", None, max(0.001, deadline - time.monotonic())
                )
                self.refusals.learned(answer, current=session is self._session)
                return seq
            except (BrokenError, ClosedError) as error:  # that connection ended: the next one
                broken = BrokenError(str(error))
                if time.monotonic() >= deadline or self._terminal is not None:
                    break
        raise broken or BrokenError("not connected to any station")

    async def subscribe(self, realm: bytes, topic: str, *, buffer: int = 1024) -> Subscription:
        sub = Subscription(realm, topic, buffer, self._unsubscribe)
        if self._subscriptions.add(sub):
            self._tell(lambda session: session.subscribe(realm, topic))
        return sub

    async def _unsubscribe(self, sub: Subscription) -> None:
        if self._subscriptions.discard(sub):
            self._tell(lambda session: session.unsubscribe(sub.realm, sub.topic))

    async def call(
        self,
        realm: bytes,
        procedure: str,
        payload: Any = None,
        *,
        timeout: float = 10.0,
        direct: bool = False,
    ) -> Any:
        """Call a procedure; its result, or ``MeshError``/``CallTimeout``/``BrokenError``.

        ``direct=True`` resolves the station serving ``procedure`` through the DHT
        (procedure_advertisement, then station_endpoint records) and calls it there, pinning
        that station's key; ``ResolveError`` when no such record exists.
        """
        session = None if direct else self._live()
        if session is not None:  # connected: no wait to deduct from the timeout
            return await session.call(realm, procedure, payload, timeout)
        started = time.monotonic()
        session = await (
            self._direct.session(procedure, timeout, self.connect_timeout)
            if direct
            else self.session(timeout)
        )
        remaining = max(0.001, timeout - (time.monotonic() - started))
        return await session.call(realm, procedure, payload, remaining)

    async def advertise(
        self, realm: bytes, procedure: str, handler: Handler, *, announce: bool = False
    ) -> None:
        """Serve ``procedure``: ``handler(IncomingCall)`` (sync or async) returns the result.
        An exception is logged and answered ERROR 0x0F ``handler_error`` without its text;
        ``CallRefused(reason)`` is answered with ``reason`` (``macula.node.serving``). ``announce``
        also stores a signed procedure_advertisement record (renewed on every reconnect) so
        others can resolve this procedure's realm and station and dial it directly."""
        self._served.serve(realm, procedure, handler)
        self._send_advertise(realm, procedure)
        if announce:
            self._announced.add((realm, procedure))
            session = await self.session()
            await self.dht.announce_procedure(realm, procedure, session.station_key)

    async def advertise_stream(self, realm: bytes, procedure: str, handler: StreamHandler) -> None:
        """Serve a streaming procedure: ``await handler(channel, incoming)``; a returned value
        is sent as STREAM_REPLY, ``None`` ends with STREAM_END(both), an exception as
        STREAM_ERROR ``handler_error``."""
        self._served.serve_stream(realm, procedure, handler)
        self._send_advertise(realm, procedure)

    def _send_advertise(self, realm: bytes, procedure: str) -> None:
        """ADVERTISE now (again, even if the station knew it) when connected."""
        self._tell(lambda session: session.advertise(realm, procedure))

    async def unadvertise(self, realm: bytes, procedure: str) -> None:
        self._announced.discard((realm, procedure))
        if self._served.withdraw(realm, procedure):
            self._tell(lambda session: session.unadvertise(realm, procedure))

    async def open_stream(
        self,
        realm: bytes,
        procedure: str,
        args: Any = None,
        *,
        mode: str = "server_stream",
        timeout: float = 30.0,
    ) -> StreamChannel:
        session = await self.session(timeout)
        return session.open_channel(realm, procedure, mode, args, timeout)

    # -- content (§11) ---------------------------------------------------------------------

    async def put_content(self, data: bytes, *, name: str = "unnamed") -> bytes:
        """Store ``data`` at the station by content id; returns the 34-byte MCID."""
        return await self._content.put(data, name=name)

    async def get_content(self, mcid: bytes) -> bytes:
        """Fetch by MCID and verify every byte (block digests, size, Merkle root)."""
        return await self._content.get(mcid)

    def wake(self) -> None:
        """Nudge the supervisor (tests, and callers that know the station is back)."""
        self._wake.set()
