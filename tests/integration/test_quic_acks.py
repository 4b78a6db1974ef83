"""When ``FrameProtocol`` acknowledges: an ACK rides on a reply, leaves at once after
``ack_every`` datagrams or a skipped packet number, and otherwise within ``ack_delay_s``; the
connection timer (moved only when its deadline comes earlier) still drives loss recovery.

Runs on the in-memory ``Wire`` pair of support.quickit (aioquic's real ``QuicServer``), so every
datagram each side sends is counted exactly. No timing is asserted: "at once" means within the
loop turns named, "later" is waited for with ``eventually``; where a test asserts that an ACK
did *not* leave, the ack timer is set a minute out (``hold_acks``) so a slow turn cannot send it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from macula.quic import backend as quic_backend
from macula.quic.acks import ACK_DELAY_S, MAX_ACK_DELAY_S
from macula.quic.backend import set_ack_delay
from macula.quic.transport import FrameProtocol
from support.quickit import SERVER_ADDR, Pair, Sink, encode_frame, pair
from support.waiting import eventually

__all__ = ["pair"]  # the fixture, imported for the tests below

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        quic_backend.BACKEND == "qh3",
        reason=("ACK scheduling is aioquic's; on qh3 the native core schedules ACKs itself"),
    ),
]


def in_flight(protocol: FrameProtocol) -> int:
    """Bytes ``protocol`` sent that its peer has not acknowledged yet."""
    return int(protocol._quic._loss.bytes_in_flight)


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)  # one loop turn each: the in-memory wire delivers per turn


class Echo(Sink):
    """A server sink that answers every frame at once, on the same stream (an RPC server)."""

    def __init__(self, server: FrameProtocol) -> None:
        super().__init__()
        self.server = server

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        super().frames_received(stream_id, frames)
        for frame in frames:
            self.server.send(stream_id, encode_frame({"echo": frame["n"]}))


def hold_acks(*protocols: FrameProtocol) -> None:
    """An ACK no packet carries waits a minute: out of every test's way."""
    for protocol in protocols:
        set_ack_delay(protocol._quic, 60.0)


async def opened(pair: Pair) -> int:
    """A stream both sides know, with every ACK of the handshake and the first frame settled."""
    stream = pair.client.new_stream()
    pair.client.send(stream, encode_frame({"n": -1}))
    await eventually(lambda: pair.server_sink.frames)
    await eventually(lambda: in_flight(pair.client) == 0 and in_flight(pair.server) == 0)
    return stream


async def test_the_ack_rides_on_the_reply_and_no_ack_only_datagram_is_sent(pair: Pair) -> None:
    stream = await opened(pair)
    hold_acks(pair.client, pair.server)
    echo = Echo(pair.server)
    pair.server.sink = echo
    for n in range(5):  # sequential request/response, as an RPC caller does
        up, down = len(pair.to_server.sent), len(pair.to_client.sent)
        pair.client.send(stream, encode_frame({"n": n}))
        await eventually(lambda n=n: {"echo": n} in pair.client_sink.frames)  # type: ignore[misc]
        # one datagram each way: the reply carried the server's ACK of the request, and
        # the next request carries the client's ACK of this reply
        assert len(pair.to_server.sent) - up == 1
        assert len(pair.to_client.sent) - down == 1
        assert in_flight(pair.client) == 0  # the request is acknowledged (by the reply)
    assert in_flight(pair.server) > 0  # the last reply's ACK waits for a packet to ride on


async def test_a_lone_datagram_is_not_acknowledged_at_once(pair: Pair) -> None:
    stream = await opened(pair)
    hold_acks(pair.client)
    up = len(pair.to_server.sent)
    pair.server.send(stream, encode_frame({"n": 1}))
    await eventually(lambda: {"n": 1} in pair.client_sink.frames)
    await turns(3)  # the client's transmit for that turn ran: nothing was worth sending
    assert len(pair.to_server.sent) == up
    assert in_flight(pair.server) > 0
    pair.client.send(stream, encode_frame({"n": 2}))  # the next packet carries the ACK
    await eventually(lambda: in_flight(pair.server) == 0)
    assert len(pair.to_server.sent) == up + 1


