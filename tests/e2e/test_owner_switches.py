"""The owner's capability switches seen by a harness: a real ``macula-mcp`` (plain and attach)
and the daemon's HTTP ``/mcp``, driven by the official SDK client in both protocol eras. A tool
the owner turned off is not listed and a call to it anyway is ``capability_disabled``; a change
by the CLI or by the console reaches every attached client as ``tools/list_changed``; each
preset lists exactly its tools; a malformed file fails closed, naming its line and key."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from relay.station.station import Station
from support.consolekit import Home, console, http
from support.httpkit import http_client, served
from support.mcpkit import bad, cli, server_env, server_params, stop_daemon
from support.ownerkit import Watched, watched
from support.waiting import eventually
from tools.launch import server_command
from tools.owner.store import policy_path

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "2026-07-28"]

# what each preset lists, written out here on purpose (not imported from tools.owner.presets)
READ_ONLY = {
    "mesh_agents", "mesh_observe_lobby", "mesh_unobserve_lobby", "mesh_lobby_transcript",
    "mesh_rooms", "mesh_read_inbox", "mesh_wait_room", "mesh_wait_ring", "mesh_task_wait",
    "mesh_task_get", "mesh_task_list", "mesh_recall", "mesh_search", "mesh_list_stations",
    "mesh_reservations", "mesh_list_realms", "mesh_get", "mesh_find_record",
    "mesh_find_records", "mesh_find_records_by_type", "mesh_watch", "mesh_audit",
    "mesh_approvals",
}  # fmt: skip
TALK = READ_ONLY | {
    "mesh_hello", "mesh_goodbye", "mesh_open_room", "mesh_join_room", "mesh_leave_room",
    "mesh_say", "mesh_ring", "mesh_answer_ring", "mesh_trust_agent", "mesh_untrust_agent",
}  # fmt: skip
FULL = TALK | {
    "mesh_call", "mesh_serve", "mesh_unserve", "mesh_publish", "mesh_put", "mesh_remember",
    "mesh_remember_directory", "mesh_reserve_paths", "mesh_release_paths", "mesh_join_realm",
    "mesh_task_send", "mesh_task_cancel", "mesh_task_update", "mesh_task_complete",
}  # fmt: skip
PRESETS = {"read-only": READ_ONLY, "talk": TALK, "full": FULL}


def owner(home: Path, *args: str) -> None:
    """``macula-mcp owner ARGS`` for ``home``, as the person runs it; it must succeed."""
    done = cli(["owner", *args], {"MACULA_HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


async def refused(session: Watched, tool: str, switch: str) -> None:
    error = await bad(session.client, tool)
    assert error["code"] == "capability_disabled" and error["retryable"] == 0, error
    assert switch in error["detail"] and "owner" in error["next_action"], error


async def turned_off_by_cli(session: Watched, home: Path, agent: str) -> None:
    """The CLI turns ``mesh_serve`` off for ``agent``: the client is told, the tool is gone, a
    call to it anyway is refused; turned on again, it is back."""
    assert "mesh_serve" in await session.names()
    seen = len(session.changes)
    owner(home, "set", "mesh_serve", "0", "--agent", agent)
    await session.next_change(seen)
    assert "mesh_serve" not in await session.names()
    await refused(session, "mesh_serve", f"agents.{agent}.tools.mesh_serve")
    seen = len(session.changes)
    owner(home, "set", "mesh_serve", "1", "--agent", agent)
    await session.next_change(seen)
    assert "mesh_serve" in await session.names()


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("form", ["plain", "attach"])
async def test_a_cli_change_reaches_a_stdio_client(
    form: str, mode: str, station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    argv = [*server_command(), "attach"] if form == "attach" else None
    params = server_params(server_env(home, station.endpoint, MACULA_MCP_AGENT="ada"), argv)
    try:
        async with watched(params, mode) as session:
            if mode == "legacy":  # a pinned 2026 client has no discover result to read
                caps = session.client.server_capabilities
                assert caps.tools is not None and caps.tools.list_changed
            await turned_off_by_cli(session, home, "ada")
    finally:
        if form == "attach":
            stop_daemon(home)


async def test_each_preset_lists_exactly_its_tools(station: Station, tmp_path: Path) -> None:
    home = tmp_path / "h"
    params = server_params(server_env(home, station.endpoint))
    async with watched(params, "legacy") as session:
        assert await session.names() == FULL
        for preset in ("read-only", "talk", "full"):
            seen = len(session.changes)
            owner(home, "preset", preset)
            if preset != "full" or seen:
                await session.next_change(seen)
            assert await session.names() == PRESETS[preset], preset
        seen = len(session.changes)
        owner(home, "preset", "read-only")
        await session.next_change(seen)
        await refused(session, "mesh_say", "preset read-only")


async def test_a_malformed_file_fails_closed_naming_line_and_key(
    station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    env = server_env(home, station.endpoint)
    with tempfile.TemporaryFile("w+") as errors:
        transport = stdio_client(server_params(env), errlog=errors)
        async with watched(transport, "legacy") as session:
            assert await session.names() == FULL
            seen = len(session.changes)
            path = policy_path(home)
            path.write_text('preset = "talk"\n[tools]\nmesh_say = 1\nmesh_sya = 0\n')
            await session.next_change(seen)
            assert await session.names() == set()
            error = await bad(session.client, "mesh_read_inbox")
            assert error["code"] == "capability_disabled"
            assert f"{path}:4: key tools.mesh_sya" in error["detail"], error
            policy = await session.client.read_resource("mesh://policy")
            assert '"line": 4' in policy.contents[0].text  # type: ignore[union-attr]
            shown = cli(["owner", "show"], {"MACULA_HOME": str(home)})
            assert shown.returncode == 1 and f"{path}:4: key tools.mesh_sya" in shown.stdout
            seen = len(session.changes)
            path.write_text('preset = "talk"\n')  # fixed by hand
            await session.next_change(seen)
            assert await session.names() == TALK

            def said() -> str:
                errors.seek(0)
                return errors.read()

            await eventually(lambda: "tools.mesh_sya" in said())
            assert said().count("tools.mesh_sya") == 1  # once per change, not per call


@pytest.mark.parametrize("mode", ERAS)
async def test_http_clients_are_told_of_a_console_change(
    mode: str, station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "h"
    async with (
        served(home, station.endpoint, MACULA_MCP_CHANNEL="0") as daemon,
        console(Home(home)) as page,
        http_client(daemon.token("bob")) as bearer,
    ):
        status, headers, _ = await http(page.url)
        cookie = {k.lower(): v for k, v in headers.items()}["set-cookie"].split(";")[0]
        own = {"Cookie": cookie, "Origin": page.origin}
        transport = streamable_http_client(daemon.url, http_client=bearer)
        async with watched(transport, mode) as session:
            assert "mesh_publish" in await session.names()
            seen = len(session.changes)
            body = {"name": "pubsub", "value": 0, "agent": "bob"}
            status, _, answer = await http(page.origin + "/api/owner", "POST", own, body)
            assert status == 200, answer
            await session.next_change(seen)
            assert not {"mesh_publish", "mesh_watch"} & await session.names()
            await refused(session, "mesh_publish", "agents.bob.groups.pubsub")
            # the CLI's change reaches it too
            seen = len(session.changes)
            owner(home, "set", "mesh_say", "0")
            await session.next_change(seen)
            assert "mesh_say" not in await session.names()
            # a bad change from the console writes nothing and says why
            status, _, answer = await http(
                page.origin + "/api/owner", "POST", own, {"name": "pubsub", "value": True}
            )
            assert status == 400 and b"invalid_argument" in answer
