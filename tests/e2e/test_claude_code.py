"""First contact with the real Claude Code CLI (``claude`` on PATH; skipped otherwise; nothing is
installed here): ``macula-mcp register`` into a throwaway HOME, then ``claude mcp list``
health-checks the server by starting it. It must show macula connected in a fresh home, with
another home's station holding 127.0.0.1:4433, and with a stale station whose home was deleted
holding it; and Claude Code's own debug log must show one spawn, no probe timeout, and the
2025-11-25 ("legacy") era, the one in which it keeps ``claude/channel``. Registered with
``--http`` against a running daemon (``macula-mcp console`` starts it) whose ``/mcp`` keeps at
most 2 sessions, ``claude mcp list`` (which never ends its session) connects over HTTP on every
one of more runs than that: the daemon ends the least recently used idle session for each.

Every station and daemon started here is stopped at the end; Claude Code ends the servers it
started itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.station.station import Station
from support.mcpkit import cli, stop_daemon_for_good
from tools.launch import server_command
from tools.local_station import station as local_station
from tools.settings import HTTP_MAX_SESSIONS_ENV

CLAUDE = shutil.which("claude")
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="the claude CLI is not on PATH")
DEFAULT_PORT = 4433


def harness_env(home: Path) -> dict[str, str]:
    """What a person's shell gives Claude Code: a HOME, no macula settings of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MACULA_", "CLAUDE"))}
    env.update(HOME=str(home), NO_COLOR="1")
    return env


def register(home: Path, *extra: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    done = cli(["register", "--harness", "claude-code", *extra], harness_env(home))
    assert done.returncode == 0, done.stderr
    entry = json.loads((home / ".claude.json").read_text())["mcpServers"]["macula"]
    assert Path(entry["command"]).name == Path(server_command()[0]).name


def mcp_list(home: Path) -> str:
    assert CLAUDE is not None
    done = subprocess.run(
        [CLAUDE, "mcp", "list"],
        cwd=home,
        env=harness_env(home),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    return done.stdout + done.stderr


def connected(listing: str) -> bool:
    line = next((text for text in listing.splitlines() if text.startswith("macula:")), "")
    return "Connected" in line and "Failed" not in line


@pytest.fixture
def homes(tmp_path: Path) -> Iterator[list[Path]]:
    """HOMEs for Claude Code; each one's local station and daemon are stopped afterwards."""
    made: list[Path] = []
    yield made
    for home in made:
        with contextlib.suppress(Exception):
            cli(["daemon", "stop"], {**harness_env(home), "MACULA_HOME": str(home / ".macula")})
        with contextlib.suppress(Exception):
            local_station.stop_local_station(home / ".macula")


@contextlib.contextmanager
def station_on_default_port(data_dir: Path) -> Iterator[subprocess.Popen[bytes] | None]:
    """A station of some other home listening on 127.0.0.1:4433, started without the watch
    for its home (as older versions did); None when the port is taken already (then whatever
    holds it plays the foreign station)."""
    if local_station._port_taken(DEFAULT_PORT):
        yield None
        return
    data_dir.mkdir(parents=True, mode=0o700)
    endpoint = data_dir / "station.endpoint"
    child = subprocess.Popen(
        [sys.executable, "-m", "relay.ops.cli", "--port", str(DEFAULT_PORT), "--data-dir",
         str(data_dir), "--endpoint-file", str(endpoint)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline_polls = 400
        while not endpoint.exists() and child.poll() is None and deadline_polls:
            deadline_polls -= 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(0.05)  # waiting for it to listen (it writes the file then)
        assert endpoint.exists(), "the foreign station did not start"
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def debug_lines(home: Path) -> list[str]:
    """Claude Code's debug log lines about the macula server."""
    lines: list[str] = []
    for log in sorted((home / ".claude" / "debug").glob("*.txt")):
        lines += [line for line in log.read_text().splitlines() if 'MCP server "macula"' in line]
    return lines


def test_a_fresh_home_connects_at_once_in_the_era_that_keeps_channels(
    homes: list[Path], tmp_path: Path
) -> None:
    home = tmp_path / "fresh"
    homes.append(home)
    register(home)
    listing = mcp_list(home)
    assert connected(listing), listing
    assert CLAUDE is not None
    subprocess.run(  # not logged in: it connects its MCP servers, then says so and exits
        [CLAUDE, "--debug", "-p", "hi"], cwd=home, env=harness_env(home),
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    lines = debug_lines(home)
    established = [line for line in lines if "Connection established with capabilities" in line]
    assert established, "\n".join(lines)
    assert '"protocolEra":"legacy"' in established[-1], established[-1]
    assert not [line for line in lines if "respawning" in line or "probe timed out" in line]


def test_another_homes_station_on_the_default_port_does_not_stop_a_new_home(
    homes: list[Path], tmp_path: Path
) -> None:
    with station_on_default_port(tmp_path / "other" / ".macula" / "embedded-station"):
        home = tmp_path / "second"
        homes.append(home)
        register(home, "--attach")
        listing = mcp_list(home)
        assert connected(listing), listing


def test_a_stale_station_whose_home_was_deleted_does_not_stop_a_new_home(
    homes: list[Path], tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    with station_on_default_port(gone / ".macula" / "embedded-station"):
        shutil.rmtree(gone)
        home = tmp_path / "after"
        homes.append(home)
        register(home)
        listing = mcp_list(home)
        assert connected(listing), listing


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A HOME whose ``.macula`` is short enough for the daemon's socket; its daemon stopped
    (killed if it will not stop) afterwards."""
    home = Path(tempfile.mkdtemp(prefix="mcc-", dir="/tmp"))
    yield home
    stop_daemon_for_good(home / ".macula")
    shutil.rmtree(home, ignore_errors=True)


@pytest.mark.anyio
async def test_claude_code_connects_over_http_more_times_than_the_daemon_keeps_sessions(
    short_home: Path, station: Station
) -> None:
    cap = 2
    macula_home = short_home / ".macula"
    env = harness_env(short_home) | {
        "MACULA_HOME": str(macula_home),
        "MACULA_MESH_STATIONS": station.endpoint,
        HTTP_MAX_SESSIONS_ENV: str(cap),
    }
    started = await asyncio.to_thread(cli, ["console"], env)  # starts the daemon
    assert started.returncode == 0, started.stderr
    done = await asyncio.to_thread(cli, ["register", "--http", "--harness", "claude-code"], env)
    assert done.returncode == 0, done.stderr
    entry = json.loads((short_home / ".claude.json").read_text())["mcpServers"]["macula"]
    assert entry["type"] == "http" and entry["url"].endswith("/mcp")
    for run in range(cap + 3):  # each run opens a session and leaves it open
        listing = await asyncio.to_thread(mcp_list, short_home)
        assert connected(listing), (run, listing)
        [line] = [text for text in listing.splitlines() if text.startswith("macula:")]
        assert entry["url"] in line and "(HTTP)" in line, line
    log = (macula_home / "logs" / "daemon.log").read_text()
    assert log.count("ended to make room") >= 3, log[-2000:]
