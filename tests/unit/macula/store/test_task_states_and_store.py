"""Tasks without a mesh: the state machine (every transition), the store on real SQLite files
(state_seq, one outcome, idempotency keys, bounds, the outbox, a restart), and the signed
messages (tampering, wrong peer, stale, booleans) and their limits."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from macula.agent.task_messages import (
    TaskLimits,
    message_procedure,
    sign_message,
    update_body,
    verify_message,
)
from macula.errors import ConfigError
from macula.store.base import Bounds
from macula.store.tasks import (
    STATES,
    TERMINAL,
    TRANSITIONS,
    Task,
    TaskError,
    TaskStore,
    check_transition,
    digest,
)
from support.identities import new_identity as identity
from support.running import run

T = TypeVar("T")
ME = b"\x01" * 32
PEER = b"\x02" * 32
OTHER = b"\x03" * 32
NOW = 1_700_000_000_000


def task(state: str = "submitted", seq: int = 1, role: str = "requester", **kw: object) -> Task:
    base = Task(
        "t1",
        "requester",
        PEER,
        "title",
        "input",
        state,
        seq,
        None,
        None,
        None,
        None,
        0,
        0,
        NOW,
        NOW,
    )
    return replace(base, role="assignee" if role == "assignee" else "requester", **kw)  # type: ignore[arg-type]


# -- the state machine -----------------------------------------------------------------------


LEGAL = {
    ("submitted", "working"),
    ("submitted", "input_required"),
    ("submitted", "completed"),
    ("submitted", "failed"),
    ("submitted", "canceled"),
    ("working", "working"),
    ("working", "input_required"),
    ("working", "completed"),
    ("working", "failed"),
    ("working", "canceled"),
    ("input_required", "working"),
    ("input_required", "input_required"),
    ("input_required", "completed"),
    ("input_required", "failed"),
    ("input_required", "canceled"),
    # issue 39: the assignee's owner holds the task, then decides
    ("submitted", "pending_owner_approval"),
    ("pending_owner_approval", "submitted"),
    ("pending_owner_approval", "completed"),
    ("pending_owner_approval", "failed"),
    ("pending_owner_approval", "canceled"),
}


@pytest.mark.parametrize(("before", "after"), list(itertools.product(STATES, STATES)))
def test_every_transition_is_legal_or_refused_naming_the_state(before: str, after: str) -> None:
    current = task(before, 3)
    if (before, after) in LEGAL:
        check_transition(current, after)
        assert after in TRANSITIONS[before]
        return
    with pytest.raises(TaskError) as caught:
        check_transition(current, after)
    error = caught.value
    assert before in error.detail and error.task == current and not error.retryable
    expected = "already_terminal" if before in TERMINAL else "illegal_transition"
    assert error.code == expected
    if before in TERMINAL:
        assert "exactly one outcome" in error.detail


def test_an_unknown_state_is_an_invalid_argument() -> None:
    with pytest.raises(TaskError) as caught:
        check_transition(task(), "done")
    assert caught.value.code == "invalid_argument"


def test_digest_is_order_independent_and_content_bound() -> None:
    assert digest({"a": 1, "b": "x"}) == digest({"b": "x", "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})


# -- the store -------------------------------------------------------------------------------


async def opened(path: Path) -> TaskStore:
    return await TaskStore.open(path)


def test_state_seq_history_and_exactly_one_outcome(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            first = await store.create(ME, task(role="assignee"), NOW, max_open_per_peer=8)
            assert (first.state, first.state_seq, first.created_ms) == ("submitted", 1, NOW)
            seqs = [1]
            for state in ("working", "input_required", "working", "completed"):
                changed = await store.transition(ME, "t1", state, NOW + 1, by="assignee")
                seqs.append(changed.state_seq)
            assert seqs == [1, 2, 3, 4, 5]
            for late in ("completed", "failed", "canceled", "working"):
                with pytest.raises(TaskError) as caught:
                    await store.transition(ME, "t1", late, NOW + 2, by="assignee", result="x")
                assert caught.value.code == "already_terminal"
                assert caught.value.task is not None and caught.value.task.state == "completed"
            history = await store.history(ME, "t1")
            assert [(h.state_seq, h.state) for h in history] == [
                (1, "submitted"),
                (2, "working"),
                (3, "input_required"),
                (4, "working"),
                (5, "completed"),
            ]
            assert history[0].by == "requester" and history[-1].by == "assignee"
            with pytest.raises(TaskError) as missing:
                await store.transition(ME, "nope", "working", NOW, by="assignee")
            assert missing.value.code == "not_found"
            with pytest.raises(TaskError) as wrong_role:
                await store.transition(ME, "t1", "working", NOW, by="assignee", role="requester")
            assert wrong_role.value.code == "not_found"

    run(main())


def test_idempotency_keys_return_the_first_outcome_and_refuse_other_arguments(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            args = digest({"input": "x"})
            made = await store.create(
                ME,
                task(),
                NOW,
                max_open_per_peer=8,
                key="k",
                key_digest=args,
                outbox={"kind": "task_sent"},
            )
            again = await store.create(
                ME,
                replace(task(), task_id="t2"),
                NOW,
                max_open_per_peer=8,
                key="k",
                key_digest=args,
                outbox={"kind": "task_sent"},
            )
            assert (again.task_id, again.replayed, made.replayed) == ("t1", 1, 0)
            assert len(await store.list_tasks(ME)) == 1
            assert await store.pending_outbox(ME) == 1  # the replay queued nothing
            with pytest.raises(TaskError) as conflict:
                await store.create(
                    ME,
                    replace(task(), task_id="t3"),
                    NOW,
                    max_open_per_peer=8,
                    key="k",
                    key_digest=digest({"input": "y"}),
                )
            assert conflict.value.code == "idempotency_conflict"

            done = await store.transition(
                ME, "t1", "completed", NOW, by="assignee", result="r", key="c", key_digest="d1"
            )
            replay = await store.transition(
                ME, "t1", "completed", NOW, by="assignee", result="r", key="c", key_digest="d1"
            )
            assert (replay.replayed, replay.state_seq) == (1, done.state_seq)
            with pytest.raises(TaskError) as other:
                await store.transition(
                    ME, "t1", "failed", NOW, by="assignee", key="c", key_digest="d2"
                )
            assert other.value.code == "idempotency_conflict"
            assert await store.replay(ME, "t1", "fresh", "d") is None
            same_id = await store.create(ME, task(), NOW, max_open_per_peer=8)
            assert same_id.replayed == 1  # a retried delivery of the same task: no second row
            with pytest.raises(TaskError) as taken:
                await store.create(ME, task(peer=OTHER), NOW, max_open_per_peer=8)
            assert taken.value.code == "task_id_taken"

    run(main())


def test_open_tasks_per_peer_are_bounded_and_terminal_ones_free_a_slot(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            for n in range(2):
                await store.create(ME, replace(task(), task_id=f"t{n}"), NOW, max_open_per_peer=2)
            with pytest.raises(TaskError) as full:
                await store.create(ME, replace(task(), task_id="t9"), NOW, max_open_per_peer=2)
            assert full.value.code == "too_many_open" and full.value.retryable
            await store.create(
                ME, replace(task(), task_id="o", peer=OTHER), NOW, max_open_per_peer=2
            )
            await store.transition(ME, "t0", "canceled", NOW, by="requester")
            await store.create(ME, replace(task(), task_id="t9"), NOW, max_open_per_peer=2)

    run(main())


def test_the_requester_copy_moves_forward_only(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            await store.create(ME, task(), NOW, max_open_per_peer=8)
            fresh, applied = await store.apply_remote(
                ME, PEER, "t1", {"state": "submitted", "state_seq": 1}, NOW
            )
            assert fresh is not None and (fresh.delivered, applied) == (1, 0)
            ahead = {"state": "input_required", "state_seq": 3, "note": "q?"}
            moved, applied = await store.apply_remote(ME, PEER, "t1", ahead, NOW)
            assert moved is not None and (moved.state, moved.state_seq, applied) == (
                "input_required",
                3,
                1,
            )
            stale, applied = await store.apply_remote(
                ME, PEER, "t1", {"state": "working", "state_seq": 2}, NOW
            )
            assert stale is not None and (stale.state, applied) == ("input_required", 0)
            done = {"state": "completed", "state_seq": 4, "result": "r"}
            await store.apply_remote(ME, PEER, "t1", done, NOW)
            after, applied = await store.apply_remote(
                ME, PEER, "t1", {"state": "failed", "state_seq": 9}, NOW
            )
            assert after is not None and (after.state, after.result, applied) == (
                "completed",
                "r",
                0,
            )
            unknown, _ = await store.apply_remote(ME, OTHER, "t1", done, NOW)
            assert unknown is None  # only the peer we sent it to speaks for it

    run(main())


def test_the_outbox_keeps_order_per_peer_backs_off_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "home" / "tasks.sqlite3"

    async def before() -> None:
        store = await TaskStore.open(path)
        await store.create(ME, task(role="assignee"), NOW, max_open_per_peer=8)
        await store.transition(ME, "t1", "working", NOW, by="assignee", outbox=update_body)
        await store.transition(
            ME, "t1", "input_required", NOW, by="assignee", note="q", outbox=update_body
        )
        await store.enqueue(ME, OTHER, "t7", {"kind": "task_updated"}, NOW)
        due = await store.due(ME, NOW)
        assert [(e.peer, e.body.get("state_seq")) for e in due] == [(PEER, 2), (OTHER, None)]
        await store.retry_later(due[0].entry_id, NOW + 5_000, "unreachable")
        assert [e.peer for e in await store.due(ME, NOW + 1)] == [OTHER]  # PEER waits its turn
        assert await store.next_due_ms(ME) == NOW
        dead.append(store)  # no close: the process dies here (closed after the check)

    async def after() -> None:
        async with await TaskStore.open(path) as store:
            kept = await store.get(ME, "t1")
            assert kept is not None and (kept.state, kept.state_seq, kept.note) == (
                "input_required",
                3,
                "q",
            )
            assert await store.pending_outbox(ME) == 3
            assert await store.retry_now(ME, NOW + 1) == 1
            first = (await store.due(ME, NOW + 1))[0]
            assert (first.attempts, first.body["state"]) == (1, "working")
            await store.delivered(first.entry_id)
            nxt = [e for e in await store.due(ME, NOW + 1) if e.peer == PEER]
            assert nxt[0].body["state_seq"] == 3
            assert await store.list_tasks(OTHER) == []  # another owner sees nothing
            assert os.stat(path).st_mode & 0o777 == 0o600

    dead: list[TaskStore] = []
    try:
        run(before())
        run(after())
    finally:
        for store in dead:  # else its worker thread keeps the interpreter from exiting
            run(store.close())


def test_prune_drops_old_terminal_tasks_never_open_ones(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            for n in range(4):
                await store.create(
                    ME, replace(task(), task_id=f"t{n}"), NOW + n, max_open_per_peer=8
                )
            await store.transition(ME, "t0", "failed", NOW, by="assignee", error="e")
            await store.transition(ME, "t1", "completed", NOW + 5_000, by="assignee", result="r")
            store.bounds = Bounds(max_rows=3, max_age_ms=1_000)
            assert await store.prune(ME, NOW + 5_000) == 1  # t0 is old; the open ones stay
            assert sorted(t.task_id for t in await store.list_tasks(ME)) == ["t1", "t2", "t3"]
            assert await store.history(ME, "t0") == []
            store.bounds = Bounds(max_rows=1, max_age_ms=1_000)
            assert await store.prune(ME, NOW + 5_000) == 1  # over max_rows: terminal ones only
            assert sorted(t.task_id for t in await store.list_tasks(ME)) == ["t2", "t3"]
            assert await store.prune(ME, NOW + 5_000) == 0

    run(main())


def test_list_filters_by_role_state_and_pages(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            await store.create(ME, task(), NOW, max_open_per_peer=8)
            await store.create(
                ME, replace(task(role="assignee"), task_id="a1"), NOW + 1, max_open_per_peer=8
            )
            assert [t.task_id for t in await store.list_tasks(ME, role="assignee")] == ["a1"]
            assert [t.task_id for t in await store.list_tasks(ME)] == ["a1", "t1"]
            assert [t.task_id for t in await store.list_tasks(ME, limit=1, offset=1)] == ["t1"]
            await store.transition(ME, "t1", "canceled", NOW + 2, by="requester")
            assert [t.task_id for t in await store.list_tasks(ME, open_only=1)] == ["a1"]
            assert [t.task_id for t in await store.list_tasks(ME, state="canceled")] == ["t1"]

    run(main())


# -- messages and limits ---------------------------------------------------------------------


def test_a_signed_message_verifies_only_as_sent_to_its_peer_and_fresh() -> None:
    alice, bob, mallory = identity(), identity(), identity()
    body = {"kind": "task_sent", "task_id": "t1", "title": "t", "input": "x", "note": None}
    signed = sign_message(alice, bob.node_id, body, NOW)
    assert "note" not in signed  # nulls are left out
    assert verify_message(signed, bob.node_id, alice.node_id, NOW + 59_000) == []
    assert verify_message(signed, bob.node_id, alice.node_id, NOW + 61_000) == ["proof: stale"]
    assert "from: not the attested sender" in verify_message(
        signed, bob.node_id, mallory.node_id, NOW
    )
    assert "to: addressed to another node" in verify_message(
        signed, mallory.node_id, alice.node_id, NOW
    )
    for key, value in (("input", "y"), ("kind", "task_input_given"), ("task_id", "t2")):
        tampered = dict(signed, **{key: value})
        assert verify_message(tampered, bob.node_id, alice.node_id, NOW) == [
            "proof: wrong_procedure"
        ], key
    forged = sign_message(mallory, bob.node_id, body, NOW) | {"from": alice.node_id.hex()}
    assert verify_message(forged, bob.node_id, alice.node_id, NOW) == ["proof: wrong_node"]
    flagged = sign_message(alice, bob.node_id, body | {"urgent": True}, NOW)
    assert any("booleans" in p for p in verify_message(flagged, bob.node_id, alice.node_id, NOW))
    assert verify_message([], bob.node_id, alice.node_id, NOW) == [
        "message: expected an object, got list"
    ]
    bad = verify_message({"kind": "x", "task_id": "a:b"}, bob.node_id, alice.node_id, NOW)
    assert {
        "kind: unknown",
        "from: not the attested sender",
        "sent_at: expected an integer",
    } <= set(bad)
    assert message_procedure(bob.node_id, signed).startswith(f"agent.{bob.node_id.hex()}.task#")


def test_limits_default_configure_and_name_every_problem() -> None:
    limits = TaskLimits()
    assert limits.problems(title="t", input="x", result="r", note="n", error="e") == []
    problems = limits.problems(title=" ", input="x" * (16 * 1024 + 1), note="é" * 1025, result=None)
    assert [p.split(":")[0] for p in problems] == ["title", "input", "note"]
    env = {"MACULA_MCP_TASKS_MAX_OPEN_PER_PEER": "3", "MACULA_MCP_TASKS_MAX_INPUT_BYTES": "10"}
    configured = TaskLimits.from_env(env)
    assert (configured.max_open_per_peer, configured.max_input_bytes) == (3, 10)
    assert configured.max_title_chars == 280
    for bad in ("0", "-1", "x", ""):
        with pytest.raises(ConfigError, match="MACULA_MCP_TASKS_RETRY_MAX_MS"):
            TaskLimits.from_env({"MACULA_MCP_TASKS_RETRY_MAX_MS": bad})
