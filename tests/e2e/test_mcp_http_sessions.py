"""Streamable HTTP sessions as the transport spec says, driven by raw HTTP where the exact
requests matter: a dropped GET stream resumed with ``Last-Event-ID`` replays what was missed,
``DELETE`` ends a session (404 after), 401 without a good token, a token never reaches another
identity's session, a foreign ``Origin`` or ``Host`` is refused before anything opens."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.extension import NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import GET_STREAM_KEY

from relay.station.station import Station
from support.httpkit import ACCEPT, INIT, Raw, Served, client, events, http_client, served
from support.mcpkit import Pushed, good
from support.waiting import eventually
from tools.server.channel import METHOD

pytestmark = pytest.mark.anyio


async def pushes(response: httpx2.Response, count: int) -> list[tuple[str | None, Any]]:
    got: list[tuple[str | None, Any]] = []
    async for ident, message in events(response):
        if message.get("method") == "notifications/claude/channel":
            got.append((ident, message))
            if len(got) == count:
                break
    return got


@pytest.mark.slow  # the SDK client's own resume (below) runs by default; this one, by hand
async def test_a_dropped_get_stream_resumes_with_last_event_id(
    station: Station, tmp_path: Path
) -> None:
    async with (
        served(tmp_path / "h", station.endpoint, MACULA_MCP_CONTACT_POLICY="ask") as daemon,
        http_client(daemon.token()) as http,
    ):
        ada = Raw(http, daemon.url)
        await ada.open()
        ada_id = (await ada.call("mesh_hello"))["node_id"]
        session = daemon.mcp.sessions[ada.sid]
        async with (
            client(daemon.url, daemon.token("bob")) as bob,
            client(daemon.url, daemon.token("carol")) as carol,
        ):
            await good(bob, "mesh_hello")
            await good(carol, "mesh_hello")
            async with ada.get_stream() as stream:
                rung = await good(bob, "mesh_ring", to=ada_id, purpose="first")
                [(first_id, first)] = await pushes(stream, 1)
            assert first["params"]["meta"]["ring_id"] == rung["ring_id"] and first_id
            # the stream is gone; what is pushed meanwhile waits in the session's store
            missed = await good(carol, "mesh_ring", to=ada_id, purpose="second")
            await eventually(lambda: session.events.stored(GET_STREAM_KEY) >= 2, 15.0)
            async with ada.get_stream(last_event_id=first_id) as resumed:
                [(_, second)] = await pushes(resumed, 1)
            assert second["params"]["meta"]["ring_id"] == missed["ring_id"]


async def test_delete_ends_the_session(station: Station, tmp_path: Path) -> None:
    async with (
        served(tmp_path / "h", station.endpoint) as daemon,
        http_client(daemon.token()) as http,
    ):
        ada = Raw(http, daemon.url)
        await ada.open()
        assert (await http.delete(daemon.url, headers=ada.headers())).status_code == 200
        assert ada.sid not in daemon.mcp.sessions
        for method in ("POST", "GET", "DELETE"):
            later = await http.request(method, daemon.url, headers=ada.headers(), json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/list"})  # fmt: skip
            assert later.status_code == 404, method
        [hosted] = daemon.hosts.by_id.values()
        await eventually(lambda: hosted.sessions == 0)


async def refused(daemon: Served, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.post(daemon.url, json=INIT, headers={**ACCEPT, **headers})


async def test_no_good_token_gets_401_and_opens_nothing(station: Station, tmp_path: Path) -> None:
    async with served(tmp_path / "h", station.endpoint) as daemon:
        token = daemon.token()
        missing = await refused(daemon)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == 'Bearer realm="macula"'
        for wrong in (f"Bearer {token[:-1]}x", f"Basic {token}", "Bearer", f"Bearer {token}x"):
            answer = await refused(daemon, Authorization=wrong)
            assert answer.status_code == 401, wrong
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert token not in answer.text
        modern = await refused(daemon, Authorization="Bearer nope", **{
            "MCP-Protocol-Version": "2026-07-28"})  # fmt: skip
        assert modern.status_code == 401
        assert daemon.hosts.by_id == {} and daemon.mcp.sessions == {}
        assert (await refused(daemon, Authorization=f"bearer {token}")).status_code == 200


async def test_a_foreign_origin_or_host_is_refused(station: Station, tmp_path: Path) -> None:
    async with served(tmp_path / "h", station.endpoint) as daemon:
        auth = f"Bearer {daemon.token()}"
        for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example:80"):
            answer = await refused(daemon, Authorization=auth, Origin=origin)
            assert answer.status_code == 403, origin
        rebound = await refused(daemon, Authorization=auth, Host="evil.example")
        assert rebound.status_code == 421
        assert daemon.hosts.by_id == {} and daemon.mcp.sessions == {}
        async with httpx2.AsyncClient() as http:
            big = b"[" * (4 * 1024 * 1024 + 1)
            answer = await http.post(
                daemon.url, content=big, headers={**ACCEPT, "Authorization": auth}
            )
            assert answer.status_code == 413
        local = await refused(daemon, Origin="http://localhost:9999")  # passes, to the token
        assert local.status_code == 401


async def test_a_token_never_reaches_another_identitys_session(
    station: Station, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # and no log line, at any level, carries a token
    async with (
        served(tmp_path / "h", station.endpoint) as daemon,
        http_client(daemon.token()) as ada_http,
        http_client(daemon.token("bob")) as bob_http,
    ):
        ada = Raw(ada_http, daemon.url)
        await ada.open()
        ada_id = (await ada.call("mesh_hello"))["node_id"]
        intruder = Raw(bob_http, daemon.url)
        intruder.sid = ada.sid  # bob's token, ada's session id
        listed = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
        for method in ("POST", "GET", "DELETE"):
            answer = await bob_http.request(
                method, daemon.url, headers=intruder.headers(), json=listed
            )
            assert answer.status_code == 404, method
        assert ada.sid in daemon.mcp.sessions  # untouched
        bob = Raw(bob_http, daemon.url)
        await bob.open()
        assert (await bob.call("mesh_hello"))["node_id"] != ada_id
        assert (await ada.call("mesh_hello"))["node_id"] == ada_id
        for token in (daemon.token(), daemon.token("bob")):
            assert token not in caplog.text
        assert "http session" in caplog.text  # the log was captured


async def test_an_agent_running_with_other_settings_is_refused_naming_them(
    station: Station, tmp_path: Path
) -> None:
    """A stdio attach opened agent ``default`` with another contact policy: an HTTP session of
    it is refused (503) naming the variable, and nothing is opened for it."""
    async with served(tmp_path / "h", station.endpoint) as daemon:
        env = {**daemon.mcp.env, "MACULA_MCP_AGENT": "default", "MACULA_MCP_CONTACT_POLICY": "ask"}
        async with daemon.hosts.session(env):
            answer = await refused(daemon, Authorization=f"Bearer {daemon.token()}")
            assert answer.status_code == 503
            assert "MACULA_MCP_CONTACT_POLICY" in answer.json()["error"]["message"]
            assert daemon.mcp.sessions == {}


async def test_the_sdk_clients_session_survives_its_get_stream_being_dropped(
    station: Station, tmp_path: Path
) -> None:
    """The official client over HTTP: the daemon drops its GET stream; the client reconnects
    with ``Last-Event-ID`` on its own, the session goes on, and what was pushed meanwhile (or
    after) reaches it."""
    received: list[Pushed] = []

    async def record(params: Pushed) -> None:
        received.append(params)

    binding = NotificationBinding(method=METHOD, params_type=Pushed, handler=record)
    async with (
        served(tmp_path / "h", station.endpoint, MACULA_MCP_CONTACT_POLICY="ask") as daemon,
        http_client(daemon.token()) as http,
        streamable_http_client(daemon.url, http_client=http) as (read, write),
        ClientSession(read, write, notification_bindings=[binding]) as ada,
        client(daemon.url, daemon.token("bob")) as bob,
        client(daemon.url, daemon.token("carol")) as carol,
    ):
        await ada.initialize()
        ada_id = (await good(ada, "mesh_hello"))["node_id"]
        [session] = [s for s in daemon.mcp.sessions.values() if s.agent == "default"]
        await good(bob, "mesh_hello")
        await good(carol, "mesh_hello")
        await good(bob, "mesh_ring", to=ada_id, purpose="first")
        await eventually(lambda: len(received) == 1, 15.0)
        session.transport.close_standalone_sse_stream()  # the daemon drops the GET
        rung = await good(carol, "mesh_ring", to=ada_id, purpose="second")
        await eventually(lambda: len(received) == 2, 15.0)
        assert received[1].meta["ring_id"] == rung["ring_id"]
        assert (await good(ada, "mesh_hello"))["node_id"] == ada_id  # the same session
        assert session.sid in daemon.mcp.sessions


async def test_a_session_without_requests_ends_after_the_idle_timeout(
    station: Station, tmp_path: Path
) -> None:
    async with (
        served(tmp_path / "h", station.endpoint, idle_timeout=0.5) as daemon,
        http_client(daemon.token()) as http,
    ):
        ada = Raw(http, daemon.url)
        await ada.open()
        [hosted] = daemon.hosts.by_id.values()
        await eventually(lambda: ada.sid not in daemon.mcp.sessions and hosted.sessions == 0, 10)
        later = await http.post(daemon.url, headers=ada.headers(), json={
            "jsonrpc": "2.0", "id": 5, "method": "tools/list"})  # fmt: skip
        assert later.status_code == 404
