"""The console over real parts, in this process: a real station (QUIC on loopback), agents as
real runtimes each driven through its MCP tools by the SDK's in-process client, the console's
ASGI app served by uvicorn on 127.0.0.1:0 exactly as the daemon serves it, and (for the page)
Debian's headless Chromium driven by playwright."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import Client

from relay.station.station import Station
from tools.daemon.http.home_token import home_token, port_path
from tools.daemon.http.listener import Guarded, bind, build_app, serve
from tools.server.runtime import Runtime, open_runtime
from tools.server.server import build_server

from .waiting import eventually

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Home:
    """What the console reads (``tools.daemon.console.snapshot.ConsoleSource``): one home's
    runtimes."""

    home: Path
    hosted: list[Runtime] = field(default_factory=list)

    def runtimes(self) -> list[Runtime]:
        return list(self.hosted)


@dataclass
class Agent:
    runtime: Runtime
    client: Client

    @property
    def node_id(self) -> str:
        return self.runtime.node.identity.node_id.hex()

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        assert not result.is_error, (tool, result.structured_content or result.content)
        data = result.structured_content
        assert isinstance(data, dict)
        return data


@contextlib.asynccontextmanager
async def agent(
    home: Home,
    station: Station,
    name: str,
    policy: str = "open",
    *,
    named: int = 0,
    operator: str | None = None,
) -> AsyncIterator[Agent]:
    """An agent of ``home`` (its own key), hosted by the console as the daemon hosts it; with
    ``named`` 1 its key is chosen by ``MACULA_MCP_AGENT=name`` (as ``register`` writes it)."""
    env = {
        "MACULA_HOME": str(home.home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_CONTACT_POLICY": policy,
        "MACULA_MCP_OPERATOR_NAME": operator or name,
    }
    if named:
        env["MACULA_MCP_AGENT"] = name
    else:
        env["MACULA_MCP_IDENTITY"] = str(home.home / f"{name}.key")
    async with open_runtime(env) as runtime:

        @contextlib.asynccontextmanager
        async def lent() -> AsyncIterator[Runtime]:
            yield runtime

        async with Client(build_server(env, runtime=lent)) as client:
            home.hosted.append(runtime)
            try:
                yield Agent(runtime, client)
            finally:
                home.hosted.remove(runtime)


@dataclass
class Served:
    app: Guarded
    port: int
    token: str

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/?token={self.token}"


@contextlib.asynccontextmanager
async def console(home: Home) -> AsyncIterator[Served]:
    """The console of ``home`` on 127.0.0.1:0, as ``Daemon._http`` serves it."""
    app = build_app(home)
    sock = bind(0)
    stopping = asyncio.Event()
    task = asyncio.create_task(serve(app, sock, home.home, stopping))
    await eventually(lambda: port_path(home.home).exists())
    try:
        yield Served(app, int(port_path(home.home).read_text()), home_token(home.home))
    finally:
        stopping.set()
        await task


def _request(
    url: str, method: str, headers: dict[str, str], body: bytes | None
) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def http(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request (no redirect followed), off the loop."""
    data = None if body is None else json.dumps(body).encode()
    sent = dict(headers or {})
    if data is not None:
        sent.setdefault("Content-Type", "application/json")
    return await asyncio.to_thread(_request, url, method, sent, data)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Debian's headless Chromium, driven by playwright (callers skip when ``CHROMIUM`` is
    absent)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield launched
        finally:
            await launched.close()
