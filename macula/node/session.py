"""One handshaken connection from one identity to one station: the I/O shell of ``ClientCore``.

``Session`` is to ``macula.client.core.ClientCore`` what ``relay.station.station`` is to
``relay.core.router.RouterCore``: it moves bytes between the QUIC connection
(``macula.quic.transport``) and
the core, reads the clock, keeps one timer for call deadlines, and turns the core's outputs into
asyncio futures (calls, the handshake), queue items (streaming channels) and calls on its owner
(the ``Node``). Every protocol decision — handshake, verification, call matching, deadlines,
intent replay, duplicate suppression — is the core's. A session does no reconnecting: when the
connection breaks it fails what is pending with ``BrokenError`` and tells its owner once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any, Protocol

from macula.client.channels import ChannelState
from macula.client.core import ClientCore
from macula.client.events import (
    CallArrived,
    CallSettled,
    ChannelData,
    ChannelFinished,
    ChannelOpened,
    Ended,
    Established,
    EventArrived,
    HandshakeFailed,
    Output,
    Transmit,
)
from macula.client.intent import EventDedup, Intent, Wanted
from macula.clock import MsClock, now_ms
from macula.errors import BrokenError, CallTimeout, HandshakeError, MaculaError, MeshError
from macula.quic.transport import FrameProtocol, client_configuration, dial
from macula.stations import StationAddress
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError, WireError
from macula.wire.frames import Call, Event, Goodbye, StreamOpen
from macula.wire.identity import ZERO_REALM, Identity

log = logging.getLogger("macula.node.session")

__all__ = ["Session", "SessionOwner", "StreamChannel"]


class SessionOwner(Protocol):
    """What a session reports upward (implemented by ``Node``)."""

    def event_received(self, session: Session, event: Event) -> None: ...

    def call_received(self, session: Session, stream: int, call: Call) -> None: ...

    def stream_opened(
        self, session: Session, channel: StreamChannel, opening: StreamOpen
    ) -> None: ...

    def session_broken(self, session: Session, reason: str, terminal: bool) -> None: ...


_END = object()


class StreamChannel:
    """One streaming-RPC session on a dedicated stream (§8), seen from either side."""

    MAX_BUFFERED = 1024  # bodies held for a reader; one more fails the stream ("overflow")

    def __init__(self, session: Session, state: ChannelState) -> None:
        self.session = session
        self.state = state
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()  # bodies (bounded by _put), then _END
        self._failure: tuple[str, str] | None = None  # ours: the reader did not keep up

    quic_stream = property(lambda self: self.state.stream)
    stream_id = property(lambda self: self.state.stream_id)
    reply = property(lambda self: self.state.reply)
    replied = property(lambda self: self.state.replied)
    error = property(lambda self: self._failure or self.state.error)
    peer_finished = property(lambda self: self.state.peer_finished)
    finished = property(lambda self: self.state.finished)
    closed = property(lambda self: self.state.closed)

    # sending
    def send(self, body: Any, *, encoding: str = "raw") -> None:
        core = self.session.core
        self.session.run(core.channel_send(self.state, body, encoding, self.session.clock()))

    def end(self, role: str = "send") -> None:
        """STREAM_END: ``send`` finishes our direction, ``both`` ends the session."""
        self.session.run(self.session.core.channel_end(self.state, role, self.session.clock()))

    def fail(self, code: str, message: str) -> None:
        core = self.session.core
        self.session.run(core.channel_fail(self.state, code, message, self.session.clock()))

    def send_reply(self, payload: Any) -> None:
        core = self.session.core
        self.session.run(core.channel_reply(self.state, payload, self.session.clock()))

    # receiving (fed by the session from the core's outputs)
    def _put(self, item: Any) -> None:
        """Queue a body or the end. A body past ``MAX_BUFFERED`` unread ones fails the stream
        instead of being dropped: the peer gets STREAM_ERROR ``overflow``, nothing more is
        accepted, and the reader gets what was buffered, then a ``MeshError``."""
        if self._failure is not None:
            return
        if item is not _END and self._inbox.qsize() >= self.MAX_BUFFERED:
            self._failure = ("overflow", "receiver too slow")
            log.info("stream %s: receiver too slow, stream failed", self.stream_id.hex()[:8])
            if not self.closed:
                with contextlib.suppress(MaculaError, WireError):
                    self.fail(*self._failure)
            item = _END
        self._inbox.put_nowait(item)

    async def receive(self) -> Any:
        """Next body; ``StopAsyncIteration`` at the end, ``MeshError`` on a STREAM_ERROR."""
        item = await self._inbox.get()
        if item is _END:
            self._inbox.put_nowait(_END)  # stay at the end for later readers
            if self.error is not None:
                raise MeshError(ErrorCode.UNKNOWN_ERROR, f"{self.error[0]}: {self.error[1]}")
            raise StopAsyncIteration
        return item

    def __aiter__(self) -> StreamChannel:
        return self

    async def __anext__(self) -> Any:
        return await self.receive()

    async def wait_reply(self, timeout: float) -> Any:
        """Drain until the provider's STREAM_REPLY (or END) and return the reply payload."""

        async def drain() -> None:
            async for _ in self:
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except TimeoutError:
            raise CallTimeout(f"no stream reply within {timeout:g} s") from None
        return self.reply


