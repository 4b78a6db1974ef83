"""Sessions a harness never ends (``claude mcp list`` opens one per run and never sends
``DELETE``): past ``max_sessions``, a new session ends the least recently used idle one, as a
``DELETE`` would (404 after); a session with a request in flight or an open GET stream is never
ended for room; only when every session is busy is a new one refused (503)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from relay.station.station import Station
from support.httpkit import ACCEPT, INIT, Raw, http_client, served
from support.waiting import eventually

pytestmark = pytest.mark.anyio

LISTED = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}


async def tools_status(http: httpx2.AsyncClient, url: str, raw: Raw) -> int:
    return (await http.post(url, json=LISTED, headers=raw.headers())).status_code


async def test_harness_sessions_never_ended_make_room_least_recently_used_first(
    station: Station, tmp_path: Path
) -> None:
    async with (
        served(tmp_path / "h", station.endpoint, max_sessions=2) as daemon,
        http_client(daemon.token()) as http,
    ):
        # the official client, as a harness's health check: initialize, list, leave (no DELETE)
        for _ in range(4):
            transport = streamable_http_client(
                daemon.url, http_client=http, terminate_on_close=False
            )
            async with Client(transport, mode="legacy") as checked:  # type: ignore[arg-type]
                assert {t.name for t in (await checked.list_tools()).tools} >= {"mesh_hello"}
        assert len(daemon.mcp.sessions) == 2
        first, second = Raw(http, daemon.url), Raw(http, daemon.url)
        await first.open()
        await second.open()
        assert len(daemon.mcp.sessions) == 2
        assert await tools_status(http, daemon.url, first) == 200  # first: most recently used
        third = Raw(http, daemon.url)
        await third.open()  # the table is full: second, the least recently used, ends
        assert await tools_status(http, daemon.url, second) == 404
        assert await tools_status(http, daemon.url, first) == 200
        assert await tools_status(http, daemon.url, third) == 200
        assert set(daemon.mcp.sessions) == {first.sid, third.sid}
        [hosted] = daemon.hosts.by_id.values()
        await eventually(lambda: hosted.sessions == 2, 10.0)  # the ended ones let go of it


async def test_a_busy_session_is_never_ended_for_room_and_all_busy_is_503(
    station: Station, tmp_path: Path
) -> None:
    async with (
        served(tmp_path / "h", station.endpoint, max_sessions=2) as daemon,
        http_client(daemon.token()) as http,
    ):
        streaming, calling = Raw(http, daemon.url), Raw(http, daemon.url)
        await streaming.open()
        await calling.open()  # streaming is now the least recently used
        sessions = daemon.mcp.sessions
        room = (await calling.call("mesh_open_room", purpose="quiet"))["room_topic"]
        await calling.call("mesh_wait_room", room_topic=room, wait_seconds=0.5)  # read it all
        arguments = {"room_topic": room, "wait_seconds": 600}  # nothing will come
        waiting = {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                   "params": {"name": "mesh_wait_room", "arguments": arguments}}  # fmt: skip

        async with streaming.get_stream():
            in_flight = asyncio.create_task(
                http.post(daemon.url, json=waiting, headers=calling.headers())
            )
            await eventually(
                lambda: sessions[streaming.sid].in_flight and sessions[calling.sid].in_flight, 10
            )
            refused = await http.post(daemon.url, json=INIT, headers=ACCEPT)
            assert refused.status_code == 503
            assert "all are in use" in refused.json()["error"]["message"]
            assert set(sessions) == {streaming.sid, calling.sid}

            in_flight.cancel()  # the harness gives up its call: calling is idle again
            with contextlib.suppress(asyncio.CancelledError):
                await in_flight
            await eventually(lambda: not sessions[calling.sid].in_flight, 10)
            latest = Raw(http, daemon.url)
            await latest.open()
            assert set(sessions) == {streaming.sid, latest.sid}  # calling made room
            assert await tools_status(http, daemon.url, calling) == 404
            assert await tools_status(http, daemon.url, streaming) == 200
