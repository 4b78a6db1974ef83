"""A hand-driven client for hostile-input tests: any bytes or frame, on any stream.

``async with raw_client(station) as raw:`` dials the station over real QUIC (127.0.0.1),
performs CONNECT/HELLO unless ``handshake=False``, and records everything the station sends:
every decoded frame map with the stream it came on, streams the station ended, framing errors,
and the loss of the connection. Nothing here validates what it sends: signing is explicit and
optional, so tests can send exactly the frame they mean to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from macula.quic.backend import events
from macula.quic.transport import FrameProtocol, client_configuration, dial
from macula.wire import cbor
from macula.wire.errors import FramingError
from macula.wire.frames import CAP_STATION, Call, Connect, Frame, new_frame_id
from macula.wire.framing import frame_bytes
from macula.wire.identity import DOMAIN_FRAME, ZERO_REALM, Identity
from relay.station.station import Station

FrameMap = dict[str, Any]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def stamp(skew_ms: int = 0) -> dict[str, Any]:
    """A fresh envelope stamp (``frame_id``, ``sent_at_ms``), optionally off by ``skew_ms``."""
    at = now_ms() + skew_ms
    return {"frame_id": new_frame_id(max(at, 0), os.urandom(10)), "sent_at_ms": max(at, 0)}


def sign_map(frame_map: Mapping[str, Any], identity: Identity) -> FrameMap:
    """``frame_map`` with a fresh frame ``signature`` by ``identity`` (§4.2); any
    ``publisher_sig`` is kept as it is."""
    unsigned = {k: v for k, v in frame_map.items() if k not in ("signature", "publisher_sig")}
    signed = dict(frame_map)
    signed["signature"] = identity.sign(DOMAIN_FRAME + cbor.encode(unsigned))
    return signed


@dataclass(frozen=True, slots=True)
class Received:
    stream: int
    frame: FrameMap

    @property
    def frame_type(self) -> object:
        return self.frame.get("frame_type")


class RawClient:
    """One QUIC connection driven by hand; implements ``macula.quic.transport.FrameSink``."""

    def __init__(self, protocol: FrameProtocol, identity: Identity) -> None:
        self.protocol = protocol
        self.identity = identity
        self.control: int | None = None
        self.received: list[Received] = []
        self.ended_streams: set[int] = set()
        self.framing_errors: list[tuple[int, FramingError]] = []
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._changed = asyncio.Event()
        # FrameProtocol does not report a FIN on a stream it never received bytes on, so FINs
        # are observed on the QUIC events themselves.
        self.fins: set[int] = set()
        self._reserved: set[int] = set()
        deliver = protocol.quic_event_received

        def observe(event: events.QuicEvent) -> None:
            if isinstance(event, events.StreamDataReceived) and event.end_stream:
                self.fins.add(event.stream_id)
                self._changed.set()
            deliver(event)

        protocol.quic_event_received = observe  # type: ignore[method-assign]

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    # -- FrameSink ----------------------------------------------------------------------------

    def frames_received(self, stream_id: int, frames: list[FrameMap]) -> None:
        self.received.extend(Received(stream_id, f) for f in frames)
        self._changed.set()

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.framing_errors.append((stream_id, error))
        self._changed.set()

    def stream_ended(self, stream_id: int) -> None:
        self.ended_streams.add(stream_id)
        self._changed.set()

    def stream_reset(self, stream_id: int) -> None:
        self.stream_ended(stream_id)

    def connection_lost(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()
        self._changed.set()

    # -- sending ------------------------------------------------------------------------------

    def new_stream(self) -> int:
        """A fresh client-initiated bidi stream id. aioquic hands out the same id until bytes
        are sent on it, so ids are reserved here."""
        stream = self.protocol.new_stream()
        while stream in self._reserved:
            stream += 4
        self._reserved.add(stream)
        return stream

    def _stream(self, stream: int | None) -> int:
        if stream is not None:
            return stream
        if self.control is None:
            self.control = self.new_stream()
        return self.control

    def send_bytes(self, data: bytes, *, stream: int | None = None, end: bool = False) -> None:
        """Exactly these bytes, no framing added."""
        self.protocol.send(self._stream(stream), data, end_stream=end)

    def send_map(
        self,
        frame_map: Mapping[str, Any],
        *,
        stream: int | None = None,
        signer: Identity | None = None,
    ) -> bytes:
        """Encode ``frame_map`` (signed first by ``signer`` if given) and send it; returns the
        exact bytes sent, so a test can replay them."""
        body = dict(frame_map) if signer is None else sign_map(frame_map, signer)
        data = frame_bytes(cbor.encode(body))
        self.send_bytes(data, stream=stream)
        return data

    def send(
        self, frame: Frame, *, stream: int | None = None, signer: Identity | None = None
    ) -> bytes:
        """Sign ``frame`` with ``signer`` (default: this client's identity) and send it."""
        data = frame.signed_by(signer or self.identity).encode()
        self.send_bytes(data, stream=stream)
        return data

    async def flush(self, timeout: float = 5.0) -> None:
        """A ``_relay.ping`` round trip on the control stream, like ``Node.flush``: the stream
        is ordered, so the answer comes after the station processed every frame sent on it
        before."""
        stamped = stamp()
        call = Call(
            **stamped,
            call_id=os.urandom(16),
            procedure="_relay.ping",
            realm=ZERO_REALM,
            payload={},
            deadline_ms=stamped["sent_at_ms"] + 60_000,
            caller=self.node_id,
        )
        self.send(call)
        reply = await self.reply_to(call.call_id, timeout)
        assert reply["frame_type"] == "result", reply

    def stop_reading(self, stream: int) -> None:
        """Ask the station to stop sending on ``stream`` (QUIC STOP_SENDING)."""
        self.protocol._quic.stop_stream(stream, 0)
        self.protocol.transmit()

    # -- handshake ----------------------------------------------------------------------------

    async def handshake(self, timeout: float = 5.0) -> FrameMap:
        """CONNECT on a fresh control stream; returns the HELLO map (accepted or not)."""
        self.control = self.new_stream()
        connect = Connect(
            **stamp(),
            node_id=self.node_id,
            station_id=self.node_id,
            puzzle_evidence=self.identity.puzzle_evidence,
        )
        self.send(connect)
        hello = await self.expect(lambda r: r.frame_type == "hello", timeout)
        return hello.frame

    # -- receiving ----------------------------------------------------------------------------

    def frames(self, frame_type: str | None = None, *, stream: int | None = None) -> list[FrameMap]:
        return [
            r.frame
            for r in self.received
            if (frame_type is None or r.frame_type == frame_type)
            and (stream is None or r.stream == stream)
        ]

    async def expect(
        self, predicate: Callable[[Received], bool], timeout: float = 5.0, *, start: int = 0
    ) -> Received:
        """The first frame (from index ``start``) matching ``predicate``; ``TimeoutError``."""
        async with asyncio.timeout(timeout):
            while True:
                for item in self.received[start:]:
                    if predicate(item):
                        return item
                self._changed.clear()
                await self._changed.wait()

    async def reply_to(self, call_id: bytes, timeout: float = 5.0) -> FrameMap:
        """The RESULT or ERROR carrying ``call_id``."""
        found = await self.expect(
            lambda r: r.frame_type in ("result", "error") and r.frame.get("call_id") == call_id,
            timeout,
        )
        return found.frame

    async def quiet(self, predicate: Callable[[Received], bool], period: float = 0.3) -> None:
        """Assert that nothing matching ``predicate`` arrives within ``period`` seconds."""
        start = len(self.received)
        with contextlib.suppress(TimeoutError):
            found = await self.expect(predicate, period, start=start)
            raise AssertionError(f"unexpected frame: {found.frame!r:.300}")

    async def wait_fin(self, stream: int, timeout: float = 5.0) -> None:
        """Until the station has ended its side of ``stream``."""
        async with asyncio.timeout(timeout):
            while stream not in self.fins:
                self._changed.clear()
                await self._changed.wait()

    async def wait_lost(self, timeout: float = 5.0) -> str:
        async with asyncio.timeout(timeout):
            await self.lost.wait()
        return self.lost_reason


@contextlib.asynccontextmanager
async def raw_client(
    station: Station, identity: Identity | None = None, *, handshake: bool = True
) -> AsyncIterator[RawClient]:
    """A raw connection to ``station`` on 127.0.0.1, handshaken unless ``handshake=False``."""
    configuration = client_configuration(server_name="127.0.0.1")
    async with dial("127.0.0.1", station.port, configuration, timeout=5.0) as protocol:
        client = RawClient(protocol, identity or Identity.generate(os.urandom))
        protocol.sink = client
        if handshake:
            hello = await client.handshake()
            assert hello.get("accepted") == "true", f"station refused the raw client: {hello}"
        yield client


async def link_in(raw: RawClient, **fields: Any) -> dict[str, Any]:
    """CONNECT with the station bit (and ``fields``, e.g. ``realms``): the HELLO (accepted or
    not)."""
    raw.control = raw.new_stream()
    connect = Connect(
        **stamp(),
        capabilities=CAP_STATION,
        node_id=raw.node_id,
        station_id=raw.node_id,
        puzzle_evidence=raw.identity.puzzle_evidence,
        **fields,
    )
    raw.send(connect)
    hello = await raw.expect(lambda r: r.frame_type == "hello")
    return hello.frame
