"""The QUIC I/O path: one transmit per connection per loop turn, several datagrams per read.

``FrameProtocol`` pairs here run over an in-memory wire (``Wire``: every datagram sent is
handed to the peer on the next loop turn, or held while ``hold`` is set) behind aioquic's real
``QuicServer``, so what each side transmits can be counted exactly; ``DrainingProtocol`` runs
on real UDP sockets on loopback.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from macula.quic.datagrams import DrainingProtocol, bound_socket
from macula.quic.transport import (
    DATAGRAM_SIZE,
    LOOPBACK_DATAGRAM_SIZE,
    FrameProtocol,
    client_configuration,
    datagram_size,
    dial,
    with_datagram_size,
)
from relay.station.station import Station
from support.quickit import CLIENT_ADDR, SERVER_ADDR, Pair, encode_frame, pair
from support.waiting import eventually

__all__ = ["pair"]  # the fixture, imported for the tests below

pytestmark = pytest.mark.anyio


def count_transmits(protocol: FrameProtocol) -> list[int]:
    calls = [0]
    transmit = protocol.transmit

    def counted() -> None:
        calls[0] += 1
        transmit()

    protocol.transmit = counted  # type: ignore[method-assign]
    return calls


async def test_handshake_then_frames_both_ways(pair: Pair) -> None:
    stream = pair.client.new_stream()
    pair.client.send(stream, encode_frame({"t": "hello"}))
    await eventually(lambda: pair.server_sink.frames == [{"t": "hello"}])
    pair.server.send(stream, encode_frame({"t": "back"}))
    await eventually(lambda: pair.client_sink.frames == [{"t": "back"}])


async def test_datagrams_received_in_one_turn_share_one_transmit(pair: Pair) -> None:
    stream = pair.client.new_stream()
    pair.client.send(stream, encode_frame({"t": "open"}))
    await eventually(lambda: pair.server_sink.frames)
    pair.to_client.hold = True
    frames = [{"n": i, "pad": bytes(500)} for i in range(16)]  # within the initial window
    for frame in frames:
        pair.server.send(stream, encode_frame(frame))
    await eventually(lambda: len(pair.to_client.held) >= 5, message="server sent too little")
    held, pair.to_client.held = pair.to_client.held, []
    pair.to_client.hold = False
    calls = count_transmits(pair.client)
    for datagram in held:
        pair.client.datagram_received(datagram, SERVER_ADDR)
    assert pair.client_sink.frames == frames  # handed over at once, in order
    assert calls[0] == 0  # nothing transmitted per datagram
    await asyncio.sleep(0)  # one loop turn: the scheduled transmit runs
    assert calls[0] == 1
    # the ACK for all of them still leaves (on the ack timer the transmit armed)
    await eventually(lambda: bytes_in_flight(pair.server._quic) == 0)


def bytes_in_flight(quic: Any) -> int:
    """Bytes the sender still waits to see acknowledged (aioquic's loss recovery, or qh3's
    native core)."""
    loss = getattr(quic, "_loss", None)
    return int(loss.bytes_in_flight if loss is not None else quic._core.bytes_in_flight)


async def test_pings_are_answered_both_ways(pair: Pair) -> None:
    assert await pair.client.acknowledged(5.0)
    assert await pair.server.acknowledged(5.0)


async def test_a_ping_into_silence_is_not_acknowledged(pair: Pair) -> None:
    pair.to_server.hold = True
    assert not await pair.client.acknowledged(0.2)
    assert not await pair.client.acknowledged(0.05, attempts=3)  # 0.05 + 0.1 + 0.2 s
    assert pair.client._ping_waiters == {}  # no waiter outlives the call


async def test_a_ping_answered_late_counts_while_attempts_remain(pair: Pair) -> None:
    """A peer behind by more than one ping's time (its receive queue deep) answers the first
    ping late: with attempts left (0.2 + 0.4 + 0.8 s) that late answer counts (issue 27)."""
    pair.to_server.hold = True
    answer = asyncio.ensure_future(pair.client.acknowledged(0.2, attempts=3))
    # the second ping is out: the first went unanswered for its 0.2 s
    await eventually(lambda: len(pair.client._ping_waiters) >= 2)
    held, pair.to_server.held = pair.to_server.held, []
    pair.to_server.hold = False
    for datagram in held:  # the peer catches up: it reads what waited for it
        pair.to_server.peer.datagram_received(datagram, CLIENT_ADDR)  # type: ignore[union-attr]
    assert await asyncio.wait_for(answer, 5)
    assert pair.client._ping_waiters == {}


async def test_close_reaches_the_peer_with_its_reason(pair: Pair) -> None:
    pair.client.close_connection("done here")
    await eventually(lambda: pair.server_sink.lost)
    assert pair.server_sink.lost == ["done here"]
    await eventually(lambda: pair.client_sink.lost)


@pytest.mark.parametrize("pair", [0.5], indirect=True)
async def test_idle_timeout_still_ends_a_silent_connection(pair: Pair) -> None:
    pair.to_server.hold = pair.to_client.hold = True  # the network goes dark
    await eventually(lambda: pair.client_sink.lost and pair.server_sink.lost, timeout=10.0)
    assert pair.client.lost and pair.server.lost


# -- DrainingProtocol on real UDP sockets ----------------------------------------------------


class Recorder(asyncio.DatagramProtocol):
    def __init__(self, close_on_first: bool = False) -> None:
        self.received: list[bytes] = []
        self.at_next_turn: int | None = None
        self.errors: list[Exception] = []
        self.lost: list[Exception | None] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.close_on_first = close_on_first

    def connection_made(self, transport: asyncio.DatagramTransport) -> None:  # type: ignore[override]
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not self.received:
            asyncio.get_running_loop().call_soon(self.snapshot)
            if self.close_on_first and self.transport is not None:
                self.transport.close()
        self.received.append(data)

    def snapshot(self) -> None:
        self.at_next_turn = len(self.received)

    def error_received(self, exc: Exception) -> None:
        self.errors.append(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


async def drained(
    recorder: Recorder, count: int, max_batch: int
) -> tuple[asyncio.DatagramTransport, socket.socket]:
    """``count`` datagrams waiting on a fresh socket before its transport starts reading."""
    sock = await bound_socket("127.0.0.1", 0)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sender:
        for i in range(count):
            sender.sendto(b"%d" % i, sock.getsockname())
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: DrainingProtocol(recorder, sock, max_batch), sock=sock
    )
    return transport, sock


async def test_every_waiting_datagram_is_read_in_one_callback_in_order() -> None:
    recorder = Recorder()
    transport, _ = await drained(recorder, 10, max_batch=32)
    try:
        await eventually(lambda: len(recorder.received) == 10)
        assert recorder.received == [b"%d" % i for i in range(10)]
        assert recorder.at_next_turn == 10  # all ten before the loop turned
    finally:
        transport.close()


async def test_a_batch_is_bounded_and_the_rest_read_later() -> None:
    recorder = Recorder()
    transport, _ = await drained(recorder, 10, max_batch=4)
    try:
        await eventually(lambda: len(recorder.received) == 10)
        assert recorder.received == [b"%d" % i for i in range(10)]
        assert recorder.at_next_turn == 4
    finally:
        transport.close()


async def test_nothing_is_read_once_the_transport_closes() -> None:
    recorder = Recorder(close_on_first=True)
    await drained(recorder, 5, max_batch=32)
    await eventually(lambda: recorder.lost)
    assert recorder.received == [b"0"]
    assert recorder.lost == [None]


async def test_socket_errors_reach_the_inner_protocol() -> None:
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: the kernel answers with ICMP unreachable
    sock = await bound_socket("127.0.0.1", 0)
    sock.connect(("127.0.0.1", port))
    recorder = Recorder()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: DrainingProtocol(recorder, sock), sock=sock
    )
    try:
        transport.sendto(b"anyone?")
        await eventually(lambda: recorder.errors)
        assert isinstance(recorder.errors[0], ConnectionRefusedError)
    finally:
        transport.close()


async def test_a_batch_of_zero_is_refused() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock, pytest.raises(ValueError, match="at least 1"):
        DrainingProtocol(Recorder(), sock, max_batch=0)


async def test_binding_an_address_not_ours_fails_clearly() -> None:
    with pytest.raises(OSError):
        await bound_socket("192.0.2.1", 0)  # TEST-NET-1: never a local address


# -- datagram size by path -------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_paths_get_large_datagrams(host: str) -> None:
    assert datagram_size(host) == LOOPBACK_DATAGRAM_SIZE
    assert datagram_size(host, 4000) == 4000


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "2001:db8::1", "example.org", ""])
def test_other_paths_keep_the_smallest_datagram(host: str) -> None:
    assert datagram_size(host) == DATAGRAM_SIZE == 1200


@pytest.mark.parametrize("size", [0, 1199, LOOPBACK_DATAGRAM_SIZE + 1, 65_000])
def test_a_loopback_size_out_of_range_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="1200 to 16000"):
        datagram_size("127.0.0.1", size)


def test_the_callers_configuration_is_left_alone() -> None:
    configuration = client_configuration(server_name="127.0.0.1")
    sized = with_datagram_size(configuration, "127.0.0.1")
    assert sized.max_datagram_size == LOOPBACK_DATAGRAM_SIZE
    assert sized.alpn_protocols == configuration.alpn_protocols
    assert configuration.max_datagram_size == DATAGRAM_SIZE
    assert with_datagram_size(configuration, "192.0.2.1") is configuration


async def test_a_loopback_dial_and_station_use_large_datagrams(station: Station) -> None:
    configuration = client_configuration(server_name="127.0.0.1")
    async with dial("127.0.0.1", station.port, configuration, timeout=10.0) as protocol:
        assert protocol._quic._configuration.max_datagram_size == LOOPBACK_DATAGRAM_SIZE
        assert await protocol.acknowledged(5.0)
        sizes: list[int] = []
        sendto = protocol._transport.sendto  # type: ignore[union-attr]

        def recorded(data: bytes, addr: Any = None) -> None:
            sizes.append(len(data))
            sendto(data, addr)

        protocol._transport.sendto = recorded  # type: ignore[union-attr, method-assign]
        protocol.send(protocol.new_stream(), encode_frame({"pad": bytes(30_000)}))
        await eventually(lambda: sizes)
        assert max(sizes) > DATAGRAM_SIZE
    server = station._server
    assert server is not None
    assert server._configuration.max_datagram_size == LOOPBACK_DATAGRAM_SIZE
