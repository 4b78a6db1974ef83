"""The A2A door against a real daemon surface: the official ``a2a-sdk`` client on one side, the
mesh agent on the other through its MCP tools (official ``mcp`` client on the same daemon)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from a2a.client import A2ACardResolver
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import A2AError

from relay.station.station import Station
from support.doorkit import a2a_client, alice_at_door, home_served, http, say, state_of
from support.httpkit import Raw, events, http_client
from support.httpkit import client as mcp_client
from support.mcpkit import bad, good
from support.waiting import eventually
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
            forged = await plain.get(
                home.agent_url("alice") + ".well-known/agent-card.json",
                headers={"Host": "evil.example"},
            )  # the agent's key signs the URL the socket has, never one a caller wrote
            assert forged.status_code == 200 and "evil" not in forged.text
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


async def test_send_a_task_the_agent_completes(
    station: Station, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # and no log line, at any level, carries the token
    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
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
        assert seen["peer_label"] == "A2A client crew (through this home's A2A door)"
        assert seen["input"] == "what is 6*7?"
        assert final.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert final.task.artifacts[0].parts[0].text == "42"
        assert "what is 6*7?" in caplog.text and token not in caplog.text


async def test_stream_an_input_required_round_trip_and_resubscribe(
    station: Station, tmp_path: Path
) -> None:
    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token) as a2a:
            stream = a2a.send_message(say("translate 'hello'"))
            first = await anext(stream)
            assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
            a2a_id, context_id = first.task.id, first.task.context_id
            task = await next_task(alice)
            await good(alice, "mesh_task_update", task_id=task["task_id"], state="working")
            await good(
                alice, "mesh_task_update", task_id=task["task_id"], state="input_required",
                note="into which language?",
            )  # fmt: skip
            seen = [e async for e in stream]
            states = [state_of(e) for e in seen]
            assert states == [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_INPUT_REQUIRED]
            assert seen[-1].status_update.status.message.parts[0].text == "into which language?"
            # the answer: a message naming the task; the agent reads it as the task's input
            answered = a2a.send_message(say("French", task_id=a2a_id, context_id=context_id))
            working = await anext(answered)
            assert state_of(working) == TaskState.TASK_STATE_WORKING
            assert not working.status_update.status.HasField("message")  # not the agent's words
            moved = await good(
                alice, "mesh_task_wait", task_id=task["task_id"], wait_seconds=30,
                after_state_seq=3,
            )  # fmt: skip
            assert moved["task"]["state"] == "working" and moved["task"]["note"] == "French"
            # a second client view: resubscribe to the task while it works
            resubscribed = a2a.subscribe(SubscribeToTaskRequest(id=a2a_id))
            again = await anext(resubscribed)
            assert again.task.id == a2a_id
            await good(alice, "mesh_task_complete", task_id=task["task_id"], result="bonjour")
            rest = [e async for e in answered]
            assert state_of(rest[-1]) == TaskState.TASK_STATE_COMPLETED
            tail = [e async for e in resubscribed]
            assert state_of(tail[-1]) == TaskState.TASK_STATE_COMPLETED
            got = await a2a.get_task(GetTaskRequest(id=a2a_id))
        assert got.status.state == TaskState.TASK_STATE_COMPLETED
        assert got.artifacts[0].parts[0].text == "bonjour"
        assert [m.parts[0].text for m in got.history if m.role == Role.ROLE_USER][:2] == [
            "translate 'hello'",
            "French",
        ]


async def test_cancel_reaches_the_agent(station: Station, tmp_path: Path) -> None:
    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token) as a2a:
            stream = a2a.send_message(say("a long job"))
            a2a_id = (await anext(stream)).task.id
            task = await next_task(alice)
            await good(alice, "mesh_task_update", task_id=task["task_id"], state="working")
            assert state_of(await anext(stream)) == TaskState.TASK_STATE_WORKING
            canceled = await a2a.cancel_task(CancelTaskRequest(id=a2a_id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            mesh = await good(alice, "mesh_task_get", task_id=task["task_id"])
            assert mesh["state"] == "canceled", mesh
            refused = await bad(alice, "mesh_task_complete", task_id=task["task_id"], result="x")
            assert refused["code"] == "already_terminal"  # one outcome
            with pytest.raises(A2AError):  # canceled is an outcome: not cancelable again
                await a2a.cancel_task(CancelTaskRequest(id=a2a_id))
            listed = await a2a.list_tasks(ListTasksRequest())
        assert [t.id for t in listed.tasks] == [a2a_id]


async def test_the_channel_push_says_a2a_and_which_client(station: Station, tmp_path: Path) -> None:
    async with (
        home_served(tmp_path / "h", station.endpoint, **ASK) as home,
        http_client(home.mcp_token("alice")) as alice_http,
    ):
        alice = Raw(alice_http, home.mcp_url)
        await alice.open()
        await alice.call("mesh_hello")
        token = home.a2a_token("crew", "alice")
        async with alice.get_stream() as stream, a2a_client(home.agent_url("alice"), token) as a2a:
            sending = a2a.send_message(say("review PR 7"))
            await anext(sending)
            async for _, message in events(stream):
                if message.get("method") == "notifications/claude/channel":
                    break
            await sending.aclose()
    pushed = json.dumps(message["params"])
    # who, from the owner's records (the client's words stay out: it is no room-mate)
    assert "A2A client crew (through this home's A2A door)" in pushed
    assert "handed you a task" in pushed and "review PR 7" not in pushed


async def ask_then_finish(home: Any, alice: Any, a2a: Any) -> tuple[str, str]:
    """An A2A task the agent asks about (input-required), then completes without the answer:
    (the A2A task id, its context id)."""
    stream = a2a.send_message(say("translate 'hello'"))
    first = await anext(stream)
    task = await next_task(alice)
    await good(
        alice, "mesh_task_update", task_id=task["task_id"], state="input_required",
        note="which language?",
    )  # fmt: skip
    assert state_of([e async for e in stream][-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
    await good(alice, "mesh_task_complete", task_id=task["task_id"], result="hola")
    return first.task.id, first.task.context_id


async def test_an_outcome_after_input_required_reaches_the_client(
    station: Station, tmp_path: Path
) -> None:
    async with alice_at_door(tmp_path / "h", station.endpoint, **ASK) as (home, alice):
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token) as a2a:
            a2a_id, context_id = await ask_then_finish(home, alice, a2a)

            async def completed() -> Any:
                got = await a2a.get_task(GetTaskRequest(id=a2a_id))
                return got if got.status.state == TaskState.TASK_STATE_COMPLETED else None

            got = await eventually(completed, 10)
            assert got.artifacts[0].parts[0].text == "hola"
            # a late answer is told the outcome, at once (it hung before)
            late = a2a.send_message(say("Spanish", task_id=a2a_id, context_id=context_id))
            seen = await asyncio.wait_for(anext(late), 10)
            assert seen.artifact_update.artifact.parts[0].text == "hola"
            assert state_of(await asyncio.wait_for(anext(late), 10)) == (
                TaskState.TASK_STATE_COMPLETED
            )
            # with no watcher (a door that lost it), the answer itself gets the outcome
            await home.door.served["alice"].executor.close()
            a2a_id, context_id = await ask_then_finish(home, alice, a2a)
            late = a2a.send_message(say("Spanish", task_id=a2a_id, context_id=context_id))
            seen = [e async for e in late]
            assert state_of(seen[-1]) == TaskState.TASK_STATE_COMPLETED
            got = await a2a.get_task(GetTaskRequest(id=a2a_id))
            assert got.artifacts[0].parts[0].text == "hola"
