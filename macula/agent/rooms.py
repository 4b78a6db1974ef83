"""Rooms and central (``agents.lobby``): background taps, transcript, open/join/leave/say/wait.

Invariants:
- every room the agent is in, and central, is tapped in the background on the node's one
  connection; every valid envelope heard is recorded in the transcript (duplicates by
  ``message_id`` are ignored), with ``attested`` = 1 only when the station-reported publisher
  equals ``from``; invalid envelopes are counted, never recorded;
- only attested messages count as someone joining or replying;
- the observer also taps PUBLIC rooms announced on central (a ``room_opened`` on central whose
  ``refs[0]`` names the room), at most ``max_rooms``; what it drops is counted;
- waiting never polls the station: it waits on the local transcript, which the taps fill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from macula.agent.envelope import (
    LOBBY_TOPIC,
    TALK_KINDS,
    Envelope,
    build_envelope,
    is_attested,
    is_room_topic,
    new_message_id,
    new_room_topic,
    poll_hint,
    thread,
    validate,
)
from macula.errors import MaculaError
from macula.node import Node
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.subscriptions import Delivery, Subscription
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.agent.rooms")

HELP_KINDS = frozenset({"help_requested", "help_offered"})
DEFAULT_MAX_ROOMS = 20


class RoomError(MaculaError):
    """A room operation that cannot be done; the message says why and what to do."""


class Rooms:
    def __init__(
        self,
        node: Node,
        transcript: TranscriptStore,
        clock: Callable[[], int],
        *,
        max_rooms: int = DEFAULT_MAX_ROOMS,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.node = node
        self.transcript = transcript
        self.clock = clock
        self.max_rooms = max_rooms
        self.random = random_bytes
        self.me = node.identity.node_id.hex()
        self.stats: Counter[str] = Counter()
        self._taps: dict[str, tuple[Subscription, asyncio.Task[None]]] = {}
        self._observed: set[str] = set()  # public rooms tapped by the observer only
        self._changed = asyncio.Condition()
        self._group: asyncio.TaskGroup | None = None
        self.observing = False

    # -- taps ---------------------------------------------------------------------------------

    async def start(self, group: asyncio.TaskGroup, *, observe: bool = True) -> None:
        """Tap central and every room we are in (after a restart too)."""
        self._group = group
        await self._tap(LOBBY_TOPIC)
        for membership in await self.transcript.joined_rooms():
            await self._tap(membership.room_topic)
        self.observing = observe
        if observe:
            for room in (await self.transcript.seen_rooms())[: self.max_rooms]:
                await self._observe(room.room_topic)

    async def stop(self) -> None:
        for topic in list(self._taps):
            await self._untap(topic)
        self._observed.clear()

    async def unobserve(self) -> None:
        self.observing = False
        for topic in list(self._observed):
            await self._untap(topic)
        self._observed.clear()

    async def observe(self, max_rooms: int | None = None) -> int:
        if max_rooms is not None:
            self.max_rooms = max_rooms
        self.observing = True
        for room in (await self.transcript.seen_rooms())[: self.max_rooms]:
            await self._observe(room.room_topic)
        return len(self._observed)

    async def _tap(self, topic: str) -> None:
        if topic in self._taps or self._group is None:
            return
        sub = await self.node.subscribe(ZERO_REALM, topic, buffer=4096)
        task = self._group.create_task(self._pump(topic, sub))
        self._taps[topic] = (sub, task)

    async def _untap(self, topic: str) -> None:
        tap = self._taps.pop(topic, None)
        if tap is not None:
            sub, task = tap
            task.cancel()
            await sub.close()

    async def _observe(self, topic: str) -> None:
        if topic in self._taps:
            return
        if len(self._observed) >= self.max_rooms:
            self.stats["observer_rooms_dropped"] += 1
            return
        self._observed.add(topic)
        await self._tap(topic)

    async def _pump(self, topic: str, sub: Subscription) -> None:
        async for delivery in sub:
            try:
                await self._heard(topic, delivery)
            except Exception:
                log.exception("room message not recorded")

    async def _heard(self, topic: str, delivery: Delivery) -> None:
        envelope = delivery.payload
        problems = validate(envelope)
        if problems or envelope.get("room_topic") != topic:
            self.stats["invalid_envelopes"] += 1
            log.info("ignored an invalid envelope on %s: %s", topic, "; ".join(problems))
            return
        attested = is_attested(envelope, delivery.publisher)
        if not attested:
            self.stats["unattested"] += 1
        new = await self._record(envelope, delivery.publisher, attested)
        if new and attested and topic == LOBBY_TOPIC and envelope["kind"] == "room_opened":
            refs = envelope.get("refs") or []
            if refs and is_room_topic(refs[0]):
                await self.transcript.note_public_room(
                    refs[0], envelope["from"], envelope.get("purpose"), self.clock()
                )
                if self.observing:
                    await self._observe(refs[0])

    async def _record(
        self, envelope: Envelope | dict[str, Any], publisher: bytes, attested: bool
    ) -> bool:
        new = await self.transcript.record(
            room_topic=envelope["room_topic"],
            message_id=envelope["message_id"],
            from_hex=envelope["from"],
            kind=envelope["kind"],
            sent_at=envelope["sent_at"],
            received_ms=self.clock(),
            envelope=json.dumps(envelope, sort_keys=True),
            text=envelope.get("text"),
            in_reply_to=envelope.get("in_reply_to"),
            refs=envelope.get("refs"),
            participants=envelope.get("participants"),
            purpose=envelope.get("purpose"),
            publisher=publisher,
            attested=int(attested),
        )
        if new:
            async with self._changed:
                self._changed.notify_all()
        return new

    # -- operations -----------------------------------------------------------------------------

    async def _publish(self, topic: str, kind: str, text: str = "", **fields: Any) -> Envelope:
        envelope = build_envelope(
            message_id=new_message_id(self.random(16)),
            room_topic=topic,
            sender=self.node.identity.node_id,
            kind=kind,
            text=text,
            sent_at=self.clock(),
            **fields,
        )
        # record first: the tap may deliver our own copy later (ignored as a duplicate)
        await self._record(envelope, self.node.identity.node_id, True)
        await self.node.publish(ZERO_REALM, topic, dict(envelope))
        return envelope

    async def open(
        self, purpose: str | None = None, *, public: int = 0, participants: Sequence[bytes] = ()
    ) -> dict[str, Any]:
        topic = new_room_topic(self.random(16))
        await self.transcript.join_room(topic, "opener", public, purpose, self.clock())
        await self._tap(topic)
        opened = await self._publish(
            topic,
            "room_opened",
            purpose or "",
            purpose=purpose,
            participants=list(participants) or None,
        )
        if public:
            await self._publish(
                LOBBY_TOPIC, "room_opened", purpose or "", purpose=purpose, refs=[topic]
            )
        return {
            "room_topic": topic,
            "message_id": opened["message_id"],
            "public": int(bool(public)),
        }

    async def join(self, topic: str) -> dict[str, Any]:
        if not is_room_topic(topic):
            raise RoomError(f"{topic!r} is not a room topic (agents.room.<32 lowercase hex>)")
        newly = await self.transcript.join_room(topic, "participant", 0, None, self.clock())
        await self._tap(topic)
        self._observed.discard(topic)
        message_id = None
        if newly:
            message_id = (await self._publish(topic, "participant_joined"))["message_id"]
        return {
            "room_topic": topic,
            "joined": 1,
            "already_member": int(not newly),
            "message_id": message_id,
        }

    async def leave(self, topic: str, *, close: int = 0) -> dict[str, Any]:
        membership = {m.room_topic: m for m in await self.transcript.joined_rooms()}.get(topic)
        if membership is None:
            raise RoomError(f"not in {topic}: nothing to leave (mesh_rooms lists your rooms)")
        if close and membership.role != "opener":
            raise RoomError("only the agent that opened a room can close it; leave it instead")
        kind = "room_closed" if close else "participant_left"
        with contextlib.suppress(MaculaError):
            await self._publish(topic, kind)
        await self.transcript.leave_room(topic, self.clock())
        await self._untap(topic)
        return {"room_topic": topic, "left": 1, "closed": int(bool(close))}

    async def say(
        self,
        topic: str,
        kind: str,
        text: str,
        *,
        in_reply_to: str | None = None,
        refs: Sequence[str] | None = None,
        wait_reply_seconds: float = 0,
    ) -> dict[str, Any]:
        if kind not in TALK_KINDS:
            raise RoomError(
                f"kind must be one of {sorted(TALK_KINDS)}; lifecycle kinds are the room tools'"
            )
        if topic != LOBBY_TOPIC and topic not in {
            m.room_topic for m in await self.transcript.joined_rooms()
        }:
            raise RoomError(f"not in {topic}: join it first (mesh_join_room)")
        envelope = await self._publish(
            topic, kind, text, in_reply_to=in_reply_to, refs=list(refs) if refs else None
        )
        result: dict[str, Any] = {"room_topic": topic, "message_id": envelope["message_id"]}
        if wait_reply_seconds > 0:
            reply = await self.wait(topic, wait_reply_seconds, after_ms=envelope["sent_at"])
            result["reply"] = reply
            result["timed_out"] = int(reply is None)
        return result

    async def wait(
        self,
        topic: str,
        wait_seconds: float,
        *,
        after_ms: int | None = None,
        kinds: set[str] | None = None,
        sender: str | None = None,
    ) -> dict[str, Any] | None:
        """The first attested message in ``topic`` from someone else received after now."""
        since = self.clock() if after_ms is None else after_ms
        deadline = asyncio.get_running_loop().time() + max(0.0, wait_seconds)

        async def found() -> dict[str, Any] | None:
            for message in await self.transcript.messages(topic, since_ms=since, limit=200):
                if (
                    message.attested
                    and message.from_hex != self.me
                    and (kinds is None or message.kind in kinds)
                    and (sender is None or message.from_hex == sender)
                ):
                    return _public(message)
            return None

        while True:
            hit = await found()
            if hit is not None:
                return hit
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return None
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)

    async def rooms(self) -> dict[str, Any]:
        joined = [asdict(m) for m in await self.transcript.joined_rooms()]
        seen = [asdict(r) for r in await self.transcript.seen_rooms()]
        return {"joined": joined, "seen_on_central": seen, "observed": sorted(self._observed)}

    async def inbox(self, limit: int = 100) -> dict[str, Any]:
        rooms = []
        for membership in await self.transcript.joined_rooms():
            messages = await self.transcript.messages(membership.room_topic, limit=limit)
            raw = [json.loads(m.envelope) | {"attested": m.attested} for m in messages]
            threaded = [
                {**t.message, "thread_root": t.thread_root, "depth": t.depth} for t in thread(raw)
            ]
            entry: dict[str, Any] = {"room_topic": membership.room_topic, "messages": threaded}
            hint = poll_hint(raw, self.me)
            if hint:
                entry["poll_hint"] = hint
            rooms.append(entry)
        help_broadcasts = await self.transcript.recent(HELP_KINDS, LOBBY_TOPIC, None, 20)
        return {"rooms": rooms, "central_help": [_public(m) for m in help_broadcasts]}


def _public(message: TranscriptMessage) -> dict[str, Any]:
    """A transcript row as agents see it (no booleans, no raw bytes)."""
    return {
        "room_topic": message.room_topic,
        "message_id": message.message_id,
        "from": message.from_hex,
        "kind": message.kind,
        "text": message.text,
        "in_reply_to": message.in_reply_to,
        "refs": list(message.refs) if message.refs else None,
        "sent_at": message.sent_at,
        "attested": message.attested,
    }
