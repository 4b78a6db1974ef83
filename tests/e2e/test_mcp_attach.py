"""``macula-mcp attach`` as a harness runs it: real processes, the official SDK client, a daemon
started by the first attach under a temporary ``MACULA_HOME``, stopped (or killed) at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from relay.station.station import Station
from support.mcpkit import good, initialize_request, server_params, stop_daemon
from support.waiting import eventually
from tools.daemon.unix_socket import acquire_lock, pid_path, read_pid
from tools.launch import server_command
from tools.settings import socket_path

pytestmark = pytest.mark.anyio


def _kill(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def home(station: Station) -> Iterator[Path]:
    """A short MACULA_HOME (its socket path must fit AF_UNIX); its daemon is stopped after the
    test (before the station), killed if it does not stop, and every pid it had is killed."""
    folder = Path(tempfile.mkdtemp(prefix="mat-", dir="/tmp"))
    pids: set[int] = set()
    yield folder
    sock = socket_path({"MACULA_HOME": str(folder)})
    pids.add(read_pid(sock) or 0)
    stop_daemon(folder)
    for pid in pids - {0, os.getpid()}:
        _kill(pid)
    shutil.rmtree(folder, ignore_errors=True)


def attach_env(home: Path, station: Station, **extra: str) -> dict[str, str]:
    return dict(os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint, **extra)


def attach_command() -> list[str]:
    return [*server_command(), "attach"]


@asynccontextmanager
async def session(env: dict[str, str], command: list[str] | None = None) -> AsyncIterator[Client]:
    async with Client(server_params(env, command or attach_command())) as client:
        yield client


async def node_id(client: Client) -> str:
    identity = await client.read_resource("mesh://identity")
    return str(json.loads(identity.contents[0].text)["node_id"])  # type: ignore[union-attr]


def daemon_status(home: Path) -> dict[str, Any]:
    done = subprocess.run(
        [*server_command(), "daemon", "status", "--json"],
        env=dict(os.environ, MACULA_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return dict(json.loads(done.stdout))


async def test_the_node_stays_between_sessions_and_reads_what_came_meanwhile(
    station: Station, home: Path, tmp_path: Path
) -> None:
    ada_env = attach_env(home, station, MACULA_MCP_AGENT="ada", MACULA_MCP_CONTACT_POLICY="ask")
    bob_env = attach_env(tmp_path / "bob", station, MACULA_MCP_IDENTITY=str(tmp_path / "bob.key"))
    async with session(bob_env, server_command()) as bob:  # plain macula-mcp
        await good(bob, "mesh_hello", message="bob here")
        async with session(ada_env) as ada:
            ada_id = (await good(ada, "mesh_hello", operator_name="ada"))["node_id"]
            assert await node_id(ada) == ada_id
            rung = await good(bob, "mesh_ring", to=ada_id, purpose="pair on the parser?")
            assert rung["answer"] == 3  # deferred to ada under ask
            inbox = await good(ada, "mesh_read_inbox")
            assert [r["ring_id"] for r in inbox["rings"]["pending"]] == [rung["ring_id"]]
            answered = await good(ada, "mesh_answer_ring", ring_id=rung["ring_id"], answer=1)
            assert answered["caller_notified"] == 1
            room = rung["room_topic"]
        # ada's harness session closed: the daemon keeps ada's node, present, in the room
        hosted = daemon_status(home)
        assert hosted["running"] == 1 and hosted["sessions"] == 0
        assert [(i["node_id"], i["sessions"], i["present"]) for i in hosted["identities"]] == [
            (ada_id, 0, 1)
        ]
        said = await good(bob, "mesh_say", room_topic=room, kind="question_asked", text="still?")

        async with session(ada_env) as ada_again:
            assert await node_id(ada_again) == ada_id

            async def heard() -> list[dict[str, Any]]:
                inbox = await good(ada_again, "mesh_read_inbox")
                return [
                    m
                    for r in inbox["rooms"]
                    if r["room_topic"] == room
                    for m in r["messages"]
                    if m.get("message_id") == said["message_id"]
                ]

            [message] = await eventually(heard, 15, interval=0.1)
            assert message["text"] == "still?"
        assert [i["node_id"] for i in daemon_status(home)["identities"]] == [ada_id]


async def test_two_sessions_of_one_agent_share_one_node(station: Station, home: Path) -> None:
    env = attach_env(home, station, MACULA_MCP_AGENT="ada")
    async with session(env) as first, session(env) as second:
        assert await node_id(first) == await node_id(second)
        await good(first, "mesh_hello")
        await good(second, "mesh_publish", topic="e2e.shared", fact={"n": 1})
        status = daemon_status(home)
        assert status["sessions"] == 2
        assert [(i["node_id"], i["sessions"]) for i in status["identities"]] == [
            (await node_id(first), 2)
        ]
        assert len(station.core.peers) == 1  # one QUIC connection for both sessions
    assert daemon_status(home)["sessions"] == 0


async def test_a_crashed_daemon_is_replaced_and_the_agent_keeps_its_id(
    station: Station, home: Path
) -> None:
    env = attach_env(home, station, MACULA_MCP_AGENT="ada")
    async with session(env) as first:
        before = await node_id(first)
    sock = socket_path(env)
    crashed = read_pid(sock)
    assert crashed is not None
    os.kill(crashed, signal.SIGKILL)
    await eventually(lambda: asyncio.to_thread(lambda: not _alive(crashed)), 15, interval=0.1)
    assert sock.exists() and pid_path(sock).exists()  # a crash leaves its files behind
    async with session(env) as second:
        assert await node_id(second) == before
    assert read_pid(sock) not in (None, crashed)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_attach(
    env: dict[str, str], argv: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv or attach_command(),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and done.stdout == "", (done.stdout, done.stderr)
    return lines[0]


async def test_attach_failures_are_one_line_and_never_touch_a_live_daemon(
    station: Station, home: Path
) -> None:
    env = attach_env(home, station, MACULA_MCP_AGENT="ada")
    async with session(env) as client:  # a daemon runs
        live = await node_id(client)
        sock = socket_path(env)
        pid = read_pid(sock)
        other_version = (
            "import tools.daemon.protocol as p; p.VERSION = '0.0.1+daemon0'; "
            "from tools.daemon.attach import main; main([])"
        )
        done = await asyncio.to_thread(run_attach, env, [sys.executable, "-c", other_version])
        assert done.returncode == 1
        line = one_line(done)
        assert "0.0.1+daemon0" in line and "macula-mcp daemon stop" in line
        bad = dict(env, MACULA_MCP_AGENT="not a name!")
        done = await asyncio.to_thread(run_attach, bad)
        assert done.returncode == 2 and "MACULA_MCP_AGENT" in one_line(done)
        conflicting = dict(env, MACULA_MCP_CONTACT_POLICY="closed")
        done = await asyncio.to_thread(run_attach, conflicting)
        assert done.returncode == 2 and "MACULA_MCP_CONTACT_POLICY" in one_line(done)
        assert await node_id(client) == live  # the session in use never noticed
        assert read_pid(sock) == pid
    too_long = dict(env, MACULA_MCP_SOCKET="/tmp/" + "s" * 200)
    done = await asyncio.to_thread(run_attach, too_long)
    assert done.returncode == 2 and "MACULA_MCP_SOCKET" in one_line(done)


async def test_a_daemon_that_holds_the_lock_but_never_answers_is_reported(
    station: Station, home: Path
) -> None:
    env = attach_env(home, station, MACULA_MCP_DAEMON_START_S="2")
    sock = socket_path(env)
    sock.parent.mkdir(mode=0o700, parents=True)
    pid_path(sock).write_text(f"{os.getpid()}\n")
    lock = acquire_lock(sock)  # "a hung daemon": the lock is held, nothing listens
    try:
        done = await asyncio.to_thread(run_attach, env)
    finally:
        lock.close()
    assert done.returncode == 1
    line = one_line(done)
    assert "within 2 s" in line and f"pid {os.getpid()} holds its lock" in line


async def test_goodbye_closes_the_agent_and_an_idle_daemon_exits(
    station: Station, home: Path
) -> None:
    env = attach_env(home, station, MACULA_MCP_AGENT="ada", MACULA_MCP_DAEMON_IDLE_S="3")
    async with session(env) as ada:
        await good(ada, "mesh_hello")
        assert daemon_status(home)["identities"][0]["present"] == 1
        await good(ada, "mesh_goodbye")
    sock = socket_path(env)
    pid = read_pid(sock)
    assert pid is not None

    async def closed() -> bool:
        status = await asyncio.to_thread(daemon_status, home)
        return status.get("identities") == [] or status["running"] == 0

    await eventually(
        closed, 15, interval=0.1
    )  # said goodbye, no session left: its node is closed at once
    await eventually(
        lambda: asyncio.to_thread(lambda: not _alive(pid)), 30, interval=0.1
    )  # then idle
    assert not sock.exists() and not pid_path(sock).exists()


async def test_an_oversized_message_ends_only_its_session(station: Station, home: Path) -> None:
    env = attach_env(home, station, MACULA_MCP_AGENT="ada", MACULA_MCP_DAEMON_MAX_LINE="4096")
    async with session(env) as steady:
        before = await node_id(steady)
        init = initialize_request("big")
        huge = dict(init, id=2, params=dict(init["params"], clientInfo={"name": "x" * 9000}))
        payload = (json.dumps(init) + "\n" + json.dumps(huge) + "\n").encode()

        def oversized() -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                attach_command(), env=env, input=payload, capture_output=True, timeout=60
            )

        done = await asyncio.to_thread(oversized)
        assert json.loads(done.stdout.splitlines()[0])["id"] == 1  # served until the big one
        assert b'"id":2' not in done.stdout
        assert await node_id(steady) == before  # the other session still works
        assert daemon_status(home)["sessions"] == 1
