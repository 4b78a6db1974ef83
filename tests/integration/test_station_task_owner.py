"""One task owner on the relay side: the link manager, the station DHT, the room history's
writer and the monitor's HTTP clients all run their tasks in the station's one task group
(``Station.spawn``), each still knowing its own (``macula.task_scope.TaskScope``); a stop
leaves none of them running."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from relay.federation.links import LinkTarget
from relay.station.station import Station
from support.meshkit import station_config
from support.monitorkit import monitor_on
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_every_component_spawns_into_the_station_group_and_a_stop_ends_them(
    tmp_path: Path,
) -> None:
    nowhere = LinkTarget(os.urandom(32), "127.0.0.1", 9)  # never answers: redialled
    config = dataclasses.replace(station_config(tmp_path / "s"), peers=[nowhere])
    station = Station(config)
    await station.__aenter__()
    try:
        async with monitor_on(station, read_timeout_s=60.0) as monitor:
            _, writer = await asyncio.open_connection(*monitor.address)  # sends nothing
            await eventually(lambda: monitor.server.clients == 1)
            assert station.links is not None and station.house is not None
            history = station.house.history
            assert history is not None

            async def idle() -> None:
                await asyncio.Event().wait()

            history_task = history._scope.spawn(idle())  # what the writer is spawned through
            scopes = {
                "links": station.links._scope.tasks(),
                "dht": station.dht._scope.tasks(),
                "monitor": monitor.server._scope.tasks(),
                "history": history._scope.tasks(),
            }
            owned = station.tasks()
            for name, tasks in scopes.items():
                assert tasks, name
                assert tasks <= owned, name  # the station's group runs them
            assert history_task in owned
            every = frozenset().union(*scopes.values())
            await station.stop()  # the monitor still open: the group ends its client too
            assert all(task.done() for task in every)
            assert station.background() == (0, 0)
            writer.close()
    finally:
        await station.stop()
