"""``lean_handshake``: one spare connection id each way and PADDING skipped natively, on a
sans-I/O aioquic handshake between our client connection and a station-like server connection;
the native PADDING skip consumes exactly what aioquic's own handler does."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
from aioquic._buffer import Buffer
from aioquic.quic.logger import QuicLogger
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from macula.quic import backend as quic_backend
from macula.quic.backend import (
    ACTIVE_CONNECTION_ID_LIMIT,
    QuicConfiguration,
    QuicConnection,
    events,
    lean_handshake,
)
from macula.quic.transport import ALPN, ClientConnection, client_configuration
from macula.wire.identity import Identity
from relay.station.tls import build_certificate

pytestmark = pytest.mark.skipif(quic_backend.BACKEND != "aioquic", reason="aioquic internals")

CLIENT_ADDR = ("10.0.0.1", 5000)
SERVER_ADDR = ("10.0.0.2", 4433)


def _server_configuration() -> QuicConfiguration:
    from cryptography import x509

    identity = Identity.generate(os.urandom)
    pem = build_certificate(identity, ["10.0.0.2"], datetime.datetime.now(datetime.UTC))
    configuration = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
    configuration.certificate = x509.load_pem_x509_certificate(pem)
    configuration.private_key = Ed25519PrivateKey.from_private_bytes(identity.seed)
    return configuration


def _handshake(*, lean_server: bool = True) -> tuple[QuicConnection, QuicConnection]:
    """A client and a server exchanging datagrams in memory until both are idle."""
    client = ClientConnection(configuration=client_configuration(server_name="10.0.0.2"))
    server = QuicConnection(
        configuration=_server_configuration(),
        original_destination_connection_id=client.original_destination_connection_id,
    )
    if lean_server:
        lean_handshake(server)
    _exchange(client, server)
    return client, server


def _exchange(client: QuicConnection, server: QuicConnection) -> None:
    """Connect, then pass datagrams both ways until neither side has any (at most 20 rounds)."""
    now = 0.0
    client.connect(SERVER_ADDR, now=now)
    for _ in range(20):
        now += 0.01
        moved = False
        for datagram, _addr in client.datagrams_to_send(now=now):
            server.receive_datagram(datagram, CLIENT_ADDR, now=now)
            moved = True
        for datagram, _addr in server.datagrams_to_send(now=now):
            client.receive_datagram(datagram, SERVER_ADDR, now=now)
            moved = True
        if not moved:
            break


def _completed(quic: QuicConnection) -> bool:
    seen = []
    while (event := quic.next_event()) is not None:
        seen.append(event)
    return any(isinstance(event, events.HandshakeCompleted) for event in seen)


def test_both_sides_complete_and_hold_one_spare_connection_id_each() -> None:
    client, server = _handshake()
    assert _completed(client) and _completed(server)
    for quic in (client, server):
        assert quic._local_active_connection_id_limit == ACTIVE_CONNECTION_ID_LIMIT
        assert len(quic._peer_cid_available) == ACTIVE_CONNECTION_ID_LIMIT - 1
        assert len(quic._host_cids) == ACTIVE_CONNECTION_ID_LIMIT


def test_a_lean_client_still_completes_with_an_unchanged_aioquic_server() -> None:
    client, server = _handshake(lean_server=False)
    assert _completed(client) and _completed(server)
    assert len(client._peer_cid_available) == 1  # the server honours the client's limit
    assert len(server._peer_cid_available) == 7  # the client gives the server what it asks


def test_our_client_connection_skips_padding_natively() -> None:
    client = ClientConnection(configuration=client_configuration(server_name="10.0.0.2"))
    handlers = client._QuicConnection__frame_handlers  # type: ignore[attr-defined]
    assert handlers[0x00][0] is quic_backend._skip_padding


def test_a_qlog_keeps_aioquic_padding_handler() -> None:
    configuration = client_configuration(server_name="10.0.0.2")
    configuration.quic_logger = QuicLogger()
    client = ClientConnection(configuration=configuration)
    handlers = client._QuicConnection__frame_handlers  # type: ignore[attr-defined]
    assert handlers[0x00][0] is not quic_backend._skip_padding
    assert client._local_active_connection_id_limit == ACTIVE_CONNECTION_ID_LIMIT


@pytest.mark.parametrize(
    ("data", "start"),
    [
        (bytes(15_600), 0),  # a whole padded packet
        (b"\x01" + bytes(40), 1),  # padding to the end
        (bytes(40) + b"\x02\x00\x00", 0),  # padding, then the next frame
        (b"\x00\x00\x06", 1),  # a single zero, then a frame
        (b"\x00", 1),  # nothing left
        (b"\x07\x00", 0),  # no padding at all: the handler consumes nothing
    ],
)
def test_the_native_skip_consumes_exactly_what_aioquic_does(data: bytes, start: int) -> None:
    ours = Buffer(data=data)
    ours.seek(start)
    quic_backend._skip_padding(None, 0x00, ours)
    theirs = Buffer(data=data)
    theirs.seek(start)
    plain: Any = QuicConnection(configuration=client_configuration(server_name="x"))
    QuicConnection._handle_padding_frame(plain, None, 0x00, theirs)  # type: ignore[arg-type]
    assert ours.tell() == theirs.tell()


def test_large_loopback_datagrams_still_handshake_through_the_native_skip() -> None:
    """The client pads its second flight's 1-RTT packet to the whole 16,000-byte datagram:
    the server parses those PADDING frames with the native skip and completes."""
    client_conf = client_configuration(server_name="10.0.0.2")
    client_conf.max_datagram_size = 16_000
    client = ClientConnection(configuration=client_conf)
    server_conf = _server_configuration()
    server_conf.max_datagram_size = 16_000
    server = QuicConnection(
        configuration=server_conf,
        original_destination_connection_id=client.original_destination_connection_id,
    )
    lean_handshake(server)
    calls: list[int] = []
    handlers = server._QuicConnection__frame_handlers  # type: ignore[attr-defined]
    skip, epochs = handlers[0x00]

    def counting(context: Any, frame_type: int, buf: Buffer) -> None:
        before = buf.tell()
        skip(context, frame_type, buf)
        calls.append(buf.tell() - before)

    handlers[0x00] = (counting, epochs)
    _exchange(client, server)
    assert _completed(client) and _completed(server)
    assert calls and max(calls) > 10_000  # the long PADDING run went through the native skip
