"""A client and a server QUIC protocol joined by an in-memory network (no sockets): datagrams
are recorded and delivered on the next loop turn, or held; frames encoded as on the wire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from macula.quic.backend import QuicConfiguration, QuicConnection, QuicServer
from macula.quic.transport import (
    ALPN,
    FrameProtocol,
    client_configuration,
)
from macula.wire import cbor
from macula.wire.errors import FramingError
from macula.wire.framing import frame_bytes
from relay.station.tls import ensure_certificate

from .identities import new_identity

CLIENT_ADDR = ("10.0.0.1", 4000)
SERVER_ADDR = ("10.0.0.2", 4433)


def encode_frame(frame: dict[str, Any]) -> bytes:
    return frame_bytes(cbor.encode(frame))


class Wire(asyncio.DatagramTransport):
    """One direction of an in-memory network: ``sendto`` records, then delivers next turn."""

    def __init__(self, source: tuple[str, int]) -> None:
        super().__init__()
        self.source = source
        self.peer: asyncio.DatagramProtocol | None = None
        self.sent: list[bytes] = []
        self.held: list[bytes] = []
        self.hold = False
        self.closed = False

    def sendto(self, data: Any, addr: Any = None) -> None:
        self.sent.append(bytes(data))
        if self.hold:
            self.held.append(bytes(data))
        elif self.peer is not None:
            asyncio.get_running_loop().call_soon(
                self.peer.datagram_received, bytes(data), self.source
            )

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Sink:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.lost: list[str] = []

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        self.frames.extend(frames)

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        raise AssertionError(f"framing failed: {error}")

    def stream_ended(self, stream_id: int) -> None:
        pass

    def stream_reset(self, stream_id: int) -> None:
        pass

    def connection_lost(self, reason: str) -> None:
        self.lost.append(reason)


class Pair:
    def __init__(self, client: FrameProtocol, to_server: Wire, to_client: Wire) -> None:
        self.client = client
        self.to_server = to_server
        self.to_client = to_client
        self.servers: list[FrameProtocol] = []
        self.client_sink = Sink()
        self.server_sink = Sink()
        client.sink = self.client_sink

    @property
    def server(self) -> FrameProtocol:
        return self.servers[0]


@pytest.fixture
async def pair(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    idle = getattr(request, "param", 60.0)
    cert, key = ensure_certificate(tmp_path, new_identity(), ["127.0.0.1"])
    server_configuration = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
    server_configuration.idle_timeout = idle
    server_configuration.load_cert_chain(cert, key)
    configuration = client_configuration(server_name="127.0.0.1")
    configuration.idle_timeout = idle
    to_server, to_client = Wire(CLIENT_ADDR), Wire(SERVER_ADDR)
    client = FrameProtocol(QuicConnection(configuration=configuration))
    made = Pair(client, to_server, to_client)

    def create(quic: QuicConnection, **kwargs: Any) -> FrameProtocol:
        protocol = FrameProtocol(quic, **kwargs)
        protocol.sink = made.server_sink
        made.servers.append(protocol)
        return protocol

    server = QuicServer(configuration=server_configuration, create_protocol=create)
    server.connection_made(to_client)
    to_server.peer, to_client.peer = server, client
    client.connection_made(to_server)
    client.connect(SERVER_ADDR)
    await asyncio.wait_for(client.wait_connected(), 10.0)
    yield made
    client.close_connection("test over")
