"""A held call approved where nothing could run it (the agent restarted and had not served the
procedure again when the decision was applied) answers its caller that it did not run, instead
of "approved, running" until the item is forgotten."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.agent.approvals import Approvals
from macula.node.serving import CallRefused
from macula.store.approvals import ApprovalStore
from tools.groups.owner.served_calls import HeldCalls, call_ref

pytestmark = pytest.mark.anyio

ME, CALLER = b"\x01" * 32, b"\x02" * 32


async def test_an_approved_call_nothing_ran_says_so(tmp_path: Path) -> None:
    async with await ApprovalStore.open(tmp_path / "a.sqlite3") as store:
        approvals = Approvals(ME, store, lambda: 1_000, settings_file=tmp_path / "owner.toml")
        content = {"procedure": "org.example.deploy", "realm": "00" * 32, "payload": {"n": 1}}
        ref = call_ref("org.example.deploy", b"\x00" * 32, {"n": 1})
        item = await approvals.hold("call", CALLER, ref, content)
        await approvals.decide(item.approval_id, "approved", by="owner (cli)")
        assert await approvals.apply_due() == 1  # no call applier yet: applied, nothing kept
        held = HeldCalls(approvals, lambda name: None)  # served again later
        with pytest.raises(CallRefused, match="approved, but not run"):
            await held._fetch(CALLER, item.approval_id)
