"""Errors reach the agent: ``macula-mcp`` whose stations cannot be reached, or whose settings
are wrong, still completes the MCP handshake and answers every tool with a structured error
naming the problem and the fix; once the cause is gone the same session's next call works.
Real ``macula-mcp`` subprocesses driven by the official SDK client; real station processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import bad, good, server_params, stop_daemon_for_good
from support.processkit import StationProcess, free_udp_port
from support.waiting import eventually
from tools.launch import server_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def home() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="mer-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def env_of(home: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ, MACULA_HOME=str(home), MACULA_MCP_IDENTITY=str(home / "id.key"), **extra
    )


async def status(client: Client) -> dict[str, Any]:
    read = await client.read_resource("mesh://status")
    return dict(json.loads(read.contents[0].text))  # type: ignore[union-attr]


async def test_an_unreachable_station_is_told_to_every_tool(home: Path) -> None:
    env = env_of(home, MACULA_MESH_STATIONS="127.0.0.1:1")
    async with Client(server_params(env)) as client:  # initialize answered
        error = await bad(client, "mesh_hello")
        assert error["code"] == "station_unreachable", error
        assert error["retryable"] == 1
        assert error["stations"] == ["127.0.0.1:1"]
        assert (
            "127.0.0.1:1" in error["next_action"] and "MACULA_MESH_STATIONS" in error["next_action"]
        )
        assert (await bad(client, "mesh_agents"))["code"] == "station_unreachable"
        said = await status(client)
        assert said["connected"] == 0 and said["problem"]["code"] == "station_unreachable"
        assert len((await client.list_tools()).tools) > 5  # the session lives on


async def test_the_next_call_works_once_the_station_is_started(home: Path) -> None:
    port = free_udp_port()
    env = env_of(home, MACULA_MESH_STATIONS=f"127.0.0.1:{port}")
    station = StationProcess(home / "station", port)
    async with Client(server_params(env)) as client:
        error = await bad(client, "mesh_hello")
        assert error["code"] == "station_unreachable", error
        try:
            await station.start()
            hello = await good(client, "mesh_hello")  # a call wakes the retry and waits for it
            assert hello, hello
            said = await status(client)
            assert said["connected"] == 1 and "problem" not in said
        finally:
            await station.kill()


async def test_nonsense_stations_name_the_variable(home: Path) -> None:
    env = env_of(home, MACULA_MESH_STATIONS="nonsense")
    async with Client(server_params(env)) as client:
        error = await bad(client, "mesh_hello")
        assert error["code"] == "configuration", error
        assert error["variable"] == "MACULA_MESH_STATIONS"
        assert error["retryable"] == 0 and "MACULA_MESH_STATIONS" in error["next_action"]
        said = await status(client)
        assert said["problem"]["variable"] == "MACULA_MESH_STATIONS"


async def test_attach_with_other_settings_than_the_daemons_agent_is_told_and_recovers(
    station: Station, home: Path
) -> None:
    attach = [*server_command(), "attach"]
    first = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint)
    first["MACULA_MCP_AGENT"] = "ada"
    other = dict(first, MACULA_MESH_STATIONS=f"{station.endpoint},127.0.0.1:1")
    ada_up, ada_leaves = asyncio.Event(), asyncio.Event()

    async def ada_session() -> None:  # the agent the daemon runs, with the first settings
        async with Client(server_params(first, attach)) as ada:
            await good(ada, "mesh_hello")
            ada_up.set()
            await ada_leaves.wait()
            await good(ada, "mesh_goodbye")  # its runtime closes once ada detaches

    try:
        ada = asyncio.create_task(ada_session())
        await asyncio.wait_for(ada_up.wait(), 60)
        async with Client(server_params(other, attach)) as later:
            error = await bad(later, "mesh_hello")  # same agent, other stations
            assert error["code"] == "daemon_settings_differ", error
            assert error["variables"] == ["MACULA_MESH_STATIONS"]
            assert "macula-mcp daemon stop" in error["command"]
            assert error["command"] in error["next_action"]
            assert str(home) in error["command"]
            said = await status(later)
            assert said["problem"]["code"] == "daemon_settings_differ"
            ada_leaves.set()
            await ada

            async def works() -> bool:
                result = await later.call_tool("mesh_hello", {})
                return not result.is_error

            await eventually(works, timeout=30, interval=0.2)  # the same session, no restart
            assert (await status(later))["connected"] == 1
    finally:
        stop_daemon_for_good(home)


async def test_a_bad_contact_policy_fails_closed_and_says_so(station: Station, home: Path) -> None:
    env = env_of(home, MACULA_MESH_STATIONS=station.endpoint)
    env["MACULA_MCP_CONTACT_POLICY"] = "yes-please"
    async with Client(server_params(env)) as client:
        hello = await good(client, "mesh_hello")
        assert hello["ring"]["contact_policy"] == "closed", hello
        read = await client.read_resource("mesh://policy")
        policy = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert policy["contact_policy"] == "closed" and policy["source"] == "invalid_override"
        said = await status(client)
        assert any("MACULA_MCP_CONTACT_POLICY" in line for line in said["warnings"]), said


def test_on_a_terminal_it_says_what_it_is_and_still_serves(home: Path) -> None:
    import pty
    import select
    import subprocess

    from support.mcpkit import initialize_request

    terminal, its_side = pty.openpty()
    child = subprocess.Popen(
        server_command(),
        stdin=its_side,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_of(home, MACULA_MESH_STATIONS="127.0.0.1:1"),
    )
    os.close(its_side)
    try:
        assert child.stderr is not None and child.stdout is not None
        ready, _, _ = select.select([child.stderr], [], [], 30)
        line = child.stderr.readline().decode() if ready else ""
        assert "MCP server" in line and "macula-mcp register" in line and "macula-mcp demo" in line
        os.write(terminal, json.dumps(initialize_request("tty")).encode() + b"\n")
        ready, _, _ = select.select([child.stdout], [], [], 30)
        answer = json.loads(child.stdout.readline()) if ready else {}
        assert answer.get("id") == 1 and "serverInfo" in answer.get("result", {}), answer
    finally:
        child.kill()
        child.wait()
        os.close(terminal)


async def test_attach_to_a_daemon_of_another_version_serves_the_error(
    station: Station, home: Path
) -> None:
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint)
    other_version = (
        "import tools.daemon.protocol as p; p.VERSION = '0.0.1+daemon0'; "
        "from tools.daemon.attach import main; main([])"
    )
    try:
        async with Client(server_params(env, [*server_command(), "attach"])) as ada:
            await good(ada, "mesh_hello")  # a daemon of this version runs
            async with Client(server_params(env, [sys.executable, "-c", other_version])) as old:
                error = await bad(old, "mesh_hello")
                assert error["code"] == "daemon_unavailable", error
                assert "0.0.1+daemon0" in error["detail"]
                assert "macula-mcp daemon stop" in error["detail"]
                assert (await status(old))["problem"]["code"] == "daemon_unavailable"
    finally:
        stop_daemon_for_good(home)
