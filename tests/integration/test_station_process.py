"""``tools.local_station.process``: a station started through its entry point (a real
``python -m relay.ops.cli`` subprocess on loopback port 0), reached over QUIC, stopped on leaving;
one that cannot start says why. And no module of ``tools`` loads ``relay`` into its process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from macula.stations import parse_station
from support.paths import REPO
from tools.local_station.process import StationProcessError, relay_environment, station_process
from tools.local_station.station import presented_key

pytestmark = pytest.mark.anyio


async def test_a_station_process_listens_answers_with_its_key_and_stops(tmp_path: Path) -> None:
    async with station_process(tmp_path / "station") as endpoint:
        address = parse_station(endpoint)
        assert address.host == "127.0.0.1" and address.port > 0
        assert await presented_key(address, timeout=5) == address.node_id
    assert await presented_key(address, timeout=1) is None  # stopped: nothing answers


async def test_a_station_restarted_on_its_port_comes_back_with_the_same_key(
    tmp_path: Path,
) -> None:
    async with station_process(tmp_path / "station") as first:
        pass
    port = parse_station(first).port
    async with station_process(tmp_path / "station", port=port) as again:
        assert again == first  # same data directory, same key; same port
        assert await presented_key(parse_station(again), timeout=5) == parse_station(first).node_id


async def test_a_station_that_cannot_start_says_why(tmp_path: Path) -> None:
    data_dir = tmp_path / "station"
    data_dir.mkdir()
    (data_dir / "station.key").write_bytes(b"not a key")
    with pytest.raises(StationProcessError, match="before listening") as caught:
        async with station_process(data_dir, timeout_s=30):
            pass
    assert "station.out" in str(caught.value)


def test_relay_environment_names_relay_without_importing_it(tmp_path: Path) -> None:
    script = (
        "import os, sys; from pathlib import Path\n"
        "from tools.local_station.process import relay_environment\n"
        "env = relay_environment({'PYTHONPATH': 'elsewhere'})\n"
        "first, *rest = env['PYTHONPATH'].split(os.pathsep)\n"
        "assert (Path(first) / 'relay' / 'ops' / 'cli.py').is_file(), first\n"
        "assert rest == ['elsewhere'], rest\n"
        "print(int('relay' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert relay_environment({})["PYTHONPATH"]


def test_no_tools_module_loads_relay() -> None:
    root = REPO
    names = sorted(
        ".".join(p.relative_to(root).with_suffix("").parts)
        for p in (root / "tools").glob("*.py")
        if p.name != "__init__.py"
    )
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'relay' or m.startswith('relay.')))\n"
    )
    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
        cwd=root, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
