"""``macula-mcp console`` as a person runs it: it starts this home's daemon, prints the console's
URL (and nothing else on stdout); the daemon serves the console on 127.0.0.1 behind the token,
shows the agent a harness attached (``macula-mcp attach``, the official SDK client), and its log
never holds the token."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import cli, good, server_params, stop_daemon, stop_daemon_for_good
from tools.daemon.http.home_token import port_path
from tools.launch import server_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def home() -> Iterator[Path]:
    """A short MACULA_HOME (its socket must fit AF_UNIX); its daemon stopped, or killed, after."""
    folder = Path(tempfile.mkdtemp(prefix="mco-", dir="/tmp"))
    yield folder
    stop_daemon_for_good(folder)
    shutil.rmtree(folder, ignore_errors=True)


def fetch(url: str, cookie: str | None = None) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    headers = {} if cookie is None else {"Cookie": cookie}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=20) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_console_starts_the_daemon_and_serves_its_agents(
    home: Path, station: Station
) -> None:
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint)
    done = await asyncio.to_thread(cli, ["console"], env)
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and "/?token=" in url and "\n" not in url
    port = int(port_path(home).read_text())
    assert url.startswith(f"http://127.0.0.1:{port}/")
    assert port_path(home).stat().st_mode & 0o777 == 0o600
    origin, token = url.split("/?token=")

    status, _, _ = await asyncio.to_thread(fetch, origin + "/api/snapshot")
    assert status == 401
    status, headers, _ = await asyncio.to_thread(fetch, url)
    assert status == 303
    cookie = {k.lower(): v for k, v in headers.items()}["set-cookie"].split(";")[0]

    agent_env = dict(env, MACULA_MCP_AGENT="ada")
    async with Client(server_params(agent_env, [*server_command(), "attach"])) as client:
        me = await good(client, "mesh_hello")
        status, _, body = await asyncio.to_thread(fetch, origin + "/api/snapshot", cookie)
        assert status == 200
        hosted = [i["node_id"] for i in json.loads(body)["identities"]]
        assert hosted == [me["node_id"]]

    again = await asyncio.to_thread(cli, ["console"], env)  # the same daemon, the same URL
    assert again.stdout.strip() == url
    log = (home / "logs" / "daemon.log").read_text()
    assert "console and HTTP listening" in log and token not in log


async def test_the_daemon_serves_mcp_over_http_on_a_port_kept_across_restarts(
    home: Path, station: Station
) -> None:
    """The daemon ``console`` started serves ``/mcp`` (the home token is agent ``default``) on
    the same port as the console; stopped and started again, it listens on that port again, so
    the entries ``register --http`` wrote stay right."""
    from support.httpkit import client

    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint)
    done = await asyncio.to_thread(cli, ["console"], env)
    assert done.returncode == 0, done.stderr
    origin, token = done.stdout.strip().split("/?token=")
    async with client(origin + "/mcp", token) as mcp:
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        assert {"mesh_hello", "mesh_say", "mesh_wait_room"} <= names
        said = await mcp.call_tool("mesh_hello", {})
        assert not said.is_error, said.structured_content
    wrong = urllib.request.Request(
        origin + "/mcp", data=b"{}", method="POST", headers={"Authorization": "Bearer " + "x" * 43}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(urllib.request.urlopen, wrong, None, 20)
    assert refused.value.code == 401

    stop_daemon(home)
    assert not port_path(home).exists()  # no live port while nothing listens
    again = await asyncio.to_thread(cli, ["console"], env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().split("/?token=")[0] == origin
