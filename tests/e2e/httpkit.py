"""MCP over Streamable HTTP as the daemon serves it, in the test process: the daemon's ``Hosts``
(real runtimes on a real station), ``tools.mcp_http`` mounted at ``/mcp`` in a Starlette app
(``Route("/mcp", endpoint=app)``, as the daemon's HTTP listener mounts it), served by uvicorn on
127.0.0.1 port 0; clients are the official SDK's (``mcp.client.streamable_http``) with a bearer.

Invariants: loopback only; every served app is shut down (uvicorn exits, runtimes close)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.routing import Route

from tests.integration.waiting import eventually
from tools.daemon_hosts import Hosts, IdleClock
from tools.http_token import home_token
from tools.mcp_http import McpHttp, mcp_http_app
from tools.mcp_http_tokens import agent_token


@dataclass
class Served:
    url: str
    mcp: McpHttp
    hosts: Hosts
    home: Path

    def token(self, agent: str | None = None) -> str:
        """The home token (no ``agent``), or agent ``agent``'s."""
        return home_token(self.home) if agent is None else agent_token(self.home, agent)


@asynccontextmanager
async def served(home: Path, endpoint: str, **extra: Any) -> AsyncIterator[Served]:
    """The daemon's ``/mcp`` for ``home`` on a station; ``extra`` goes to the environment
    (strings) or to ``McpHttp`` (``idle_timeout``, ``max_sessions``, ``max_events``)."""
    settings = {
        k: extra.pop(k) for k in ("idle_timeout", "max_sessions", "max_events") if k in extra
    }
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=endpoint, **extra)
    async with asyncio.TaskGroup() as group:
        hosts = Hosts(group, IdleClock(3600.0, time.monotonic()), time.monotonic)
        mcp = mcp_http_app(hosts, home, env, **settings)

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with mcp.lifespan():
                yield

        app = Starlette(routes=[Route("/mcp", endpoint=mcp)], lifespan=lifespan)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        server = uvicorn.Server(config)
        task = group.create_task(server.serve())
        await eventually(lambda: server.started or task.done(), 20.0)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield Served(f"http://127.0.0.1:{port}/mcp", mcp, hosts, home)
        finally:
            server.should_exit = True
            await task
            await hosts.close_all()


def http_client(token: str | None, **headers: str) -> httpx2.AsyncClient:
    auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx2.AsyncClient(headers={**auth, **headers}, timeout=httpx2.Timeout(30, read=60))


@asynccontextmanager
async def client(
    url: str, token: str, mode: str = "legacy", **kwargs: Any
) -> AsyncIterator[Client]:
    """The SDK client over Streamable HTTP with ``Authorization: Bearer token``."""
    async with http_client(token) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, **kwargs) as connected:  # type: ignore[arg-type]
            yield connected
