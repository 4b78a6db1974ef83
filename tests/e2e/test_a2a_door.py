"""The A2A door against a real daemon surface: the official ``a2a-sdk`` client on one side, the
mesh agent on the other through its MCP tools (official ``mcp`` client on the same daemon)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from a2a.client import A2ACardResolver
from a2a.types import TaskState

from relay.station.station import Station
from support.a2akit import a2a_client, home_served, http, say
from support.httpkit import client as mcp_client
from support.mcpkit import good
from tools.a2a.card import verify_card

pytestmark = pytest.mark.anyio
ASK = {"MACULA_MCP_CONTACT_POLICY": "ask"}


async def next_task(agent: Any) -> dict[str, Any]:
    """The next task handed to ``agent`` (its mesh_task_wait)."""
    waited = await good(agent, "mesh_task_wait", wait_seconds=30)
    assert waited["task"] is not None, waited
    return dict(waited["task"])


async def test_card_is_signed_by_the_agent_and_names_it(station: Station, tmp_path: Path) -> None:
    async with (
        home_served(tmp_path / "h", station.endpoint, **ASK) as home,
        mcp_client(home.mcp_url, home.mcp_token("alice")) as alice,
    ):
        me = await good(alice, "mesh_hello")
        node = bytes.fromhex(me["node_id"])
        async with http(None) as plain:
            card = await A2ACardResolver(plain, home.agent_url("alice")).get_agent_card(
                signature_verifier=lambda c: verify_card(c, node)
            )
        assert card.name == me["petname"] and me["node_id"] in card.description
        assert card.supported_interfaces[0].url == home.agent_url("alice")
        assert card.supported_interfaces[0].protocol_version == "1.0"
        assert card.capabilities.streaming
        scheme = card.security_schemes["bearer"].http_auth_security_scheme
        assert scheme.scheme == "Bearer" and "a2a-token create" in scheme.description
        assert list(card.security_requirements[0].schemes) == ["bearer"]
        card.name = "someone else"  # a changed card no longer verifies
        with pytest.raises(Exception, match="No valid signature"):
            verify_card(card, node)


async def test_send_a_task_the_agent_completes(station: Station, tmp_path: Path) -> None:
    async with (
        home_served(tmp_path / "h", station.endpoint, **ASK) as home,
        mcp_client(home.mcp_url, home.mcp_token("alice")) as alice,
    ):
        await good(alice, "mesh_hello")
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token, streaming=False) as a2a:

            async def agent() -> dict[str, Any]:
                task = await next_task(alice)
                await good(alice, "mesh_task_complete", task_id=task["task_id"], result="42")
                return task

            worker = asyncio.create_task(agent())
            [final] = [e async for e in a2a.send_message(say("what is 6*7?"))]
            seen = await worker
        assert seen["title"].startswith("A2A from crew: what is 6*7?")
        assert seen["input"] == "what is 6*7?"
        assert final.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert final.task.artifacts[0].parts[0].text == "42"
