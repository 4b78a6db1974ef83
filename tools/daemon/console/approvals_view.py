"""The console's approval queue (issue 39): the person at the console sees what waits, WITH
its content, and approves or denies it in one click.

Invariants:
- the items of every agent of this home: from the open runtime's store when the daemon hosts
  that agent (a decision there is applied at once: ``Approvals.decide`` kicks), else from its
  store file (applied when the agent next starts): so the queue shows after a daemon restart,
  before any session attached;
- ``decide`` takes ``{"approval_id": 16 hex, "decision": "approve"|"deny", "reason"?}``; a bad
  field is an ``ActionError`` naming it; an unknown, decided or expired item is refused with
  the store's code;
- nothing here is reachable by the model: these are console routes, behind the console guard.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from macula.clock import now_ms
from macula.store.approvals import ApprovalError
from tools.daemon.console.actions import ActionError, text_field
from tools.owner.approvals import STORE_NAME, decide_in, owner_view, pending_in
from tools.server.runtime import Runtime

_ID: Final = re.compile(r"[0-9a-f]{16}")
MAX_REASON_CHARS: Final = 500


def _hosted(runtimes: list[Runtime]) -> dict[Path, Runtime]:
    return {runtime.agent.approvals.store.path.resolve(): runtime for runtime in runtimes}


def _files(home: Path, hosted: dict[Path, Runtime]) -> list[Path]:
    found = {path.resolve() for path in (home / "agents").glob(f"*/{STORE_NAME}")}
    return sorted(found - set(hosted))


async def pending(home: Path, runtimes: list[Runtime]) -> dict[str, Any]:
    """Every pending item of this home, oldest first, with its content."""
    now = now_ms()
    hosted = _hosted(runtimes)
    items: list[dict[str, Any]] = []
    for runtime in hosted.values():
        approvals = runtime.agent.approvals
        items += [owner_view(i, now) for i in await approvals.store.pending(None, now, limit=500)]
    items += await pending_in(_files(home, hosted), now)
    items.sort(key=lambda item: (-item["age_s"], item["approval_id"]))
    return {"approvals": items}


async def decide(home: Path, runtimes: list[Runtime], body: Mapping[str, Any]) -> dict[str, Any]:
    approval_id = text_field(body, "approval_id", 16)
    if not _ID.fullmatch(approval_id):
        raise ActionError("invalid_argument", "approval_id: 16 lowercase hex")
    choice = body.get("decision")
    if choice not in ("approve", "deny"):
        raise ActionError("invalid_argument", "decision: approve or deny")
    reason = text_field(body, "reason", MAX_REASON_CHARS, required=False) or None
    decision = "approved" if choice == "approve" else "denied"
    hosted = _hosted(runtimes)
    try:
        for runtime in hosted.values():
            approvals = runtime.agent.approvals
            if await approvals.store.get(approval_id) is not None:
                item = await approvals.decide(
                    approval_id, decision, by="owner (console)", reason=reason
                )
                return {"approval_id": item.approval_id, "state": item.state}
        item = await decide_in(
            _files(home, hosted), approval_id, decision, reason, by="owner (console)"
        )
    except ApprovalError as exc:
        raise ActionError(exc.code, exc.detail) from None
    return {"approval_id": item.approval_id, "state": item.state}
