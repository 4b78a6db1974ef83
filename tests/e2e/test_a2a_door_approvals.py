"""The owner's approval queue decides for an A2A client as for any mesh sender (issue 39 and
42): with ``tasks_from_strangers = 1`` an A2A client's message waits for the owner (the A2A
client sees the task submitted, the model sees only ``mesh_approvals``' metadata); approved by
``macula-mcp approvals approve`` it reaches the agent and completes; denied, the A2A client
sees it rejected."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from a2a.types import TaskState

from relay.station.station import Station
from support.doorkit import a2a_client, alice_at_door, say, state_of
from support.mcpkit import cli, good
from support.waiting import eventually

pytestmark = pytest.mark.anyio
HELD = "[approvals]\ntasks_from_strangers = 1\n"


def owner(home: Path, *args: str) -> None:
    done = cli(["approvals", *args, "--agent", "alice"], dict(os.environ, MACULA_HOME=str(home)))
    assert done.returncode == 0, done.stderr


async def test_an_a2a_clients_task_waits_for_the_owner(station: Station, tmp_path: Path) -> None:
    home_dir = tmp_path / "h"
    home_dir.mkdir(mode=0o700)
    (home_dir / "owner.toml").write_text(HELD)
    (home_dir / "owner.toml").chmod(0o600)
    async with alice_at_door(home_dir, station.endpoint, MACULA_MCP_CONTACT_POLICY="ask") as (
        home,
        alice,
    ):
        token = home.a2a_token("crew", "alice")
        async with a2a_client(home.agent_url("alice"), token) as a2a:
            stream = a2a.send_message(say("the words only the owner reads"))
            first = await anext(stream)
            assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED

            async def held() -> list[dict[str, Any]]:
                listed = await good(alice, "mesh_approvals")
                return list(listed["pending"])

            await eventually(held)
            [item] = await held()
            assert item["kind"] == "task" and "content" not in item
            assert "the words only the owner reads" not in str(item)
            listed = await good(alice, "mesh_task_list")
            assert listed["tasks"] == []  # the model has nothing to work on yet

            await asyncio.to_thread(owner, home_dir, "approve", item["approval_id"])
            got = await good(alice, "mesh_task_wait", wait_seconds=30)
            task = got["task"]
            assert task is not None and task["input"] == "the words only the owner reads"
            await good(alice, "mesh_task_complete", task_id=task["task_id"], result="read")
            states = [state_of(event) async for event in stream]
            assert states[-1] == TaskState.TASK_STATE_COMPLETED

            # a second message is denied by the owner: the A2A client sees it rejected
            stream = a2a.send_message(say("another request"))
            await anext(stream)
            await eventually(held)
            [item] = await held()
            await asyncio.to_thread(owner, home_dir, "deny", item["approval_id"])
            states = [state_of(event) async for event in stream]
            assert states[-1] == TaskState.TASK_STATE_REJECTED
