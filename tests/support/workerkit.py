"""Helpers for ``macula-relay --workers N`` tests: the parent as a real process (its stderr read
line by line: which worker listens with which pid and monitor), a worker's clients and links
read from its monitor."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from .monitorkit import get_json

MONITOR = re.compile(r"^worker=(\d+) .*monitor listening on http://127\.0\.0\.1:(\d+)/")
LISTENING = re.compile(r"worker (\d+) \(pid (\d+)\) listening")


@dataclass
class WorkerStation:
    process: asyncio.subprocess.Process
    endpoint: str = ""
    lines: list[str] = field(default_factory=list)
    monitors: dict[int, int] = field(default_factory=dict)  # worker -> monitor port (latest)
    pids: dict[int, int] = field(default_factory=dict)  # worker -> pid (latest)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self, line: str) -> None:
        self.lines.append(line)
        if found := MONITOR.search(line):
            self.monitors[int(found[1])] = int(found[2])
        if found := LISTENING.search(line):
            self.pids[int(found[1])] = int(found[2])
        self.changed.set()

    async def until(self, predicate: object, timeout: float = 30.0) -> None:
        """Until ``predicate()`` holds, re-checked at each new log line."""
        assert callable(predicate)

        async def waiting() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(waiting(), timeout)

    async def clients(self, worker: int) -> set[str]:
        """Node ids of the clients worker ``worker`` holds."""
        page = await get_json(("127.0.0.1", self.monitors[worker]), "/connections?limit=100")
        return {row["node_id"] for row in page["connections"]}

    async def linked(self, worker: int) -> int:
        """How many links worker ``worker`` holds up."""
        page = await get_json(("127.0.0.1", self.monitors[worker]), "/links")
        return sum(row["linked"] for row in page["links"])


async def _read(station: WorkerStation, stream: asyncio.StreamReader) -> None:
    while line := await stream.readline():
        station.note(line.decode(errors="replace").rstrip())


@contextlib.asynccontextmanager
async def worker_station(
    data_dir: Path, *extra: str, count: int = 2, env: dict[str, str] | None = None
) -> AsyncIterator[WorkerStation]:
    """``macula-relay --workers count`` on 127.0.0.1, any free port, a monitor per worker;
    yields once it printed its endpoint; SIGTERM on leaving (then the exit code is asserted 0)."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "relay.ops.cli", "--port", "0", "--data-dir", str(data_dir)),
        *("--workers", str(count), "--monitor", "127.0.0.1:0", *extra),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    station = WorkerStation(process)
    assert process.stdout is not None and process.stderr is not None
    reader = asyncio.create_task(_read(station, process.stderr))
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert b"@" in line, f"printed {line!r}; log: {station.lines[-20:]}"
        station.endpoint = line.decode().strip()
        await station.until(lambda: len(station.monitors) == count)
        try:
            yield station
        except BaseException:
            print("\n".join(station.lines[-60:]))  # the station's side, shown by pytest
            raise
        if process.returncode is None:
            process.terminate()
        assert await asyncio.wait_for(process.wait(), 20) == 0, station.lines[-20:]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await reader