async def test_a_lone_datagram_is_acknowledged_within_the_ack_delay(pair: Pair) -> None:
    stream = await opened(pair)
    up = len(pair.to_server.sent)
    pair.server.send(stream, encode_frame({"n": 1}))
    await eventually(lambda: {"n": 1} in pair.client_sink.frames)
    await eventually(lambda: in_flight(pair.server) == 0)  # the ack timer sent it
    assert len(pair.to_server.sent) == up + 1  # one ACK-only datagram


async def test_two_datagrams_owed_an_ack_get_it_in_the_same_turn(pair: Pair) -> None:
    stream = await opened(pair)
    pair.to_client.hold = True
    pair.server.send(stream, encode_frame({"n": 1, "pad": bytes(1500)}))  # two datagrams
    await eventually(lambda: len(pair.to_client.held) >= 2, message="server sent too little")
    held, pair.to_client.held = pair.to_client.held, []
    pair.to_client.hold = False
    up = len(pair.to_server.sent)
    for datagram in held:
        pair.client.datagram_received(datagram, SERVER_ADDR)
    await turns(1)  # the client's transmit of this turn
    assert len(pair.to_server.sent) == up + 1  # the ACK, without waiting for the timer
    await turns(1)  # the wire delivers it
    assert in_flight(pair.server) == 0


async def test_a_skipped_packet_number_is_acknowledged_at_once(pair: Pair) -> None:
    stream = await opened(pair)
    pair.to_client.hold = True
    pair.server.send(stream, encode_frame({"n": 1}))
    await eventually(lambda: pair.to_client.held)
    pair.to_client.held.clear()  # lost on the way
    pair.server.send(stream, encode_frame({"n": 2}))
    await eventually(lambda: pair.to_client.held)
    later, pair.to_client.held = pair.to_client.held, []
    pair.to_client.hold = False
    up = len(pair.to_server.sent)
    for datagram in later:  # one datagram: ``ack_every`` alone would let the ACK wait
        pair.client.datagram_received(datagram, SERVER_ADDR)
    await turns(1)
    assert len(pair.to_server.sent) == up + 1  # the ACK that tells the server of the gap
    # and the lost frame is sent again: both arrive, in order
    await eventually(lambda: pair.client_sink.frames[-2:] == [{"n": 1}, {"n": 2}])


async def test_a_datagram_lost_in_silence_is_resent_by_the_timer(pair: Pair) -> None:
    stream = await opened(pair)
    pair.to_client.hold = True
    pair.server.send(stream, encode_frame({"n": 7}))
    await eventually(lambda: pair.to_client.held)
    pair.to_client.held.clear()  # the only datagram is lost; nothing else is sent
    pair.to_client.hold = False
    await eventually(lambda: {"n": 7} in pair.client_sink.frames)  # loss timer: resent
    await eventually(lambda: in_flight(pair.server) == 0)


async def test_an_ack_delay_of_zero_sends_every_ack_at_once(pair: Pair) -> None:
    stream = await opened(pair)
    pair.client.configure_acks(0.0, 1)
    up = len(pair.to_server.sent)
    pair.server.send(stream, encode_frame({"n": 1}))
    await eventually(lambda: {"n": 1} in pair.client_sink.frames)
    await turns(1)
    assert len(pair.to_server.sent) == up + 1


async def test_ack_settings_out_of_range_are_refused(pair: Pair) -> None:
    assert pair.client.ack_delay_s == ACK_DELAY_S
    with pytest.raises(ValueError, match="ack delay"):
        pair.client.configure_acks(MAX_ACK_DELAY_S + 0.001, 2)
    with pytest.raises(ValueError, match="ack delay"):
        pair.client.configure_acks(-0.001, 2)
    with pytest.raises(ValueError, match="ack_every"):
        pair.client.configure_acks(ACK_DELAY_S, 0)
    assert pair.client.ack_delay_s == ACK_DELAY_S and pair.client.ack_every == 2
