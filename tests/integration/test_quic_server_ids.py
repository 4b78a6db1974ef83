"""The station's QUIC server over real QUIC on loopback: while nodes are connected, its
connection-id map and the map's reverse index agree; once they leave, both are empty (each
ending removed its own ids, ``relay.station.quic_server``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

import pytest

from macula.node.node import Node
from relay.station.quic_server import ProtocolsByCid
from relay.station.station import Station
from support.waiting import eventually

pytestmark = pytest.mark.anyio


def table(station: Station) -> ProtocolsByCid:
    protocols = station._server._protocols  # type: ignore[union-attr]
    assert isinstance(protocols, ProtocolsByCid)
    return protocols


async def test_every_id_of_a_connection_goes_when_it_ends(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(make_node(probe_interval_s=0)) for _ in range(5)]
        for node in nodes:
            await node.flush()
        ids = table(station)
        assert len(ids.cids_of) == 5 and len(ids) >= 5
        assert all(ids[cid] is p for p, cids in ids.cids_of.items() for cid in cids)
        assert sum(len(cids) for cids in ids.cids_of.values()) == len(ids)
    await eventually(lambda: not table(station) and not table(station).cids_of, timeout=10)
