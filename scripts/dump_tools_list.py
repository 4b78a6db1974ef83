"""Print ``tools/list`` as a client receives it (wire JSON, one tool a line), full or terse.

``uv run python scripts/dump_tools_list.py [--terse] > tools.json``: compare two dumps to check
that a refactor left what a model reads unchanged (names, order, descriptions, schemas, hints).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.server.server import build_server


async def dump(terse: bool) -> str:
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": "1" if terse else "0"}
    tools = await build_server(env).list_tools()
    wire = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    return "\n".join(json.dumps(tool, ensure_ascii=False, sort_keys=True) for tool in wire)


if __name__ == "__main__":
    print(asyncio.run(dump("--terse" in sys.argv[1:])))
