"""The door in a real daemon process, set up as a person does it: ``macula-mcp a2a-token
create`` (CLI subprocess), the agent attached with ``macula-mcp attach`` (the daemon it starts
serves ``/a2a/<agent>/`` on its loopback listener), the official ``a2a-sdk`` client on the port
the daemon wrote; ``list`` shows no secret, ``revoke`` closes the door to that client."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a.types import TaskState
from mcp import Client

from relay.station.station import Station
from support.doorkit import a2a_client, http, say
from support.mcpkit import cli, good, server_params, stop_daemon_for_good
from support.waiting import eventually
from tools.daemon.http.home_token import port_path
from tools.launch import server_command

pytestmark = pytest.mark.anyio


@pytest.fixture
def home() -> Iterator[Path]:
    """A short MACULA_HOME (its socket path must fit AF_UNIX); its daemon stopped after."""
    folder = Path(tempfile.mkdtemp(prefix="a2a-", dir="/tmp"))
    yield folder
    stop_daemon_for_good(folder)
    shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_person_opens_the_door_with_two_commands(station: Station, home: Path) -> None:
    beyond = free_port()  # the door alone, as behind a TLS proxy (docs/a2a.md)
    env = dict(
        os.environ, MACULA_HOME=str(home), MACULA_MESH_STATIONS=station.endpoint,
        MACULA_MCP_AGENT="ada", MACULA_MCP_CONTACT_POLICY="ask",
        MACULA_MCP_HTTP_A2A_LISTEN=f"127.0.0.1:{beyond}",
        MACULA_MCP_HTTP_A2A_URL="https://agents.example.org",
    )  # fmt: skip
    made = cli(["a2a-token", "create", "crew", "--agent", "ada"], env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("a2a_") and "/a2a/ada/" in made.stderr
    for path in (home / "a2a" / "clients").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and token not in path.read_text("latin-1")
    listed = cli(["a2a-token", "list"], env)
    assert listed.stdout.startswith("crew\tagent=ada\tnode_id=") and token not in listed.stdout
    again = cli(["a2a-token", "create", "crew"], env)
    assert again.returncode == 1 and "revoke it first" in again.stderr
    async with Client(server_params(env, [*server_command(), "attach"])) as ada:
        await good(ada, "mesh_hello")
        await eventually(lambda: port_path(home).exists(), 30.0)
        port = int(port_path(home).read_text().strip())
        url = f"http://127.0.0.1:{port}/a2a/ada/"

        async def ada_works() -> None:
            task = (await good(ada, "mesh_task_wait", wait_seconds=30))["task"]
            await good(ada, "mesh_task_complete", task_id=task["task_id"], result="done")

        async with a2a_client(url, token, streaming=False) as a2a:
            worker = asyncio.create_task(ada_works())
            [final] = [e async for e in a2a.send_message(say("do it"))]
            await worker
        assert final.task.status.state == TaskState.TASK_STATE_COMPLETED
        async with http(None) as plain:  # beyond loopback: the door and nothing else
            proxied = f"http://127.0.0.1:{beyond}"
            card = (await plain.get(f"{proxied}/a2a/ada/.well-known/agent-card.json")).json()
            assert card["supportedInterfaces"][0]["url"] == "https://agents.example.org/a2a/ada/"
            for path in ("/", "/mcp", "/events"):
                assert (await plain.get(proxied + path)).status_code == 404, path
        gone = cli(["a2a-token", "revoke", "crew"], env)
        assert gone.returncode == 0 and not list((home / "a2a" / "clients").glob("crew.*"))
        async with http(token) as session:
            refused = await session.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                                                    "params": {"id": "x"}})  # fmt: skip
            assert refused.status_code == 401
