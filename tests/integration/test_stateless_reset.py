"""Stateless resets over real QUIC on loopback (RFC 9000 §10.3, ``macula.quic.resets``).

A station answers a short-header packet for a connection id it does not know with a reset
carrying the token derived from its key and that id (none for a tiny packet, at most its rate
a second); a node whose station forgot its connection learns it from that reset and is back at
once, intent replayed. The station restarted for real (SIGKILL, same key, port and data dir)
is ``test_station_restart.py``. aioquic only: a qh3 station sends no resets.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import pytest

from macula.node.node import Node
from macula.quic.backend import STATELESS_RESETS
from macula.quic.resets import (
    RESET_MIN_SIZE,
    TOKEN_SIZE,
    ResetLimiter,
    StatelessResets,
    is_reset,
)
from relay.station.quic_server import ProtocolsByCid
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM
from support.waiting import eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not STATELESS_RESETS, reason="stateless resets need aioquic"),
]
CID_LENGTH = 8  # aioquic's connection ids, the station's too


@pytest.fixture
async def udp() -> AsyncIterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock
    finally:
        sock.close()


def short_packet(cid: bytes, size: int) -> bytes:
    return bytes([0x40 | 0x01]) + cid + os.urandom(size - 1 - len(cid))


async def reply(sock: socket.socket) -> bytes:
    return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 2048), 5)


def resets_of(station: Station) -> StatelessResets:
    assert station.resets is not None
    return station.resets


async def test_an_unknown_connection_gets_a_reset_with_the_token_of_the_station_key(
    station: Station, udp: socket.socket
) -> None:
    cid = os.urandom(CID_LENGTH)
    trigger = short_packet(cid, 300)
    udp.sendto(trigger, ("127.0.0.1", station.port))
    answer = await reply(udp)
    expected = StatelessResets(station.identity.seed, os.urandom).token(cid)
    assert is_reset(answer, expected) and answer.endswith(expected)
    assert answer[0] & 0xC0 == 0x40 and RESET_MIN_SIZE <= len(answer) < len(trigger)
    assert resets_of(station).sent == 1


async def test_every_connection_id_the_station_hands_out_carries_its_derived_token(
    station: Station,
) -> None:
    """The id of the transport parameters and those of NEW_CONNECTION_ID frames alike."""
    async with Node(new_identity(), [station.endpoint], probe_interval_s=0) as node:
        await node.flush()
        quic = (await node.session()).protocol._quic
        await eventually(lambda: len(quic._peer_cid_available) >= 1)  # NEW_CONNECTION_ID
        given = [quic._peer_cid, *quic._peer_cid_available]  # type: ignore[attr-defined]
        expected = StatelessResets(station.identity.seed, os.urandom)
        assert all(c.stateless_reset_token == expected.token(c.cid) for c in given)
        assert len({c.stateless_reset_token for c in given}) == len(given)


async def test_tiny_packets_get_no_reset_and_the_rate_is_bounded(
    station: Station, udp: socket.socket
) -> None:
    resets = resets_of(station)
    address = ("127.0.0.1", station.port)
    udp.sendto(short_packet(os.urandom(CID_LENGTH), RESET_MIN_SIZE), address)  # too small
    cid = os.urandom(CID_LENGTH)
    udp.sendto(short_packet(cid, 60), address)
    answer = await reply(udp)  # the first answer is the second packet's: none came for the first
    assert answer.endswith(resets.token(cid)) and len(answer) < 60
    assert (resets.too_small, resets.sent) == (1, 1)

    resets.limiter = ResetLimiter(rate=0.001, burst=2)  # two now, then one in 1,000 s
    for _ in range(6):
        udp.sendto(short_packet(os.urandom(CID_LENGTH), 100), address)
    await eventually(lambda: resets.sent + resets.limited == 7, timeout=5)
    assert (resets.sent, resets.limited) == (3, 4)
    answers = [await reply(udp) for _ in range(2)]
    assert all(len(a) >= RESET_MIN_SIZE for a in answers)


async def test_a_node_whose_connection_the_station_forgot_is_reset_and_back_at_once(
    station: Station,
) -> None:
    """The station loses the connection (as a restarted one has): the node's next packet is
    answered with a reset, which ends its connection at once; it dials again without waiting
    (``settle_s=0``: its connection had settled), replays its subscription, and its PUBLISH
    in flight is confirmed on the new connection. No probe runs: only the reset could tell."""
    node = Node(new_identity(), [station.endpoint], probe_interval_s=0, settle_s=0)
    async with node:
        sub = await node.subscribe(REALM, "reset.news")
        await node.flush()
        protocol = (await node.session()).protocol
        forged = os.urandom(40) + os.urandom(TOKEN_SIZE)  # not the station's token
        protocol.datagram_received(forged, ("127.0.0.1", station.port))
        assert not protocol.lost and node.stats.stateless_resets == 0
        await node.flush()

        table = station._server._protocols  # type: ignore[union-attr]
        assert isinstance(table, ProtocolsByCid)
        for connection in list(table.cids_of):
            table.forget(connection)  # the station no longer knows the node's connection
        await node.publish_confirmed(REALM, "reset.news", "after the reset", timeout=10)
        assert protocol.lost and protocol.reset_by_peer
        assert "stateless reset" in protocol.lost_reason
        assert (node.stats.stateless_resets, node.stats.reconnects) == (1, 1)
        assert (await sub.next(5)).payload == "after the reset"  # subscription replayed
        await node.flush()
        async with Node(new_identity(), [station.endpoint]) as other:
            await other.publish(REALM, "reset.news", "from another node")
            assert (await sub.next(5)).payload == "from another node"
    assert resets_of(station).sent >= 1
