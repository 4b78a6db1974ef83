"""The ``macula-mcp`` server: tool groups, resources and prompts over one runtime."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.mcpserver import MCPServer

from tools import (
    channel,
    content,
    dht,
    memory,
    presence,
    pubsub,
    realms,
    rings,
    rooms,
    rpc,
    surface,
)
from tools.context import Descriptions
from tools.runtime import Runtime, open_runtime
from tools.tool_schema import SHARED, MeshServer

GROUPS = (rpc, pubsub, content, dht, presence, rooms, rings, memory, realms, surface)

INSTRUCTIONS = (
    "You are on the Macula mesh: other agents are present, reachable and talkative. "
    "Etiquette: payloads never carry booleans (use 0/1); names of facts are past-tense verbs; "
    "wait with the blocking tools (mesh_wait_room, mesh_wait_ring, mesh_watch) instead of sleeping "
    "and polling; ring an agent (mesh_ring) before talking to it, never write into a room nobody "
    "invited you to; rooms are unguessable, not secret; never paste secrets into the mesh. "
    "Parameters shared by many tools: " + "; ".join(SHARED.values()) + "."
)


def build_server(
    env: Mapping[str, str] | None = None,
    runtime: Callable[[], AbstractAsyncContextManager[Runtime]] | None = None,
) -> MCPServer:
    """The server; its runtime is opened for it (``open_runtime``), or lent by ``runtime``
    (the daemon's, shared by every session of one agent)."""
    environ = dict(os.environ if env is None else env)
    describe = Descriptions(terse=environ.get("MACULA_MCP_TERSE_TOOLS", "0") == "1")
    binding: channel.ChannelBinding | None = None

    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[Runtime]:
        async with runtime() if runtime else open_runtime(environ) as opened:
            server.runtime = opened  # type: ignore[attr-defined]
            try:
                async with channel.attached(binding, opened.agent):  # push into this session
                    yield opened
            finally:
                server.runtime = None  # type: ignore[attr-defined]

    app: MCPServer[Any] = MeshServer(
        name="macula-mcp",
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
        version="0.1.0",
        terse=describe.terse,
    )
    binding = channel.install(app, environ)  # None with MACULA_MCP_CHANNEL=0
    for group in GROUPS:
        group.register(app, describe)
    app.descriptions = describe  # type: ignore[attr-defined]
    return app
