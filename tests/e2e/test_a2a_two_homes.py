"""End to end across two homes and a real station: an ``a2a-sdk`` client hands work to agent A
through A's daemon's door; A hands part of it to mesh agent B on the other home with
``mesh_task_send``; B completes; A completes the A2A task with B's result; the A2A client sees
one completed task. Each door serves only its own daemon's agents."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from a2a.types import TaskState

from relay.station.station import Station
from support.doorkit import a2a_client, home_served, http, say
from support.httpkit import client as mcp_client
from support.mcpkit import good

pytestmark = pytest.mark.anyio
ASK = {"MACULA_MCP_CONTACT_POLICY": "ask"}


async def test_work_flows_a2a_to_a_to_b_and_back(station: Station, tmp_path: Path) -> None:
    async with (
        home_served(tmp_path / "one", station.endpoint, **ASK) as one,
        home_served(tmp_path / "two", station.endpoint, **ASK) as two,
        mcp_client(one.mcp_url, one.mcp_token("ada")) as ada,
        mcp_client(two.mcp_url, two.mcp_token("bob")) as bob,
    ):
        await good(ada, "mesh_hello")
        bob_id = (await good(bob, "mesh_hello"))["node_id"]
        token = one.a2a_token("crew", "ada")
        async with http(token) as session:  # each door serves its own daemon's agents only
            assert (
                await session.get(two.agent_url("ada") + ".well-known/agent-card.json")
            ).status_code == 404
            assert (
                await session.get(one.agent_url("bob") + ".well-known/agent-card.json")
            ).status_code == 404

        async def ada_works() -> dict[str, Any]:
            waited = await good(ada, "mesh_task_wait", wait_seconds=30)
            mine = waited["task"]
            await good(ada, "mesh_task_update", task_id=mine["task_id"], state="working")
            part = await good(
                ada, "mesh_task_send", to=bob_id, title="the second half",
                input=f"second half of: {mine['input']}",
            )  # fmt: skip
            done = await good(
                ada, "mesh_task_wait", task_id=part["task_id"], wait_seconds=30,
                after_state_seq=part["state_seq"],
            )  # fmt: skip
            while not done["task"]["terminal"]:
                done = await good(
                    ada, "mesh_task_wait", task_id=part["task_id"], wait_seconds=30,
                    after_state_seq=done["task"]["state_seq"],
                )  # fmt: skip
            result = f"first half: AB; {done['task']['result']}"
            await good(ada, "mesh_task_complete", task_id=mine["task_id"], result=result)
            return dict(mine)

        async def bob_works() -> dict[str, Any]:
            waited = await good(bob, "mesh_task_wait", wait_seconds=30)
            handed = waited["task"]
            await good(
                bob, "mesh_task_complete", task_id=handed["task_id"], result="second half: CD"
            )
            return dict(handed)

        workers = [asyncio.create_task(ada_works()), asyncio.create_task(bob_works())]
        async with a2a_client(one.agent_url("ada"), token) as a2a:

            async def follow() -> list[Any]:
                return [e async for e in a2a.send_message(say("spell ABCD in two halves"))]

            events, ada_saw, bob_saw = await asyncio.wait_for(
                asyncio.gather(follow(), *workers), 90
            )
    assert ada_saw["title"] == "A2A from crew: spell ABCD in two halves"
    assert bob_saw["input"] == "second half of: spell ABCD in two halves"
    tasks = {e.task.id for e in events if e.HasField("task")} | {
        e.status_update.task_id for e in events if e.HasField("status_update")
    }
    assert len(tasks) == 1  # one A2A task from start to end
    last = events[-1].status_update.status
    assert last.state == TaskState.TASK_STATE_COMPLETED
    [artifact] = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert artifact.parts[0].text == "first half: AB; second half: CD"
