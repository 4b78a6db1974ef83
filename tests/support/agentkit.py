"""MCP servers with the pub/sub and agent tool groups, in process over a real station, through
the official client: calls that must succeed or be refused (no booleans in either), two agents
meeting; ``exec`` commands a served procedure runs (``DOUBLE``)."""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult

from relay.station.station import Station
from tools.groups import presence, pubsub, rings, rooms
from tools.server.context import Descriptions
from tools.server.runtime import Runtime, open_runtime
from tools.server.schema import MeshServer
from tools.server.server import build_server

from .processkit import StationProcess
from .waiting import eventually

GROUPS = (pubsub, presence, rooms, rings)


def build_app(
    env: dict[str, str], *, terse: bool = False, groups: tuple[ModuleType, ...] = GROUPS
) -> tuple[MCPServer, Descriptions]:
    """A server like ``tools.server.server.build_server``, with ``groups`` (the pub/sub and agent
    ones)."""
    describe = Descriptions(terse=terse)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[Runtime]:
        async with open_runtime(env) as runtime:
            yield runtime

    app = MeshServer(name="macula-mcp-test", lifespan=lifespan)  # the argument boundary too
    for group in groups:
        group.register(app, describe)
    return app, describe


@contextlib.asynccontextmanager
async def mcp_agent(
    station: Station, tmp_path: Path, name: str, policy: str = "open"
) -> AsyncIterator[Client]:
    home = tmp_path / name
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
        "MACULA_MCP_CONTACT_POLICY": policy,
    }
    app, _ = build_app(env)
    async with Client(app) as client:
        yield client


def no_booleans(value: object, path: str = "result") -> None:
    assert type(value) is not bool, f"{path} is a boolean"
    if isinstance(value, dict):
        for key, item in value.items():
            no_booleans(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            no_booleans(item, f"{path}[{i}]")


async def call(client: Client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {})
    assert not result.is_error, (tool, result.structured_content or result.content)
    data = result.structured_content
    assert isinstance(data, dict)
    no_booleans(data)
    return data


async def refused(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert result.is_error, (tool, args, result.structured_content)
    error = result.structured_content
    assert isinstance(error, dict), (tool, result.content)
    assert {"code", "detail", "retryable", "next_action"} <= error.keys()
    no_booleans(error)
    return error


async def meet(alice: Client, bob: Client) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both say hello so that each hears the other (alice hellos again once bob listens)."""
    await call(alice, "mesh_hello", {"operator_name": "alice"})
    bob_view = await call(bob, "mesh_hello", {"operator_name": "bob", "model": "test-model"})
    alice_view = await call(alice, "mesh_hello", {"message": "hi all"})

    async def sees(client: Client, node_id: str) -> bool:
        """Heard its hello (a row from the station's directory alone is not meeting)."""
        rows = (await call(client, "mesh_agents"))["agents"]
        return any(row["node_id"] == node_id and row["source"] != "directory" for row in rows)

    await eventually(lambda: sees(alice, bob_view["node_id"]))
    await eventually(lambda: sees(bob, alice_view["node_id"]))
    return alice_view, bob_view


def python(code: str) -> str:
    """An ``exec`` command line running ``code`` (no single quotes in it) with this Python."""
    return f"{shlex.quote(sys.executable)} -c '{code}'"


DOUBLE = python(
    "import json,os,sys; p=json.load(sys.stdin); "
    'print(json.dumps({"doubled": p["n"]*2, "caller": os.environ["MACULA_CALLER"], "echo": p}))'
)


# --- the whole server (tools.server.server), in either protocol era -------------------------------

ERROR_KEYS = {"code", "detail", "retryable", "next_action"}


class Agent:
    """An MCP client: ``ok`` calls that must succeed, ``refused`` ones that must be refused."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def raw(self, tool: str, **args: Any) -> CallToolResult:
        return await self.client.call_tool(tool, args)

    async def ok(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.raw(tool, **args)
        assert not result.is_error, (tool, result.structured_content or result.content)
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    async def refused(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.raw(tool, **args)
        assert result.is_error, (tool, args, result.structured_content)
        error = result.structured_content
        assert isinstance(error, dict), (tool, args, result.content)  # never the SDK's bare text
        assert set(error) >= ERROR_KEYS, error
        return error


@asynccontextmanager
async def agent(station: Station | StationProcess, home: Path, mode: str) -> AsyncIterator[Agent]:
    """An MCP agent of its own ``home`` on ``station`` (in this process, or a subprocess)."""
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
        "MACULA_MCP_CONTACT_POLICY": "open",
    }
    async with Client(build_server(env), mode=mode) as client:  # type: ignore[arg-type]
        yield Agent(client)
