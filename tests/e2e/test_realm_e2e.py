"""A realm end to end: the ``macula-realm`` CLI and a real ``macula-mcp`` as subprocesses.

create -> serve -> mesh_join_realm (code, link, QR text, PNG block) -> approve (a wrong code
first, exit 1) -> mesh_join_realm wait -> approved -> mesh_list_realms / mesh://identity ->
members -> revoke; and a realm name works as the realm argument of mesh_publish.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import ImageContent

from relay.station import Station, StationConfig
from tools.launch import server_command

pytestmark = pytest.mark.anyio
NAME = "org.example.e2e"
REALM_CLI = [sys.executable, "-m", "macula.realm.cli"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def realm_cli(home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [*REALM_CLI, "--json", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


@asynccontextmanager
async def serve(home: Path, station: str) -> AsyncIterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [
            *REALM_CLI,
            "--json",
            "--home",
            str(home),
            "serve",
            "--station",
            station,
            "--publish-every-s",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert json.loads(line)["serving"] == 1, line
        yield process
    finally:
        process.terminate()
        process.wait(timeout=20)


@asynccontextmanager
async def mcp(home: Path, station: str) -> AsyncIterator[Client]:
    env = dict(
        os.environ,
        MACULA_HOME=str(home),
        MACULA_MESH_STATIONS=station,
        MACULA_MCP_IDENTITY=str(home / "id.key"),
    )
    command = server_command()
    async with Client(StdioServerParameters(command=command[0], args=command[1:], env=env)) as c:
        yield c


async def test_create_serve_join_approve_list_revoke(tmp_path: Path) -> None:
    owner = tmp_path / "owner"
    async with Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station:
        code, created = realm_cli(owner, "create", NAME)
        assert code == 0 and len(created["authority"]) == 64
        assert (owner / "realms" / NAME / "authority.key").stat().st_mode & 0o777 == 0o600
        code, again = realm_cli(owner, "create", NAME)
        assert code == 1 and again["code"] == "exists"

        async with serve(owner, station.endpoint), mcp(tmp_path / "agent", station.endpoint) as c:
            bad = await c.call_tool("mesh_join_realm", {"realm": "Not A Name"})
            assert bad.is_error and bad.structured_content["code"] == "invalid_argument"

            joined = await c.call_tool("mesh_join_realm", {"realm": NAME})
            assert not joined.is_error, joined.structured_content
            ticket = joined.structured_content
            assert ticket["status"] == "pending" and len(ticket["code"]) == 9
            assert ticket["link"].startswith("macula-realm://approve?") and ticket["qr_text"]
            assert ticket["authority"] == created["authority"]
            [png] = [b for b in joined.content if isinstance(b, ImageContent)]
            assert png.mime_type == "image/png"
            assert base64.b64decode(png.data).startswith(b"\x89PNG")

            identity = await c.read_resource("mesh://identity")
            text = identity.contents[0].text  # type: ignore[union-attr]
            assert ticket["code"] not in text and json.loads(text)["realms"] == []

            code, pending = realm_cli(owner, "pending")
            assert code == 0 and [p["code"] for p in pending["pending"]] == [ticket["code"]]
            wrong = "2222-2222" if ticket["code"] != "2222-2222" else "3333-3333"
            code, refused = realm_cli(owner, "approve", wrong)
            assert code == 1 and refused["code"] == "unknown_code"
            code, approved = realm_cli(owner, "approve", ticket["link"])
            assert code == 0 and approved["status"] == "approved"

            waited = await c.call_tool("mesh_join_realm", {"realm": NAME, "wait_seconds": 20})
            outcome = waited.structured_content
            assert outcome["status"] == "approved", outcome
            assert "code" not in outcome and "link" not in outcome

            listed = (await c.call_tool("mesh_list_realms", {})).structured_content
            [membership] = listed["realms"]
            assert membership["name"] == NAME and membership["role"] == "member"
            assert membership["authority"] == created["authority"]
            assert set(membership) == {
                "name",
                "realm",
                "authority",
                "role",
                "joined_at",
                "valid_until",
            }
            identity = await c.read_resource("mesh://identity")
            view = json.loads(identity.contents[0].text)  # type: ignore[union-attr]
            assert [r["name"] for r in view["realms"]] == [NAME]

            published = await c.call_tool(
                "mesh_publish", {"topic": "e2e.crew", "fact": 1, "realm": NAME}
            )
            assert published.structured_content["realm"] == membership["realm"]

            code, members = realm_cli(owner, "members")
            node_id = members["members"][0]["node"]
            assert code == 0 and members["members"][0]["revoked"] == 0
            code, revoked = realm_cli(owner, "revoke", node_id)
            assert code == 0 and revoked["status"] == "revoked"
            code, members = realm_cli(owner, "members")
            assert members["members"][0]["revoked"] == 1
            code, twice = realm_cli(owner, "revoke", node_id)
            assert code == 1 and twice["code"] == "revoked"


def test_cli_bad_usage_and_rate_limit(tmp_path: Path) -> None:
    home = tmp_path / "owner"
    code, answer = realm_cli(home, "pending")
    assert code == 2 and answer["code"] == "which_realm"
    code, answer = realm_cli(home, "create", "Bad Name")
    assert code == 2 and answer["code"] == "bad_name"
    assert realm_cli(home, "create", NAME)[0] == 0
    code, answer = realm_cli(home, "revoke", "zz")
    assert code == 2 and answer["code"] == "bad_node_id"
    code, answer = realm_cli(home, "approve", "not-a-code")
    assert code == 1 and answer["code"] == "bad_code"
    for _ in range(2):
        assert realm_cli(home, "--max-wrong-codes", "2", "deny", "2222-2222")[0] == 1
    code, answer = realm_cli(home, "--max-wrong-codes", "2", "deny", "2222-2222")
    assert code == 3 and answer["code"] == "rate_limited"
