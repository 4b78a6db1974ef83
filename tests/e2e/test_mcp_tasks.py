"""A task's whole life across two real ``macula-mcp`` processes driven by the official MCP
client: the assignee process is killed (SIGKILL) and restarted on the same MACULA_HOME and
identity in the middle, its in-progress task survives, the sender's queued answer reaches it,
and a second completion is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from relay.station.station import Station, StationConfig
from support.mcpkit import StrictTools, kill, killable_server, server_env

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def process(home: Path, station: str, policy: str) -> AsyncIterator[StrictTools]:
    env = server_env(
        home, station, MACULA_MCP_CONTACT_POLICY=policy, MACULA_MCP_TASKS_RETRY_MAX_MS="2000"
    )
    async with killable_server(home, env) as side:
        yield side


async def test_task_life_across_a_restart_of_the_assignee(tmp_path: Path) -> None:
    bob_home = tmp_path / "bob"
    async with (
        Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station,
        process(tmp_path / "alice", station.endpoint, "ask") as alice,
    ):
        await alice.good("mesh_hello", operator_name="alice")
        async with process(bob_home, station.endpoint, "ask") as bob:
            bob_id = (await bob.good("mesh_hello", operator_name="bob"))["node_id"]
            sent = await alice.good(
                "mesh_task_send",
                to=bob_id,
                title="convert the notes",
                input="notes: a, b, c",
                idempotency_key="send-1",
            )
            task_id = sent["task_id"]
            assert (sent["state"], sent["state_seq"], sent["delivered"]) == ("submitted", 1, 1)
            retry = await alice.good(
                "mesh_task_send",
                to=bob_id,
                title="convert the notes",
                input="notes: a, b, c",
                idempotency_key="send-1",
            )
            assert (retry["task_id"], retry["replayed"]) == (task_id, 1)

            handed = (await bob.good("mesh_task_wait", wait_seconds=10))["task"]
            assert (handed["task_id"], handed["role"], handed["contact"]) == (
                task_id,
                "assignee",
                3,
            )
            assert handed["input"] == "notes: a, b, c"
            await bob.good("mesh_task_update", task_id=task_id, state="working", note="on it")
            moved = await alice.good(
                "mesh_task_wait", task_id=task_id, wait_seconds=10, after_state_seq=1
            )
            assert (moved["changed"], moved["task"]["state"]) == (1, "working")
            await bob.good(
                "mesh_task_update", task_id=task_id, state="input_required", note="which format?"
            )
            asked = await alice.good(
                "mesh_task_wait", task_id=task_id, wait_seconds=10, after_state_seq=2
            )
            assert (asked["task"]["state"], asked["task"]["note"]) == (
                "input_required",
                "which format?",
            )
            kill(bob_home)
            with pytest.raises(BaseException):  # noqa: B017 - the session ends with its process
                await bob.client.call_tool("mesh_task_get", {"task_id": task_id})

        answered = await alice.good(
            "mesh_task_send", task_id=task_id, input="markdown", idempotency_key="answer-1"
        )
        assert answered["state"] == "input_required"  # queued: bob is gone
        async with process(bob_home, station.endpoint, "ask") as bob:
            kept = await bob.good("mesh_task_list", role="assignee")
            assert [(t["task_id"], t["state"]) for t in kept["tasks"]] == [
                (task_id, "input_required")
            ]
            resumed = await bob.good(
                "mesh_task_wait", task_id=task_id, wait_seconds=60, after_state_seq=3
            )
            assert resumed["task"]["state"] == "working"
            assert (resumed["task"]["note"], resumed["task"]["state_seq"]) == ("markdown", 4)
            done = await bob.good(
                "mesh_task_complete", task_id=task_id, result="# a\n# b\n# c", idempotency_key="c-1"
            )
            assert (done["state"], done["state_seq"], done["terminal"]) == ("completed", 5, 1)
            outcome = await alice.good(
                "mesh_task_wait", task_id=task_id, wait_seconds=30, after_state_seq=4
            )
            assert (outcome["task"]["state"], outcome["task"]["result"]) == (
                "completed",
                "# a\n# b\n# c",
            )

            second = await bob.bad("mesh_task_complete", task_id=task_id, result="again")
            assert second["code"] == "already_terminal" and "completed" in second["detail"]
            assert second["task"]["result"] == "# a\n# b\n# c"
            failing = await bob.bad("mesh_task_complete", task_id=task_id, error="oops")
            assert failing["code"] == "already_terminal"
            same = await bob.good(
                "mesh_task_complete", task_id=task_id, result="# a\n# b\n# c", idempotency_key="c-1"
            )
            assert same["replayed"] == 1
            late = await alice.bad("mesh_task_cancel", task_id=task_id)
            assert late["code"] == "already_terminal"
            whole = await alice.good("mesh_task_get", task_id=task_id)
            assert [h["state"] for h in whole["history"]] == [
                "submitted",
                "working",
                "input_required",
                "working",
                "completed",
            ]
            assert (await bob.bad("mesh_task_update", task_id=task_id, state="completed"))[
                "code"
            ] == "invalid_argument"
            missing = await alice.bad("mesh_task_send", title="t", input="x")
            assert "to:" in missing["detail"]
