"""Shared pieces of the end-to-end tests that drive ``macula-mcp`` as a harness does: its
environment and stdio parameters, the CLI in a subprocess, tool calls that must succeed or fail
with a structured error (official SDK client), and stopping a ``MACULA_HOME``'s daemon.

Invariants: nothing here starts a station (the ``station`` fixture in ``conftest.py`` does);
every subprocess is bounded by a timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp import Client, ClientSession, StdioServerParameters
from pydantic import BaseModel

from tools.daemon.unix_socket import read_pid
from tools.launch import server_command
from tools.settings import socket_path


def server_env(home: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """``macula-mcp``'s environment: this one plus its home, station and identity file."""
    return dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=endpoint,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
        **extra,
    )


def server_params(env: dict[str, str], command: list[str] | None = None) -> StdioServerParameters:
    """``command`` (by default ``macula-mcp`` itself) as the SDK client's stdio server."""
    argv = command or server_command()
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env)


def initialize_request(client_name: str) -> dict[str, Any]:
    """A raw JSON-RPC ``initialize`` (id 1, protocol 2025-06-18) for writing to stdin by hand."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": client_name, "version": "0"},
        },
    }


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m tools.cli ARGS`` in a subprocess, as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def stop_daemon(home: Path) -> None:
    """``macula-mcp daemon stop --wait 20`` for ``home`` (nothing if none runs)."""
    subprocess.run(
        [*server_command(), "daemon", "stop", "--wait", "20"],
        env=dict(os.environ, MACULA_HOME=str(home)),
        capture_output=True,
        timeout=40,
        check=False,
    )


def stop_daemon_for_good(home: Path) -> None:
    """``stop_daemon(home)``, then SIGKILL to the pid the daemon had if it would not stop."""
    pid = read_pid(socket_path({"MACULA_HOME": str(home)}))
    stop_daemon(home)
    if pid is not None and pid != os.getpid():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def good(session: ClientSession | Client, tool: str, **args: Any) -> dict[str, Any]:
    """Call ``tool``; it must succeed. Its structured content."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, (tool, result.structured_content)
    return dict(result.structured_content or {})


async def bad(session: ClientSession | Client, tool: str, **args: Any) -> dict[str, Any]:
    """Call ``tool``; it must fail with a structured error (code, detail, retryable 0/1,
    next_action). The error."""
    result = await session.call_tool(tool, args)
    assert result.is_error, (tool, args, result.structured_content)
    error = dict(result.structured_content or {})
    assert {"code", "detail", "retryable", "next_action"} <= set(error), error
    assert error["retryable"] in (0, 1)
    return error


class Tools:
    """A client's tool calls as methods: ``await tools.good("mesh_hello")``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def good(self, tool: str, **args: Any) -> dict[str, Any]:
        return await good(self.client, tool, **args)

    async def bad(self, tool: str, **args: Any) -> dict[str, Any]:
        return await bad(self.client, tool, **args)


class StrictTools(Tools):
    """``Tools`` whose successful results must hold no booleans (0/1 only)."""

    async def good(self, tool: str, **args: Any) -> dict[str, Any]:
        data = await super().good(tool, **args)
        assert "True" not in repr(data) and "False" not in repr(data), data  # no booleans
        return data


@contextlib.asynccontextmanager
async def killable_server(home: Path, env: dict[str, str]) -> AsyncIterator[StrictTools]:
    """``macula-mcp`` under ``sh -c 'echo $$ > pid; exec ...'`` (so ``kill(home)`` can SIGKILL
    it), driven by the official SDK client."""
    home.mkdir(parents=True, exist_ok=True)
    script = f'echo $$ > "{home / "pid"}"; exec "$0" "$@"'
    command = ["sh", "-c", script, *server_command()]
    async with Client(server_params(env, command)) as client:
        yield StrictTools(client)


def kill(home: Path) -> None:
    """SIGKILL the ``macula-mcp`` that ``killable_server`` started for ``home``."""
    os.kill(int((home / "pid").read_text().strip()), signal.SIGKILL)


class Pushed(BaseModel):
    """A channel notification's params, as a harness that declared the channel receives them."""

    content: str
    meta: dict[str, str]
