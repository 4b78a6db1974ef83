"""``Node``: one identity on the mesh, one connection, desired state replayed on reconnect.

``async with Node(identity, stations=[...]) as node:`` connects to the first reachable station
of the list and keeps exactly one ``Session`` for this identity. Subscriptions and
advertisements are *intent*: kept here, sent on every (re)connect. When the session breaks the
supervisor reconnects with backoff (``macula.backoff``), failing over along the station list,
replays the intent, then tells listeners ``reconnected``. Closing the node never reconnects,
and no task outlives the ``async with`` (all tasks belong to the node's task group).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from macula.backoff import Backoff
from macula.dht import DhtClient, ResolveError
from macula.errors import (
    BrokenError,
    ClosedError,
    ConfigError,
    HandshakeError,
    MaculaError,
    MeshError,
)
from macula.keyfile import KeyFileError, load_or_create_identity
from macula.session import Session, StreamChannel, now_ms, stamp
from macula.stations import STATIONS_ENV, StationAddress, parse_station, parse_station_list
from macula.wire import content
from macula.wire.codes import ErrorCode
from macula.wire.errors import WireError
from macula.wire.frames import (
    Advertise,
    Call,
    Event,
    Publish,
    StreamOpen,
    Subscribe,
    Unadvertise,
    Unsubscribe,
)
from macula.wire.identity import Identity

log = logging.getLogger("macula.node")

CONTENT_BLOCK_TIMEOUT = 15.0
CONTENT_MANIFEST_TIMEOUT = 5.0
CONTENT_WINDOW = 2  # block CALLs in flight on one content stream (more overflows UDP buffers)

T = TypeVar("T")


async def _windowed(work: list[Coroutine[Any, Any, T]], window: int = CONTENT_WINDOW) -> list[T]:
    """Run ``work`` with at most ``window`` in flight; results in order; first error wins."""
    gate = asyncio.Semaphore(window)

    async def one(item: Coroutine[Any, Any, T]) -> T:
        async with gate:
            return await item

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(item)) for item in work]
    return [task.result() for task in tasks]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event as a subscriber sees it."""

    realm: bytes
    topic: str
    publisher: bytes
    seq: int
    payload: Any
    authenticated: bool  # publisher_sig present and valid (§4.4)


@dataclass(frozen=True, slots=True)
class IncomingCall:
    realm: bytes
    procedure: str
    payload: Any
    caller: bytes
    deadline_ms: int


Handler = Callable[[IncomingCall], Any]
StreamHandler = Callable[[StreamChannel, IncomingCall], Awaitable[Any]]


class Subscription:
    """An async iterator of ``Delivery`` with a bounded buffer.

    When the consumer falls behind by ``buffer`` events, the *oldest* buffered event is
    dropped and counted in ``dropped`` (a warning is logged once per 1000 drops).
    """

    def __init__(self, node: Node, realm: bytes, topic: str, buffer: int) -> None:
        self.node = node
        self.realm = realm
        self.topic = topic
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue(maxsize=buffer)
        self.dropped = 0
        self.delivered = 0
        self.closed = False

    def _offer(self, delivery: Delivery) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning(
                    "subscription %s: consumer too slow, %d events dropped",
                    self.topic,
                    self.dropped,
                )
        self._queue.put_nowait(delivery)
        self.delivered += 1

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Delivery:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return item

    async def next(self, timeout: float | None = None) -> Delivery:
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.node._unsubscribe(self)
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(None)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


@dataclass(slots=True)
class _Served:
    handler: Handler | None = None
    stream_handler: StreamHandler | None = None


@dataclass(slots=True)
class NodeStats:
    reconnects: int = 0
    events_duplicate: int = 0
    events_unauthenticated: int = 0
    calls_served: int = 0
    handler_errors: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def _first_connect_error(
    stations: Sequence[StationAddress], last: MaculaError | OSError | None
) -> MaculaError:
    if isinstance(last, HandshakeError):
        return last
    names = ", ".join(map(str, stations))
    return BrokenError(f"no station reachable: {names} (last error: {last})")


IDENTITY_ENV = "MACULA_MCP_IDENTITY"


def identity_from_env(environ: Mapping[str, str] | None = None) -> Identity:
    """The identity at ``MACULA_MCP_IDENTITY`` (or ``$MACULA_HOME/identity.key``)."""
    env = os.environ if environ is None else environ
    home = Path(env.get("MACULA_HOME") or "~/.macula").expanduser()
    raw = env.get(IDENTITY_ENV)
    if raw is not None and not raw.strip():
        raise ConfigError(f"{IDENTITY_ENV} is set but empty: give the path of a key file")
    path = Path(raw).expanduser() if raw else home / "identity.key"
    try:
        return load_or_create_identity(path)
    except (KeyFileError, OSError) as exc:
        raise ConfigError(f"{IDENTITY_ENV}: {exc}") from None


