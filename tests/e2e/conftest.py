"""End-to-end fixtures: a real station on 127.0.0.1:0 in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.station.station import Station, StationConfig


@pytest.fixture
async def station(tmp_path: Path) -> AsyncIterator[Station]:
    async with Station(StationConfig(data_dir=tmp_path / "station", port=0)) as running:
        yield running
