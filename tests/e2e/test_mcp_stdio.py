"""``macula-mcp`` as a harness runs it: a real subprocess over stdio, the official SDK client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from mcp import Client

from relay.station.station import Station, StationConfig
from support.mcpkit import initialize_request, server_env, server_params
from tools.launch import server_command

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_both_protocol_eras_complete_a_session(
    mode: str, station: Station, tmp_path: Path
) -> None:
    async with Client(
        server_params(server_env(tmp_path / "a", station.endpoint)), mode=mode
    ) as client:
        tools = await client.list_tools()
        names = {t.name for t in tools.tools}
        assert {"mesh_publish", "mesh_watch"} <= names
        result = await client.call_tool("mesh_publish", {"topic": "e2e.t", "fact": {"n": 1}})
        assert not result.is_error and result.structured_content["published"] == 1
        bad = await client.call_tool(
            "mesh_publish", {"topic": "e2e.t", "fact": 1, "realm": "not hex, not a name"}
        )
        assert bad.is_error
        assert set(bad.structured_content) == {"code", "detail", "retryable", "next_action"}
        identity = await client.read_resource("mesh://identity")
        text = identity.contents[0].text  # type: ignore[union-attr]
        assert "seed" not in text and json.loads(text)["node_id"]


# slow: terse descriptions are checked in-process (test_mcp_agent_tools.py); this spawns two
# servers
@pytest.mark.slow
async def test_terse_descriptions_are_shorter(station: Station, tmp_path: Path) -> None:
    async with Client(server_params(server_env(tmp_path / "full", station.endpoint))) as client:
        full = {t.name: t.description or "" for t in (await client.list_tools()).tools}
    env = server_env(tmp_path / "terse", station.endpoint, MACULA_MCP_TERSE_TOOLS="1")
    async with Client(server_params(env)) as client:
        terse = {t.name: t.description or "" for t in (await client.list_tools()).tools}
    assert full.keys() == terse.keys()
    for name in full:
        assert 0 < len(terse[name]) < len(full[name]), name
    caveats = {  # safety caveats a terse description must keep
        "mesh_serve": ["stdin"],
        "mesh_put": ["secret"],
        "mesh_join_room": ["invited", "not encrypted"],
        "mesh_say": ["invited"],
        "mesh_ring": ["invited"],
        "mesh_trust_agent": ["trust"],
    }
    for name, phrases in caveats.items():
        for phrase in phrases:
            assert phrase in full[name].lower() and phrase in terse[name].lower(), (name, phrase)


def test_stdin_close_ends_the_server_gracefully(tmp_path: Path) -> None:
    async def with_station() -> tuple[int | None, float, str]:
        async with Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station:
            env = server_env(tmp_path / "a", station.endpoint)
            process = subprocess.Popen(
                server_command(),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            init = initialize_request("t")
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write((json.dumps(init) + "\n").encode())
            process.stdin.flush()
            line = await asyncio.to_thread(process.stdout.readline)
            assert json.loads(line)["id"] == 1  # stdout carries protocol only
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            process.stdin.write((json.dumps(initialized) + "\n" + json.dumps(ping) + "\n").encode())
            process.stdin.flush()
            line = await asyncio.to_thread(process.stdout.readline)
            assert json.loads(line)["id"] == 2  # serving: stdin is closed on a running server
            started = time.monotonic()
            process.stdin.close()
            # bounded, not instant: a runtime still opening when stdin closes could hang its
            # close (runtime_gate now cancels a close stuck for CLOSE_WAIT_S); under load
            code = await asyncio.to_thread(process.wait, 20)
            stderr = process.stderr.read().decode() if process.stderr else ""
            return code, time.monotonic() - started, stderr

    code, _took, stderr = asyncio.run(with_station())
    assert code == 0, stderr  # (the wait above is bounded: a hang fails the test)
