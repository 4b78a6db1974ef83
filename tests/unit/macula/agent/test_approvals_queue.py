"""``Approvals`` with a fake clock: decisions and expiries applied once each through the applier
of their kind (an unknown kind still ends applied), the audit hook told without content, and
the owner's settings read again when the file changes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from macula.agent.approvals import Approvals
from macula.store.approvals import ApprovalStore, Item

pytestmark = pytest.mark.anyio

ME, ALICE = b"\x01" * 32, b"\x02" * 32


async def test_decisions_and_expiries_are_applied_once(tmp_path: Path) -> None:
    now = [1_000_000]
    owner_file = tmp_path / "owner.toml"
    owner_file.write_text("[approvals]\ntasks_from_strangers = 1\nttl_s = 10\n")
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        approvals = Approvals(ME, store, lambda: now[0], settings_file=owner_file)
        applied: list[tuple[str, str]] = []
        events: list[tuple[str, Any]] = []

        async def apply(item: Item) -> dict[str, int]:
            applied.append((item.ref, item.state))
            assert item.content is not None  # the applier still has it
            return {"ran": 1}

        approvals.appliers["task"] = apply
        approvals.audit = lambda event, item: events.append((event, item.content))
        first = await approvals.hold("task", ALICE, "t1", {"input": "secret"})
        again = await approvals.hold("task", ALICE, "t1", {"input": "secret"})
        assert again.approval_id == first.approval_id and first.expires_ms == now[0] + 10_000
        await approvals.hold("task", ALICE, "t2", {"input": "secret"})
        await approvals.hold("call", ALICE, "c1", {"payload": 1})  # no applier for calls here
        await approvals.decide(first.approval_id, "approved", by="owner")
        assert await approvals.apply_due() == 1
        now[0] += 10_000  # t2 and c1 reach their TTL
        assert await approvals.apply_due() == 2
        assert await approvals.apply_due() == 0
        assert applied == [("t1", "approved"), ("t2", "expired")]
        assert [e for e, _ in events] == [
            "queued",
            "queued",
            "queued",
            "approved",
            "expired",
            "expired",
        ]
        assert all(content is None for _, content in events)
        kept = await store.get(first.approval_id)
        assert kept is not None and kept.content is None and kept.result == {"ran": 1}


async def test_settings_are_read_again_when_the_file_changes(tmp_path: Path) -> None:
    owner_file = tmp_path / "owner.toml"
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        approvals = Approvals(ME, store, lambda: 0, settings_file=owner_file, agent_name="bob")
        assert approvals.settings().tasks_from_strangers == 0  # no file
        owner_file.write_text("[agents.bob.approvals]\ntasks_from_strangers = 1\n")
        assert approvals.settings().tasks_from_strangers == 1
        owner_file.write_text("[approvals]\nttl_s = -1\n")
        broken = approvals.settings()
        assert broken.error is not None and broken.rings_when_asked == 1  # fails closed
        # an edit of the same size within one timestamp tick (mtime set back) still counts
        stamp = owner_file.stat()
        owner_file.write_text("[approvals]\nttl_s = -2\n")
        os.utime(owner_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        owner_file.write_text("[approvals]\nttl_s = 99\n")
        os.utime(owner_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        assert approvals.settings().error is None


async def test_a_decision_made_elsewhere_between_apply_and_sleep_is_applied_at_once(
    tmp_path: Path,
) -> None:
    """The owner's CLI decides in another process right after ``apply_due`` read: the loop must
    not then sleep with nothing pending and no expiry (the decision would wait for a restart)."""
    owner_file = tmp_path / "owner.toml"
    owner_file.write_text("[approvals]\ntasks_from_strangers = 1\n")
    async with (
        await ApprovalStore.open(tmp_path / "a.sqlite3") as store,
        await ApprovalStore.open(tmp_path / "a.sqlite3") as cli_side,
    ):
        approvals = Approvals(ME, store, lambda: 1_000, settings_file=owner_file, poll_s=3600)
        item = await approvals.hold("task", ALICE, "t1", {"input": "x"})
        assert await approvals.apply_due() == 0
        await cli_side.decide(item.approval_id, "approved", 1_000, by="owner (cli)")
        assert await approvals._sleep_for() == 0.0  # not None: wake and apply it now
        assert await approvals.apply_due() == 1
