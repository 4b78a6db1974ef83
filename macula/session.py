"""One handshaken connection from one identity to one station (PROTOCOL.md §5-§8).

A ``Session`` owns one QUIC connection: the control stream (CONNECT/HELLO, CALL/RESULT/ERROR,
PUBLISH/EVENT, ...) plus any number of dedicated streams (content calls, streaming RPC). It does
no reconnecting: when the connection breaks it fails what is pending with ``BrokenError`` and
tells its owner (the ``Node``) once. Every frame received is verified before use (§4.3): HELLO
against the pinned key when there is one, EVENTs against the station key and their
``publisher_sig``, replies against their responder, CALLs against their caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from macula.errors import BrokenError, CallTimeout, ClosedError, HandshakeError, MeshError
from macula.stations import StationAddress
from macula.transport import FrameProtocol, client_configuration, dial
from macula.wire.codes import ErrorCode, code_name
from macula.wire.errors import FramingError, ProtocolError
from macula.wire.frames import (
    Call,
    Connect,
    Error,
    Event,
    Frame,
    Goodbye,
    Hello,
    Result,
    StreamData,
    StreamEnd,
    StreamError,
    StreamOpen,
    StreamReply,
    UnknownFrameType,
    new_frame_id,
    parse_frame,
)
from macula.wire.identity import ZERO_REALM, Identity

log = logging.getLogger("macula.session")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def stamp() -> dict[str, Any]:
    now = now_ms()
    return {"frame_id": new_frame_id(now, os.urandom(10)), "sent_at_ms": now}


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

    def __init__(self, session: Session, quic_stream: int, stream_id: bytes) -> None:
        self.session = session
        self.quic_stream = quic_stream
        self.stream_id = stream_id
        self._inbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=1024)
        self._seq = 0
        self.reply: Any = None
        self.replied = False
        self.error: tuple[str, str] | None = None
        self.peer_finished = False
        self.finished = False  # we sent STREAM_END(send)
        self.closed = False

    # sending
    def send(self, body: Any, *, encoding: str = "raw") -> None:
        frame = StreamData(
            **stamp(),
            stream_id=self.stream_id,
            seq=self._seq,
            encoding=encoding,
            body=body,
            signer=self.session.identity.node_id,
        )
        self._seq += 1
        self.session.send(self.quic_stream, frame)

    def end(self, role: str = "send") -> None:
        """STREAM_END: ``send`` finishes our direction, ``both`` ends the session."""
        frame = StreamEnd(
            **stamp(), stream_id=self.stream_id, role=role, signer=self.session.identity.node_id
        )
        self.session.send(self.quic_stream, frame)
        self.finished = True
        if role == "both" or self.peer_finished:
            self.closed = True

    def fail(self, code: str, message: str) -> None:
        self.session.send(
            self.quic_stream,
            StreamError(
                **stamp(),
                stream_id=self.stream_id,
                code=code.encode(),
                message=message.encode(),
                signer=self.session.identity.node_id,
            ),
        )
        self.closed = True

    def send_reply(self, payload: Any) -> None:
        self.session.send(
            self.quic_stream,
            StreamReply(
                **stamp(),
                stream_id=self.stream_id,
                payload=payload,
                responded_by=self.session.identity.node_id,
            ),
        )
        self.closed = True

    # receiving
    def deliver(self, frame: Frame) -> None:
        if isinstance(frame, StreamData):
            self._put(frame.body)
        elif isinstance(frame, StreamEnd):
            self.peer_finished = True
            self.closed = self.closed or frame.role == "both" or self.finished
            self._put(_END)
        elif isinstance(frame, StreamReply):
            self.reply, self.replied, self.closed = frame.payload, True, True
            self._put(_END)
        elif isinstance(frame, StreamError):
            self.error = (
                frame.code.decode("utf-8", "replace"),
                frame.message.decode("utf-8", "replace"),
            )
            self.closed = True
            self._put(_END)

    def lost(self, reason: str) -> None:
        if not self.closed:
            self.error = ("unavailable", reason)
            self.closed = True
            self._put(_END)

    def _put(self, item: Any) -> None:
        try:
            self._inbox.put_nowait(item)
        except asyncio.QueueFull:
            log.warning("stream %s: receiver too slow, frame dropped", self.stream_id.hex()[:8])

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


@dataclass(slots=True)
class _ContentStream:
    waiters: dict[bytes, asyncio.Future[Any]]


class Session:
    def __init__(
        self,
        identity: Identity,
        address: StationAddress,
        protocol: FrameProtocol,
        owner: SessionOwner,
    ) -> None:
        self.identity = identity
        self.address = address
        self.protocol = protocol
        self.owner = owner
        self.station_key: bytes = b""
        self.control = protocol.new_stream()
        self._hello: asyncio.Future[Hello] | None = None
        self._calls: dict[bytes, asyncio.Future[Any]] = {}
        self._content: dict[int, _ContentStream] = {}
        self._channels: dict[int, StreamChannel] = {}
        self._closed = False
        self._broken: str | None = None
        self.ended = asyncio.Event()  # set once: broken, closed, or released by the owner
        self.goodbye: Goodbye | None = None
        self.tls_pinned = False  # the TLS certificate key was checked against the station id
        self.dropped: dict[str, int] = {}

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
    ) -> AsyncIterator[Session]:
        configuration = client_configuration(server_name=address.host)
        try:
            connecting = dial(address.host, address.port, configuration, timeout=timeout)
            protocol = await connecting.__aenter__()
        except (OSError, TimeoutError, ConnectionError) as exc:
            raise BrokenError(
                f"cannot reach station {address}: {exc or type(exc).__name__}"
            ) from exc
        try:
            session = cls(identity, address, protocol, owner)
            protocol.sink = session
            if address.node_id is not None:
                key = protocol.peer_certificate_key()
                if key != address.node_id:
                    raise HandshakeError(
                        f"station {address} presented certificate key "
                        f"{key.hex() if key else 'none'}, expected {address.node_id.hex()}",
                        retryable=False,
                    )
                session.tls_pinned = True
            await session._handshake(timeout)
            try:
                yield session
            finally:
                session._close()
        finally:
            await connecting.__aexit__(None, None, None)

    async def _handshake(self, timeout: float) -> None:
        connect = Connect(
            **stamp(),
            node_id=self.identity.node_id,
            station_id=self.identity.node_id,
            puzzle_evidence=self.identity.puzzle_evidence,
        )
        self._hello = asyncio.get_running_loop().create_future()
        self.send(self.control, connect)
        try:
            hello = await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except TimeoutError:
            raise BrokenError(
                f"station {self.address} sent no HELLO within {timeout:g} s"
            ) from None
        if not hello.accepted:
            code = hello.refusal_code
            why = f" ({code_name(code)})" if code is not None else ""
            raise HandshakeError(
                f"station {self.address} refused the connection{why}", refusal_code=code
            )
        self.station_key = hello.node_id

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.ended.set()
        self._fail_all(ClosedError("session closed"))

    def _fail_all(self, error: Exception) -> None:
        for future in [
            *self._calls.values(),
            *(w for c in self._content.values() for w in c.waiters.values()),
        ]:
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        for channel in self._channels.values():
            channel.lost(str(error))

    @property
    def alive(self) -> bool:
        return not self._closed and self._broken is None and not self.protocol.lost

    # -- sending ------------------------------------------------------------------------------

    def send(self, stream: int, frame: Frame) -> None:
        if not self.alive:
            raise (
                ClosedError("session closed")
                if self._closed
                else BrokenError(self._broken or "connection lost")
            )
        self.protocol.send(stream, frame.sign_and_encode(self.identity))

    def send_control(self, frame: Frame) -> None:
        self.send(self.control, frame)

    async def call(
        self,
        realm: bytes,
        procedure: str,
        payload: Any,
        timeout: float,
        *,
        stream: int | None = None,
    ) -> Any:
        call_id = os.urandom(16)
        call = Call(
            **stamp(),
            call_id=call_id,
            procedure=procedure,
            realm=realm,
            payload=payload,
            deadline_ms=now_ms() + int(timeout * 1000),
            caller=self.identity.node_id,
        )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        waiters = self._calls if stream is None else self._content[stream].waiters
        waiters[call_id] = future
        try:
            self.send(self.control if stream is None else stream, call)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise CallTimeout(f"{procedure}: no answer within {timeout:g} s") from None
        finally:
            waiters.pop(call_id, None)

    @contextlib.asynccontextmanager
    async def content_stream(self) -> AsyncIterator[int]:
        """A dedicated stream for a sequence of built-in CALLs (§6.3); FIN when done."""
        stream = self.protocol.new_stream()
        self._content[stream] = _ContentStream({})
        try:
            yield stream
        finally:
            self._content.pop(stream, None)
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
        channel = StreamChannel(self, stream, os.urandom(16))
        self._channels[stream] = channel
        opening = StreamOpen(
            **stamp(),
            stream_id=channel.stream_id,
            procedure=procedure,
            realm=realm,
            mode=mode,
            args=args,
            deadline_ms=now_ms() + int(timeout * 1000),
            caller=self.identity.node_id,
        )
        self.send(stream, opening)
        return channel

    def reply(self, stream: int, call: Call, payload: Any) -> None:
        self.send(
            stream,
            Result(
                **stamp(), call_id=call.call_id, payload=payload, responded_by=self.identity.node_id
            ),
        )

    def reply_error(self, stream: int, call: Call, code: int, detail: str | None) -> None:
        raw = None if detail is None else detail.encode("utf-8")[:256]
        self.send(
            stream,
            Error(
                **stamp(),
                call_id=call.call_id,
                code=code,
                reported_by=self.identity.node_id,
                detail=raw,
            ),
        )

    # -- receiving (FrameSink) --------------------------------------------------------------

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        for frame_map in frames:
            try:
                frame = parse_frame(frame_map)
            except UnknownFrameType:
                continue
            except ProtocolError as exc:
                self._count("malformed", f"{exc}")
                continue
            if stream_id == self.control:
                self._control_frame(frame)
            elif stream_id in self._content:
                self._reply_frame(frame, self._content[stream_id].waiters)
            else:
                self._stream_frame(stream_id, frame)

    def _verified(self, frame: Frame) -> bool:
        """§4.3. A frame the station itself signs needs no signature check when TLS already
        proved the station's key (certificate pinned to ``node_id``): nothing but the
        station can have sent it on this connection. Relayed frames name their signer and
        are always verified end to end."""
        signer = frame.expected_signer()
        if signer is None and self.tls_pinned:
            return True
        key = signer or self.station_key
        if key and frame.verifies(key):
            return True
        self._count("unverified", f"{frame.FRAME_TYPE} does not verify")
        return False

    def _control_frame(self, frame: Frame) -> None:
        if isinstance(frame, Hello):
            if self._hello is None or self._hello.done():
                return
            expected = self.address.node_id or frame.node_id
            if frame.node_id != expected or not frame.verifies(expected):
                self._hello.set_exception(
                    HandshakeError(
                        f"station {self.address}: HELLO does not verify against {expected.hex()}"
                    )
                )
            else:
                self._hello.set_result(frame)
            return
        if not self.station_key or not self._verified(frame):
            return
        if isinstance(frame, Event):
            if frame.publisher_sig is not None and not frame.publisher_sig_valid():
                self._count("bad_publisher_sig", "event publisher_sig does not verify")
                return
            self.owner.event_received(self, frame)
        elif isinstance(frame, (Result, Error)):
            self._reply_frame(frame, self._calls)
        elif isinstance(frame, Call):
            self.owner.call_received(self, self.control, frame)
        elif isinstance(frame, Goodbye):
            self.goodbye = frame
            terminal = frame.reason == "replaced_by_newer_handshake"
            self._broke(f"station said goodbye: {frame.reason}", terminal=terminal)

    def _reply_frame(self, frame: Frame, waiters: dict[bytes, asyncio.Future[Any]]) -> None:
        if not isinstance(frame, (Result, Error)) or not self._verified(frame):
            return
        future = waiters.pop(frame.call_id, None)
        if future is None or future.done():
            return
        if isinstance(frame, Result):
            future.set_result(frame.payload)
        else:
            future.set_exception(MeshError(frame.code, frame.detail_text, frame.name))

    def _stream_frame(self, stream_id: int, frame: Frame) -> None:
        if not self._verified(frame):
            return
        channel = self._channels.get(stream_id)
        if channel is not None:
            channel.deliver(frame)
            if (channel.closed and channel.peer_finished) or channel.replied or channel.error:
                self._channels.pop(stream_id, None)
            return
        if isinstance(frame, StreamOpen):
            channel = StreamChannel(self, stream_id, frame.stream_id)
            self._channels[stream_id] = channel
            self.owner.stream_opened(self, channel, frame)
        elif isinstance(frame, Call):
            self.owner.call_received(self, stream_id, frame)

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self._broke(f"station sent a malformed stream: {error}", terminal=False)
        self.protocol.close_connection("framing error")

    def stream_ended(self, stream_id: int) -> None:
        channel = self._channels.pop(stream_id, None)
        if channel is not None and not channel.closed:
            channel.lost("stream closed before a terminal frame")

    def stream_reset(self, stream_id: int) -> None:
        self.stream_ended(stream_id)

    def connection_lost(self, reason: str) -> None:
        self._broke(reason, terminal=False)

    def _broke(self, reason: str, *, terminal: bool) -> None:
        if self._closed or self._broken is not None:
            return
        self._broken = reason
        self.ended.set()
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(BrokenError(f"station {self.address}: {reason}"))
        self._fail_all(BrokenError(f"connection to {self.address} lost: {reason}"))
        self.owner.session_broken(self, reason, terminal)

    def _count(self, what: str, why: str) -> None:
        self.dropped[what] = self.dropped.get(what, 0) + 1
        log.warning("session %s: dropped frame: %s", self.address, why)
