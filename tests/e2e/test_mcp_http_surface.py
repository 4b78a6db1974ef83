"""MCP over Streamable HTTP from the daemon: the official SDK client runs the stdio surface
checks (every tool, resource and prompt listed; one call of each tool group; progress) in both
protocol eras, and an auto client is led to the era the stdio front leads it to."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from relay.station.station import Station
from support.httpkit import Served, client, served
from support.mcpkit import bad, good
from support.waiting import eventually
from tools.server.channel import CAPABILITY
from tools.server.server import build_server

pytestmark = pytest.mark.anyio


async def stdio_surface() -> tuple[set[str], set[str], set[str]]:
    """The names of tools, resources and prompts the stdio server lists (no runtime needed)."""
    app = build_server({"MACULA_HOME": "/nonexistent"})
    tools = {t.name for t in await app.list_tools()}
    resources = {str(r.uri) for r in await app.list_resources()}
    prompts = {p.name for p in await app.list_prompts()}
    return tools, resources, prompts


async def check_surface(connected: Client) -> None:
    tools, resources, prompts = await stdio_surface()
    assert {t.name for t in (await connected.list_tools()).tools} == tools
    assert {str(r.uri) for r in (await connected.list_resources()).resources} == resources
    assert {p.name for p in (await connected.list_prompts()).prompts} == prompts
    for uri in sorted(resources):
        read = await connected.read_resource(uri)
        assert read.contents and read.contents[0].text  # type: ignore[union-attr]
    prompt = await connected.get_prompt(sorted(prompts)[0])
    assert prompt.messages


async def one_call_per_group(ada: Client, bob: Client) -> None:
    """One call of each tool group (rpc, pubsub, content, dht, presence, rooms, rings, memory,
    realms, tasks) and a structured error, over HTTP."""
    ada_id = (await good(ada, "mesh_hello", message="ada over http"))["node_id"]
    bob_id = (await good(bob, "mesh_hello", message="bob over http"))["node_id"]
    assert ada_id != bob_id
    assert (await good(ada, "mesh_publish", topic="http.t", fact={"n": 1}))["published"] == 1
    error = await bad(ada, "mesh_publish", topic="", fact=1)
    assert error["retryable"] in (0, 1)
    put = await good(ada, "mesh_put", content=base64.b64encode(b"over http").decode())
    got = await good(bob, "mesh_get", mcid_hex=put["mcid_hex"])
    assert base64.b64decode(got["content_base64"]) == b"over http"
    assert (await good(ada, "mesh_find_records_by_type", record_type="station_endpoint"))["records"]
    assert "agents" in await good(ada, "mesh_agents")
    opened = await good(ada, "mesh_open_room", purpose="http room")
    rung = await good(ada, "mesh_ring", to=bob_id, purpose="over http")
    assert rung["answer"] in (1, 3)
    assert opened["room_topic"]
    await good(ada, "mesh_remember", content="HTTP sessions share the daemon's runtime.")
    assert (await good(ada, "mesh_list_realms"))["realms"] == []
    assert "tasks" in await good(ada, "mesh_task_list")
    await bad(ada, "mesh_call", procedure="org.example.http.nobody_v1", args={})
    progressed: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        progressed.append(progress)

    waited = await ada.call_tool(
        "mesh_wait_ring", {"wait_seconds": 1}, progress_callback=on_progress
    )
    assert not waited.is_error and progressed  # progress notifications reach the client


async def test_both_eras_serve_the_whole_surface(station: Station, tmp_path: Path) -> None:
    """ada in the 2025 era (a session), bob in the 2026-07-28 era (request by request): each
    lists what stdio lists, and they call each tool group on one another."""
    async with (
        served(tmp_path / "h", station.endpoint) as daemon,
        client(daemon.url, daemon.token(), "legacy") as ada,
        client(daemon.url, daemon.token("bob"), "2026-07-28") as bob,
    ):
        assert (ada.protocol_version, bob.protocol_version) == ("2025-11-25", "2026-07-28")
        await check_surface(ada)
        await check_surface(bob)
        await one_call_per_group(ada, bob)
        await one_call_per_group(bob, ada)


async def era(daemon: Served, mode: str) -> tuple[str, bool, int]:
    async with client(daemon.url, daemon.token(), mode) as connected:
        experimental = connected.server_capabilities.experimental or {}
        tools = len((await connected.list_tools()).tools)
        return connected.protocol_version, CAPABILITY in experimental, tools


async def test_with_push_on_an_auto_client_is_led_to_the_legacy_era(
    station: Station, tmp_path: Path
) -> None:
    async with served(tmp_path / "on", station.endpoint) as daemon:
        assert (await era(daemon, "auto"))[:2] == ("2025-11-25", True)


@pytest.mark.slow  # one more daemon; the modern era itself is served in the test above
async def test_with_push_off_an_auto_client_gets_the_modern_era(
    station: Station, tmp_path: Path
) -> None:
    async with served(tmp_path / "off", station.endpoint, MACULA_MCP_CHANNEL="0") as daemon:
        version, channel, tools = await era(daemon, "auto")
        assert (version, channel) == ("2026-07-28", False) and tools > 10


async def test_a_session_counts_on_its_identitys_runtime(station: Station, tmp_path: Path) -> None:
    """Two sessions of one token share one runtime; the daemon's status counts both."""
    async with served(tmp_path / "h", station.endpoint) as daemon:
        async with (
            client(daemon.url, daemon.token()) as one,
            client(daemon.url, daemon.token()) as two,
        ):
            first = await one.read_resource("mesh://identity")
            second = await two.read_resource("mesh://identity")
            view: Any = json.loads(first.contents[0].text)  # type: ignore[union-attr]
            assert view == json.loads(second.contents[0].text)  # type: ignore[union-attr]
            [hosted] = daemon.hosts.by_id.values()
            assert hosted.sessions == 2 and len(daemon.mcp.sessions) == 2
        # both clients said DELETE on the way out: their sessions ended, the runtime stays
        await eventually(lambda: not daemon.mcp.sessions and hosted.sessions == 0)
        assert daemon.hosts.by_id
