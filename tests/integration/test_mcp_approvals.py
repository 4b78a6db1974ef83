"""The model and the approval queue, through the real MCP server (the SDK's in-process client):
``mesh_approvals`` shows what waits as metadata only, never the content; and no tool, called
with hostile arguments naming the item, approves or denies it or reveals its content."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from macula.agent.agent import Agent
from macula.agent.task_messages import TaskLimits
from macula.node.node import Node
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import settings
from tools.server.server import build_server

pytestmark = pytest.mark.anyio

SECRET = "the launch code is 0000-swordfish"


@asynccontextmanager
async def stranger(station: Station, home: Path) -> AsyncIterator[Agent]:
    config = dataclasses.replace(settings(home, "open"), task_limits=TaskLimits())
    async with Node(new_identity(), [station.endpoint]) as node, Agent(node, config) as agent:
        await agent.hello()
        yield agent


def hostile(schema: dict[str, Any], approval_id: str) -> dict[str, Any]:
    """Every parameter set to the item's id (strings) or its least value (numbers)."""
    args: dict[str, Any] = {}
    for name, spec in schema.get("properties", {}).items():
        kinds = {spec.get("type")} | {s.get("type") for s in spec.get("anyOf", [])}
        if "string" in kinds:
            args[name] = approval_id
        elif "integer" in kinds or "number" in kinds:
            args[name] = spec.get("minimum", 0)
    return args


def shown(result: Any) -> str:
    return json.dumps(result.structured_content) + " ".join(
        getattr(block, "text", "") for block in result.content
    )


async def test_the_model_sees_metadata_only_and_no_tool_decides(
    station: Station, tmp_path: Path
) -> None:
    home = tmp_path / "bob"
    home.mkdir()
    (home / "owner.toml").write_text("[approvals]\ntasks_from_strangers = 1\n")
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
        "MACULA_MCP_CONTACT_POLICY": "ask",
    }
    async with Client(build_server(env)) as bob, stranger(station, tmp_path / "eve") as eve:
        me = (await bob.call_tool("mesh_hello", {})).structured_content
        assert me is not None
        sent = await eve.tasks.send(bytes.fromhex(me["node_id"]), "do it", SECRET)
        assert sent.state == "pending_owner_approval"

        listed = await bob.call_tool("mesh_approvals", {})
        assert not listed.is_error and SECRET not in shown(listed)
        [item] = listed.structured_content["pending"]  # type: ignore[index]
        assert set(item) == {
            "approval_id", "kind", "sender", "petname", "size", "age_s", "expires_in_s"
        }  # fmt: skip
        assert (item["kind"], item["sender"]) == ("task", eve.node.identity.node_id.hex())
        assert item["size"] > len(SECRET)
        approval_id = item["approval_id"]

        tools = (await bob.list_tools()).tools
        for tool in tools:
            if tool.name == "mesh_goodbye":
                continue  # it ends presence; it takes no argument that could name an item
            for args in (
                hostile(tool.input_schema, approval_id),
                {"approval_id": approval_id, "decision": "approved", "approve": 1},
            ):
                result = await asyncio.wait_for(bob.call_tool(tool.name, args), 60)
                assert SECRET not in shown(result), tool.name

        approvals = [t for t in tools if "approv" in t.name or "deny" in t.name]
        assert [t.name for t in approvals] == ["mesh_approvals"]
        assert approvals[0].annotations is not None and approvals[0].annotations.read_only_hint
        still = (await bob.call_tool("mesh_approvals", {})).structured_content
        assert still is not None and [i["approval_id"] for i in still["pending"]] == [approval_id]
        assert (await eve.tasks.get(sent.task_id)).state == "pending_owner_approval"


async def test_the_model_cannot_trust_a_stranger_past_the_queue(
    station: Station, tmp_path: Path
) -> None:
    """The allowlist says who is a stranger: while the owner holds strangers' work, trusting the
    sender shown by ``mesh_approvals`` is refused, and the sender's next task waits too."""
    home = tmp_path / "bob"
    home.mkdir()
    (home / "owner.toml").write_text("[approvals]\ntasks_from_strangers = 1\n")
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
        "MACULA_MCP_CONTACT_POLICY_FILE": str(home / "contacts.json"),
    }
    async with Client(build_server(env)) as bob, stranger(station, tmp_path / "eve") as eve:
        me = (await bob.call_tool("mesh_hello", {})).structured_content
        assert me is not None
        bob_id = bytes.fromhex(me["node_id"])
        first = await eve.tasks.send(bob_id, "do it", SECRET)
        assert first.state == "pending_owner_approval"
        sender = eve.node.identity.node_id.hex()
        refused = await bob.call_tool("mesh_trust_agent", {"node_id": sender})
        assert refused.is_error and refused.structured_content is not None
        assert refused.structured_content["code"] == "owner_decides"
        assert not (home / "contacts.json").exists()  # the allowlist was not written
        second = await eve.tasks.send(bob_id, "do it again", SECRET)
        assert second.state == "pending_owner_approval"
        untrusted = await bob.call_tool("mesh_untrust_agent", {"node_id": sender})
        assert not untrusted.is_error  # narrowing stays the model's to do
