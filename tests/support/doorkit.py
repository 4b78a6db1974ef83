"""The A2A door as the daemon serves it, in the test process: the daemon's ``Hosts`` (real
runtimes on a real station), ``/mcp`` (``tools.daemon.http.mcp``, where the mesh agent attaches
with the official ``mcp`` client) and ``/a2a/`` (``tools.a2a.door.Door``) routed as the daemon's
listener routes them, served by uvicorn on 127.0.0.1 port 0; A2A clients are the official
``a2a-sdk``'s, with a bearer token made as ``macula-mcp a2a-token create`` makes it.

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

import httpx
import uvicorn
from a2a.client import Client, ClientConfig, create_client
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import Message, Role, SendMessageRequest
from starlette.applications import Starlette
from starlette.routing import Route

from macula.clock import now_ms
from tools.a2a import tokens
from tools.a2a.door import PREFIX, Door
from tools.daemon.hosts import Hosts, IdleClock
from tools.daemon.http.mcp import McpHttp, mcp_http_app
from tools.daemon.http.tokens import agent_token

from .waiting import eventually


@dataclass
class Home:
    base: str  # http://127.0.0.1:PORT
    mcp: McpHttp
    hosts: Hosts
    door: Door
    home: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"

    def agent_url(self, agent: str) -> str:
        return f"{self.base}{PREFIX}{agent}/"

    def mcp_token(self, agent: str) -> str:
        return agent_token(self.home, agent)

    def a2a_token(self, client: str, agent: str) -> str:
        """A new A2A client's token (as ``macula-mcp a2a-token create``)."""
        return tokens.create(self.home, client, agent, now_ms())[1]


@asynccontextmanager
async def home_served(home: Path, endpoint: str, **extra: str) -> AsyncIterator[Home]:
    """One home's daemon HTTP surface (``/mcp`` and ``/a2a/``) on the station at ``endpoint``."""
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=endpoint, **extra)
    async with asyncio.TaskGroup() as group:
        hosts = Hosts(group, IdleClock(3600.0, time.monotonic()), time.monotonic)
        mcp = mcp_http_app(hosts, home, env)
        async with Door(hosts, home) as door:

            @asynccontextmanager
            async def lifespan(_: Starlette) -> AsyncIterator[None]:
                async with mcp.lifespan():
                    yield

            routes = [Route("/mcp", endpoint=mcp), Route(PREFIX + "{rest:path}", endpoint=door)]
            app = Starlette(routes=routes, lifespan=lifespan)
            config = uvicorn.Config(
                app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
            )
            server = uvicorn.Server(config)
            task = group.create_task(server.serve())
            await eventually(lambda: server.started or task.done(), 20.0)
            port = server.servers[0].sockets[0].getsockname()[1]
            try:
                yield Home(f"http://127.0.0.1:{port}", mcp, hosts, door, home)
            finally:
                server.should_exit = True
                await task
        await hosts.close_all()


def http(token: str | None) -> httpx.AsyncClient:
    """A plain HTTP client speaking A2A 1.0 (its version header), with ``token`` if given."""
    auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
    headers = {"A2A-Version": "1.0", **auth}
    return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120))


@asynccontextmanager
async def a2a_client(
    url: str, token: str | None, *, streaming: bool = True, **kwargs: Any
) -> AsyncIterator[Client]:
    """The official SDK client for the agent at ``url`` (its Card fetched from there)."""
    async with http(token) as session:
        config = ClientConfig(httpx_client=session, streaming=streaming)
        client = await create_client(url, config, **kwargs)
        async with client:
            yield client


def say(text: str, task_id: str | None = None, context_id: str | None = None) -> SendMessageRequest:
    message: Message = new_text_message(
        text, role=Role.ROLE_USER, task_id=task_id, context_id=context_id
    )
    return SendMessageRequest(message=message)


def state_of(event: Any) -> int:
    """The task state a stream event carries (a task, or a status update)."""
    if event.HasField("status_update"):
        return int(event.status_update.status.state)
    return int(event.task.status.state)


@asynccontextmanager
async def alice_at_door(home: Path, endpoint: str, **extra: str) -> AsyncIterator[tuple[Home, Any]]:
    """``home_served`` with agent alice attached over ``/mcp`` (the official ``mcp`` client) and
    present (``mesh_hello`` done): the door's usual start."""
    from .httpkit import client as mcp_client
    from .mcpkit import good

    async with (
        home_served(home, endpoint, **extra) as served,
        mcp_client(served.mcp_url, served.mcp_token("alice")) as alice,
    ):
        await good(alice, "mesh_hello")
        yield served, alice
