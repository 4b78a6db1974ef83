"""``mesh_audit`` is read-only and reaches only its own agent's trail: hostile arguments (paths,
other cursors, bounds out of range, wrong types) get a structured ``invalid_argument``, and the
trail only ever grows by the entries of those calls (every byte before stays), still verifying."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import tools.server.server
from macula.agent.audit import audit_dir
from macula.agent.audit_verify import verify_trail
from macula.keyfile import save_identity
from macula.store.audit_log import segments
from relay.station.station import Station
from support.identities import new_identity
from tools.groups import presence
from tools.groups.owner import audit

pytestmark = pytest.mark.anyio

HOSTILE: list[dict[str, Any]] = [
    {"cursor": "../../etc/passwd"},
    {"cursor": "a1/../../x"},
    {"cursor": "s5"},  # another tool's cursor
    {"cursor": "a" + "9" * 40},
    {"kind": "../audit"},
    {"kind": "tool_called\x00"},
    {"kind": ["tool_called"]},
    {"since_seq": 0},
    {"since_seq": -1},
    {"since_seq": 2**60},
    {"since_seq": 9, "until_seq": 3},
    {"since_ms": 9, "until_ms": 3},
    {"until_ms": "yesterday"},
    {"limit": 0},
    {"limit": 10**9},
    {"directory": "/tmp"},
    {"node_id": "00" * 32},
]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
async def client(
    station: Station, home: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Client]:
    monkeypatch.setattr(tools.server.server, "GROUPS", (presence, audit))
    save_identity(home / "id.key", new_identity())
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
    }
    async with Client(tools.server.server.build_server(env)) as connected:
        yield connected


def trail_bytes(home: Path) -> bytes:
    (directory,) = (home / "audit").iterdir()
    return b"".join(path.read_bytes() for _, path in segments(directory))


async def test_hostile_arguments_are_refused_and_the_trail_only_grows(
    client: Client, home: Path
) -> None:
    hello = await client.call_tool("mesh_hello", {})
    assert not hello.is_error, hello.structured_content
    canary = home / "canary"
    canary.write_bytes(b"untouched")
    before = trail_bytes(home)
    for args in HOSTILE:
        result = await client.call_tool("mesh_audit", args)
        assert result.is_error, (args, result.structured_content)
        error = result.structured_content or {}
        assert error["code"] == "invalid_argument", (args, error)
        assert set(error) >= {"code", "detail", "retryable", "next_action"}
    after = trail_bytes(home)
    assert after.startswith(before) and after.count(b"\n") - before.count(b"\n") >= len(HOSTILE)
    assert canary.read_bytes() == b"untouched"
    page = await client.call_tool("mesh_audit", {"kind": "tool_called", "limit": 200})
    refused = [e for e in (page.structured_content or {})["entries"] if e["outcome"] != "ok"]
    assert len(refused) == len(HOSTILE) and {e["outcome"] for e in refused} == {"invalid_argument"}


async def test_the_agent_reads_only_its_own_trail(client: Client, home: Path) -> None:
    other = new_identity()
    stranger = audit_dir(home, other.node_id)
    stranger.mkdir(parents=True)
    (stranger / "seg-000000000001.jsonl").write_text('{"seq":1,"kind":"tool_called"}\n')
    await client.call_tool("mesh_hello", {})
    page = (await client.call_tool("mesh_audit", {"limit": 200})).structured_content or {}
    assert page["entries"] and all(e.get("hash") for e in page["entries"])
    mine = [p for p in (home / "audit").iterdir() if p != stranger]
    assert len(mine) == 1 and verify_trail(mine[0]).problem is None


async def test_a_damaged_trail_never_fails_a_tool_call(client: Client, home: Path) -> None:
    assert not (await client.call_tool("mesh_hello", {})).is_error
    (directory,) = (home / "audit").iterdir()
    _, newest = segments(directory)[-1]
    with open(newest, "ab") as segment:  # a hand edit: a line whose seq is not a number
        segment.write(b'{"hash":"x","seq":"x"}\n{"hash":"y","seq":1e999}\n')
    (directory / "head").write_bytes(b'{"seq":"x"}')
    hello = await client.call_tool("mesh_hello", {})
    assert not hello.is_error, hello.structured_content
    page = await client.call_tool("mesh_audit", {"limit": 200})
    assert not page.is_error, page.structured_content
    assert verify_trail(directory).problem is not None  # the owner's verify names the damage


async def test_a_name_that_is_no_tool_never_reaches_the_trail(client: Client, home: Path) -> None:
    secret = "my password is hunter2"
    assert not (await client.call_tool("mesh_hello", {})).is_error  # the runtime is open
    with contextlib.suppress(Exception):  # the SDK may raise for an unknown tool: the trail
        await client.call_tool(secret, {})  # is what matters here
    page = (await client.call_tool("mesh_audit", {"limit": 200})).structured_content or {}
    names = [e["facts"]["name"] for e in page["entries"] if e["kind"] == "tool_called"]
    assert "?" in names and "mesh_hello" in names
    unknown = next(e for e in page["entries"] if e["facts"].get("name") == "?")
    assert len(unknown["facts"]["name_digest"]) == 64
    assert b"hunter2" not in trail_bytes(home)
