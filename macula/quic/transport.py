"""aioquic glue shared by the client and the station: frames over QUIC streams.

The only module of ``macula`` that imports ``aioquic.asyncio``. Invariants:
- every bidirectional stream gets its own ``FrameDecoder``; complete frames are handed to the
  ``FrameSink`` in arrival order, per stream, synchronously from the event loop callback;
- the first stream the peer sends on (its control stream) is decoded with ``control_limits``
  when set, every other stream with ``limits`` (frame size and CBOR items per frame);
- while ``pre_open_bytes`` is set (a station before the peer's CONNECT is accepted), the peer
  may send at most that many bytes, all on its first stream; anything else is a framing error
  on that stream, reported once, after which nothing more the peer sends is read;
- a framing error on a stream is reported once (``framing_failed``) with the frames that
  preceded it; the sink decides what to close;
- ``send`` never blocks: it queues bytes in aioquic and schedules one transmit per loop turn,
  so many frames written in one callback go out in as few datagrams as possible; a datagram
  received is processed at once (its events reach the sink synchronously) but its transmit
  (ACKs, replies) is that same one-per-loop-turn transmit, not aioquic's one per datagram;
- ACKs ride on the packets this side sends anyway, within a bound (``macula.quic.acks``,
  which ``FrameProtocol`` builds on);
- connection loss is reported exactly once (``connection_lost``), with the reason;
- ``pause_reading(stream)`` stops handing that stream's frames to the sink: its bytes are held
  (``macula.quic.held_streams``); on aioquic it gets no new QUIC credit (``macula.quic.credit``),
  so the sender is blocked after at most ``STREAM_WINDOW`` bytes; on qh3 (credit is native) a
  stream holding more than that fails (``framing_failed``, ``flow_control``), its bytes dropped.
  ``resume_reading`` hands the held bytes over a chunk per loop turn (pausing again stops at
  the next chunk), then reading goes on as before;
- a server connection over a cap is refused (``refuse``) before any handshake work on aioquic;
  on qh3 just after its first datagram is fed (its core exists only from then on);
- a dial that did not connect closes at once, without waiting for a close that cannot come;
  one that heard ICMP "port unreachable" sends nothing more (``abandon``: one datagram a dial);
- a client connection the peer answers with a stateless reset (a datagram none of whose packets
  could be processed, ending with the reset token of the connection id it sends to) ends at
  once, ``reset_by_peer`` set: the station lost it (restarted; ``macula.quic.resets``);
- ``queued_bytes(stream)`` is what ``send`` wrote on a stream that aioquic has not sent yet.
TLS: the station presents a self-signed Ed25519 certificate whose key *is* its node id
(PROTOCOL.md §1.2); a client pins it by comparing the certificate's raw public key with the
expected node id, and aioquic still checks the TLS CertificateVerify against that key.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from macula.quic.backend import (
    CLOSES_BEFORE_FIRST_DATAGRAM,
    WRITE_REFUSED,
    NetworkAddress,
    QuicConfiguration,
    QuicConnection,
    QuicConnectionProtocol,
    QuicErrorCode,
    QuicFrameType,
    closed_by_peer_early,
    ended_by_reset,
    events,
    lean_handshake,
    offer_x25519_only,
    peer_certificate,
    peer_reset_token,
    release_crypto_buffers,
    unsent_bytes,
)
from macula.quic.credit import ReceiveCredit
from macula.quic.datagrams import open_draining
from macula.quic.held_streams import HeldStreams
from macula.quic.paths import DATAGRAM_SIZE, LOOPBACK_DATAGRAM_SIZE, with_datagram_size
from macula.quic.paths import datagram_size as datagram_size  # (re-exported)
from macula.quic.pings import PingingProtocol
from macula.quic.resets import is_reset
from macula.wire import cbor
from macula.wire.errors import FramingError
from macula.wire.framing import MAX_FRAME_SIZE, FrameDecoder

log = logging.getLogger("macula.quic.transport")

ALPN = "macula"
# Receive windows of PROTOCOL.md §1.4 (the reference station's values).
STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
IDLE_TIMEOUT_S = 60.0
RELEASE_CHUNK = 64 * 1024  # held bytes handed over per loop turn after a resume
# why a connection the peer answered with a stateless reset ended (it had lost our connection)
STATELESS_RESET_REASON = "stateless reset: the station no longer knows this connection"
# QUIC carries a close reason in one packet; a longer one is cut (at a character boundary)
MAX_CLOSE_REASON_BYTES = 100


class StreamLimits:
    """What one stream's decoder accepts: frame size and CBOR items per frame."""

    __slots__ = ("max_frame_size", "max_items")

    def __init__(
        self, max_frame_size: int = MAX_FRAME_SIZE, max_items: int = cbor.DEFAULT_MAX_ITEMS
    ) -> None:
        self.max_frame_size = max_frame_size
        self.max_items = max_items


