"""Integration fixtures: a real station on 127.0.0.1:0 over real QUIC, in this process; ``mesh``,
three stations linked (a module with a mesh of its own defines its own ``mesh``). The console
tests' ``browser`` is in the root conftest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.wire.identity import Identity
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import station_config, three_stations


@pytest.fixture
async def station(tmp_path: Path) -> AsyncIterator[Station]:
    async with Station(station_config(tmp_path / "station")) as running:
        yield running


@pytest.fixture
def make_node(station: Station) -> Callable[..., Node]:
    def make(identity: Identity | None = None, **kwargs: object) -> Node:
        return Node(identity or new_identity(), [station.endpoint], **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[Station, Station, Station]]:
    async with three_stations(tmp_path) as stations:
        yield stations
