"""Station lifecycle: a failed start leaves nothing open; a stop leaves no timer or task behind."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

import relay.station.station as station_module
from macula.store.base import StoreError
from relay.core.policy import StationPolicy
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import station_config
from support.rawclient import raw_client
from support.waiting import eventually

pytestmark = pytest.mark.anyio


def sqlite_threads() -> int:
    """aiosqlite runs one (non-daemon) worker thread per open connection."""
    return sum("_connection_worker_thread" in t.name for t in threading.enumerate())


def udp_port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_a_taken_port_fails_the_start_and_closes_the_stores(tmp_path: Path) -> None:
    data_dir = tmp_path / "station"
    before = sqlite_threads()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        taken = squatter.getsockname()[1]
        with pytest.raises(OSError):
            await Station(station_config(data_dir, port=taken)).__aenter__()
    # the record and content stores were open when the bind failed: both are closed again
    await eventually(lambda: sqlite_threads() <= before)  # others may end meanwhile
    async with Station(station_config(data_dir)) as station:  # the same data dir serves
        assert station.port != 0


async def test_a_house_store_failure_after_binding_releases_the_port(tmp_path: Path) -> None:
    data_dir = tmp_path / "station"
    (data_dir / "memory.sqlite3").mkdir(parents=True)  # the house memory store cannot open
    before = sqlite_threads()
    station = Station(station_config(data_dir))
    with pytest.raises(StoreError):
        await station.__aenter__()
    assert station.port != 0  # the QUIC server had been bound
    assert udp_port_free(station.port)
    await eventually(lambda: sqlite_threads() <= before)  # others may end meanwhile
    await station.stop()  # a stop after a failed start is a no-op


async def test_stop_cancels_pending_close_timers_and_finishes_every_task(tmp_path: Path) -> None:
    policy = StationPolicy(drain_ms=60_000)  # the replaced connection's close is a minute away
    station = Station(station_config(tmp_path / "station", policy))
    await station.__aenter__()
    identity = new_identity()
    async with raw_client(station, identity) as older, raw_client(station, identity):
        await older.expect(lambda r: r.frame_type == "goodbye")
        tasks, timers = station.background()
        assert tasks and timers
        handles = list(station._timers)
        await station.stop()
        assert all(timer.cancelled() for timer in handles)
        assert station.background() == (0, 0)  # every task in its group done, no timer left
    await station.stop()  # idempotent


async def test_stop_says_goodbye_to_every_client_before_closing_it(tmp_path: Path) -> None:
    station = Station(station_config(tmp_path / "station"))
    await station.__aenter__()
    async with raw_client(station) as first, raw_client(station) as second:
        await station.stop()
        for client in (first, second):
            goodbye = await client.expect(lambda r: r.frame_type == "goodbye")
            assert goodbye.frame.get("reason") == "operator_stop"
            await client.lost.wait()  # closed once the GOODBYE was through


async def test_a_client_that_never_acknowledges_holds_the_stop_only_to_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(station_module, "DRAIN_DEADLINE_S", 0.05)
    station = Station(station_config(tmp_path / "station"))
    await station.__aenter__()
    async with raw_client(station) as silent:
        transport: Any = silent.protocol._transport
        transport.sendto = lambda *_: None  # its ACKs (and everything else) go nowhere
        await asyncio.wait_for(station.stop(), 10)  # bounded, not the 60 s idle timeout
        assert station.background() == (0, 0)


async def test_a_failing_background_task_is_logged_and_the_rest_keep_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async with Station(station_config(tmp_path / "station")) as station:
        running, _ = station.background()
        station.spawn(fails())
        await eventually(lambda: "station task failed" in caplog.text)
        assert station.background()[0] == running  # the ticker and the refresher still run
        async with raw_client(station) as client:  # and the station still serves
            assert client.control is not None
