"""The local station's files without a station: settings, status of corrupt or stale files,
a pid that belongs to another program, the start lock (real files, real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from macula.errors import ConfigError
from tools.local_station import station as local_station
from tools.local_station.station import (
    LocalStationError,
    StationFiles,
    local_station_status,
    stop_local_station,
)
from tools.settings import LOCAL_STATION_IDLE_ENV as IDLE_ENV
from tools.settings import LOCAL_STATION_LOG_BYTES_ENV as LOG_BYTES_ENV
from tools.settings import LOCAL_STATION_PORT_ENV as PORT_ENV
from tools.settings import LOCAL_STATION_TIMEOUT_ENV as TIMEOUT_ENV
from tools.settings import home_port
from tools.settings import local_station_settings as settings

KEY = "ab" * 32


@pytest.fixture
def files(tmp_path: Path) -> StationFiles:
    found = StationFiles(tmp_path / "home")
    found.data_dir.mkdir(parents=True, mode=0o700)
    return found


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not a station."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
    yield process
    process.kill()
    process.wait()


def write(files: StationFiles, pid: object, endpoint: str) -> None:
    files.pid.write_text(f"{pid}\n")
    files.endpoint.write_text(f"{endpoint}\n")


def test_settings_have_defaults_and_name_a_bad_value() -> None:
    default = settings({"MACULA_HOME": "/tmp/some-home"})
    assert (default.port, default.timeout_s, default.log_bytes) == (
        home_port(Path("/tmp/some-home")),
        10.0,
        1 << 20,
    )
    assert (default.idle_s, default.check_s) == (6 * 3600.0, 2.0)
    given = settings({PORT_ENV: "0", TIMEOUT_ENV: "2.5", LOG_BYTES_ENV: "4096"})
    assert (given.port, given.timeout_s, given.log_bytes) == (0, 2.5, 4096)
    bad = [(PORT_ENV, "70000"), (PORT_ENV, "x"), (PORT_ENV, "-1"), (TIMEOUT_ENV, "0")]
    bad += [(TIMEOUT_ENV, "soon"), (LOG_BYTES_ENV, "10"), (IDLE_ENV, "0.5")]
    for name, value in bad:
        with pytest.raises(ConfigError, match=name):
            settings({name: value})


def test_no_files_is_stopped(files: StationFiles) -> None:
    status = local_station_status(files.home)
    assert status.state == "stopped" and status.pid is None
    assert stop_local_station(files.home) is False
    assert stop_local_station(files.home / "never-made") is False
    assert not (files.home / "never-made").exists()


@pytest.mark.parametrize(
    ("pid", "endpoint", "said"),
    [
        ("garbage", f"{KEY}@127.0.0.1:4433", "does not hold a process id"),
        ("1", f"{KEY}@127.0.0.1:4433", "does not hold a process id"),
        ("12345", "nothex@127.0.0.1:4433", "does not hold node_id@host:port"),
        ("12345", "127.0.0.1:4433", "names no node id"),
        (None, f"{KEY}@127.0.0.1:4433", "station.pid is missing"),
    ],
)
def test_corrupt_files_are_stale_and_stop_clears_them(
    files: StationFiles, pid: str | None, endpoint: str, said: str
) -> None:
    files.endpoint.write_text(endpoint)
    if pid is not None:
        files.pid.write_text(pid)
    status = local_station_status(files.home)
    assert status.state == "stale" and said in status.detail
    assert stop_local_station(files.home) is False
    assert not files.pid.exists() and not files.endpoint.exists()
    assert (files.data_dir / "station.lock").exists()  # the lock file stays


def test_unreadable_pid_file_is_stale(files: StationFiles) -> None:
    files.pid.write_bytes(b"\xff\xfe")
    files.endpoint.write_text(f"{KEY}@127.0.0.1:4433")
    assert local_station_status(files.home).state == "stale"


def test_a_pid_now_held_by_another_program_is_never_signalled(
    files: StationFiles, stranger: subprocess.Popen[bytes]
) -> None:
    write(files, stranger.pid, f"{KEY}@127.0.0.1:4433")
    status = local_station_status(files.home)
    assert status.state == "stale" and f"pid {stranger.pid}" in status.detail
    assert status.view()["state"] == "stale"
    assert stop_local_station(files.home) is False
    assert stranger.poll() is None  # alive: not ours, not touched
    assert not files.pid.exists()


def test_a_dead_pid_is_stale(files: StationFiles) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, check=True)  # fmt: skip
    write(files, int(done.stdout), f"{KEY}@127.0.0.1:4433")
    assert local_station_status(files.home).state == "stale"


def test_a_process_on_our_data_dir_counts_as_running(files: StationFiles) -> None:
    """What the OS says about the command line decides: a stand-in with the station's
    arguments counts as running, and stop ends it with SIGTERM."""
    stand_in = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; print(1, flush=True); time.sleep(60)",
            "relay.ops.cli",
            "--data-dir",
            str(files.data_dir),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stand_in.stdout is not None and stand_in.stdout.readline()  # it runs (exec'd)
        write(files, stand_in.pid, f"{KEY}@127.0.0.1:4433")
        status = local_station_status(files.home)
        assert status.state == "running" and status.pid == stand_in.pid
        assert status.uptime_s is not None and status.uptime_s >= 0
        assert status.view()["endpoint"] == f"{KEY}@127.0.0.1:4433"
        local_station._STARTED[stand_in.pid] = stand_in  # reaped by stop, as a started one
        assert stop_local_station(files.home) is True
        assert stand_in.returncode == -15
        assert not files.pid.exists() and not files.endpoint.exists()
    finally:
        stand_in.kill()
        stand_in.wait()


def test_a_station_that_ignores_sigterm_is_reported_not_killed(files: StationFiles) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code, "relay.ops.cli", "--data-dir", str(files.data_dir)],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # handler installed
        write(files, stubborn.pid, f"{KEY}@127.0.0.1:4433")
        with pytest.raises(
            LocalStationError, match=f"did not stop within 0 s.*kill -9 {stubborn.pid}"
        ):
            stop_local_station(files.home, timeout_s=0.3)
        assert stubborn.poll() is None and files.pid.exists()
    finally:
        stubborn.kill()
        stubborn.wait()


def test_the_lock_held_elsewhere_times_out_with_a_clear_error(files: StationFiles) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
         str(files.lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        started = time.monotonic()
        locked = local_station._locked(files, 0.2)
        with pytest.raises(LocalStationError, match="starting or stopping the local station"):
            locked.__enter__()
        assert time.monotonic() - started < 2
    finally:
        holder.kill()
        holder.wait()
    with local_station._locked(files, 0.2):  # released when its holder died
        assert os.stat(files.lock).st_mode & 0o777 == 0o600
    assert os.stat(files.data_dir).st_mode & 0o777 == 0o700
