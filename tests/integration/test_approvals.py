"""The owner's approval queue between real agents over one real station (loopback QUIC, real
SQLite files), decided by the owner's CLI in a subprocess or in process (as the console does):
a stranger's task waits and the sender sees ``pending_owner_approval``; approved it reaches
the assignee's model; denied or expired the sender's copy ends ``refused:``. Held rings too."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from macula.agent.agent import Agent
from macula.agent.audit import AuditSettings, audit_dir
from macula.agent.contact_policy import Answer
from macula.agent.task_messages import TaskLimits
from macula.clock import now_ms
from macula.node.node import Node
from macula.store.audit_log import entries
from macula.store.tasks import Task
from relay.station.station import Station
from support.identities import new_identity
from support.mcpkit import cli
from support.meshkit import settings
from support.waiting import eventually

pytestmark = pytest.mark.anyio

FAST = TaskLimits(retry_initial_ms=50, retry_max_ms=200)


@asynccontextmanager
async def agent(
    station: Station,
    home: Path,
    policy: str,
    owner_toml: str | None = None,
    clock: Callable[[], int] | None = None,
    audit: AuditSettings | None = None,
) -> AsyncIterator[Agent]:
    config = dataclasses.replace(
        settings(home, policy),
        task_limits=FAST,
        owner_file=home / "owner.toml",
        audit=audit or AuditSettings.off(),
    )
    if owner_toml is not None:
        (home / "owner.toml").write_text(owner_toml)
    extra = {} if clock is None else {"clock": clock}
    async with (
        Node(new_identity(), [station.endpoint]) as node,
        Agent(node, config, **extra) as a,
    ):
        a.approvals.poll_s = 0.05
        yield a


def owner_cli(home: Path, *args: str) -> str:
    env = dict(os.environ, MACULA_HOME=str(home), MACULA_MCP_RINGS_DB=str(home / "rings.sqlite3"))
    done = cli(["approvals", *args], env)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def state_of(sender: Agent, task_id: str) -> Task:
    return await sender.tasks.get(task_id)


async def test_a_strangers_task_waits_then_approved_reaches_the_model(
    station: Station, tmp_path: Path
) -> None:
    held = "[approvals]\ntasks_from_strangers = 1\n"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, tmp_path / "bob", "ask", held) as bob,
    ):
        await alice.hello()
        await bob.hello()
        bob_id = bob.node.identity.node_id
        sent = await alice.tasks.send(bob_id, "summarize", "the secret text")
        assert (sent.state, sent.state_seq) == ("pending_owner_approval", 2)
        assert "held for the owner's approval" in (sent.note or "")
        assert await bob.tasks.list_tasks() == []  # the model sees nothing of it
        [item] = await bob.approvals.pending()
        assert (item.kind, item.sender, item.ref) == (
            "task",
            alice.node.identity.node_id,
            sent.task_id,
        )

        listed = await asyncio.to_thread(owner_cli, tmp_path / "bob", "list")
        assert item.approval_id in listed and "the secret text" in listed  # the owner sees it
        again = await alice.tasks.send(bob_id, "summarize", "the secret text")
        assert again.state == "pending_owner_approval"  # a second task waits as well
        await asyncio.to_thread(owner_cli, tmp_path / "bob", "approve", item.approval_id)

        handed = await bob.tasks.wait(None, 10)
        assert handed.task is not None and handed.task.task_id == sent.task_id
        assert (handed.task.state, handed.task.state_seq, handed.task.input) == (
            "submitted",
            3,
            "the secret text",
        )

        async def submitted() -> bool:
            return (await state_of(alice, sent.task_id)).state == "submitted"

        await eventually(submitted)
        await bob.tasks.complete(sent.task_id, result="done")
        done = await alice.tasks.wait(sent.task_id, 10, after_state_seq=3)
        assert done.task is not None and done.task.state == "completed"
        history = [
            h.state
            for h in await alice.tasks.store.history(alice.node.identity.node_id, sent.task_id)
        ]
        assert history[:3] == ["submitted", "pending_owner_approval", "submitted"]

        # the second is denied by the owner: the sender learns it, the model never saw it
        [second] = await bob.approvals.pending()
        await asyncio.to_thread(
            owner_cli, tmp_path / "bob", "deny", second.approval_id, "--reason", "not today"
        )
        ended = await alice.tasks.wait(again.task_id, 10, after_state_seq=2)
        assert ended.task is not None and ended.task.state == "failed"
        assert (ended.task.error or "").startswith("refused: owner denied: not today")
        assert [t.task_id for t in await bob.tasks.list_tasks()] == [sent.task_id]
        stored = await bob.approvals.store.get(second.approval_id)
        assert stored is not None and stored.content is None and stored.applied == 1
        # a retried send of the denied task hears the same decision (it is not queued again)
        assert await bob.approvals.count_pending() == 0


async def test_a_held_task_canceled_by_its_sender_leaves_the_queue(
    station: Station, tmp_path: Path
) -> None:
    held = "[approvals]\ntasks_from_strangers = 1\n"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, tmp_path / "bob", "ask", held) as bob,
    ):
        await alice.hello()
        await bob.hello()
        sent = await alice.tasks.send(bob.node.identity.node_id, "t", "x")
        assert sent.state == "pending_owner_approval"
        canceled = await alice.tasks.cancel(sent.task_id, "never mind")
        assert (canceled.state, canceled.state_seq) == ("canceled", 3)
        assert await bob.approvals.count_pending() == 0
        assert await bob.tasks.list_tasks() == []


async def test_an_allowlisted_sender_is_not_held(station: Station, tmp_path: Path) -> None:
    held = "[approvals]\ntasks_from_strangers = 1\n"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, tmp_path / "bob", "ask", held) as bob,
    ):
        await alice.hello()
        await bob.hello()
        await bob.trust(alice.node.identity.node_id.hex())
        sent = await alice.tasks.send(bob.node.identity.node_id, "t", "x")
        assert sent.state == "submitted" and await bob.approvals.count_pending() == 0


async def test_an_undecided_task_expires_and_the_sender_is_refused(
    station: Station, tmp_path: Path
) -> None:
    offset = [0]

    def clock() -> int:
        return now_ms() + offset[0]

    held = "[approvals]\ntasks_from_strangers = 1\nttl_s = 10\nmax_pending = 1\n"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, tmp_path / "bob", "ask", held, clock=clock) as bob,
    ):
        await alice.hello()
        await bob.hello()
        bob_id = bob.node.identity.node_id
        first = await alice.tasks.send(bob_id, "one", "x")
        assert first.state == "pending_owner_approval"
        with pytest.raises(Exception) as full:  # max_pending 1: refused clearly, not dropped
            await alice.tasks.send(bob_id, "two", "y")
        assert getattr(full.value, "code", None) == "approval_queue_full"
        offset[0] = 11_000  # past the TTL (within the messages' 60 s skew)
        bob.approvals.kick.set()
        ended = await alice.tasks.wait(first.task_id, 10, after_state_seq=2)
        assert ended.task is not None and ended.task.state == "failed"
        assert (ended.task.error or "").startswith("refused: the owner did not decide in time")


async def test_a_ring_under_ask_waits_for_the_owner(station: Station, tmp_path: Path) -> None:
    held = "[approvals]\nrings_when_asked = 1\n"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, tmp_path / "bob", "ask", held) as bob,
        agent(station, tmp_path / "carol", "open") as carol,
    ):
        await alice.hello()
        await bob.hello()
        await carol.hello()
        bob_id = bob.node.identity.node_id
        placed = await alice.rings.ring(bob_id, "pair on the parser")
        assert placed.answer == Answer.DEFERRED
        assert (placed.reason or "").startswith("pending_owner_approval")
        assert await bob.rings.pending() == []  # the model cannot answer it
        [item] = await bob.approvals.pending()
        await bob.approvals.decide(item.approval_id, "approved", by="owner (test)")
        late = await alice.rings.wait_answer(placed.ring_id, 10)
        assert late is not None and late.answer == Answer.ACCEPTED
        seen = await bob.rings.wait_ring(5)  # the model learns it joined
        assert seen is not None and seen.ring_id == placed.ring_id and seen.answer == 1

        denied = await carol.rings.ring(bob_id, "another")  # (one ring per 2 s per ringer)
        [item] = await bob.approvals.pending()
        await bob.approvals.decide(item.approval_id, "denied", by="owner (test)")
        late = await carol.rings.wait_answer(denied.ring_id, 10)
        assert late is not None and late.answer == Answer.DECLINED
        assert (late.reason or "").startswith("refused: owner denied")


async def test_the_trail_says_queued_then_the_owners_decision(
    station: Station, tmp_path: Path
) -> None:
    """The held task is ``task_received`` queued in the assignee's trail, and the owner's
    approval (by the CLI) and denial ``owner_decided``; never the task's text."""
    held = "[approvals]\ntasks_from_strangers = 1\n"
    bob_home = tmp_path / "bob"
    async with (
        agent(station, tmp_path / "alice", "open") as alice,
        agent(station, bob_home, "ask", held, audit=AuditSettings(bob_home)) as bob,
    ):
        await alice.hello()
        await bob.hello()
        bob_id = bob.node.identity.node_id
        first = await alice.tasks.send(bob_id, "summarize", "words only the owner reads")
        second = await alice.tasks.send(bob_id, "summarize", "words only the owner reads")
        assert first.state == second.state == "pending_owner_approval"
        by_ref = {item.ref: item for item in await bob.approvals.pending()}
        await asyncio.to_thread(owner_cli, bob_home, "approve", by_ref[first.task_id].approval_id)
        await asyncio.to_thread(owner_cli, bob_home, "deny", by_ref[second.task_id].approval_id)

        def trail() -> list[dict[str, object]]:
            return list(entries(audit_dir(bob_home, bob_id)))

        def decided() -> bool:
            return sum(e["kind"] == "owner_decided" for e in trail()) == 2

        await eventually(decided)
        received = [(e["outcome"], e["facts"]["task_id"]) for e in trail()
                    if e["kind"] == "task_received"]  # fmt: skip
        assert received == [("queued", first.task_id), ("queued", second.task_id)]
        decisions = {
            e["facts"]["approval_id"]: (e["outcome"], e["facts"]["item_kind"], e["facts"]["by"])
            for e in trail()
            if e["kind"] == "owner_decided"
        }
        assert decisions[by_ref[first.task_id].approval_id][:2] == ("approved", "task")
        assert decisions[by_ref[second.task_id].approval_id][:2] == ("denied", "task")
        assert all("cli" in str(by) for _, _, by in decisions.values())
    written = b"".join(p.read_bytes() for p in audit_dir(bob_home, bob_id).iterdir())
    assert b"words only the owner reads" not in written