class FrameSink(Protocol):
    """What a connection reports to its owner (station router shell or client session)."""

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None: ...

    def framing_failed(self, stream_id: int, error: FramingError) -> None: ...

    def stream_ended(self, stream_id: int) -> None: ...

    def stream_reset(self, stream_id: int) -> None: ...

    def connection_lost(self, reason: str) -> None: ...


class FrameProtocol(PingingProtocol):
    """A QUIC connection that speaks length-prefixed frames on every bidi stream."""

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.sink: FrameSink | None = None
        self._decoders: dict[int, FrameDecoder] = {}
        self._failed_streams: set[int] = set()
        self._lost = False
        self._transmit_scheduled = False
        self.limits = StreamLimits()
        self.control_limits: StreamLimits | None = None
        self.pre_open_bytes: int | None = None  # None: the gate is open
        self.on_first_datagram: Callable[[str], None] | None = None
        self.peer_host: str | None = None
        self.lost_reason = ""
        self._first_stream: int | None = None
        self._received_before_open = 0
        self._gate_tripped = False
        self._last_reserved: int | None = None
        self.credit = ReceiveCredit(quic, STREAM_WINDOW)
        self._holding = HeldStreams()  # paused (or still releasing) streams' bytes
        self._written: dict[int, int] = {}  # stream id -> bytes given to ``send``
        self._bytes = [0, 0]  # stream bytes received, given to ``send`` (qh3's ``stream_bytes``)

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        first = self.peer_host is None
        if first:
            self.peer_host = str(addr[0])
            if CLOSES_BEFORE_FIRST_DATAGRAM:
                self._first_datagram()
        # aioquic's own ``datagram_received`` transmits after every datagram; here the
        # datagram is fed and its events handled at once, but the transmit (ACKs, frames the
        # events produced) waits for the end of the loop turn, so every datagram read in one
        # turn shares one ``transmit`` (one packet build, fewer datagrams sent)
        self._feed(cast(bytes, data), addr)
        if first and not CLOSES_BEFORE_FIRST_DATAGRAM:
            self._first_datagram()  # qh3: its core (which a close needs) exists from here on
        self._process_events()
        if not self._lost and (closed := closed_by_peer_early(self._quic)) is not None:
            self._ended_early(closed)
        self._schedule_transmit()

    def _ended_early(self, closed: events.ConnectionTerminated) -> None:
        """What the library does on ``ConnectionTerminated``, at once (``closed_by_peer_early``):
        the handshake and ping waiters fail, ``wait_closed`` returns, the loss is reported."""
        waiter, self._connected_waiter = self._connected_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError(closed.reason_phrase))
        for ping in self._ping_waiters.values():
            if not ping.done():
                ping.set_exception(ConnectionError(closed.reason_phrase))
        self._ping_waiters.clear()
        self._closed.set()
        self._report_lost(closed.reason_phrase or f"closed (code {closed.error_code})")

    def _first_datagram(self) -> None:
        if self.on_first_datagram is not None and self.peer_host is not None:
            self.on_first_datagram(self.peer_host)  # may ``refuse``: the reply is a close

    def refuse(self, reason: str) -> None:
        """Close before the QUIC handshake is answered: QUIC ``CONNECTION_REFUSED`` with
        ``reason`` (a transport close, so the reason reaches the peer in the Initial packet)."""
        self._quic.close(
            error_code=QuicErrorCode.CONNECTION_REFUSED,
            frame_type=QuicFrameType.PADDING,
            reason_phrase=_cut_reason(reason),
        )
        self._schedule_transmit()

    def open_gate(self) -> None:
        """The peer's handshake is done: it may send on any stream, without a byte budget."""
        self.pre_open_bytes = None

    # -- receiving ------------------------------------------------------------------------

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self._bytes[0] += len(event.data)
            self._stream_data(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, (events.StreamReset, events.StopSendingReceived)):
            # the peer abandoned the stream (or will not read it any more): same for us
            self._decoders.pop(event.stream_id, None)
            self._forget_held(event.stream_id)
            if self.sink is not None:
                self.sink.stream_reset(event.stream_id)
        elif isinstance(event, events.ConnectionTerminated):
            self._report_lost(event.reason_phrase or f"terminated (code {event.error_code})")

    def _stream_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        holding = self._holding
        if not holding.holds(stream_id):
            self._deliver(stream_id, data, end_stream)
        elif stream_id not in self._failed_streams:
            held = holding.hold(stream_id, data, end_stream)
            if held > self.credit.window:  # qh3 only: aioquic's credit stops the sender first
                self._overflowed(stream_id)

    def _overflowed(self, stream_id: int) -> None:
        """A held stream got more than one window: it fails, and what it held is dropped."""
        self._forget_held(stream_id)
        self._decoders.pop(stream_id, None)
        self._failed_streams.add(stream_id)
        if self.sink is not None:
            detail = f"over {self.credit.window} bytes sent while its reading was paused"
            self.sink.framing_failed(stream_id, FramingError("flow_control", detail))

    def _deliver(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.credit.consume(stream_id, len(data))
        if end_stream:
            self.credit.forget(stream_id)
        if stream_id in self._failed_streams or self._gate_tripped:
            return  # a broken stream is reported once; later bytes are dropped
        if self._first_stream is None:
            self._first_stream = stream_id
        if self.pre_open_bytes is not None and not self._within_gate(stream_id, len(data)):
            return
        decoder = self._decoders.get(stream_id)
        if decoder is None:
            if not data and end_stream:
                if self.sink is not None:
                    self.sink.stream_ended(stream_id)  # a stream closed without a byte
                return
            limits = self.limits
            if stream_id == self._first_stream and self.control_limits is not None:
                limits = self.control_limits
            decoder = self._decoders[stream_id] = FrameDecoder(
                max_frame_size=limits.max_frame_size, max_items=limits.max_items
            )
        sink = self.sink
        try:
            frames = decoder.feed(data) if data else []
        except FramingError as exc:
            self._decoders.pop(stream_id, None)
            self._failed_streams.add(stream_id)
            if sink is not None:
                if exc.frames_before:
                    sink.frames_received(stream_id, exc.frames_before)
                sink.framing_failed(stream_id, exc)
            return
        if frames and sink is not None:
            sink.frames_received(stream_id, frames)
        if end_stream:
            self._decoders.pop(stream_id, None)
            if sink is not None:
                if not decoder.at_frame_boundary():
                    sink.framing_failed(
                        stream_id, FramingError("truncated", "stream ended inside a frame")
                    )
                else:
                    sink.stream_ended(stream_id)

    def pause_reading(self, stream_id: int) -> None:
        """Hold ``stream_id``'s bytes and grant it no more credit until ``resume_reading``."""
        if stream_id not in self._failed_streams:
            self._holding.paused.add(stream_id)

    def resume_reading(self, stream_id: int) -> None:
        """Hand the held bytes over (from the next loop turn on) and grant credit again."""
        self._holding.paused.discard(stream_id)
        if self._holding.has_bytes(stream_id):
            self._loop.call_soon(self._release, stream_id)
        self._payload_queued = True
        self._schedule_transmit()  # the new MAX_STREAM_DATA leaves at once

    def paused(self, stream_id: int) -> bool:
        return stream_id in self._holding.paused

    def held_bytes(self, stream_id: int) -> int:
        return self._holding.size(stream_id)

    def _release(self, stream_id: int) -> None:
        """One chunk of held bytes to the sink; the rest on a later turn, unless paused."""
        holding = self._holding
        if stream_id in holding.paused or self._lost:
            return
        taken = holding.take(stream_id, RELEASE_CHUNK)
        if taken is None:
            return
        self._deliver(stream_id, *taken)
        if holding.has_bytes(stream_id) and stream_id not in holding.paused:
            self._loop.call_soon(self._release, stream_id)
        self._schedule_transmit()

    def _forget_held(self, stream_id: int) -> None:
        self._holding.forget(stream_id)
        self.credit.forget(stream_id)

    def _within_gate(self, stream_id: int, size: int) -> bool:
        """Before ``open_gate``: only the first stream, at most ``pre_open_bytes`` in all."""
        assert self.pre_open_bytes is not None
        self._received_before_open += size
        if stream_id != self._first_stream:
            error = FramingError("stream_before_handshake", "data on a second stream too early")
        elif self._received_before_open > self.pre_open_bytes:
            limit = self.pre_open_bytes
            error = FramingError("handshake_too_large", f"over {limit} bytes before the handshake")
        else:
            return True
        self._gate_tripped = True
        self._decoders.clear()
        if self.sink is not None:
            self.sink.framing_failed(stream_id, error)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._report_lost(str(exc) if exc else "transport closed")

    def _report_lost(self, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        self.lost_reason = reason
        if self.sink is not None:
            self.sink.connection_lost(reason)

    # -- sending --------------------------------------------------------------------------

    def new_stream(self) -> int:
        """Reserve a fresh bidirectional stream id. aioquic hands out the same id until bytes
        are sent on it, so ids reserved here are remembered and never given out twice."""
        stream_id = self._quic.get_next_available_stream_id(is_unidirectional=False)
        if self._last_reserved is not None and stream_id <= self._last_reserved:
            stream_id = self._last_reserved + 4
        self._last_reserved = stream_id
        return stream_id

    def send(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Queue ``data`` (already framed) on ``stream_id``; transmit on the next loop turn."""
        if self._lost:
            return
        try:
            self._quic.send_stream_data(stream_id, data, end_stream)
        except WRITE_REFUSED as exc:  # finished, reset, stopped, or the connection closed
            log.debug("send on stream %d refused: %s", stream_id, exc)
            return
        self._written[stream_id] = self._written.get(stream_id, 0) + len(data)
        self._bytes[1] += len(data)
        self._payload_queued = True
        self._schedule_transmit()

    def queued_bytes(self, stream_id: int) -> int:
        """Bytes written on ``stream_id`` that aioquic has not sent yet (flow or congestion
        control holds them: the peer is not keeping up)."""
        unsent = unsent_bytes(self._quic, stream_id, self._written.get(stream_id, 0))
        if unsent is None:
            self._written.pop(stream_id, None)
            return 0
        return unsent

    def end_stream(self, stream_id: int) -> None:
        self.send(stream_id, b"", end_stream=True)
        self._decoders.pop(stream_id, None)

    def _schedule_transmit(self) -> None:
        if not self._transmit_scheduled:
            self._transmit_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._transmit_scheduled = False
        if not self._lost:
            self.transmit()

    def close_connection(self, reason: str = "", error_code: int = 0) -> None:
        if self._lost:
            return
        self.close(error_code=error_code, reason_phrase=_cut_reason(reason))

    @property
    def lost(self) -> bool:
        return self._lost

    @property
    def reset_by_peer(self) -> bool:
        """The peer ended this (client) connection with a stateless reset: it is up again but
        lost its state (a restart), so it can be dialled again at once."""
        return bool(getattr(self._quic, "reset_by_peer", False))

    def release_handshake_buffers(self) -> bool:
        """Give back the TLS buffers the handshake needed (``release_crypto_buffers``): False
        while the handshake is not confirmed yet (or on qh3)."""
        return release_crypto_buffers(self._quic)

    def stream_bytes(self) -> tuple[int, int]:
        """(stream bytes received, stream bytes sent) so far, as aioquic's connection-level flow
        control counts them; on qh3 (which does not say) as this protocol counted them."""
        limit = getattr(self._quic, "_local_max_data", None)
        if limit is None:
            return self._bytes[0], self._bytes[1]
        return int(limit.used), int(self._quic._remote_max_data_used)

    # -- TLS ------------------------------------------------------------------------------

    def peer_certificate_key(self) -> bytes | None:
        """Raw Ed25519 public key of the peer's TLS certificate, if it has one."""
        certificate = peer_certificate(self._quic)
        if certificate is None:
            return None
        key = certificate.public_key()
        if not isinstance(key, Ed25519PublicKey):
            return None
        return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _cut_reason(reason: str) -> str:
    """At most ``MAX_CLOSE_REASON_BYTES`` of UTF-8, never cut inside a character."""
    raw = reason.encode("utf-8")
    if len(raw) <= MAX_CLOSE_REASON_BYTES:
        return reason
    return raw[:MAX_CLOSE_REASON_BYTES].decode("utf-8", errors="ignore")


RECEIVE_BUFFER = 4 * 1024 * 1024


def enlarge_receive_buffer(sock: socket.socket | None) -> None:
    """Ask for a 4 MiB UDP receive buffer (bursts of handshakes or blocks overflow the
    default); the kernel may grant less, which is fine."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


def _consume_waiter(protocol: QuicConnectionProtocol) -> None:
    """aioquic fails its (shielded) handshake waiter later; mark that outcome as seen."""
    waiter = getattr(protocol, "_connected_waiter", None)
    if waiter is not None:
        waiter.add_done_callback(lambda f: f.cancelled() or f.exception())


class ClientConnection(QuicConnection):
    """A client QUIC connection whose ClientHello offers one key share, X25519, instead of
    aioquic's four (P-256, P-384, X25519, X448): every share offered is a key generated per
    connect. Callgrind, one sans-I/O handshake (both sides): 21.0 M instructions with four,
    7.5 M with X25519 alone (docs/performance.md §5). Every aioquic station accepts X25519.
    It also asks for one spare connection id and skips PADDING natively (``lean_handshake``,
    docs/performance.md §11)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        lean_handshake(self)
        self.packets_processed = 0  # aioquic: packets decrypted and handled
        self.reset_by_peer = False  # ended by a stateless reset from the peer

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        offer_x25519_only(self)

    def _payload_received(self, *args: Any, **kwargs: Any) -> tuple[bool, bool]:
        self.packets_processed += 1  # aioquic calls this once per packet it could process
        handled: tuple[bool, bool] = super()._payload_received(*args, **kwargs)
        return handled

    def receive_datagram(self, data: bytes, addr: NetworkAddress, now: float) -> None:
        """The library's, then: a datagram of which no packet could be processed, ending with
        the stateless reset token of the connection id we send to, ends the connection at once
        (RFC 9000 §10.3.1; ``macula.quic.resets``): the peer lost its state (restarted). On qh3
        (which processes packets natively) its core makes that call; this notes it."""
        processed, state = self.packets_processed, self._state
        super().receive_datagram(data, addr, now)
        if (
            self.packets_processed == processed
            and is_reset(data, peer_reset_token(self))
            and ended_by_reset(self, state, STATELESS_RESET_REASON)
        ):
            self.reset_by_peer = True

    def handle_timer(self, now: float) -> None:
        if not self.reset_by_peer:  # ended by a reset: a timer armed before has nothing to do
            super().handle_timer(now)


def client_configuration(
    *, server_name: str, cafile: str | None = None, verify_certificate: bool = False
) -> QuicConfiguration:
    """QUIC client settings: ALPN ``macula``, TLS 1.3; certificate chain checked only when a
    CA file is given (pinning by node id is checked after the handshake instead)."""
    configuration = QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN],
        idle_timeout=IDLE_TIMEOUT_S,
        max_data=CONNECTION_WINDOW,
        max_stream_data=STREAM_WINDOW,
        max_datagram_size=DATAGRAM_SIZE,  # (qh3's own default is 1,280)
        server_name=server_name,
    )
    if cafile is not None:
        configuration.load_verify_locations(cafile)
        configuration.verify_mode = ssl.CERT_REQUIRED
    else:
        configuration.verify_mode = ssl.CERT_REQUIRED if verify_certificate else ssl.CERT_NONE
    return configuration


async def _resolved(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> tuple[int, tuple[Any, ...]]:
    """The socket family and address to dial: an IP literal as it is (no resolver thread on
    the connect path: under load that hand-off alone took milliseconds), a name through
    ``getaddrinfo``."""
    try:
        literal = ipaddress.ip_address(host)
        if isinstance(literal, ipaddress.IPv6Address) and literal.scope_id:
            raise ValueError("a scoped address: the resolver fills in the scope id")
    except ValueError:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, _, _, _, address = infos[0]
        return family, tuple(address)
    if literal.version == 6:
        return socket.AF_INET6, (str(literal), port, 0, 0)
    return socket.AF_INET, (str(literal), port)


@contextlib.asynccontextmanager
async def dial(
    host: str,
    port: int,
    configuration: QuicConfiguration,
    *,
    timeout: float = 10.0,
    loopback_datagram_size: int = LOOPBACK_DATAGRAM_SIZE,
) -> AsyncIterator[FrameProtocol]:
    """Open one QUIC connection to ``host:port``; the connection closes when the block ends.

    Unlike ``aioquic.asyncio.connect``, a handshake that never completes is bounded by
    ``timeout`` and an IPv4 address is dialled over an IPv4 socket. To a loopback address,
    datagrams are up to ``loopback_datagram_size`` bytes (1,200 to 16,000) instead of 1,200.
    """
    loop = asyncio.get_running_loop()
    family, address = await _resolved(loop, host, port)
    configuration = with_datagram_size(configuration, str(address[0]), loopback_datagram_size)
    connection = ClientConnection(configuration=configuration)
    protocol = FrameProtocol(connection)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind(("::", 0, 0, 0) if family == socket.AF_INET6 else ("0.0.0.0", 0))
        sock.connect(address)  # a connected socket hears ICMP "port unreachable" at once
        enlarge_receive_buffer(sock)
    except BaseException:
        sock.close()
        raise
    transport = await open_draining(sock, protocol)
    connected_once = False
    try:
        protocol.connect(address)
        connected: asyncio.Future[None] = asyncio.ensure_future(protocol.wait_connected())
        race: set[asyncio.Future[Any]] = {connected, protocol.refused}
        try:
            done, _ = await asyncio.wait(race, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if protocol.refused in done:
                raise ConnectionRefusedError(f"{host}:{port}: {protocol.refused.result()}")
            if connected not in done:
                raise TimeoutError(
                    f"QUIC handshake with {host}:{port} timed out after {timeout:g} s"
                )
            try:
                connected.result()
            except ConnectionError as exc:  # closed during the handshake: say why if told
                why = protocol.lost_reason or "closed during the QUIC handshake"
                raise ConnectionError(f"{host}:{port}: {why}") from exc
        except BaseException:
            connected.cancel()
            _consume_waiter(protocol)
            raise
        connected_once = True
        yield protocol
    finally:
        if protocol.refused.done():  # ICMP: nothing listens there, nothing to tell or wait for
            protocol.abandon()
        else:
            protocol.close_connection("client closed")
        if connected_once and not protocol.refused.done():  # else no close can be answered
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(protocol.wait_closed(), 1.0)
        transport.close()
