"""``mesh_serve ... allow="owner"`` over a real station, both agents real MCP servers (the SDK's
in-process client): a call waits for the owner and the caller gets ``pending_owner_approval``
with an approval id at once; approved, the command runs once and the caller fetches its reply
with ``{"_approval": id}`` (or by repeating the call); denied, the caller hears ``refused:``;
the model of the serving agent sees the call as metadata only."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.keyfile import save_identity
from relay.station.station import Station
from support.agentkit import Agent, python
from support.identities import new_identity
from support.mcpkit import cli
from support.waiting import eventually
from tools.server.server import build_server

pytestmark = pytest.mark.anyio

COUNTED = python(
    'import json,sys; p=json.load(sys.stdin); f=open(p["log"],"a"); f.write("x\\n"); f.close(); '
    'print(json.dumps({"ran": len(open(p["log"]).read().splitlines()), "n": p["n"]}))'
)


@pytest.fixture
def mcp(station: Station, tmp_path: Path) -> Callable[[str], Any]:
    @asynccontextmanager
    async def start(name: str) -> AsyncIterator[Agent]:
        home = tmp_path / name
        save_identity(home / "id.key", new_identity())
        env = {
            "MACULA_HOME": str(home),
            "MACULA_MESH_STATIONS": station.endpoint,
            "MACULA_MCP_IDENTITY": str(home / "id.key"),
        }
        async with Client(build_server(env)) as client:
            yield Agent(client)

    return start


async def pending_call(caller: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """mesh_call until the station knows the procedure (ADVERTISE has no acknowledgement)."""

    async def attempt() -> dict[str, Any] | None:
        result = await caller.raw("mesh_call", procedure="org.example.deploy", args=args)
        if result.is_error and (result.structured_content or {}).get("code") == (
            "unknown_next_peer"
        ):
            return None
        assert not result.is_error, result.structured_content
        return dict(result.structured_content or {})

    answer: dict[str, Any] = await eventually(attempt)
    return answer


async def test_a_call_waits_for_the_owner_then_runs_once(
    mcp: Callable[[str], Any], tmp_path: Path
) -> None:
    log = str(tmp_path / "ran.log")
    async with mcp("bob") as bob, mcp("alice") as alice:
        served = await bob.ok(
            "mesh_serve", name="org.example.deploy", exec=COUNTED, allow="owner", announce=0
        )
        assert served["allow"] == "owner"
        first = (await pending_call(alice, {"log": log, "n": 1}))["result"]
        assert first["state"] == "pending_owner_approval" and first["approved"] == 0
        approval_id = first["approval_id"]
        assert not os.path.exists(log)  # nothing ran
        again = await alice.ok(
            "mesh_call", procedure="org.example.deploy", args={"log": log, "n": 1}
        )
        assert again["result"]["approval_id"] == approval_id  # the same call: the same item

        shown = await bob.ok("mesh_approvals")
        [item] = shown["pending"]
        assert (item["approval_id"], item["kind"]) == (approval_id, "call")
        assert log not in json.dumps(shown)  # metadata only

        env = dict(os.environ, MACULA_HOME=str(tmp_path / "bob"))
        done = await asyncio.to_thread(cli, ["approvals", "approve", approval_id], env)
        assert done.returncode == 0, done.stderr

        async def fetched() -> dict[str, Any] | None:
            got = await alice.ok(
                "mesh_call", procedure="org.example.deploy", args={"_approval": approval_id}
            )
            return None if got["result"].get("state") == "pending_owner_approval" else got

        outcome = await eventually(fetched, 15)
        assert outcome["result"] == {"ran": 1, "n": 1}
        repeat = await alice.ok(
            "mesh_call", procedure="org.example.deploy", args={"log": log, "n": 1}
        )
        assert repeat["result"] == {"ran": 1, "n": 1}  # kept: it ran once
        assert len(Path(log).read_text().splitlines()) == 1

        denied = (
            await alice.ok("mesh_call", procedure="org.example.deploy", args={"log": log, "n": 2})
        )["result"]
        done = await asyncio.to_thread(
            cli, ["approvals", "deny", denied["approval_id"], "--reason", "not on friday"], env
        )
        assert done.returncode == 0, done.stderr

        async def refused() -> dict[str, Any] | None:
            result = await alice.raw(
                "mesh_call",
                procedure="org.example.deploy",
                args={"_approval": denied["approval_id"]},
            )
            return dict(result.structured_content or {}) if result.is_error else None

        error = await eventually(refused, 15)
        assert "refused: owner denied: not on friday" in error["detail"]
        assert len(Path(log).read_text().splitlines()) == 1  # the denied call never ran
        stranger = await bob.raw(
            "mesh_call", procedure="org.example.deploy", args={"_approval": approval_id}
        )  # only the caller that made the call fetches its outcome
        assert stranger.is_error and "not_found" in (stranger.structured_content or {})["detail"]


async def test_the_owner_holds_every_served_call_whatever_allow_the_model_chose(
    mcp: Callable[[str], Any], tmp_path: Path
) -> None:
    """``[approvals] served_calls = 1``: a procedure the model served ``allow="open"`` still
    waits for the owner; approved, it runs once."""
    log = str(tmp_path / "ran.log")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "owner.toml").write_text("[approvals]\nserved_calls = 1\n")
    async with mcp("bob") as bob, mcp("alice") as alice:
        served = await bob.ok(
            "mesh_serve", name="org.example.deploy", exec=COUNTED, allow="open", announce=0
        )
        assert served["allow"] == "open"
        first = (await pending_call(alice, {"log": log, "n": 1}))["result"]
        assert first["state"] == "pending_owner_approval" and not os.path.exists(log)
        env = dict(os.environ, MACULA_HOME=str(tmp_path / "bob"))
        done = await asyncio.to_thread(cli, ["approvals", "approve", first["approval_id"]], env)
        assert done.returncode == 0, done.stderr

        async def fetched() -> dict[str, Any] | None:
            got = await alice.ok(
                "mesh_call",
                procedure="org.example.deploy",
                args={"_approval": first["approval_id"]},
            )
            return None if got["result"].get("state") == "pending_owner_approval" else got

        assert (await eventually(fetched, 15))["result"] == {"ran": 1, "n": 1}