class Session:
    def __init__(
        self,
        identity: Identity,
        address: StationAddress,
        protocol: FrameProtocol,
        owner: SessionOwner,
        *,
        intent: Wanted | None = None,
        dedup: EventDedup | None = None,
        clock: MsClock = now_ms,
    ) -> None:
        self.identity = identity
        self.address = address
        self.protocol = protocol
        self.owner = owner
        self.clock = clock
        self.core = ClientCore(
            identity,
            os.urandom,
            intent=intent or Intent(),
            dedup=dedup or EventDedup(),
            control=protocol.new_stream(),
            pinned=address.node_id,
        )
        self.ended = asyncio.Event()  # set once: broken, closed, or released by the owner
        self._hello: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._hello.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen
        self._waiters: dict[bytes, asyncio.Future[Any]] = {}
        self._channels: dict[int, StreamChannel] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self.heard_ms = clock()  # when the station last sent us anything (``Node``'s probe)
        # realms whose endorsements a caller presented on this connection
        # (tools.groups.realm_access)
        self.presented: set[bytes] = set()

    # -- what the core knows ----------------------------------------------------------------

    @property
    def control(self) -> int:
        return self.core.control

    @property
    def station_key(self) -> bytes:
        return self.core.station_key

    @property
    def tls_pinned(self) -> bool:
        return self.core.tls_pinned

    @property
    def goodbye(self) -> Goodbye | None:
        return self.core.goodbye

    @property
    def dropped(self) -> dict[str, int]:
        return dict(self.core.dropped)

    @property
    def alive(self) -> bool:
        return self.core.alive and not self.protocol.lost

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        identity: Identity,
        address: StationAddress,
        owner: SessionOwner,
        *,
        timeout: float = 10.0,
        intent: Wanted | None = None,
        dedup: EventDedup | None = None,
    ) -> AsyncIterator[Session]:
        """Dial, check the pinned key, handshake; the connection closes when the block ends,
        whatever step failed (nothing opened here outlives the block)."""
        configuration = client_configuration(server_name=address.host)
        async with contextlib.AsyncExitStack() as stack:
            try:
                protocol = await stack.enter_async_context(
                    dial(address.host, address.port, configuration, timeout=timeout)
                )
            except (OSError, TimeoutError, ConnectionError) as exc:
                raise BrokenError(
                    f"cannot reach station {address}: {exc or type(exc).__name__}"
                ) from exc
            session = cls(identity, address, protocol, owner, intent=intent, dedup=dedup)
            stack.callback(session.close)
            protocol.sink = session
            if address.node_id is not None:
                key = protocol.peer_certificate_key()
                if key != address.node_id:
                    raise HandshakeError(
                        f"station {address} presented certificate key "
                        f"{key.hex() if key else 'none'}, expected {address.node_id.hex()}",
                        retryable=False,
                    )
                session.core.tls_pinned = True
            await session._handshake(timeout)
            yield session

    async def _handshake(self, timeout: float) -> None:
        self.run(self.core.connect(self.clock()))
        try:
            await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except TimeoutError:
            raise BrokenError(
                f"station {self.address} sent no HELLO within {timeout:g} s"
            ) from None
        except HandshakeError as exc:
            raise HandshakeError(
                f"station {self.address}: {exc}", exc.refusal_code, retryable=exc.retryable
            ) from None
        except BrokenError as exc:
            raise BrokenError(f"station {self.address}: {exc}") from None

    def close(self) -> None:
        """We end the session: what is pending fails with ``ClosedError``."""
        self.run(self.core.close())

    # -- the core's outputs -------------------------------------------------------------------

    def run(self, outputs: list[Output]) -> None:
        for output in outputs:
            if isinstance(output, Transmit):
                self.protocol.send(output.stream, output.data)
            elif isinstance(output, EventArrived):
                self.owner.event_received(self, output.event)
            elif isinstance(output, CallSettled):
                self._settle(output)
            elif isinstance(output, CallArrived):
                self.owner.call_received(self, output.stream, output.call)
            elif isinstance(output, (ChannelData, ChannelFinished)):
                self._to_channel(output)
            elif isinstance(output, ChannelOpened):
                state = self.core.channel(output.stream)
                if state is not None:
                    channel = self._channels[output.stream] = StreamChannel(self, state)
                    self.owner.stream_opened(self, channel, output.opening)
            elif isinstance(output, Established):
                if not self._hello.done():
                    self._hello.set_result(output.station_key)
            elif isinstance(output, HandshakeFailed):
                if not self._hello.done():
                    self._hello.set_exception(output.error)
            elif isinstance(output, Ended):
                self._ended(output)

    def _settle(self, settled: CallSettled) -> None:
        future = self._waiters.pop(settled.call_id, None)
        if future is None or future.done():
            return
        if settled.error is not None:
            future.set_exception(settled.error)
        else:
            future.set_result(settled.payload)

    def _to_channel(self, output: ChannelData | ChannelFinished) -> None:
        channel = self._channels.get(output.stream)
        if channel is None:
            return
        if isinstance(output, ChannelData):
            channel._put(output.body)
        else:
            channel._put(_END)
            if self.core.channel(output.stream) is None:
                self._channels.pop(output.stream, None)

    def _ended(self, ended: Ended) -> None:
        self.ended.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not ended.closed:
            self.owner.session_broken(self, ended.reason, ended.terminal)

    def _arm_timer(self, due: int | None) -> None:
        """One timer, never later than the earliest call deadline the core holds. It moves only
        earlier (a new call with a nearer deadline); a settled call leaves it armed, and when it
        fires ``_tick`` re-arms it at the earliest deadline still pending, if any: no timer is
        made or cancelled per call."""
        if due is None or not self.core.alive:
            return
        if self._timer_at is not None and self._timer_at <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        delay = max(0.0, (due - self.clock()) / 1000)
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer, self._timer_at = None, None
        self.run(self.core.tick(self.clock()))
        self._arm_timer(self.core.next_deadline())

    # -- sending ------------------------------------------------------------------------------

    def subscribe(self, realm: bytes, topic: str) -> None:
        self.run(self.core.subscribe(realm, topic, self.clock()))

    def unsubscribe(self, realm: bytes, topic: str) -> None:
        self.run(self.core.unsubscribe(realm, topic, self.clock()))

    def advertise(self, realm: bytes, procedure: str) -> None:
        self.run(self.core.advertise(realm, procedure, self.clock()))

    def unadvertise(self, realm: bytes, procedure: str) -> None:
        self.run(self.core.unadvertise(realm, procedure, self.clock()))

    def sync_intent(self) -> None:
        """Tell the station what the intent gained or lost since it was last told."""
        self.run(self.core.sync_intent(self.clock()))

    def publish(self, realm: bytes, topic: str, payload: Any, seq: int) -> None:
        self.run(self.core.publish(realm, topic, payload, seq, self.clock()))

    async def call(
        self,
        realm: bytes,
        procedure: str,
        payload: Any,
        timeout: float,
        *,
        stream: int | None = None,
        deadline_ms: int | None = None,
    ) -> Any:
        """CALL and wait for its answer; ``CallTimeout`` after ``timeout`` seconds.
        ``deadline_ms`` overrides the deadline written in the frame (not the local wait)."""
        now = self.clock()
        expires = now + int(timeout * 1000)
        call_id, out = self.core.call(
            realm,
            procedure,
            payload,
            expires if deadline_ms is None else deadline_ms,
            now,
            stream=stream,
            expires_ms=expires,
        )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = future
        self.run(out)
        self._arm_timer(expires)
        try:
            return await future
        except CallTimeout:
            raise CallTimeout(f"{procedure}: no answer within {timeout:g} s") from None
        finally:
            if self._waiters.pop(call_id, None) is not None:
                self.core.forget_call(call_id)  # cancelled: a late answer is ignored

    @contextlib.asynccontextmanager
    async def content_stream(self) -> AsyncIterator[int]:
        """A dedicated stream for a sequence of built-in CALLs (§6.3); FIN when done."""
        stream = self.protocol.new_stream()
        self.core.open_content(stream)
        try:
            yield stream
        finally:
            self.core.close_content(stream)
            if self.alive:
                self.protocol.end_stream(stream)

    async def builtin(
        self, procedure: str, payload: Any, timeout: float, *, stream: int | None = None
    ) -> Any:
        return await self.call(ZERO_REALM, procedure, payload, timeout, stream=stream)

    def open_channel(
        self, realm: bytes, procedure: str, mode: str, args: Any, timeout: float
    ) -> StreamChannel:
        stream = self.protocol.new_stream()
        now = self.clock()
        state, out = self.core.open_channel(
            stream, realm, procedure, mode, args, now + int(timeout * 1000), now
        )
        channel = self._channels[stream] = StreamChannel(self, state)
        self.run(out)
        return channel

    def reply(self, stream: int, call: Call, payload: Any) -> None:
        self.run(self.core.reply(stream, call, payload, self.clock()))

    def reply_error(self, stream: int, call: Call, code: int, detail: str | None) -> None:
        self.run(self.core.reply_error(stream, call, code, detail, self.clock()))

    # -- receiving (FrameSink) --------------------------------------------------------------

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        self.heard_ms = self.clock()
        self.run(self.core.frames_received(stream_id, frames, self.heard_ms))

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.run(self.core.framing_failed(stream_id, error))
        self.protocol.close_connection("framing error")

    def stream_ended(self, stream_id: int) -> None:
        self.run(self.core.stream_ended(stream_id))
        self._channels.pop(stream_id, None)

    def stream_reset(self, stream_id: int) -> None:
        self.run(self.core.stream_reset(stream_id))
        self._channels.pop(stream_id, None)

    def connection_lost(self, reason: str) -> None:
        self.run(self.core.connection_lost(reason))
