"""Hostile values through mesh_call and mesh_publish (issue 26): a frame the station would
refuse is refused before sending with a structured error naming the fix, the tool never answers
ok for a frame that cost the connection, and the next call on the same connection succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import tools.server.server
from macula.keyfile import save_identity
from relay.station.station import Station
from support.identities import new_identity
from tools.groups import pubsub, rpc

pytestmark = pytest.mark.anyio


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"a": value} if depth % 2 else [value]
    return value


@pytest.fixture
async def client(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Client]:
    monkeypatch.setattr(tools.server.server, "GROUPS", (rpc, pubsub))
    identity = new_identity()
    save_identity(tmp_path / "id.key", identity)
    env = {
        "MACULA_HOME": str(tmp_path),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(tmp_path / "id.key"),
    }
    async with Client(tools.server.server.build_server(env)) as connected:
        yield connected


async def error_of(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert result.is_error, result.structured_content
    error = result.structured_content or {}
    assert set(error) == {"code", "detail", "retryable", "next_action"}, error
    return error


async def still_connected(client: Client) -> None:
    ping = await client.call_tool("mesh_call", {"procedure": "_relay.ping"})
    assert not ping.is_error, ping.structured_content
    published = await client.call_tool("mesh_publish", {"topic": "org.example.ok_v1", "fact": 1})
    assert not published.is_error, published.structured_content


@pytest.mark.parametrize(
    ("tool", "args", "code"),
    [
        ("mesh_publish", {"topic": "org.example.big_v1", "fact": list(range(10_000))},
         "too_many_items"),
        ("mesh_call", {"procedure": "_relay.ping", "args": list(range(10_000))},
         "too_many_items"),
        ("mesh_call", {"procedure": "_relay.ping", "args": nested(250)}, "too_deep"),
        ("mesh_call", {"procedure": "_relay.ping", "args": nested(100)}, "too_deep"),
        ("mesh_publish", {"topic": "org.example.deep_v1", "fact": nested(120)}, "too_deep"),
        ("mesh_call", {"procedure": "_relay.ping", "args": {"n": 1 << 64}}, "int_out_of_range"),
        ("mesh_publish", {"topic": "org.example.n_v1", "fact": [-(1 << 64) - 1]},
         "int_out_of_range"),
    ],
)  # fmt: skip
async def test_a_value_the_station_would_refuse_gets_a_structured_error(
    client: Client, tool: str, args: dict[str, Any], code: str
) -> None:
    await still_connected(client)
    error = await error_of(client, tool, args)
    assert error["code"] == code and error["retryable"] == 0, error
    assert error["detail"] and error["next_action"]
    await still_connected(client)


async def test_a_value_nested_past_the_limit_is_refused_at_the_tool_boundary(
    client: Client,
) -> None:
    """Deep values never reach the encoders (or the receipts' digest): the tool refuses them
    by argument name before anything recursive walks them."""
    for tool, name, args in (
        ("mesh_call", "args", {"procedure": "_relay.ping", "args": nested(250)}),
        ("mesh_publish", "fact", {"topic": "org.example.deep_v1", "fact": nested(250)}),
        ("mesh_publish", "fact", {"topic": "org.example.deep_v1", "fact": nested(100)}),
    ):
        error = await error_of(client, tool, args)
        assert error["code"] == "too_deep", error
        assert error["detail"].startswith(f"{name}: "), error
    await still_connected(client)