class Node:
    def __init__(
        self,
        identity: Identity,
        stations: Sequence[str | StationAddress],
        *,
        connect_timeout: float = 10.0,
        backoff: Backoff | None = None,
        dedup_window: int = 4096,
    ) -> None:
        if not stations:
            raise MaculaError("a Node needs at least one station address")
        self.identity = identity
        self.stations = [s if isinstance(s, StationAddress) else parse_station(s) for s in stations]
        self.connect_timeout = connect_timeout
        self.backoff = backoff or Backoff()
        self.stats = NodeStats()
        self._session: Session | None = None
        self._connected = asyncio.Event()
        self._subscriptions: dict[tuple[bytes, str], set[Subscription]] = {}
        self._served: dict[tuple[bytes, str], _Served] = {}
        self._seen: OrderedDict[tuple[bytes, bytes, int], None] = OrderedDict()
        self._dedup_window = dedup_window
        self._seq = 0
        self._listeners: list[Callable[[str], None]] = []
        self._group: asyncio.TaskGroup | None = None
        self._closing = False
        self._terminal: MaculaError | None = None
        self._wake = asyncio.Event()
        self.station_index = 0
        self._was_up = False  # announce "disconnected" once per outage
        self.dht = DhtClient(self)
        self._announced: set[tuple[bytes, str]] = set()
        self._direct: dict[bytes, Session] = {}
        self._direct_lock = asyncio.Lock()
        self._handlers: set[asyncio.Task[None]] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Node:
        """A node configured like every macula tool: ``MACULA_MESH_STATIONS`` (comma-separated
        station addresses, required) and ``MACULA_MCP_IDENTITY`` (key file; default
        ``$MACULA_HOME/identity.key``, created puzzle-hardened if missing)."""
        env = os.environ if environ is None else environ
        stations = parse_station_list(env.get(STATIONS_ENV, ""))
        if not stations:
            raise ConfigError(f"{STATIONS_ENV} is empty: set it to host:port or node_id@host:port")
        return cls(identity_from_env(env), stations, **kwargs)

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
        for session in [self._session, *self._direct.values()]:
            if session is not None:
                session.ended.set()
        for task in list(self._handlers):
            task.cancel()  # in-flight handlers end with the node
        for subs in self._subscriptions.values():
            for sub in subs:
                with contextlib.suppress(asyncio.QueueFull):
                    sub._queue.put_nowait(None)
        if self._group is not None:
            group, self._group = self._group, None
            await group.__aexit__(None, None, None)

    def on_state(self, listener: Callable[[str], None]) -> None:
        """``listener("connected" | "reconnected" | "disconnected")`` on every change."""
        self._listeners.append(listener)

    def _announce(self, state: str) -> None:
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.exception("state listener failed")

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """Own the session: connect, replay intent, wait for it to break, back off, repeat."""
        attempt = 0
        ever_connected = False
        last_error: MaculaError | OSError | None = None
        while not self._closing:
            address = self.stations[self.station_index % len(self.stations)]
            try:
                async with Session.connect(
                    self.identity, address, self, timeout=self.connect_timeout
                ) as session:
                    self._session = session
                    self._replay(session)
                    if self._announced and self._group is not None:
                        self._group.create_task(self._reannounce(session.station_key))
                    attempt = 0
                    self._connected.set()
                    if not first.done():
                        first.set_result(None)
                    if ever_connected:
                        self.stats.reconnects += 1
                    self._announce("reconnected" if ever_connected else "connected")
                    self._was_up = True
                    ever_connected = True
                    await session.ended.wait()
            except (BrokenError, HandshakeError, OSError) as exc:
                last_error = exc
                log.info("station %s unavailable: %s", address, exc)
            finally:
                self._session = None
                self._connected.clear()
            if self._closing:
                break
            if self._terminal is not None:
                self._fail_first(first, self._terminal)
                self._announce("disconnected")
                return
            if ever_connected and self._was_up:
                self._announce("disconnected")
            self._was_up = False
            self.station_index += 1
            if not ever_connected:
                if self.station_index % len(self.stations) != 0:
                    continue  # first pass: try every station once before waiting
                unrecoverable = isinstance(last_error, HandshakeError) and not last_error.retryable
                if unrecoverable or attempt + 1 >= self.backoff.first_connect_attempts:
                    self._fail_first(first, _first_connect_error(self.stations, last_error))
                    return
            delay = self.backoff.delay(attempt)
            attempt += 1
            if self._closing:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
        if not first.done():
            first.set_exception(ClosedError("node closed"))

    @staticmethod
    def _fail_first(first: asyncio.Future[None], error: Exception) -> None:
        if not first.done():
            first.set_exception(error)

    async def _reannounce(self, station_key: bytes) -> None:
        for realm, procedure in list(self._announced):
            try:
                await self.dht.announce_procedure(realm, procedure, station_key)
            except MaculaError as exc:
                log.warning("could not re-announce %s: %s", procedure, exc)

    def _replay(self, session: Session) -> None:
        for realm, topic in self._subscriptions:
            session.send_control(
                Subscribe(**stamp(), topic=topic, realm=realm, subscriber=self.identity.node_id)
            )
        for realm, procedure in self._served:
            session.send_control(
                Advertise(
                    **stamp(), realm=realm, procedure=procedure, advertiser=self.identity.node_id
                )
            )

    # -- SessionOwner ------------------------------------------------------------------------

    def session_broken(self, session: Session, reason: str, terminal: bool) -> None:
        if session is not self._session:
            return
        if terminal:
            self._terminal = ClosedError(f"this identity connected elsewhere: {reason}")
        log.info("session broken: %s", reason)
        self._connected.clear()
        self._wake.set()

    def event_received(self, session: Session, event: Event) -> None:
        key = (event.realm, event.publisher, event.seq)
        if key in self._seen:
            self.stats.events_duplicate += 1
            return
        self._seen[key] = None
        if len(self._seen) > self._dedup_window:
            self._seen.popitem(last=False)
        authenticated = event.publisher_sig is not None  # verified by the session
        if not authenticated:
            self.stats.events_unauthenticated += 1
        delivery = Delivery(
            event.realm, event.topic, event.publisher, event.seq, event.payload, authenticated
        )
        for sub in self._subscriptions.get((event.realm, event.topic), ()):
            sub._offer(delivery)

    def call_received(self, session: Session, stream: int, call: Call) -> None:
        served = self._served.get((call.realm, call.procedure))
        if served is None or served.handler is None:
            session.reply_error(stream, call, ErrorCode.UNKNOWN_NEXT_PEER, None)
            return
        self._spawn_handler(self._serve_call(session, stream, call, served.handler))

    def stream_opened(self, session: Session, channel: StreamChannel, opening: StreamOpen) -> None:
        served = self._served.get((opening.realm, opening.procedure))
        if served is None or served.stream_handler is None or self._group is None:
            channel.fail("not_found", f"{opening.procedure} is not served here")
            return
        incoming = IncomingCall(
            opening.realm, opening.procedure, opening.args, opening.caller, opening.deadline_ms
        )
        self._spawn_handler(self._serve_stream(channel, incoming, served.stream_handler))

    def _spawn_handler(self, work: Coroutine[Any, Any, None]) -> None:
        if self._group is None or self._closing:
            work.close()
            return
        task = self._group.create_task(work)
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _serve_call(
        self, session: Session, stream: int, call: Call, handler: Handler
    ) -> None:
        incoming = IncomingCall(
            call.realm, call.procedure, call.payload, call.caller, call.deadline_ms
        )
        try:
            result = handler(incoming)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            self.stats.handler_errors += 1
            self._answer_error(session, stream, call, str(exc) or type(exc).__name__)
            return
        self.stats.calls_served += 1
        self._answer(session, stream, call, result)

    @staticmethod
    def _answer(session: Session, stream: int, call: Call, result: Any) -> None:
        """Send a RESULT; a lost session is logged, an unencodable result becomes ERROR 0x0F."""
        try:
            session.reply(stream, call, result)
        except MaculaError as exc:
            log.info("reply not sent: %s", exc)
        except WireError as exc:
            log.warning("handler result not encodable: %s", exc)
            Node._answer_error(session, stream, call, f"result not encodable: {exc.detail}")

    @staticmethod
    def _answer_error(session: Session, stream: int, call: Call, detail: str) -> None:
        try:
            session.reply_error(stream, call, ErrorCode.UNKNOWN_ERROR, detail)
        except (MaculaError, WireError) as exc:
            log.info("error reply not sent: %s", exc)

    async def _serve_stream(
        self, channel: StreamChannel, incoming: IncomingCall, handler: StreamHandler
    ) -> None:
        try:
            result = await handler(channel, incoming)
            if not channel.closed:
                if result is None:
                    channel.end("both")
                else:
                    channel.send_reply(result)
        except Exception as exc:
            with contextlib.suppress(MaculaError, WireError):
                if not channel.closed:
                    channel.fail("handler_error", str(exc) or type(exc).__name__)

    # -- using the mesh ------------------------------------------------------------------------

    async def session(self, timeout: float | None = None) -> Session:
        """The live session, waiting for a reconnect if one is under way."""
        if self._closing:
            raise ClosedError("node closed")
        if self._terminal is not None:
            raise self._terminal
        session = self._session
        if session is not None and session.alive:
            return session
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except TimeoutError:
            raise BrokenError("not connected to any station") from None
        if self._session is None:
            raise BrokenError("not connected to any station")
        return self._session

    async def flush(self, timeout: float = 10.0) -> None:
        """Return once the station has processed every frame this node sent before the call.

        One ``_relay.ping`` round trip on the control stream: the stream is ordered and the
        station handles its frames in order, so its answer comes after every SUBSCRIBE,
        ADVERTISE, UNSUBSCRIBE and PUBLISH sent earlier has taken effect at the station.
        """
        session = await self.session(timeout)
        await session.builtin("_relay.ping", None, timeout)

    @property
    def connected(self) -> bool:
        return self._session is not None and self._session.alive

    @property
    def station(self) -> StationAddress | None:
        return self._session.address if self._session else None

    def _next_seq(self) -> int:
        """Unique per publisher across restarts: never below the clock in microseconds."""
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    async def publish(
        self, realm: bytes, topic: str, payload: Any, *, timeout: float = 10.0
    ) -> int:
        """Publish with a fresh ``seq`` and a ``publisher_sig``; returns the seq."""
        session = await self.session(timeout)
        frame = Publish(
            **stamp(),
            topic=topic,
            realm=realm,
            publisher=self.identity.node_id,
            seq=self._next_seq(),
            payload=payload,
            published_at_ms=now_ms(),
        )
        session.send_control(frame.with_publisher_sig(self.identity))
        return frame.seq

    async def subscribe(self, realm: bytes, topic: str, *, buffer: int = 1024) -> Subscription:
        sub = Subscription(self, realm, topic, buffer)
        key = (realm, topic)
        first = key not in self._subscriptions
        self._subscriptions.setdefault(key, set()).add(sub)
        if first and self._session is not None and self._session.alive:
            with contextlib.suppress(MaculaError):
                self._session.send_control(
                    Subscribe(**stamp(), topic=topic, realm=realm, subscriber=self.identity.node_id)
                )
        return sub

    async def _unsubscribe(self, sub: Subscription) -> None:
        key = (sub.realm, sub.topic)
        subs = self._subscriptions.get(key)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subscriptions[key]
            if self._session is not None and self._session.alive:
                with contextlib.suppress(MaculaError):
                    self._session.send_control(
                        Unsubscribe(
                            **stamp(),
                            topic=sub.topic,
                            realm=sub.realm,
                            subscriber=self.identity.node_id,
                        )
                    )

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
        started = time.monotonic()
        session = await (
            self._direct_session(procedure, timeout) if direct else self.session(timeout)
        )
        remaining = max(0.001, timeout - (time.monotonic() - started))
        return await session.call(realm, procedure, payload, remaining)

    async def _direct_session(self, procedure: str, timeout: float) -> Session:
        records = await self.dht.procedure_records(procedure)
        stations = [r.payload.get("serving_station") for r in records]
        serving = next((s for s in stations if type(s) is bytes and len(s) == 32), None)
        if serving is None:
            raise ResolveError(
                f"no procedure_advertisement record names a station for {procedure!r}"
            )
        home = await self.session(timeout)
        if serving == home.station_key:
            return home
        async with self._direct_lock:
            cached = self._direct.get(serving)
            if cached is not None and cached.alive:
                return cached
            address = await self.dht.resolve_station(serving)
            ready: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
            if self._group is None:
                raise ClosedError("node closed")
            self._group.create_task(self._hold_direct(address, ready))
            session = await ready
            self._direct[serving] = session
            return session

    async def _hold_direct(self, address: StationAddress, ready: asyncio.Future[Session]) -> None:
        """Keep a pinned connection to another station open while the node lives."""
        try:
            async with Session.connect(
                self.identity, address, self, timeout=self.connect_timeout
            ) as session:
                ready.set_result(session)
                await session.ended.wait()
        except MaculaError as exc:
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if address.node_id is not None:
                self._direct.pop(address.node_id, None)

    async def advertise(
        self, realm: bytes, procedure: str, handler: Handler, *, announce: bool = False
    ) -> None:
        """Serve ``procedure``: ``handler(IncomingCall)`` (sync or async) returns the result;
        an exception becomes ERROR 0x0F with its message. ``announce`` also stores a signed
        procedure_advertisement record (renewed on every reconnect) so others can resolve
        this procedure's realm and station and dial it directly."""
        self._served[(realm, procedure)] = _Served(handler=handler)
        self._send_advertise(realm, procedure)
        if announce:
            self._announced.add((realm, procedure))
            session = await self.session()
            await self.dht.announce_procedure(realm, procedure, session.station_key)

    async def advertise_stream(self, realm: bytes, procedure: str, handler: StreamHandler) -> None:
        """Serve a streaming procedure: ``await handler(channel, incoming)``; a returned value
        is sent as STREAM_REPLY, ``None`` ends with STREAM_END(both), an exception as
        STREAM_ERROR ``handler_error``."""
        self._served[(realm, procedure)] = _Served(stream_handler=handler)
        self._send_advertise(realm, procedure)

    def _send_advertise(self, realm: bytes, procedure: str) -> None:
        if self._session is not None and self._session.alive:
            with contextlib.suppress(MaculaError):
                self._session.send_control(
                    Advertise(
                        **stamp(),
                        realm=realm,
                        procedure=procedure,
                        advertiser=self.identity.node_id,
                    )
                )

    async def unadvertise(self, realm: bytes, procedure: str) -> None:
        self._announced.discard((realm, procedure))
        if self._served.pop((realm, procedure), None) is None:
            return
        if self._session is not None and self._session.alive:
            with contextlib.suppress(MaculaError):
                self._session.send_control(
                    Unadvertise(
                        **stamp(),
                        realm=realm,
                        procedure=procedure,
                        advertiser=self.identity.node_id,
                    )
                )

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
        """Store ``data`` at the station by content id; returns the 34-byte MCID.

        Blocks go out on one dedicated stream with up to ``CONTENT_WINDOW`` CALLs in flight
        (the station answers each by ``call_id``, §1.3); the manifest follows the last block.
        """
        plan = content.plan_put(data, name, created=int(time.time()))
        session = await self.session(CONTENT_BLOCK_TIMEOUT)
        async with session.content_stream() as stream:

            async def put(mcid: content.Mcid, block: memoryview) -> None:
                args = {"mcid": mcid.to_bytes(), "payload": bytes(block)}
                answer = await session.builtin(
                    "_content.put_block", args, CONTENT_BLOCK_TIMEOUT, stream=stream
                )
                if answer != "ok":
                    raise MeshError(ErrorCode.UNKNOWN_ERROR, f"put_block answered {answer!r}")

            await _windowed([put(mcid, block) for mcid, block in plan.blocks])
            if plan.manifest is not None:
                answer = await session.builtin(
                    "_content.put_manifest",
                    {"manifest": plan.manifest.to_wire()},
                    CONTENT_MANIFEST_TIMEOUT,
                    stream=stream,
                )
                if answer != "ok":
                    raise MeshError(ErrorCode.UNKNOWN_ERROR, f"put_manifest answered {answer!r}")
        return plan.mcid.to_bytes()

    async def get_content(self, mcid: bytes) -> bytes:
        """Fetch by MCID and verify every byte (block digests, size, Merkle root)."""
        wanted = content.Mcid.from_bytes(mcid)
        session = await self.session(CONTENT_BLOCK_TIMEOUT)
        async with session.content_stream() as stream:
            if not wanted.is_manifest:
                block = await self._get_block(session, stream, wanted)
                content.verify_block(wanted, block)
                return block
            answer = await session.builtin(
                "_content.get_manifest", {"mcid": mcid}, CONTENT_MANIFEST_TIMEOUT, stream=stream
            )
            if answer == "not_found":
                raise MeshError(ErrorCode.UNKNOWN_ERROR, "not_found: no such manifest here")
            manifest = content.Manifest.from_wire(answer)
            manifest.verify(wanted)
            blocks = await _windowed(
                [self._get_block(session, stream, info.mcid) for info in manifest.chunks]
            )
            return content.assemble(manifest, blocks)

    async def _get_block(self, session: Session, stream: int, mcid: content.Mcid) -> bytes:
        answer = await session.builtin(
            "_content.get_block", {"mcid": mcid.to_bytes()}, CONTENT_BLOCK_TIMEOUT, stream=stream
        )
        if answer == "not_found" or type(answer) is not bytes:
            raise MeshError(ErrorCode.UNKNOWN_ERROR, f"not_found: block {mcid.hex()[:20]}…")
        return answer

    def wake(self) -> None:
        """Nudge the supervisor (tests, and callers that know the station is back)."""
        self._wake.set()
