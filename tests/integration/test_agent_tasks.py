"""Tasks between two Agents over one real station (loopback QUIC, real SQLite files): a whole
life, waits that never miss a change, cancel, one outcome only, the contact gate, the bounds,
an assignee that comes later, and messages nobody signed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from macula.agent.agent import Agent
from macula.agent.task_messages import TaskLimits, sign_message, task_endpoint
from macula.errors import MeshError
from macula.node.node import Node
from macula.store.tasks import TaskError
from macula.wire.identity import ZERO_REALM, Identity
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import settings
from support.waiting import eventually

pytestmark = pytest.mark.anyio

FAST = TaskLimits(retry_initial_ms=50, retry_max_ms=200)


@asynccontextmanager
async def agent(
    station: Station,
    home: Path,
    policy: str = "open",
    limits: TaskLimits = FAST,
    identity: Identity | None = None,
) -> AsyncIterator[Agent]:
    config = dataclasses.replace(settings(home, policy), task_limits=limits)
    async with (
        Node(identity or new_identity(), [station.endpoint]) as node,
        Agent(node, config) as a,
    ):
        yield a


async def refused(work: object) -> TaskError:
    with pytest.raises(TaskError) as caught:
        await work  # type: ignore[misc]
    return caught.value


async def test_a_task_whole_life_and_one_outcome(station: Station, tmp_path: Path) -> None:
    async with (
        agent(station, tmp_path / "alice", "ask") as alice,
        agent(station, tmp_path / "bob", "open") as bob,
    ):
        await alice.hello()
        await bob.hello()
        bob_id = bob.node.identity.node_id
        sent = await alice.tasks.send(bob_id, "summarize", "the long text", key="send-1")
        assert (sent.state, sent.state_seq, sent.delivered, sent.role) == (
            "submitted",
            1,
            1,
            "requester",
        )
        again = await alice.tasks.send(bob_id, "summarize", "the long text", key="send-1")
        assert (again.task_id, again.replayed) == (sent.task_id, 1)
        conflict = await refused(alice.tasks.send(bob_id, "other", "x", key="send-1"))
        assert conflict.code == "idempotency_conflict"
        task_id = sent.task_id

        handed = await bob.tasks.wait(None, 5)  # what waits on bob is returned at once
        assert handed.changed == 1 and handed.task is not None
        assert (handed.task.task_id, handed.task.role, handed.task.contact) == (
            task_id,
            "assignee",
            1,
        )
        assert len(await bob.tasks.list_tasks(role="assignee")) == 1  # the replay sent nothing

        await bob.tasks.update(task_id, "working", "reading")
        await eventually(lambda: _seq(alice, task_id, 2))
        loop = asyncio.get_running_loop()
        began = loop.time()
        waited = await alice.tasks.wait(task_id, 30, after_state_seq=1)  # already past 1
        assert loop.time() - began < 1.0
        assert waited.changed == 1 and waited.task is not None and waited.task.state == "working"

        asking = asyncio.create_task(alice.tasks.wait(task_id, 10, after_state_seq=2))
        await bob.tasks.update(task_id, "input_required", "which language?")
        asked = await asking
        assert asked.task is not None
        assert (asked.task.state, asked.task.state_seq, asked.task.note) == (
            "input_required",
            3,
            "which language?",
        )
        resumed = await alice.tasks.give_input(task_id, "English", key="in-1")
        assert (resumed.state, resumed.state_seq) == ("working", 4)
        replay = await alice.tasks.give_input(task_id, "English", key="in-1")
        assert replay.replayed == 1 and replay.state_seq == 4  # no second input
        mine = await bob.tasks.get(task_id)
        assert (mine.state, mine.state_seq, mine.note) == ("working", 4, "English")
        wrong = await refused(alice.tasks.give_input(task_id, "more"))
        assert wrong.code == "illegal_transition"

        done = await bob.tasks.complete(task_id, result="a summary", key="done-1")
        assert (done.state, done.state_seq) == ("completed", 5)
        outcome = await alice.tasks.wait(task_id, 10, after_state_seq=4)
        assert outcome.task is not None
        assert (outcome.task.state, outcome.task.result) == ("completed", "a summary")

        second = await refused(bob.tasks.complete(task_id, result="another"))
        assert second.code == "already_terminal" and "completed" in second.detail
        assert second.task is not None and second.task.result == "a summary"
        failed = await refused(bob.tasks.complete(task_id, error="too late"))
        assert failed.code == "already_terminal"
        same = await bob.tasks.complete(task_id, result="a summary", key="done-1")
        assert (same.replayed, same.state_seq) == (1, 5)
        late = await refused(alice.tasks.cancel(task_id))
        assert late.code == "already_terminal" and "completed" in late.detail
        history = await alice.tasks.store.history(alice.node.identity.node_id, task_id)
        assert [h.state for h in history] == [
            "submitted",
            "working",
            "input_required",
            "working",
            "completed",
        ]
        assert [h.state_seq for h in history] == [1, 2, 3, 4, 5]


async def test_cancel_reaches_the_assignee_and_ends_both_copies(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "bob") as bob,
    ):
        await alice.hello()
        await bob.hello()
        sent = await alice.tasks.send(bob.node.identity.node_id, "build", "the thing")
        await bob.tasks.update(sent.task_id, "working")
        canceled = await alice.tasks.cancel(sent.task_id, "not needed", key="c-1")
        assert (canceled.state, canceled.cancel_requested) == ("canceled", 1)
        theirs = await bob.tasks.get(sent.task_id)
        assert (theirs.state, theirs.state_seq, theirs.note) == ("canceled", 3, "not needed")
        again = await alice.tasks.cancel(sent.task_id, "not needed", key="c-1")
        assert again.replayed == 1
        refusal = await refused(bob.tasks.complete(sent.task_id, result="anyway"))
        assert refusal.code == "already_terminal" and "canceled" in refusal.detail


async def test_contact_policy_and_bounds_refuse_clearly(station: Station, tmp_path: Path) -> None:
    tight = dataclasses.replace(FAST, max_open_per_peer=1, max_input_bytes=64)
    async with (
        agent(station, tmp_path / "alice") as alice,
        agent(station, tmp_path / "carol", "closed") as carol,
        agent(station, tmp_path / "dave", "open", tight) as dave,
    ):
        for a in (alice, carol, dave):
            await a.hello()
        closed = await refused(alice.tasks.send(carol.node.identity.node_id, "t", "x"))
        assert closed.code == "contact_refused" and closed.task is not None
        assert closed.task.state == "failed" and (closed.task.error or "").startswith("refused:")
        assert await carol.tasks.list_tasks() == []

        dave_id = dave.node.identity.node_id
        await alice.tasks.send(dave_id, "one", "x")
        busy = await refused(alice.tasks.send(dave_id, "two", "x"))
        assert busy.code == "too_many_open" and busy.retryable
        big = await refused(alice.tasks.send(dave_id, "three", "y" * 100))
        assert big.code == "too_large"
        assert len(await dave.tasks.list_tasks()) == 1
        mine = await refused(alice.tasks.send(alice.node.identity.node_id, "me", "x"))
        assert mine.code == "invalid_argument"
        nothing = await refused(alice.tasks.get("0" * 32))
        assert nothing.code == "not_found"
        not_theirs = await refused(dave.tasks.cancel((await dave.tasks.list_tasks())[0].task_id))
        assert not_theirs.code == "not_found"  # the assignee cannot cancel as a requester
        bad_state = await refused(
            dave.tasks.update((await dave.tasks.list_tasks())[0].task_id, "completed")
        )
        assert bad_state.code == "invalid_argument"


async def test_a_task_for_an_absent_agent_is_delivered_when_it_comes(
    station: Station, tmp_path: Path
) -> None:
    bob_identity = new_identity()
    async with agent(station, tmp_path / "alice") as alice:
        await alice.hello()
        sent = await alice.tasks.send(bob_identity.node_id, "later", "when you are here")
        assert (sent.state, sent.delivered) == ("submitted", 0)
        async with agent(station, tmp_path / "bob", identity=bob_identity) as bob:
            await bob.hello()
            got = await bob.tasks.wait(None, 10)
            assert got.task is not None and got.task.task_id == sent.task_id
            await eventually(lambda: _delivered(alice, sent.task_id))
            await bob.tasks.update(sent.task_id, "working")
            await eventually(lambda: _seq(alice, sent.task_id, 2))
        assert await alice.tasks.store.pending_outbox(alice.node.identity.node_id) == 0


async def test_unsigned_or_forged_messages_are_refused(station: Station, tmp_path: Path) -> None:
    async with (
        agent(station, tmp_path / "bob") as bob,
        Node(new_identity(), [station.endpoint]) as mallory,
    ):
        await bob.hello()
        bob_id = bob.node.identity.node_id
        body = {"kind": "task_sent", "task_id": "f" * 32, "title": "t", "input": "x"}
        someone = new_identity()
        forged = sign_message(someone, bob_id, body, alice_now(bob))  # signed by another key
        with pytest.raises(MeshError):
            await mallory.call(ZERO_REALM, task_endpoint(bob_id), forged)
        own = sign_message(mallory.identity, bob_id, body, alice_now(bob))
        own["input"] = "changed after signing"
        with pytest.raises(MeshError):
            await mallory.call(ZERO_REALM, task_endpoint(bob_id), own)
        with pytest.raises(MeshError):
            await mallory.call(ZERO_REALM, task_endpoint(bob_id), {"kind": "task_sent"})
        assert await bob.tasks.list_tasks() == []
        assert bob.tasks.stats["messages_unverified"] == 3
        honest = sign_message(mallory.identity, bob_id, body, alice_now(bob))
        reply = await mallory.call(ZERO_REALM, task_endpoint(bob_id), honest)
        assert (reply["kind"], reply["state"], reply["from"]) == (
            "task_updated",
            "submitted",
            bob_id.hex(),
        )


def alice_now(agent: Agent) -> int:
    return agent.clock()


async def _seq(agent: Agent, task_id: str, seq: int) -> bool:
    return (await agent.tasks.get(task_id)).state_seq == seq


async def _delivered(agent: Agent, task_id: str) -> bool:
    return (await agent.tasks.get(task_id)).delivered == 1
