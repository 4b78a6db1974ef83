"""The local station as its own process (real ``python -m relay.ops.cli`` subprocesses on
loopback port 0, real files under a temporary MACULA_HOME): started once, reused, recovered
after a crash, a port in use, a start that fails or is too slow, a station that stopped
answering. Every test stops what it started (the fixture kills leftovers on failure)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from macula.known_stations import station_node_id
from tools import settings
from tools.local_station import station as local_station
from tools.local_station.station import (
    LocalStationError,
    StationFiles,
    default_station,
    local_station_status,
    stop_local_station,
)
from tools.settings import LOCAL_STATION_PORT_ENV as PORT_ENV
from tools.settings import LOCAL_STATION_TIMEOUT_ENV as TIMEOUT_ENV

pytestmark = pytest.mark.anyio


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "home"
    yield where
    try:
        stop_local_station(where)
    finally:
        for pid, child in list(local_station._STARTED.items()):
            child.kill()
            child.wait()
            local_station._STARTED.pop(pid, None)


def env_of(home: Path, **extra: str) -> dict[str, str]:
    return {"MACULA_HOME": str(home), PORT_ENV: "0", **extra}


class Said(list[str]):
    def __call__(self, text: str) -> None:
        self.append(text)


def process_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its parent (this test process, which started it)
    has not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_started_once_reused_then_stopped(home: Path) -> None:
    said = Said()
    started = time.perf_counter()
    address, endpoint = await default_station(env_of(home), said)
    took = time.perf_counter() - started
    print(f"local station start: {took:.2f} s")
    assert endpoint == str(address) and address.node_id == station_node_id(
        home / "embedded-station"
    )
    assert any("started the local station" in line for line in said)
    files = StationFiles(home)
    for path in (files.pid, files.endpoint, files.log):
        assert os.stat(path).st_mode & 0o777 == 0o600, path
    for path in (home, files.data_dir, files.log.parent):
        assert os.stat(path).st_mode & 0o777 == 0o700, path
    status = local_station_status(home)
    assert status.state == "running" and status.endpoint == endpoint
    pid = status.pid
    assert pid is not None and os.getsid(pid) == pid  # its own session: outlives its starter

    again = Said()
    assert await default_station(env_of(home), again) == (address, endpoint)
    assert again == [] and local_station_status(home).pid == pid

    assert stop_local_station(home) is True
    assert process_gone(pid) and not files.pid.exists() and not files.endpoint.exists()
    assert "station stopped" in files.log.read_text()  # it drained and said so
    assert stop_local_station(home) is False


async def test_two_starting_at_once_start_one(home: Path) -> None:
    first, second = await asyncio.gather(
        default_station(env_of(home), Said()), default_station(env_of(home), Said())
    )
    assert first == second
    assert len(local_station._STARTED) == 1


async def test_a_crashed_station_is_replaced_with_the_same_key(home: Path) -> None:
    address, _ = await default_station(env_of(home), Said())
    pid = local_station_status(home).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    local_station._STARTED.pop(pid).wait()
    assert local_station_status(home).state == "stale"  # its files were left behind
    said = Said()
    replaced, _ = await default_station(env_of(home), said)
    assert replaced.node_id == address.node_id  # the key lives in the data dir
    assert any(f"(pid {pid}) is not running" in line for line in said)
    assert local_station_status(home).pid not in (None, pid)


async def test_a_clean_exit_removes_its_files(home: Path) -> None:
    await default_station(env_of(home), Said())
    files = StationFiles(home)
    pid = local_station_status(home).pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    assert local_station._STARTED.pop(pid).wait(10) == 0
    assert not files.pid.exists() and not files.endpoint.exists()


async def test_a_port_in_use_moves_the_station_to_a_free_port(home: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        said = Said()
        address, _ = await default_station(env_of(home, **{PORT_ENV: str(taken)}), said)
        assert address.port != taken
        assert any(f"127.0.0.1:{taken} is in use" in line for line in said)


async def test_a_station_that_cannot_start_is_reported_with_its_log(home: Path) -> None:
    files = StationFiles(home)
    files.data_dir.mkdir(parents=True)
    (files.data_dir / "station.key").write_bytes(b"not a key file")
    with pytest.raises(LocalStationError, match="exited with status") as failed:
        await default_station(env_of(home), Said())
    assert str(files.out) in str(failed.value) and str(files.log) in str(failed.value)
    assert local_station._STARTED == {}
    assert (files.data_dir / "station.key").read_bytes() == b"not a key file"  # untouched


async def test_a_station_too_slow_to_listen_is_stopped(home: Path) -> None:
    with pytest.raises(LocalStationError, match=f"did not listen within 0.1 s .{TIMEOUT_ENV}"):
        await default_station(env_of(home, **{TIMEOUT_ENV: "0.1"}), Said())
    assert local_station._STARTED == {}
    assert local_station_status(home).state == "stopped"


async def test_a_pid_file_naming_another_program_starts_a_new_station(home: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE)  # fmt: skip
    try:
        files = StationFiles(home)
        files.data_dir.mkdir(parents=True)
        files.pid.write_text(f"{stranger.pid}\n")
        files.endpoint.write_text(f"{'ab' * 32}@127.0.0.1:9\n")
        said = Said()
        await default_station(env_of(home), said)
        assert any(f"(pid {stranger.pid}) is not running" in line for line in said)
        assert stranger.poll() is None  # never signalled
        assert local_station_status(home).pid != stranger.pid
    finally:
        stranger.kill()
        stranger.wait()


async def test_our_station_not_answering_is_reported_not_replaced(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_station, "VERIFY_TIMEOUT_S", 0.5)
    await default_station(env_of(home), Said())
    pid = local_station_status(home).pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(LocalStationError, match=f"pid {pid}.*station stop"):
            await default_station(env_of(home), Said())
        assert local_station_status(home).pid == pid  # its files are kept
    finally:
        os.kill(pid, signal.SIGCONT)


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "--port", "0", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_relay_names_a_file_it_cannot_write(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    done = relay("--data-dir", str(tmp_path / "s"), "--endpoint-file", str(missing / "e"))
    assert done.returncode == 1 and f"cannot write {missing / 'e'}" in done.stderr
    assert not missing.exists()
    done = relay("--data-dir", str(tmp_path / "s"), "--log-file", str(missing / "log"))
    assert done.returncode == 1 and f"--log-file {missing / 'log'}" in done.stderr
    assert relay("--log-max-bytes", "0").returncode == 2  # argparse: must be positive


async def test_each_home_gets_its_own_port_and_a_foreign_station_does_not_stop_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two homes on one machine: the second is not refused because the first one's station
    holds the default address; each runs its own, pinned to its own key."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert settings.home_port(first) == settings.home_port(first)
    assert settings.home_port(first) != settings.home_port(second)
    try:
        one, _ = await default_station({"MACULA_HOME": str(first)}, Said())
        assert one.port == settings.home_port(first)
        monkeypatch.setattr(local_station, "DEFAULT_STATION", f"127.0.0.1:{one.port}")
        said = Said()
        two, _ = await default_station({"MACULA_HOME": str(second)}, said)
        assert two.port != one.port and two.node_id != one.node_id
        assert two.node_id == station_node_id(StationFiles(second).data_dir)
        assert any(f"not using 127.0.0.1:{one.port}" in line for line in said)
    finally:
        stop_local_station(first)
        stop_local_station(second)


def wait_until_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        child = local_station._STARTED.get(pid)
        if child is not None and child.poll() is not None:
            local_station._STARTED.pop(pid, None)
            return True
        if process_gone(pid):
            return True
        time.sleep(0.05)  # polling the process table until the deadline
    return False


async def test_the_station_ends_itself_when_its_home_is_removed(home: Path) -> None:
    import shutil

    env = env_of(home, **{settings.LOCAL_STATION_CHECK_ENV: "0.1"})
    await default_station(env, Said())
    pid = local_station_status(home).pid
    assert pid is not None
    shutil.rmtree(home)
    assert await asyncio.to_thread(wait_until_gone, pid, 15)


async def test_the_station_ends_itself_when_nobody_used_it_for_its_idle_time(
    home: Path,
) -> None:
    env = env_of(
        home, **{settings.LOCAL_STATION_CHECK_ENV: "0.1", settings.LOCAL_STATION_IDLE_ENV: "1"}
    )
    await default_station(env, Said())
    status = local_station_status(home)
    assert status.pid is not None
    assert await asyncio.to_thread(wait_until_gone, status.pid, 15)
    assert local_station_status(home).state == "stopped"  # a clean exit removed its files
