"""MCP over Streamable HTTP as the daemon serves it, in the test process: the daemon's ``Hosts``
(real runtimes on a real station), ``tools.daemon.http.mcp`` mounted at ``/mcp`` in a Starlette app
(``Route("/mcp", endpoint=app)``, as the daemon's HTTP listener mounts it), served by uvicorn on
127.0.0.1 port 0; clients are the official SDK's (``mcp.client.streamable_http``) with a bearer.

Invariants: loopback only; every served app is shut down (uvicorn exits, runtimes close)."""

from __future__ import annotations

import asyncio
import json
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

from tools.daemon.hosts import Hosts, IdleClock
from tools.daemon.http.home_token import home_token
from tools.daemon.http.mcp import McpHttp, mcp_http_app
from tools.daemon.http.tokens import agent_token

from .waiting import eventually


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


ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


async def events(response: httpx2.Response) -> AsyncIterator[tuple[str | None, Any]]:
    """(id, parsed data) of each SSE event with data on ``response``."""
    ident: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "":
            if data and "".join(data):
                yield ident, json.loads("".join(data))
            ident, data = None, []


class Raw:
    """One 2025-era session opened by hand."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.sid = ""
        self.next_id = 10

    def headers(self) -> dict[str, str]:
        return {**ACCEPT, "Mcp-Session-Id": self.sid, "MCP-Protocol-Version": "2025-11-25"}

    async def open(self) -> dict[str, Any]:
        response = await self.http.post(self.url, json=INIT, headers=ACCEPT)
        assert response.status_code == 200, response.text
        self.sid = response.headers["mcp-session-id"]
        result = await self._result(response)
        said = await self.http.post(
            self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=self.headers(),
        )  # fmt: skip
        assert said.status_code == 202
        return result

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                "params": {"name": tool, "arguments": args}}  # fmt: skip
        response = await self.http.post(self.url, json=body, headers=self.headers())
        assert response.status_code == 200, response.text
        result = await self._result(response)
        return dict(result["structuredContent"])

    async def _result(self, response: httpx2.Response) -> dict[str, Any]:
        if response.headers["content-type"].startswith("application/json"):
            return dict(response.json()["result"])
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                return dict(json.loads(line[5:])["result"])
        raise AssertionError(f"no result in {response.text!r}")

    @asynccontextmanager
    async def get_stream(self, last_event_id: str | None = None) -> AsyncIterator[httpx2.Response]:
        headers = {**self.headers(), "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        async with self.http.stream("GET", self.url, headers=headers) as response:
            assert response.status_code == 200
            yield response
