"""A station process SIGKILLed and started again on the same key, port and data dir: its node
learns from the restarted station's stateless reset that its connection is gone, and is back
at once, its subscription replayed (``macula.quic_resets``; issue 37).

The node's probe is set far apart, so the only news the node can get is the reset: no ping
meets the dead port (an ICMP "port unreachable" would tell it too, and is the other path,
left to ``test_failover``). The station process runs on aioquic whatever this one runs on (a
qh3 station sends no resets); under ``MACULA_QUIC=qh3`` the node is a qh3 client, whose native
core recognises the reset itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from meshkit import REALM, new_identity

from macula.node import Node
from macula.quic_backend import ENV as QUIC_ENV
from tools.station_process import relay_environment

pytestmark = pytest.mark.anyio


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def station_process(
    data_dir: Path, port: int
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``macula-relay`` (on aioquic) on ``port`` over ``data_dir``, its DHT on any free port:
    its endpoint once it listens. Killed on leaving if still running."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "relay.cli", "--host", "127.0.0.1", "--port", str(port)),
        *("--dht-port", "0", "--data-dir", str(data_dir), "--log-level", "warning"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={k: v for k, v in relay_environment(os.environ).items() if k != QUIC_ENV},
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert b"@" in line, f"the station printed {line!r}"
        yield line.decode().strip(), process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_node_is_back_by_the_reset_of_its_restarted_station(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "station", free_udp_port()
    async with station_process(data_dir, port) as (endpoint, process):
        node = Node(new_identity(), [endpoint], probe_interval_s=60, settle_s=0)
        async with node:
            sub = await node.subscribe(REALM, "restart.news")
            await node.flush()
            process.send_signal(signal.SIGKILL)  # no GOODBYE, no CONNECTION_CLOSE
            await process.wait()
            async with station_process(data_dir, port) as (again, _):
                assert again == endpoint  # same key, same port
                assert node.stats.reconnects == 0  # nothing told the node yet
                # its next packet meets the new process, which answers with a reset; the
                # PUBLISH in flight is confirmed on the next connection
                await node.publish_confirmed(REALM, "restart.news", "after", timeout=15)
                assert node.stats.stateless_resets == 1 and node.stats.reconnects == 1
                assert node.stats.probes_acknowledged == 0  # the probe had no part in it
                assert (await sub.next(5)).payload == "after"  # the subscription replayed
                await node.flush()
                async with Node(new_identity(), [again]) as other:
                    await other.publish(REALM, "restart.news", "from another node")
                    assert (await sub.next(5)).payload == "from another node"


def test_the_restart_bench_runs_and_tells_how_the_node_learned() -> None:
    """``scripts/bench.py restart`` end to end on one restart (figures are its own business)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
    env = {k: v for k, v in os.environ.items() if k != QUIC_ENV}
    done = subprocess.run(
        [sys.executable, str(script), "restart", "--runs", "1", "--nodes", "1", "--settle", "0.3"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "restart: 1 of 1 learned by a stateless reset" in done.stdout
    assert "restart: back after the kill in p50" in done.stdout
