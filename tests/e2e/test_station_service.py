"""``macula-relay`` as a service, in real subprocesses: the config file and its precedence, errors
naming the line, SIGHUP reloading a rate without dropping a client, systemd's notify socket
(READY, WATCHDOG, STOPPING; a path and an abstract ``@`` socket), JSON log lines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from macula.node.node import Node
from macula.wire.identity import Identity, realm_tag

pytestmark = pytest.mark.anyio
REALM = realm_tag("org.example.service")
RELAY = [sys.executable, "-m", "relay.ops.cli"]
PEER = "ab" * 32 + "@127.0.0.1:4999"


def relay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RELAY, *args], capture_output=True, text=True, timeout=30, env=env)


def test_flags_override_the_file_and_print_config_shows_it(tmp_path: Path) -> None:
    config = tmp_path / "station.toml"
    config.write_text(
        "port = 0\npublish-rate = 7.5\ncall-rate = 11\nno-memory = true\n"
        f'peer = ["{PEER}"]\nlog-level = "warning"\n'
    )
    shown = relay("--config", str(config), "--publish-rate", "9", "--print-config")
    assert shown.returncode == 0, shown.stderr
    effective = tomllib.loads(shown.stdout)
    assert effective["publish-rate"] == 9.0  # the flag wins
    assert effective["call-rate"] == 11.0 and effective["no-memory"] is True  # from the file
    assert effective["peer"] == [PEER] and effective["log-level"] == "warning"
    assert effective["max-subscriptions"] == 4096  # the default
    # the round trip and a repeated flag replacing the list:
    # tests/unit/relay/ops/test_config_file.py


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('port = 0\n\npublsh-rate = 5\n', "unknown key 'publsh-rate' (did you mean 'publish-rate'"),
        ('port = 0\n# a comment\n  call-rate = "fast"\n', "line 3: key 'call-rate': 'fast' is not"),
        ('puzzle = "sometimes"\n', "line 1: key 'puzzle': 'sometimes' is not one of"),
        ('no-memory = 1\n', "line 1: key 'no-memory': expected true or false"),
        ('port = 0\n[monitor]\nport = 1\n', "line 2: [monitor]: tables are not options"),
        ('port = 0\nmax-clock-skew-ms = -1\n', "(set in"),
        ('port = = 0\n', "not TOML"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_file_line_and_key(
    tmp_path: Path, text: str, needle: str
) -> None:
    config = tmp_path / "station.toml"
    config.write_text(text)
    run = relay("--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert run.returncode != 0
    assert needle in run.stderr and str(config) in run.stderr, run.stderr
    if "(set in" in needle:
        assert "--max-clock-skew-ms must be >= 0" in run.stderr and "line 2" in run.stderr


def test_a_public_monitor_address_needs_its_flag(tmp_path: Path) -> None:
    run = relay("--monitor", "0.0.0.0:0", "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert run.returncode != 0 and "--monitor-public" in run.stderr


class StationProcess:
    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = tmp_path / "station.log"
        command = [*RELAY, "--port", "0", "--data-dir", str(tmp_path / "data"), *args]
        command += ["--log-file", str(self.log)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().strip()
        assert self.endpoint, self.process.stderr.read() if self.process.stderr else ""

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@contextmanager
def station_process(tmp_path: Path, *args: str, **kw: Any) -> Iterator[StationProcess]:
    running = StationProcess(tmp_path, *args, **kw)
    try:
        yield running
    finally:
        running.stop()


async def logged(station: StationProcess, needle: str, timeout: float = 10.0) -> dict[str, Any]:
    """The first JSON log line whose message holds ``needle`` (polled until it is written)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        for line in station.lines():
            entry = json.loads(line)  # every line is JSON (--log-format json)
            if needle in entry["msg"]:
                return dict(entry)
        assert loop.time() < deadline, f"{needle!r} never logged"
        await asyncio.sleep(0.02)  # polling the log file for the line


async def monitor_get(address: str, path: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\n\r\n".encode())
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    document: dict[str, Any] = json.loads(response.partition(b"\r\n\r\n")[2])
    return document


async def test_sighup_changes_a_rate_without_dropping_clients(tmp_path: Path) -> None:
    config = tmp_path / "station.toml"
    config.write_text("publish-rate = 1000\nmax-streams = 64\n")
    flags = ["--config", str(config), "--monitor", "127.0.0.1:0", "--log-format", "json"]
    with station_process(tmp_path, *flags) as station:
        line = await logged(station, "monitor listening on")
        assert set(line) == {"ts", "level", "logger", "msg"} and line["level"] == "info"
        address = line["msg"].split("http://")[1].rstrip("/")
        async with Node(Identity.generate(os.urandom), [station.endpoint]) as alice:
            await alice.flush()
            before = (await monitor_get(address, "/connections"))["connections"]
            assert len(before) == 1
            for n in range(30):  # well under the first rate: never paused
                await alice.publish(REALM, "news", {"n": n})
            await alice.flush()
            assert (await monitor_get(address, "/status"))["publishers_paused_total"] == 0
            config.write_text("publish-rate = 2\nmax-streams = 64\nhost = '127.0.0.2'\n")
            station.process.send_signal(signal.SIGHUP)
            await logged(station, "reloaded publish-rate: 1000.0 -> 2.0")
            restart = await logged(station, "needs a restart")
            assert restart["msg"].endswith(": host") and restart["level"] == "warning"
            for n in range(8):  # twice the new burst (4): paused, nothing dropped
                await alice.publish(REALM, "news", {"n": n})
            await paused(address)
            after = (await monitor_get(address, "/connections"))["connections"]
            assert [(r["conn"], r["since_ms"]) for r in after] == [
                (r["conn"], r["since_ms"]) for r in before
            ]  # the same connection: the client was not dropped
        assert station.stop() == 0


async def paused(address: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (await monitor_get(address, "/status"))["publishers_paused_total"] == 0:
        assert loop.time() < deadline, "the publisher was never paused"
        await asyncio.sleep(0.02)  # polling the monitor for the pause


def notify_socket(tmp_path: Path, abstract: bool) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"macula-test-{os.getpid()}-{tmp_path.name}"
        sock.bind(b"\0" + name.encode())
        return sock, f"@{name}"
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    return sock, str(path)


def messages(sock: socket.socket, until: str, timeout: float = 15.0) -> list[dict[str, str]]:
    """Datagrams (``KEY=value`` lines) until one carries ``until``."""
    sock.settimeout(timeout)
    got = []
    while True:
        fields = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
        got.append(fields)
        if until in fields:
            return got


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_watchdog_and_stopping_reach_the_notify_socket(
    tmp_path: Path, abstract: bool
) -> None:
    sock, address = notify_socket(tmp_path, abstract)
    env = os.environ | {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"}
    with sock, station_process(tmp_path, env=env) as station:
        ready = messages(sock, "READY")[-1]
        assert ready["READY"] == "1" and ready["MAINPID"] == str(station.process.pid)
        assert ready["STATUS"] == f"serving {station.endpoint}"
        assert "WATCHDOG" in messages(sock, "WATCHDOG")[-1]
        station.process.send_signal(signal.SIGTERM)
        assert messages(sock, "STOPPING")[-1]["STOPPING"] == "1"
        assert station.process.wait(timeout=15) == 0
