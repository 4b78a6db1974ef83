"""Real station processes for tests that kill them: ``macula-relay`` on a fixed port and data
dir (so a restart keeps its key and port), started as a person starts it, killed with SIGKILL.

Invariants: the station runs on aioquic whatever this process runs on (only it sends stateless
resets); every process started here is killed and reaped on leaving; a start that prints no
endpoint within 30 s fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from macula.quic.backend import ENV as QUIC_ENV
from tools.local_station.process import relay_environment


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StationProcess:
    """One ``macula-relay`` on ``port`` over ``data_dir``; ``start`` again after ``kill``."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_udp_port() if port is None else port
        self.process: asyncio.subprocess.Process | None = None
        self.endpoint = ""

    async def start(self) -> str:
        """Start it; its endpoint (``node_id@127.0.0.1:port``) once it listens."""
        self.process = await asyncio.create_subprocess_exec(
            *(
                sys.executable,
                "-m",
                "relay.ops.cli",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ),
            *("--dht-port", "0", "--data-dir", str(self.data_dir), "--log-level", "warning"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={k: v for k, v in relay_environment(os.environ).items() if k != QUIC_ENV},
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert b"@" in line, f"the station printed {line!r}"
        self.endpoint = line.decode().strip()
        return self.endpoint

    async def kill(self) -> None:
        """SIGKILL: no GOODBYE, no CONNECTION_CLOSE, nothing flushed."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


@contextlib.asynccontextmanager
async def station_process(data_dir: Path, port: int | None = None) -> AsyncIterator[StationProcess]:
    """A started ``StationProcess``, killed on leaving if still running."""
    station = StationProcess(data_dir, port)
    try:
        await station.start()
        yield station
    finally:
        await station.kill()
