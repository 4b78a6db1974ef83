"""Rings: the addressed, proven invite into a room (``agent.<node_id>.ring``).

Callee order (every step before policy refuses without recording): the ring is addressed to
me and its proof verifies (bound to ``agent.<me>.ring#ring:<ring_id>``, skew <= 60 s, signed by
the CALL's attested caller); one ring per caller per 2 s; at most 3 pending per caller; then
the contact policy (re-read on every ring; a deferral may be held for the owner instead:
``macula.agent.held_rings``): 1 accepted (we join the room and publish
``participant_joined`` *before* answering), 2 declined with a reason, 3 deferred (pending for
the model, expires after 24 h). Every answer is proven by the callee, bound to
``agent.<caller>.ring#answer:<ring_id>``. A deferred ring answered later travels back as a
proven call to the caller's own ring endpoint.

Caller side: an answer counts only if it comes from the callee (``from`` is the node rung,
``ring_id`` is ours) and its proof verifies; anything else (someone else serving the callee's
ring endpoint, say) is refused with ``MaculaError`` and counted (``answers_foreign``,
``answers_unverified``).

Private rooms: before ringing someone into a private room we opened, its key envelope (a new
epoch when they are not yet keyed) is handed to them by a call to their ring endpoint
(payload ``{"kind": "room_key", "envelope": ...}``), so they hold the key before they join;
a callee takes such a key only when the room's opener signed it (``RoomKeys.accept``).

``observers`` are told (synchronously) of every ``RingEvent`` after waiters are woken; they
must not block, and one failing is logged, never fatal. Waits (``wait_rings``) take every
event not yet taken by a wait, oldest first (kept in memory, at most ``MAX_UNSEEN``: older
ones are dropped and counted, ``ring_events_dropped``); each event goes to one wait only.

Realms (issue 13): a ring into a room that lives in a realm names the realm (``realm``, 64
hex); the callee notes it for the room (first ring wins, ``TranscriptStore.note_invited_realm``)
before it joins, now or when it answers a deferred ring, so it joins in that realm. Ring
endpoints themselves stay in the all-zero realm (a non-member can still be rung).

Results are typed (``RingPlaced``, ``RingAnswered``, ``RingEvent``, the store's ``Ring``); the
tools shape what a model sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from macula.agent.approvals import Approvals
from macula.agent.audit import NO_TRAIL, Recorder, outside_fact
from macula.agent.contact_policy import Answer, PolicyState, decide, load_policy
from macula.agent.envelope import is_id, new_message_id
from macula.agent.held_rings import PENDING_REASON, HeldRings
from macula.agent.proof import (
    build_ring,
    build_ring_answer,
    new_ring_id,
    ring_endpoint,
    validate_ring,
    validate_ring_answer,
)
from macula.agent.room.keys import ROOM_KEY_CALL
from macula.agent.room.rooms import Rooms
from macula.errors import CallTimeout, MaculaError, MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.store.rings import Ring, RingStore
from macula.wire.codes import ErrorCode
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.agent.rings")

RATE_WINDOW_MS = 2_000
MAX_PENDING_PER_CALLER = 3
RING_TIMEOUT_S = 10.0
MAX_UNSEEN = 100  # ring events kept for the next wait; older ones are dropped (counted)
MAX_RINGS_WAITED = 20  # returned by one wait


@dataclasses.dataclass(frozen=True, slots=True)
class RingPlaced:
    """What came of a ring we placed."""

    ring_id: str
    to: bytes
    room_topic: str
    unreachable: int  # 1: nobody serves the callee's ring endpoint (``detail`` says why)
    answer: int | None  # 1 accepted, 2 declined, 3 deferred; None when unreachable
    reason: str | None = None
    detail: str | None = None
    joined: int | None = None  # after an accept: 1 once the callee's participant_joined is seen


@dataclasses.dataclass(frozen=True, slots=True)
class RingAnswered:
    """Our answer to a deferred ring."""

    ring_id: str
    answer: int
    caller_notified: int  # 0 when the caller was gone (the answer is recorded anyway)
    state: str


@dataclasses.dataclass(frozen=True, slots=True)
class RingsWaited:
    """What one wait took (oldest first) and how many more are waiting."""

    events: list[RingEvent]
    left: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RingEvent:
    """A ring that reached us (``late_answer`` 0), or the late answer to a ring of ours (1)."""

    ring_id: str
    sender: bytes
    answer: int
    reason: str | None
    room_topic: str | None
    purpose: str | None = None
    late_answer: int = 0


class Rings:
    def __init__(
        self,
        node: Node,
        store: RingStore,
        rooms: Rooms,
        clock: Callable[[], int],
        *,
        policy_file: Path,
        policy_override: str | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.node = node
        self.store = store
        self.rooms = rooms
        self.clock = clock
        self.policy_file = policy_file
        self.policy_override = policy_override
        self.random = random_bytes
        self.me = node.identity.node_id
        self.stats: Counter[str] = Counter()
        self._last_ring: dict[bytes, int] = {}
        self._incoming = asyncio.Condition()
        self._unseen: deque[RingEvent] = deque()  # not yet returned by a wait, oldest first
        self.serving = False
        self.observers: list[Callable[[RingEvent], None]] = []  # told of every RingEvent
        self.audit: Recorder = NO_TRAIL  # the agent's trail (set by Agent)
        self.held: HeldRings | None = None  # the owner's approval queue (issue 39)

    def hold_for_owner(self, approvals: Approvals) -> None:
        """Rings under ``ask`` wait for the owner when its ``rings_when_asked`` is 1."""
        self.held = HeldRings(self, approvals)

    def policy(self) -> PolicyState:
        return load_policy(self.policy_file, self.policy_override)

    async def serve(self) -> None:
        """Serve ``agent.<me>.ring`` (and announce it in the DHT for direct dial)."""
        await self.node.advertise(ZERO_REALM, ring_endpoint(self.me), self._handle, announce=True)
        self.serving = True

    async def unserve(self) -> None:
        await self.node.unadvertise(ZERO_REALM, ring_endpoint(self.me))
        self.serving = False

    # -- callee ---------------------------------------------------------------------------------

    async def _handle(self, call: IncomingCall) -> Any:
        payload = call.payload
        kind = payload.get("kind") if isinstance(payload, dict) else None
        if kind == "ring":
            reply = await self._ring_received(call)
            self._audit_ring(call, reply)
            return reply
        if kind == "ring_answer":
            return await self._answer_received(call)
        if kind == ROOM_KEY_CALL and self.rooms.keys is not None:
            accepted = await self.rooms.keys.accept(call.payload.get("envelope"), call.caller)
            if accepted.outcome == "refused":
                raise ValueError("room key refused: " + "; ".join(accepted.problems))
            return {"outcome": accepted.outcome, "keyed": accepted.keyed}
        raise ValueError("expected a ring, ring_answer or room_key payload")

    def _audit_ring(self, call: IncomingCall, reply: dict[str, Any]) -> None:
        """The trail's ``ring_received``: accepted, refused, deferred or queued; the ring (purpose,
        room) as a digest only."""
        answer = reply.get("answer")
        outcome = {1: "accepted", 3: "deferred"}.get(answer if isinstance(answer, int) else 0)
        if outcome == "deferred" and str(reply.get("reason") or "").startswith(PENDING_REASON):
            outcome = "queued"  # held for the owner (macula.agent.held_rings)
        payload = call.payload
        ring_id = payload.get("ring_id") if isinstance(payload, dict) else None
        self.audit.record(
            "ring_received",
            outcome or "refused",
            caller=call.caller.hex(),
            content_digest=self.audit.digest(payload),
            **outside_fact(self.audit, "ring_id", ring_id, is_id(ring_id)),
        )

    async def _ring_received(self, call: IncomingCall) -> dict[str, Any]:
        now = self.clock()
        payload: dict[str, Any] = call.payload
        problems = validate_ring(payload, self.me, now)
        if not problems and payload.get("from") != call.caller.hex():
            problems = ["from is not the attested caller of this ring"]
        ring_id = _text(payload.get("ring_id"))
        room = _text(payload.get("room_topic"))
        realm = bytes.fromhex(payload["realm"]) if not problems and "realm" in payload else None
        if problems:
            self.stats["rings_unverified"] += 1
            return self._answer(
                call.caller, ring_id, room, Answer.DECLINED, "unverified: " + "; ".join(problems)
            )
        last = self._last_ring.get(call.caller)
        if last is not None and now - last < RATE_WINDOW_MS:
            self.stats["rings_rate_limited"] += 1
            return self._answer(
                call.caller, ring_id, room, Answer.DECLINED, "rate limited: one ring per 2 s"
            )
        self._last_ring[call.caller] = now
        decision = decide(self.policy(), call.caller)
        answer, reason = decision.answer, decision.reason
        if (
            answer == Answer.DEFERRED
            and await self.store.count_pending_from(call.caller, now) >= MAX_PENDING_PER_CALLER
        ):
            answer, reason = (
                Answer.DECLINED,
                f"too many pending rings from you (max {MAX_PENDING_PER_CALLER})",
            )
        if answer == Answer.DEFERRED and self.held is not None and self.held.wanted():
            answer, reason = await self.held.hold(call.caller, ring_id, room, payload)
            return self._answer(call.caller, ring_id, room, answer, reason)
        if realm is not None and answer != Answer.DECLINED:
            await self.rooms.transcript.note_invited_realm(room, realm, now)
        if answer == Answer.ACCEPTED:
            await self.rooms.join(room)  # two-sided before the caller hears "accepted"
        outcome = await self.store.add(
            ring_id,
            "incoming",
            call.caller,
            now,
            purpose=payload.get("purpose"),
            room_topic=room,
            answer=None if answer == Answer.DEFERRED else int(answer),
            reason=reason,
            pending_limit=MAX_PENDING_PER_CALLER,
        )
        if outcome == "duplicate":
            return self._answer(call.caller, ring_id, room, Answer.DECLINED, "duplicate ring_id")
        await self._notify(
            RingEvent(ring_id, call.caller, int(answer), reason, room, payload.get("purpose"))
        )
        return self._answer(call.caller, ring_id, room, answer, reason)

    def _answer(
        self, caller: bytes, ring_id: str, room: str, answer: int, reason: str | None
    ) -> dict[str, Any]:
        if not ring_id or not room:
            return {"answer": int(answer), "reason": reason}  # too malformed to prove a reply to
        try:
            return dict(
                build_ring_answer(
                    self.node.identity, caller, ring_id, int(answer), room, self.clock(), reason
                )
            )
        except MaculaError:
            return {"answer": int(answer), "reason": reason}

    async def _answer_received(self, call: IncomingCall) -> dict[str, Any]:
        """A deferred ring of ours, answered later by its callee."""
        now = self.clock()
        problems = validate_ring_answer(call.payload, self.me, now)
        if not problems and call.payload.get("from") != call.caller.hex():
            problems = ["from is not the attested caller"]
        if problems:
            self.stats["answers_unverified"] += 1
            raise ValueError("unverified ring answer: " + "; ".join(problems))
        ring = await self.store.get(call.payload["ring_id"], now)
        if ring is None or ring.direction != "outgoing" or ring.peer != call.caller:
            raise ValueError("no ring of ours with that ring_id to that agent")
        await self.store.set_answer(
            ring.ring_id, call.payload["answer"], call.payload.get("reason"), now
        )
        await self._notify(
            RingEvent(
                ring.ring_id,
                call.caller,
                call.payload["answer"],
                call.payload.get("reason"),
                ring.room_topic,
                late_answer=1,
            )
        )
        return {"recorded": 1}

    async def notify_held(
        self, ring_id: str, sender: bytes, reason: str, room: str, purpose: str | None
    ) -> None:
        """Tell the model of a held ring the owner approved (we joined its room)."""
        await self._notify(RingEvent(ring_id, sender, int(Answer.ACCEPTED), reason, room, purpose))

    async def _notify(self, event: RingEvent) -> None:
        async with self._incoming:
            if len(self._unseen) >= MAX_UNSEEN:
                self._unseen.popleft()
                self.stats["ring_events_dropped"] += 1
            self._unseen.append(event)
            self._incoming.notify_all()
        for observer in list(self.observers):  # must not block: they queue, never await
            try:
                observer(event)
            except Exception:
                log.exception("a ring observer failed")

    async def wait_ring(
        self, wait_seconds: float, *, started: Callable[[], Awaitable[None]] | None = None
    ) -> RingEvent | None:
        """``wait_rings`` for one event: the oldest not yet returned, or None."""
        waited = await self.wait_rings(wait_seconds, started=started, limit=1)
        return waited.events[0] if waited.events else None

    async def wait_rings(
        self,
        wait_seconds: float,
        *,
        started: Callable[[], Awaitable[None]] | None = None,
        limit: int = MAX_RINGS_WAITED,
    ) -> RingsWaited:
        """Every ring (and late answer) that reached us since a wait last returned them,
        oldest first (up to ``limit``; ``left`` counts the rest): at once if there are any,
        else as soon as one arrives within ``wait_seconds``. Each is returned by one wait
        only. ``started`` is awaited first, so a caller can tell someone the wait has begun
        (a ring arriving from then on is returned)."""
        if started is not None:
            await started()
        async with self._incoming:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._incoming.wait_for(lambda: bool(self._unseen)), max(0.0, wait_seconds)
                )
            events = [self._unseen.popleft() for _ in range(min(limit, len(self._unseen)))]
            return RingsWaited(events, len(self._unseen))

    async def wait_answer(self, ring_id: str, wait_seconds: float) -> RingEvent | None:
        """The late answer to our deferred ring ``ring_id`` (a person or the callee's model
        answering later), within ``wait_seconds``; None when none came. The event is taken, so
        a later ``wait_rings`` does not report it again."""

        def found() -> RingEvent | None:
            for event in self._unseen:
                if event.late_answer and event.ring_id == ring_id:
                    return event
            return None

        async with self._incoming:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._incoming.wait_for(lambda: found() is not None), max(0.0, wait_seconds)
                )
            event = found()
            if event is not None:
                self._unseen.remove(event)
            return event

    async def answer_ring(
        self, ring_id: str, answer: int, reason: str | None = None
    ) -> RingAnswered:
        """Answer a deferred ring: 1 joins its room first, 2 declines; the proven answer goes
        back to the caller's ring endpoint (``caller_notified`` 0 when they are gone)."""
        if answer not in (Answer.ACCEPTED, Answer.DECLINED):
            raise MaculaError("answer must be 1 (accept) or 2 (decline)")
        now = self.clock()
        ring = await self.store.get(ring_id, now)
        if ring is None or ring.direction != "incoming":
            raise MaculaError(f"no incoming ring {ring_id!r} (mesh_read_inbox lists pending rings)")
        if ring.state != "pending":
            raise MaculaError(f"ring {ring_id!r} is already {ring.state}")
        if answer == Answer.ACCEPTED and ring.room_topic:
            await self.rooms.join(ring.room_topic)
        payload = build_ring_answer(
            self.node.identity, ring.peer, ring_id, int(answer), ring.room_topic or "", now, reason
        )
        notified = 0
        try:
            await self.node.call(
                ZERO_REALM, ring_endpoint(ring.peer), dict(payload), timeout=RING_TIMEOUT_S
            )
            notified = 1
        except (MeshError, CallTimeout) as exc:
            log.info("caller of ring %s not notified: %s", ring_id, exc)
        updated = await self.store.set_answer(
            ring_id, int(answer), reason, self.clock(), caller_notified=notified
        )
        return RingAnswered(
            ring_id, int(answer), notified, updated.state if updated else "answered"
        )

    # -- caller --------------------------------------------------------------------------------

    async def ring(
        self,
        to: bytes,
        purpose: str,
        *,
        room_topic: str | None = None,
        wait_join_seconds: float = 0,
        private: int = 0,
        realm: bytes | None = None,
    ) -> RingPlaced:
        """Ring ``to`` into ``room_topic`` (in the realm we know it in), or into a fresh room in
        ``realm`` (end-to-end encrypted with ``private`` 1); into a private room, its key goes
        to ``to`` first."""
        if to == self.me:
            raise MaculaError("you cannot ring yourself")
        room, realm = await self._ring_room(to, purpose, room_topic, private, realm)
        invitation: dict[str, Any] | None = None
        if self.rooms.keys is not None:
            message_id = new_message_id(self.random(16))
            invitation, rekeyed = await self.rooms.keys.invitation(room, to, message_id)
            if invitation is not None and rekeyed:
                await self.node.publish(realm, room, invitation)
        now = self.clock()
        ring_id = new_ring_id(self.random(16))
        payload = build_ring(self.node.identity, to, purpose, room, ring_id, now, realm)
        try:
            if invitation is not None:
                key_call = {"kind": ROOM_KEY_CALL, "envelope": invitation}
                await self.node.call(
                    ZERO_REALM, ring_endpoint(to), key_call, timeout=RING_TIMEOUT_S
                )
            reply = await self.node.call(
                ZERO_REALM, ring_endpoint(to), dict(payload), timeout=RING_TIMEOUT_S
            )
        except (MeshError, CallTimeout) as exc:
            if isinstance(exc, MeshError) and exc.code != ErrorCode.UNKNOWN_NEXT_PEER:
                raise
            await self.store.add(ring_id, "outgoing", to, now, purpose=purpose, room_topic=room)
            await self.store.set_unreachable(ring_id, str(exc), self.clock())
            return RingPlaced(ring_id, to, room, 1, None, detail=str(exc))
        self._check_answer(reply, to, ring_id)
        answer = reply["answer"]
        await self.store.add(
            ring_id,
            "outgoing",
            to,
            now,
            purpose=purpose,
            room_topic=room,
            answer=None if answer == Answer.DEFERRED else answer,
            reason=reply.get("reason"),
        )
        placed = RingPlaced(ring_id, to, room, 0, answer, reply.get("reason"))
        if answer != Answer.ACCEPTED:
            return placed
        joined = await self.rooms.wait(
            room,
            wait_join_seconds,
            after_ms=now - 1,
            kinds={"participant_joined"},
            sender=to.hex(),
        )
        return dataclasses.replace(placed, joined=int(joined is not None))

    async def _ring_room(
        self, to: bytes, purpose: str, room_topic: str | None, private: int, realm: bytes | None
    ) -> tuple[str, bytes]:
        """The room a ring invites into and its realm: ``room_topic`` in the realm we know it
        in, else a fresh room (with ``to`` keyed in when ``private``)."""
        if room_topic is None:
            keyed = [to] if private else []
            opened = await self.rooms.open(
                purpose[:280] or None,
                participants=keyed,
                private=private,
                realm=ZERO_REALM if realm is None else realm,
            )
            return opened.room_topic, opened.realm
        known = await self.rooms.transcript.room_realm(room_topic)
        if realm is not None and known is not None and realm != known:
            raise MaculaError(
                f"{room_topic} is in realm {known.hex()}, not {realm.hex()}: omit realm"
            )
        return room_topic, known or realm or ZERO_REALM

    def _check_answer(self, reply: dict[str, Any], to: bytes, ring_id: str) -> None:
        """Refuse (``MaculaError``, counted) an answer that does not verify, or that is signed
        by someone other than the callee or answers another ring."""
        problems = validate_ring_answer(reply, self.me, self.clock())
        if problems:
            self.stats["answers_unverified"] += 1
            raise MaculaError("the callee's answer does not verify: " + "; ".join(problems))
        if reply.get("from") != to.hex() or reply.get("ring_id") != ring_id:
            self.stats["answers_foreign"] += 1
            raise MaculaError(
                f"the answer to ring {ring_id} did not come from {to.hex()} (it says it is from "
                f"{str(reply.get('from'))[:64]}); refused"
            )

    async def pending(self) -> list[Ring]:
        return await self.store.pending(self.clock())

    async def recent(self, limit: int = 20) -> list[Ring]:
        return await self.store.recent(limit)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
