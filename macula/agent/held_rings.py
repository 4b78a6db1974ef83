"""Rings held for the owner's approval (issue 39): with the owner's ``rings_when_asked`` 1, a
ring the contact policy would defer to the model (``ask``) waits in the approval queue instead.

The ringer hears ``deferred`` (3) with a reason starting ``pending_owner_approval``, then the
owner's decision as a late answer (the usual proven call to its ring endpoint): approved joins
the room first and answers 1; denied or expired answers 2 with a reason starting ``refused:``.
The model never sees a held ring (it is not in the ring store until decided) and cannot answer
it; it learns of an approved one as a ring accepted into its room.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from macula.agent.approvals import Approvals, refusal_note
from macula.agent.contact_policy import Answer
from macula.agent.room.rooms import Rooms
from macula.store.approvals import ApprovalError, Item
from macula.store.rings import RingStore


class RingSide(Protocol):
    """What of ``macula.agent.rings.Rings`` the held rings use (no import cycle)."""

    stats: Counter[str]
    clock: Callable[[], int]
    rooms: Rooms
    store: RingStore

    async def answer_ring(self, ring_id: str, answer: int, reason: str | None = None) -> Any: ...

    async def notify_held(
        self, ring_id: str, sender: bytes, reason: str, room: str, purpose: str | None
    ) -> None: ...


PENDING_REASON = "pending_owner_approval"


class HeldRings:
    """The ring side of the approval queue: holds rings, applies the owner's decisions."""

    def __init__(self, rings: RingSide, approvals: Approvals) -> None:
        self.rings = rings
        self.approvals = approvals
        approvals.appliers["ring"] = self.decided

    def wanted(self) -> bool:
        return bool(self.approvals.settings().rings_when_asked)

    async def hold(
        self, caller: bytes, ring_id: str, room: str, payload: dict[str, Any]
    ) -> tuple[Answer, str]:
        """Queue the ring; the answer the ringer hears now and its reason."""
        item = await self.approvals.find("ring", caller, ring_id)
        if item is None:
            content = {
                "purpose": payload.get("purpose"),
                "room_topic": room,
                "realm": payload.get("realm"),
            }
            try:
                item = await self.approvals.hold("ring", caller, ring_id, content)
            except ApprovalError as exc:
                self.rings.stats["rings_refused_queue_full"] += 1
                return Answer.DECLINED, exc.detail
            self.rings.stats["rings_held_for_owner"] += 1
        if item.state in ("denied", "expired"):
            return Answer.DECLINED, refusal_note(item)
        return (
            Answer.DEFERRED,
            f"{PENDING_REASON}: held for the owner's approval (approval {item.approval_id}); "
            "the answer follows",
        )

    async def decided(self, item: Item) -> None:
        """Apply the owner's decision (the approvals' applier for ``ring``)."""
        rings = self.rings
        content = item.content if isinstance(item.content, dict) else {}
        room = _text(content.get("room_topic")) or ""
        purpose = _text(content.get("purpose"))
        realm = content.get("realm")
        now = rings.clock()
        approved = item.state == "approved" and bool(room)
        if approved and isinstance(realm, str):
            await rings.rooms.transcript.note_invited_realm(room, bytes.fromhex(realm), now)
        outcome = await rings.store.add(
            item.ref, "incoming", item.sender, now, purpose=purpose, room_topic=room or None
        )
        if outcome == "duplicate":
            return
        if approved:
            await rings.answer_ring(item.ref, int(Answer.ACCEPTED), "the owner approved it")
            await rings.notify_held(item.ref, item.sender, "the owner approved it", room, purpose)
        else:
            await rings.answer_ring(item.ref, int(Answer.DECLINED), refusal_note(item))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
