"""How fast the agent hears that the mesh is not usable, and how fast it works again (issue 41;
``tools/server/runtime_gate.py``, docs/errors-reach-the-agent.md).

Real ``macula-mcp`` subprocesses driven by the official SDK client: ``initialize``, the first and
second ``mesh_hello`` with stations that cannot be reached (``127.0.0.1:1``) or named wrong
(``nonsense``), and the next call of the same session after a real station process is started
on the port it names.

Run: ``uv run python scripts/bench_unusable_mesh.py``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mcp import Client

from tests.support.mcpkit import server_params
from tests.support.processkit import StationProcess, free_udp_port


def env_of(home: Path, stations: str) -> dict[str, str]:
    return dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MCP_IDENTITY=str(home / "id.key"),
        MACULA_MESH_STATIONS=stations,
    )


def code(result: Any) -> str:
    return str((result.structured_content or {}).get("code", "ok")) if result.is_error else "ok"


async def unusable(home: Path, stations: str) -> None:
    started = time.perf_counter()
    async with Client(server_params(env_of(home, stations))) as client:
        opened = time.perf_counter()
        first = await client.call_tool("mesh_hello", {})
        answered = time.perf_counter()
        second = await client.call_tool("mesh_hello", {})
        again = time.perf_counter()
    print(
        f"{stations}: initialize {opened - started:.2f} s; first call {answered - opened:.2f} s "
        f"({code(first)}); second {again - answered:.2f} s ({code(second)})"
    )


async def recovers(home: Path) -> None:
    port = free_udp_port()
    station = StationProcess(home / "station", port)
    async with Client(server_params(env_of(home, f"127.0.0.1:{port}"))) as client:
        before = await client.call_tool("mesh_hello", {})
        await station.start()
        try:
            started = time.perf_counter()
            after = await client.call_tool("mesh_hello", {})
            took = time.perf_counter() - started
        finally:
            await station.kill()
    print(f"station started after {code(before)}: the next call {took:.2f} s ({code(after)})")


async def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="bum-", dir="/tmp"))
    try:
        for stations in ("127.0.0.1:1", "nonsense"):
            await unusable(home, stations)
        await recovers(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
