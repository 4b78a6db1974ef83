"""What the A2A door refuses, and how it says so: no token or a wrong one (401, the Bearer
challenge), a token of another agent (403), another client's task (not found), a malformed
request (the JSON-RPC error the SDK names), parts past the mesh bounds or of a kind the door
does not take, and a sender the agent's contact policy declines (A2A ``rejected``)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.helpers.proto_helpers import new_message, new_raw_part, new_url_part
from a2a.types import GetTaskRequest, Role, SendMessageRequest, TaskState
from a2a.utils.errors import A2AError

from relay.station.station import Station
from support.doorkit import a2a_client, alice_at_door, home_served, http, say
from support.httpkit import client as mcp_client
from support.mcpkit import good

pytestmark = pytest.mark.anyio
ASK = {"MACULA_MCP_CONTACT_POLICY": "ask"}


def rpc(method: str, params: Any, ident: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}


async def test_tokens_reach_one_agent_and_one_clients_tasks(
    station: Station, tmp_path: Path
) -> None:
    async with (
        home_served(tmp_path / "h", station.endpoint, **ASK) as home,
        mcp_client(home.mcp_url, home.mcp_token("alice")) as alice,
        mcp_client(home.mcp_url, home.mcp_token("bob")) as bob,
    ):
        await good(alice, "mesh_hello")
        await good(bob, "mesh_hello")
        crew, other, bobs = (
            home.a2a_token("crew", "alice"),
            home.a2a_token("other", "alice"),
            home.a2a_token("bobs", "bob"),
        )
        url = home.agent_url("alice")
        body = rpc("GetTask", {"id": "x"})
        async with http(None) as plain:
            for headers in ({}, {"Authorization": "Bearer a2a_" + "x" * 43},
                            {"Authorization": f"Basic {crew}"}):  # fmt: skip
                refused = await plain.post(url, json=body, headers=headers)
                assert refused.status_code == 401, headers
                assert refused.headers["www-authenticate"].startswith("Bearer ")
                assert "a2a-token create" in refused.json()["error"]["message"]
                assert crew not in refused.text
            wrong_agent = await plain.post(
                url, json=body, headers={"Authorization": f"Bearer {bobs}"}
            )
            assert wrong_agent.status_code == 403
            nobody = await plain.post(home.agent_url("nobody"), json=body)
            assert nobody.status_code == 404
        # another client of the same agent cannot see crew's task
        async with a2a_client(url, crew) as a2a:
            stream = a2a.send_message(say("mine"))
            task_id = (await anext(stream)).task.id
            await stream.aclose()
            assert (await a2a.get_task(GetTaskRequest(id=task_id))).id == task_id
        async with a2a_client(url, other) as a2a:
            with pytest.raises(A2AError, match=r"(?i)not found"):
                await a2a.get_task(GetTaskRequest(id=task_id))
        # a revoked token stops at once
        from tools.a2a import tokens

        assert tokens.revoke(home.home, "other")
        async with http(other) as revoked:
            assert (await revoked.post(url, json=body)).status_code == 401


async def test_malformed_and_oversized_requests_get_the_error_they_name(
    station: Station, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
        token = home.a2a_token("crew", "alice")
        url = home.agent_url("alice")
        async with http(token) as session:
            parse = await session.post(
                url, content=b"{not json", headers={"content-type": "application/json"}
            )
            assert parse.json()["error"]["code"] == -32700
            unknown = await session.post(url, json=rpc("NoSuchMethod", {}))
            assert unknown.json()["error"]["code"] == -32601
            shapeless = await session.post(url, json=rpc("SendMessage", {"message": 7}))
            assert shapeless.json()["error"]["code"] in (-32602, -32600)
            huge = await session.post(url, content=b"x" * (300 * 1024))
            assert huge.status_code == 413

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
                for _ in range(40):
                    yield b"x" * 10_000

            caplog.clear()
            with caplog.at_level(logging.ERROR):
                chunked = await session.post(url, content=chunks())
            assert (chunked.status_code, chunked.json()["error"]["code"]) == (413, -32600)
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

            async def small() -> AsyncIterator[bytes]:  # a chunked body in bounds is served
                yield json.dumps(rpc("GetTask", {"id": "no-such-task"})).encode()

            chunked = await session.post(url, content=small())
            assert chunked.json()["error"]["code"] == -32001
            for part, code in (
                ({"text": "y" * 17_000}, -32602),
                ({"url": "file:///etc/passwd"}, -32005),
            ):
                message = {"messageId": "m1", "role": "ROLE_USER", "parts": [part]}
                said = await session.post(url, json=rpc("SendMessage", {"message": message}))
                assert said.json()["error"]["code"] == code, said.text
            lost = await session.post(url, json=rpc("GetTask", {"id": "no-such-task"}))
            assert lost.json()["error"]["code"] == -32001
        async with a2a_client(url, token, streaming=False) as a2a:
            with pytest.raises(A2AError, match="longer than 16384"):
                [e async for e in a2a.send_message(say("y" * 17_000))]
            for part in (new_raw_part(b"\x7fELF"), new_url_part("file:///etc/passwd")):
                message = new_message([part], role=Role.ROLE_USER)
                with pytest.raises(A2AError, match="text and data parts only"):
                    [e async for e in a2a.send_message(SendMessageRequest(message=message))]
        # nothing of it became a mesh task
        listed = await good(alice, "mesh_task_list")
        assert listed["tasks"] == []


async def test_a_sender_the_policy_declines_is_rejected(station: Station, tmp_path: Path) -> None:
    closed = {"MACULA_MCP_CONTACT_POLICY": "closed"}
    async with alice_at_door(tmp_path / "h", station.endpoint, **closed) as (home, _):
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token, streaming=False) as a2a:
            [final] = [e async for e in a2a.send_message(say("let me in"))]
        assert final.task.status.state == TaskState.TASK_STATE_REJECTED
        assert "closed" in final.task.status.message.parts[0].text


async def test_a_revoked_clients_name_given_again_reaches_none_of_its_tasks(
    station: Station, tmp_path: Path
) -> None:
    """The door keys a client's requester and its A2A tasks by its node id, not its name."""
    from a2a.types import CancelTaskRequest, ListTasksRequest

    from tools.a2a import tokens

    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
        url = home.agent_url("alice")
        first = home.a2a_token("crew", "alice")
        [old] = tokens.clients(home.home)
        async with a2a_client(url, first) as a2a:
            stream = a2a.send_message(say("the first crew's secret"))
            task_id = (await anext(stream)).task.id
            await stream.aclose()
        assert tokens.revoke(home.home, "crew")
        second = home.a2a_token("crew", "alice")  # someone else, the same name
        [new] = tokens.clients(home.home)
        assert new.node_id != old.node_id
        async with a2a_client(url, second) as a2a:
            with pytest.raises(A2AError, match=r"(?i)not found"):
                await a2a.get_task(GetTaskRequest(id=task_id))
            with pytest.raises(A2AError, match=r"(?i)not found"):
                await a2a.cancel_task(CancelTaskRequest(id=task_id))
            assert list((await a2a.list_tasks(ListTasksRequest())).tasks) == []
            stream = a2a.send_message(say("the second crew's task"))
            await anext(stream)
            await stream.aclose()
        assert list(home.door.requesters.by_client) == [new.node_id]
        assert home.door.requesters.by_client[new.node_id].tasks.me.hex() == new.node_id
        listed = await good(alice, "mesh_task_list")
        peers = {t["title"].split(":", 1)[1].strip(): t["peer"] for t in listed["tasks"]}
        assert peers == {"the first crew's secret": old.node_id,
                         "the second crew's task": new.node_id}  # fmt: skip
