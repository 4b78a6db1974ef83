"""Calls to a procedure served with ``mesh_serve ... allow="owner"``, or to any served procedure
while the owner's ``[approvals] served_calls`` is 1 (the owner's say, whatever ``allow`` the
model chose): each call waits for the owner's approval (issue 39). The semantics, as a caller
sees them:

- A call is held in the approval queue (content: procedure, realm, payload) and answered at
  once with a reply ``{"state": "pending_owner_approval", "approval_id", "expires_in_s",
  "next"}``; the command has not run.
- On approval the command runs ONCE, in the agent's approval loop (so a long command delays the
  next decisions of that agent until it ends: at most its ``exec_timeout_seconds``), and its
  reply, or its failure, is kept for the caller.
- The caller fetches the outcome by calling the same procedure again with the payload
  ``{"_approval": "<approval_id>"}`` (only the caller that made the call can fetch it), or by
  repeating the same call (same payload): while pending, the same pending reply; once run,
  the command's own reply (or an error naming its failure); denied or expired, an error whose
  reason starts ``refused:``. The outcome is kept ``ttl_s`` after the decision; after that a
  fetch is ``not_found`` and a repeated call is held again as a new item.
- Bounded like every item (``max_pending``: past it the call is refused, ``approval_queue_full``);
  still rate-limited per caller first (``ServeGate``).
- Approved after the procedure stopped being served (unserved, or the daemon restarted before
  the owner decided): the outcome is an error saying so; nothing runs (also when the decision
  was applied by an agent that had nothing to run it with: ``approved, but not run``).
- A held call that was approved is never forgotten before its outcome is kept, so a repeated
  call cannot make it run twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from macula.agent.approvals import Approvals, refusal_note
from macula.node.serving import CallRefused, IncomingCall
from macula.store.approvals import ApprovalError, Item

FETCH_KEY: Final = "_approval"
PENDING: Final = "pending_owner_approval"

# runs a served procedure's command once: (name, caller, realm, payload) -> its reply
Runner = Callable[[str, bytes, bytes, Any], Awaitable[Any]]


def call_ref(name: str, realm: bytes, payload: Any) -> str:
    """What a repeated call is recognised by: procedure, realm and payload."""
    text = json.dumps([name, realm.hex(), payload], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class HeldCalls:
    """The call side of one agent's approval queue."""

    def holds(self, allow: str) -> bool:
        """Whether a call of a procedure served with ``allow`` waits for the owner: always for
        ``allow="owner"``, and for any ``allow`` when the owner's ``served_calls`` is 1."""
        return allow == "owner" or self.approvals.settings().served_calls == 1

    def __init__(self, approvals: Approvals, runner: Callable[[str], Runner | None]) -> None:
        self.approvals = approvals
        self.runner = runner  # the runner of a procedure served allow="owner" now, else None
        approvals.appliers["call"] = self.decided

    async def handle(self, name: str, call: IncomingCall, payload: Any) -> Any:
        """A call admitted by the gate: fetch an outcome, or hold the call."""
        if isinstance(payload, dict) and set(payload) == {FETCH_KEY}:
            return await self._fetch(call.caller, str(payload[FETCH_KEY]))
        ref = call_ref(name, call.realm, payload)
        item = await self.approvals.find("call", call.caller, ref)
        if (
            item is not None
            and item.state != "pending"
            and (item.state != "approved" or item.applied)  # never forget a call still running
            and self._kept_until(item) <= self._now()
        ):
            await self.approvals.store.forget(item.approval_id)
            item = None
        if item is None:
            content = {"procedure": name, "realm": call.realm.hex(), "payload": payload}
            try:
                item = await self.approvals.hold("call", call.caller, ref, content)
            except ApprovalError as exc:
                raise CallRefused(f"{exc.code}: {exc.detail}") from None
        return self._outcome(item, name)

    async def _fetch(self, caller: bytes, approval_id: str) -> Any:
        item = await self.approvals.store.get(approval_id)
        if (
            item is None
            or item.kind != "call"
            or item.sender != caller
            or item.owner != self.approvals.me
            or (item.state != "pending" and self._kept_until(item) <= self._now())
        ):
            raise CallRefused(f"not_found: no outcome kept for approval {approval_id[:32]}")
        procedure = item.content.get("procedure") if isinstance(item.content, dict) else None
        return self._outcome(item, str(procedure or "the procedure"))

    def _outcome(self, item: Item, name: str) -> Any:
        if item.state in ("denied", "expired"):
            raise CallRefused(refusal_note(item))
        result = item.result if isinstance(item.result, dict) else None
        if item.state == "approved" and item.applied:
            if result is None:  # applied where nothing ran it (the agent restarted unserved)
                raise CallRefused(
                    f"approved, but not run: {name} was not served for the owner when the "
                    "decision was applied; call it again once it is served"
                )
            if result.get("ok") == 1:
                return result.get("reply")
            raise CallRefused(f"approved, but {result.get('error') or 'it failed'}")
        running = item.state == "approved"
        return {
            "state": PENDING,
            "approval_id": item.approval_id,
            "approved": int(running),
            "expires_in_s": max(0, item.expires_ms - self._now()) // 1000,
            "next": f"call {name} again with payload "
            f'{{"{FETCH_KEY}": "{item.approval_id}"}} for the outcome: '
            + ("approved, running" if running else "the owner (a person) decides"),
        }

    async def decided(self, item: Item) -> dict[str, Any]:
        """Run an approved call once (the approvals' applier for ``call``); the kept outcome."""
        if item.state != "approved":
            return {"ok": 0, "error": refusal_note(item)}
        content = item.content if isinstance(item.content, dict) else {}
        name = str(content.get("procedure", ""))
        run = self.runner(name)
        if run is None:
            return {"ok": 0, "error": f"{name} was not served with allow=owner when approved"}
        try:
            realm = bytes.fromhex(str(content.get("realm", "")))
            reply = await run(name, item.sender, realm, content.get("payload"))
        except (CallRefused, ValueError, OSError) as exc:
            return {"ok": 0, "error": f"the command failed: {exc}"[:2000]}
        return {"ok": 1, "reply": reply}

    def _kept_until(self, item: Item) -> int:
        return (item.decided_ms or item.received_ms) + self.approvals.settings().ttl_s * 1000

    def _now(self) -> int:
        return self.approvals.clock()
