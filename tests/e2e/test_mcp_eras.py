"""Both protocol eras on purpose, with the official SDK client driving a real ``macula-mcp``
subprocess (plain and attach): a 2025-11-25 client (``initialize``), a 2026-07-28 client pinned
to that era (no probe), and an auto client, which with channel push on is led to the legacy
era (where Claude Code keeps ``claude/channel``) and with push off gets the modern one.
The handshake card the front answers from is the server's own answer, learned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import server_env, server_params, stop_daemon
from tools.launch import server_command
from tools.stdio.front import CARD_FILE, seed_answers

pytestmark = pytest.mark.anyio
CHANNEL = "claude/channel"


async def session_facts(params: object, mode: str) -> tuple[str, int, bool]:
    """(negotiated version, tools listed, claude/channel declared) of one session."""
    async with Client(params, mode=mode) as client:  # type: ignore[arg-type]
        tools = await client.list_tools()
        experimental = client.server_capabilities.experimental or {}
        return client.protocol_version, len(tools.tools), CHANNEL in experimental


@pytest.mark.parametrize("form", ["plain", "attach"])
async def test_with_push_on_an_auto_client_is_led_to_the_legacy_era(
    form: str, station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    argv = [*server_command(), "attach"] if form == "attach" else None
    params = server_params(server_env(home, station.endpoint, MACULA_MCP_AGENT="e"), argv)
    try:
        version, tools, channel = await session_facts(params, "auto")
        assert (version, channel) == ("2025-11-25", True) and tools > 10
        # a client pinned to the 2026-07-28 era is still served in it
        version, tools, _ = await session_facts(params, "2026-07-28")
        assert version == "2026-07-28" and tools > 10
    finally:
        if form == "attach":
            stop_daemon(home)


async def test_with_push_off_an_auto_client_gets_the_modern_era(
    station: Station, tmp_path: Path
) -> None:
    env = server_env(tmp_path / "h", station.endpoint, MACULA_MCP_CHANNEL="0")
    version, tools, channel = await session_facts(server_params(env), "auto")
    assert (version, channel) == ("2026-07-28", False) and tools > 10
    version, tools, channel = await session_facts(server_params(env), "legacy")
    assert (version, channel) == ("2025-11-25", False) and tools > 10


async def test_the_card_answer_is_the_servers_own(station: Station, tmp_path: Path) -> None:
    """The first session of a new home is answered from the shipped seed and learns the
    server's own answer, equal to it; the next is answered from the card before the SDK is
    loaded, and gets exactly what the server itself would say."""
    home = tmp_path / "h"
    params = server_params(server_env(home, station.endpoint))
    async with Client(params, mode="legacy") as first:
        said = first.session.initialize_result
        assert said is not None
        assert (await first.list_tools()).tools  # the backend has answered initialize too
    card = json.loads((home / CARD_FILE).read_text())
    learned = card["answers"]["initialize 2025-11-25"]
    assert learned == said.model_dump(by_alias=True, mode="json", exclude_none=True)
    # the shipped seed the first spawn of a new home was answered from is that same answer
    assert seed_answers({})["initialize 2025-11-25"] == learned
    async with Client(params, mode="legacy") as second:
        again = second.session.initialize_result
        assert again is not None and again == said
        assert (await second.list_tools()).tools
    assert json.loads((home / CARD_FILE).read_text()) == card  # nothing was stale
