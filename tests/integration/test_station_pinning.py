"""Station identity over real QUIC: pinned on first use (known_stations), and the default
station of ``macula-mcp`` dialled only when its key is this home's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from macula.client.backoff import Backoff
from macula.config import known_stations_from_env
from macula.errors import HandshakeError
from macula.known_stations import KnownStationsError, station_node_id
from macula.node.node import Node
from macula.stations import parse_station
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import station_config
from tools import settings
from tools.cli import _station_check
from tools.local_station import station as local_station
from tools.local_station.station import ForeignStationError
from tools.server.runtime import open_runtime

pytestmark = pytest.mark.anyio
FAST = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1)


def unpinned(station: Station) -> str:
    return f"127.0.0.1:{station.port}"


async def test_a_station_given_without_node_id_is_pinned_on_first_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"MACULA_HOME": str(home), "MACULA_MCP_IDENTITY": str(home / "id.key")}
    async with (
        Station(station_config(tmp_path / "a")) as a,
        Station(station_config(tmp_path / "b")) as b,
    ):
        known = known_stations_from_env(env)
        stations = {"MACULA_MESH_STATIONS": unpinned(a)}
        async with Node.from_env(env | stations, backoff=FAST) as node:
            assert node.station is not None and node.station.node_id is None  # first use
            await node.flush()
        assert known.load() == {unpinned(a): a.node_id}
        assert os.stat(known.path).st_mode & 0o777 == 0o600
        assert os.stat(home).st_mode & 0o777 == 0o700

        async with Node.from_env(env | stations, backoff=FAST) as node:  # the same key passes
            assert node.station is not None and node.station.node_id == a.node_id
            session = await node.session()
            assert session.tls_pinned
            await node.flush()
        assert len(known.path.read_text().splitlines()) == 1

        # the station at that address now shows another key (here: the line says b's key)
        known.path.write_text(f"{unpinned(a)} {b.node_id.hex()}\n")
        with pytest.raises(KnownStationsError) as refused:
            async with Node.from_env(env | stations, backoff=FAST):
                pass
        text = str(refused.value)
        assert not refused.value.retryable
        assert f"remove the line for {unpinned(a)} from {known.path}" in text
        assert f"node_id@{unpinned(a)} in MACULA_MESH_STATIONS" in text
        assert a.node_id.hex() in text and b.node_id.hex() in text
        assert known.path.read_text() == f"{unpinned(a)} {b.node_id.hex()}\n"  # never rewritten

        # honest clients of the same station are unaffected: a pinned address, another station
        async with Node(new_identity(), [a.endpoint]) as honest:
            await honest.flush()
        async with Node.from_env(env | {"MACULA_MESH_STATIONS": unpinned(b)}) as other:
            await other.flush()

        known.path.write_text("garbage line\n")
        with pytest.raises(KnownStationsError, match=r"known_stations line 1: .*host:port"):
            async with Node.from_env(env | stations, backoff=FAST):
                pass


async def test_the_default_station_is_used_only_with_this_homes_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    env = {"MACULA_HOME": str(home), "MACULA_MCP_IDENTITY": str(home / "id.key")}
    ours = home / "embedded-station"
    async with Station(station_config(tmp_path / "theirs")) as theirs:
        default = unpinned(theirs)
        monkeypatch.setattr(local_station, "DEFAULT_STATION", default)

        # nothing of ours yet: a station found there is not trusted (doctor says why) ...
        with pytest.raises(ForeignStationError, match="no station key to check it against"):
            await local_station.own_default_station(env)
        # ... and never used: this home starts its own station, on a port of its own
        try:
            async with open_runtime(env) as runtime:
                node_id = station_node_id(ours)
                assert node_id is not None and node_id != theirs.node_id
                assert runtime.embedded_station is not None
                assert runtime.embedded_station.startswith(node_id.hex() + "@127.0.0.1:")
                assert not runtime.embedded_station.endswith(f":{theirs.port}")
                await runtime.node.flush()
                assert (await runtime.node.session()).tls_pinned

            # our embedded station's key is another: refused, naming both keys and our data dir
            expected = local_station.own_station_keys(env)
            with pytest.raises(ForeignStationError) as refused:
                await local_station.own_default_station(env)
            text = str(refused.value)
            assert isinstance(refused.value, HandshakeError) and not refused.value.retryable
            assert f"presented key {theirs.node_id.hex()}" in text
            assert next(iter(expected)).hex() in text and str(ours / "station.key") in text
            assert f"MACULA_MESH_STATIONS={theirs.endpoint}" in text
            doctor = await _station_check(env, parse_station(default))
            assert doctor == (f"station {default}", None, text)  # a warning, not a failure
        finally:
            local_station.stop_local_station(home)

    # our own station on that port (macula-relay's default data dir): dialled pinned
    async with Station(station_config(home / "station")) as mine:
        monkeypatch.setattr(local_station, "DEFAULT_STATION", unpinned(mine))
        doctor = await _station_check(env, parse_station(unpinned(mine)))
        assert doctor[1] and mine.node_id.hex() in doctor[2] and str(home / "station") in doctor[2]
        async with open_runtime(env) as runtime:
            assert [str(s) for s in runtime.stations] == [mine.endpoint]
            assert runtime.embedded_station is None
            await runtime.node.flush()
            assert (await runtime.node.session()).tls_pinned

    # nothing there: the local station process starts on this home's own port with our
    # key, pinned, and outlives the runtime that started it
    port = settings.home_port(home)
    try:
        async with open_runtime(env) as runtime:
            assert runtime.embedded_station is not None
            node_id = station_node_id(ours)
            assert node_id is not None and runtime.embedded_station == (
                f"{node_id.hex()}@127.0.0.1:{port}"
            )
            await runtime.node.flush()
        assert local_station.local_station_status(home).state == "running"
    finally:
        local_station.stop_local_station(home)
    assert local_station.local_station_status(home).state == "stopped"
