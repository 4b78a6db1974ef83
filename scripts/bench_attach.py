"""How fast a harness gets its tools: spawn -> first ``tools/list`` answered, p50 over runs.

Three ways, each against a station on loopback (in this process) under a temporary
``MACULA_HOME``: warm ``macula-mcp attach`` (the daemon runs and hosts the agent already), cold
``macula-mcp attach`` (no daemon: the attach starts it), and plain ``macula-mcp``. The clock runs
from the harness spawning the command (the official SDK client) to ``tools/list`` returning.

Run: ``uv run python scripts/bench_attach.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mcp import Client, StdioServerParameters

from relay.station import Station, StationConfig
from tools.launch import server_command


async def first_list(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params) as client:
        tools = await client.list_tools()
        took = time.perf_counter() - started
    assert tools.tools, "no tools listed"
    return took


def stop_daemon(env: dict[str, str]) -> None:
    subprocess.run(
        [*server_command(), "daemon", "stop"], env=env, capture_output=True, timeout=60, check=True
    )


def line(name: str, samples: list[float]) -> str:
    return (
        f"{name:<34} p50 {statistics.median(samples):6.3f} s   min {min(samples):6.3f} s   "
        f"max {max(samples):6.3f} s   ({len(samples)} runs)"
    )


async def bench(runs: int, home: Path) -> list[str]:
    async with Station(StationConfig(data_dir=home / "station", port=0)) as station:
        env = dict(
            os.environ,
            MACULA_HOME=str(home / "h"),
            MACULA_MESH_STATIONS=station.endpoint,
            MACULA_MCP_AGENT="bench",
        )
        attach = [*server_command(), "attach"]
        cold, warm, plain = [], [], []
        try:
            for _ in range(runs):
                cold.append(await first_list(attach, env))  # starts the daemon
                warm.append(await first_list(attach, env))  # daemon up, agent hosted
                for _ in range(2):
                    warm.append(await first_list(attach, env))
                await asyncio.to_thread(stop_daemon, env)
            plain_env = dict(env, MACULA_HOME=str(home / "plain"))
            for _ in range(runs):
                plain.append(await first_list(server_command(), plain_env))
        finally:
            await asyncio.to_thread(stop_daemon, env)
    return [
        line("warm attach -> first tools/list", warm),
        line("cold attach (starts the daemon)", cold),
        line("plain macula-mcp", plain),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="cold and plain runs (warm: 3x)")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="mba-", dir="/tmp"))  # short: the socket must fit
    try:
        for text in asyncio.run(bench(max(1, args.runs), home)):
            print(text)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})")


if __name__ == "__main__":
    main()
