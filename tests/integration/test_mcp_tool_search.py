"""``tools/list`` and the server instructions written for tool search (Claude Code loads MCP
tools on demand: at start the model sees names and ``instructions``, each description and the
instructions cut at 2 KB): every text fits, the instructions name the tools to start with and
only real tools, and exactly the handful an agent needs at once asks to stay loaded."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tools.server.server import INSTRUCTIONS, build_server
from tools.server.tool_search import ALWAYS_LOAD_KEY, ALWAYS_LOADED

pytestmark = pytest.mark.anyio

LIMIT = 2048  # bytes: what Claude Code's tool search is documented to keep of each


async def wire_tools(terse: bool) -> list[dict[str, Any]]:
    """The tools as ``tools/list`` puts them on the wire (aliases: ``_meta``, ``inputSchema``)."""
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": "1" if terse else "0"}
    tools = await build_server(env).list_tools()
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]


@pytest.mark.parametrize("terse", [False, True])
async def test_every_description_and_the_instructions_fit_in_2_kb(terse: bool) -> None:
    tools = await wire_tools(terse)
    too_long = {t["name"]: n for t in tools if (n := len(t["description"].encode())) >= LIMIT}
    assert not too_long
    assert len(INSTRUCTIONS.encode()) < LIMIT


@pytest.mark.parametrize("terse", [False, True])
async def test_exactly_the_handful_asks_to_stay_loaded(terse: bool) -> None:
    tools = {t["name"]: t for t in await wire_tools(terse)}
    kept = {name for name, t in tools.items() if t.get("_meta", {}).get(ALWAYS_LOAD_KEY) is True}
    assert kept == set(ALWAYS_LOADED)
    assert kept == {"mesh_hello", "mesh_read_inbox", "mesh_say", "mesh_wait_room", "mesh_ring"}
    for name in kept:
        assert tools[name]["_meta"] == {ALWAYS_LOAD_KEY: True}
    assert all("_meta" not in t for name, t in tools.items() if name not in kept)


async def test_the_instructions_say_what_to_call_first_and_name_only_real_tools() -> None:
    names = {t["name"] for t in await wire_tools(False)}
    assert all(name.startswith("mesh_") for name in names)  # the instructions promise mesh_*
    mentioned = set(re.findall(r"\bmesh_[a-z_]+", INSTRUCTIONS)) - {"mesh_"}
    assert mentioned <= names, mentioned - names
    start = INSTRUCTIONS[: INSTRUCTIONS.index("Every other tool")]
    assert all(name in start for name in ALWAYS_LOADED)  # said first, before the search advice
    assert "search your tools for mesh" in INSTRUCTIONS
