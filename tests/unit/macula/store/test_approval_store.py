"""The approval queue's store: bounded, survives a reopen, TTL by the clock given, one decision."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from macula.store.approvals import ApprovalError, ApprovalStore, Item

pytestmark = pytest.mark.anyio

ME, ALICE, BOB = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def item(n: int, *, sender: bytes = ALICE, now: int = 1_000, ttl_ms: int = 60_000) -> Item:
    return Item(
        approval_id=f"{n:016x}",
        owner=ME,
        kind="task",
        sender=sender,
        petname=None,
        ref=f"task-{n}",
        size=12,
        received_ms=now,
        expires_ms=now + ttl_ms,
        content={"title": f"t{n}", "input": "secret"},
    )


async def test_full_queue_refuses_clearly_and_drops_nothing(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        for n in range(3):
            await store.add(item(n), max_pending=3)
        with pytest.raises(ApprovalError) as full:
            await store.add(item(3), max_pending=3)
        assert full.value.code == "approval_queue_full" and full.value.retryable
        assert [i.ref for i in await store.pending(ME, 1_000)] == ["task-0", "task-1", "task-2"]
        assert await store.count_pending(ME, 1_000) == 3


async def test_one_sender_cannot_fill_the_queue(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        for n in range(2):
            await store.add(item(n), max_pending=10, max_per_sender=2)
        with pytest.raises(ApprovalError) as mine:
            await store.add(item(2), max_pending=10, max_per_sender=2)
        assert mine.value.code == "approval_queue_full" and "your requests" in mine.value.detail
        await store.add(item(3, sender=BOB), max_pending=10, max_per_sender=2)  # another sender


async def test_a_retried_request_finds_its_item_not_a_second(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        first = await store.add(item(1), max_pending=5)
        retry = await store.add(_same_ref(item(1)), max_pending=5)
        assert retry.approval_id == first.approval_id
        assert await store.count_pending(ME, 1_000) == 1


def _same_ref(base: Item) -> Item:
    return replace(base, approval_id="ffffffffffffffff")


async def test_queue_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite3"
    async with await ApprovalStore.open(path) as store:
        await store.add(item(1), max_pending=5)
    async with await ApprovalStore.open(path) as store:
        [held] = await store.pending(ME, 1_000)
        assert held.content == {"title": "t1", "input": "secret"} and held.state == "pending"
        assert (path.stat().st_mode & 0o777) == 0o600


async def test_ttl_by_the_clock_given(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        await store.add(item(1, ttl_ms=10_000), max_pending=5)
        await store.add(item(2, ttl_ms=50_000), max_pending=5)
        assert await store.count_pending(ME, 11_000) == 1  # item 1 is past its TTL
        with pytest.raises(ApprovalError) as late:
            await store.decide(f"{1:016x}", "approved", 11_000, by="owner")
        assert late.value.code == "expired"
        assert await store.expire(ME, 60_000) == 1  # item 2; item 1 was already expired
        states = sorted((i.ref, i.state) for i in await store.to_apply(ME))
        assert states == [("task-1", "expired"), ("task-2", "expired")]


async def test_one_decision_then_applied_erases_the_content(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        await store.add(item(1), max_pending=5)
        decided = await store.decide(f"{1:016x}", "denied", 2_000, by="owner", reason="no")
        assert (decided.state, decided.reason, decided.applied) == ("denied", "no", 0)
        with pytest.raises(ApprovalError) as twice:
            await store.decide(f"{1:016x}", "approved", 2_000, by="owner")
        assert twice.value.code == "already_decided"
        with pytest.raises(ApprovalError) as missing:
            await store.decide("0" * 16, "approved", 2_000, by="owner")
        assert missing.value.code == "not_found"
        [due] = await store.to_apply(ME)
        await store.applied(due.approval_id, {"ok": 1})
        after = await store.get(due.approval_id)
        assert after is not None and after.content is None and after.result == {"ok": 1}
        assert await store.to_apply(ME) == []
        # a retried request still hears the decision
        found = await store.find(ME, "task", ALICE, "task-1")
        assert found is not None and found.state == "denied"


async def test_metadata_never_carries_content(tmp_path: Path) -> None:
    shown = item(1).metadata(4_000)
    assert "content" not in shown and "secret" not in repr(shown)
    assert shown["age_s"] == 3 and shown["kind"] == "task"
