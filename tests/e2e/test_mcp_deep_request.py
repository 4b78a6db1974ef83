"""A JSON-RPC request nested past what the SDK's parser takes is answered with a JSON-RPC
error instead of never (issue 26), over real stdio: plain ``macula-mcp`` and the
``attach`` -> daemon path. The session goes on serving afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.mcpkit import initialize_request, server_env, stop_daemon
from tools.launch import server_command

pytestmark = pytest.mark.anyio


def deep_call(request_id: int, depth: int) -> str:
    """A tools/call whose arguments nest ``depth`` arrays, with the id after the params (the
    guard reads it wherever it stands at the top level)."""
    args = "[" * depth + "1" + "]" * depth
    return (
        '{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "mesh_call", '
        f'"arguments": {{"procedure": "io.example.x", "args": {args}}}}}, "id": {request_id}}}'
    )


class Stdio:
    """One server process spoken to line by line; every read is bounded."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def send(self, line: str | dict[str, Any]) -> None:
        assert self.process.stdin is not None
        text = line if isinstance(line, str) else json.dumps(line)
        self.process.stdin.write((text + "\n").encode())
        self.process.stdin.flush()

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 30)
        assert line, "the server closed stdout"
        message: dict[str, Any] = json.loads(line)
        return message


@contextlib.asynccontextmanager
async def spoken(command: list[str], env: dict[str, str]) -> AsyncIterator[Stdio]:
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        stdio = Stdio(process)
        stdio.send(initialize_request("deep"))
        assert (await stdio.receive())["id"] == 1
        stdio.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield stdio
    finally:
        process.kill()  # also releases a reader thread still blocked on stdout
        process.wait(10)


async def refused_then_served(stdio: Stdio) -> None:
    stdio.send(deep_call(2, 300))
    answer = await stdio.receive()
    assert answer["id"] == 2, answer
    assert answer["error"]["code"] == -32600, answer
    assert "nested deeper than" in answer["error"]["message"]
    stdio.send({"jsonrpc": "2.0", "id": "three", "method": "ping"})
    assert (await stdio.receive()) == {"jsonrpc": "2.0", "id": "three", "result": {}}
    stdio.send(deep_call(4, 110))  # within the guard: reaches the tool, a structured error
    answer = await stdio.receive()
    assert answer["id"] == 4 and answer["result"]["isError"] is True, answer
    assert answer["result"]["structuredContent"]["code"] == "too_deep", answer


async def test_the_plain_server_answers_a_deep_request_and_keeps_serving(
    tmp_path: Path, station: Station
) -> None:
    async with spoken(server_command(), server_env(tmp_path / "a", station.endpoint)) as stdio:
        await refused_then_served(stdio)


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A MACULA_HOME short enough for the daemon's AF_UNIX socket; its daemon stopped after."""
    folder = Path(tempfile.mkdtemp(prefix="mdr-", dir="/tmp"))
    yield folder
    stop_daemon(folder)
    shutil.rmtree(folder, ignore_errors=True)


async def test_the_daemon_answers_a_deep_request_through_attach(
    short_home: Path, station: Station
) -> None:
    env = dict(
        os.environ,
        MACULA_HOME=str(short_home),
        MACULA_MESH_STATIONS=station.endpoint,
        MACULA_MCP_AGENT="ada",
    )
    async with spoken([*server_command(), "attach"], env) as stdio:
        await refused_then_served(stdio)
