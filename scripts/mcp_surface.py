"""Print the size of ``tools/list`` (full and terse descriptions) and the cold start time of
``macula-mcp`` to its first ``tools/list``, each measured on a real subprocess over stdio.

``uv run python scripts/mcp_surface.py`` (starts a station on a free loopback port)
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from relay.station.station import Station, StationConfig
from tools.launch import server_command


async def measure(endpoint: str, home: Path, terse: bool) -> tuple[float, int, int]:
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=endpoint,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
        MACULA_MCP_TERSE_TOOLS="1" if terse else "0",
    )
    command = server_command()
    started = time.perf_counter()
    async with Client(
        StdioServerParameters(command=command[0], args=command[1:], env=env)
    ) as client:
        tools = await client.list_tools()
        elapsed = time.perf_counter() - started
    # the result as the server sends it: the SDK's compact JSON (until stop 35, json.dumps of
    # the parsed tools, with ", " and ": " between items: 31,900 / 21,033 then, 30,366 / 19,579
    # this way at the same commit)
    payload = tools.model_dump_json(by_alias=True, exclude_none=True)
    return elapsed, len(tools.tools), len(payload.encode())


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Station(StationConfig(data_dir=Path(tmp) / "station", port=0)) as station:
            for terse in (False, True):
                runs = [
                    await measure(station.endpoint, Path(tmp) / f"a{i}{terse}", terse)
                    for i in range(3)
                ]
                label = "terse" if terse else "full"
                cold = statistics.median(r[0] for r in runs)
                print(
                    f"tools/list ({label}): {runs[0][1]} tools, {runs[0][2]:,} bytes of JSON "
                    f"(~{runs[0][2] // 4:,} tokens); cold start to tools/list p50 {cold:.2f} s"
                )


if __name__ == "__main__":
    asyncio.run(main())
