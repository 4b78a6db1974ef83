"""Three plain ``macula-mcp`` sessions with no configured station, as a harness runs them (real
subprocesses, the official SDK client): the first starts the local station as its own
process; it closes; the other two still talk through that station; ``macula-mcp station stop``
ends it and nothing is left running."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from tools.launch import server_command
from tools.local_station.station import local_station_status, stop_local_station
from tools.settings import LOCAL_STATION_PORT_ENV as PORT_ENV

pytestmark = pytest.mark.anyio


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """MACULA_HOME; whatever station runs there at the end is stopped, or killed."""
    where = tmp_path / "home"
    yield where
    pid = local_station_status(where).pid
    try:
        stop_local_station(where)
    finally:
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running (a zombie is not: the station's parent, a closed session, is gone and the
    init of a container may reap late)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except ProcessLookupError:
        return False
    except OSError:
        return True  # no /proc: kill said it exists
    return state != "Z"


def env_of(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MACULA_MESH_STATIONS"}
    # port 0: the local station listens on a free port (4433 may be anyone's on a shared host)
    return env | {"MACULA_HOME": str(home), PORT_ENV: "0", **extra}


class Session:
    """A ``macula-mcp`` subprocess under the SDK client, held open by a task of its own, so
    sessions close in any order (the client's task groups must exit in the task that entered)."""

    def __init__(self, home: Path, name: str) -> None:
        command = server_command()
        env = env_of(home, MACULA_MCP_AGENT=name)
        self.params = StdioServerParameters(command=command[0], args=command[1:], env=env)
        self.opened = asyncio.Event()
        self.closing = asyncio.Event()
        self.client: Client | None = None
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> Client:
        self.task = asyncio.create_task(self._hold())
        opened = asyncio.create_task(self.opened.wait())
        await asyncio.wait({self.task, opened}, return_when=asyncio.FIRST_COMPLETED)
        if self.client is None:
            opened.cancel()
            await self.task  # raises why it did not open
        assert self.client is not None
        return self.client

    async def _hold(self) -> None:
        async with Client(self.params) as client:
            self.client = client
            self.opened.set()
            await self.closing.wait()

    async def close(self) -> None:
        self.closing.set()
        if self.task is not None:
            await self.task


@asynccontextmanager
async def sessions(home: Path, *names: str) -> AsyncIterator[list[Session]]:
    held = [Session(home, name) for name in names]
    try:
        yield held
    finally:
        for one in held:
            await one.close()


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, (tool, result.structured_content)
    return dict(result.structured_content or {})


async def identity(client: Client) -> dict[str, Any]:
    found = await client.read_resource("mesh://identity")
    return dict(json.loads(found.contents[0].text))  # type: ignore[union-attr]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        capture_output=True, text=True, timeout=60, env=env_of(home), check=False,
    )  # fmt: skip


async def test_the_local_station_outlives_the_session_that_started_it(home: Path) -> None:
    async with sessions(home, "one", "two", "three") as (first, second, third):
        one = await first.open()
        await call(one, "mesh_hello", message="one here")
        started = local_station_status(home)
        assert started.state == "running" and started.pid is not None
        station = (await identity(one))["embedded_station"]
        assert station == started.endpoint
        two, three = await asyncio.gather(second.open(), third.open())
        for client in (two, three):  # reused, not started again
            assert (await identity(client))["embedded_station"] == station

        await first.close()  # the session that started the station ends
        assert first.task is not None and first.task.done()
        assert alive(started.pid) and local_station_status(home).pid == started.pid
        two_id = (await call(two, "mesh_hello", message="two here"))["node_id"]
        await call(three, "mesh_hello", message="three here")
        watch = asyncio.create_task(
            call(three, "mesh_watch", topic="e2e.after", duration_seconds=10, count=1)
        )
        while not watch.done():  # SUBSCRIBE has no ack: publish until the watch has one
            await call(two, "mesh_publish", topic="e2e.after", fact={"from": "two"})
            await asyncio.wait({watch}, timeout=0.2)  # polling interval (the watch ends in 10 s)
        event = (await watch)["events"][0]
        assert event["payload"] == {"from": "two"}
        assert two_id in json.dumps(event)  # from two's node

    status = cli(home, "station", "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["pid"] == started.pid and shown["endpoint"] == station
    assert shown["answered"] == 1 and shown["uptime_s"] > 0

    stopped = cli(home, "station", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped the local station (pid {started.pid})" in stopped.stdout
    assert not alive(started.pid)
    after = cli(home, "station", "status")
    assert after.returncode == 3 and "state: stopped" in after.stdout


def test_a_bad_local_station_setting_fails_at_start_naming_it(home: Path) -> None:
    done = subprocess.run(
        server_command(), input="", capture_output=True, text=True, timeout=60,
        env=env_of(home, **{PORT_ENV: "99999"}), check=False,
    )  # fmt: skip
    assert done.returncode == 2 and PORT_ENV in done.stderr, done.stderr
    assert local_station_status(home).state == "stopped"
