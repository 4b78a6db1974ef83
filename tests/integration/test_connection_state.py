"""Per-connection state after the handshake: one key share offered, TLS buffers released, one
spare connection id each way and PADDING skipped natively."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aioquic.tls import Group

from macula.node.node import Node
from macula.quic import backend as quic_backend
from macula.quic.backend import ACTIVE_CONNECTION_ID_LIMIT, _skip_padding
from relay.station.station import Station
from support.meshkit import REALM

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        quic_backend.BACKEND == "qh3",
        reason=(
            "aioquic's handshake trims; on qh3 those helpers of macula.quic.backend do nothing"
        ),
    ),
]


async def test_client_offers_one_key_share(make_node: Callable[..., Node]) -> None:
    async with make_node(probe_interval_s=0) as node:
        session = node._session
        assert session is not None
        tls = session.protocol._quic.tls
        assert tls._supported_groups == [Group.X25519]
        assert tls._ec_private_keys == [] and tls._x448_private_key is None


async def test_station_releases_handshake_buffers_and_still_relays(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node(probe_interval_s=0) as alice, make_node(probe_interval_s=0) as bob:
        await alice.flush()
        await bob.flush()
        assert len(station._connections) == 2
        for connection in station._connections.values():
            buffers = connection._quic._crypto_buffers
            assert buffers and all(buf.capacity == 0 for buf in buffers.values())
        sub = await bob.subscribe(REALM, "after.handshake")
        await bob.flush()  # the station has the subscription
        await alice.publish(REALM, "after.handshake", b"hi")
        assert (await sub.next(10.0)).payload == b"hi"


async def test_both_ends_ask_for_one_spare_connection_id_and_skip_padding_natively(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node(probe_interval_s=0) as node:
        await node.flush()
        session = node._session
        assert session is not None
        (served,) = station._connections.values()
        for quic in (session.protocol._quic, served._quic):
            assert quic._local_active_connection_id_limit == ACTIVE_CONNECTION_ID_LIMIT
            assert len(quic._peer_cid_available) <= ACTIVE_CONNECTION_ID_LIMIT - 1
            handlers = quic._QuicConnection__frame_handlers  # type: ignore[attr-defined]
            assert handlers[0x00][0] is _skip_padding
