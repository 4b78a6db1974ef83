"""Rooms and central (``agents.lobby``): background taps, transcript, open/join/leave/say/wait.

Invariants:
- every room the agent is in, and central, is tapped in the background on the node's one
  connection; every valid envelope heard is recorded in the transcript (duplicates by
  ``message_id`` are ignored), with ``attested`` = 1 only when the event carried a valid
  ``publisher_sig`` (the delivery is authenticated) and its publisher equals ``from``; an
  unauthenticated one is recorded with ``attested`` 0 and counted (``unauthenticated``);
  invalid envelopes are counted, never recorded;
- only attested messages count as someone joining or replying;
- ``observers`` are told (synchronously, ``EnvelopeHeard``) of every valid envelope recorded
  for the first time from a tap; they must not block (they queue), and one failing is logged,
  never fatal;
- the observer also taps PUBLIC rooms announced on central (a ``room_opened`` on central whose
  ``refs[0]`` names the room), at most ``max_rooms``; what it drops is counted;
- operations return typed results (the dataclasses below, or the store's rows); how a model
  sees them (dict keys, petnames, 0/1) is the tools' business;
- private rooms (``keys``, see ``macula.agent.room.keys``): what we publish there is sealed,
  what we hear there is opened before it is recorded (the transcript holds plaintext only);
  a private room is never announced on central;
- waiting never polls the station: it waits on the local transcript, which the taps fill
  (``macula.agent.room.waits``: every new message bumps ``_generation`` under ``_changed``);
- unread marks (``wait_unread_all``, ``inbox``): every unread message from someone else is
  returned at once (``macula.agent.room.waits``: oldest first, capped), else the first ones
  recorded; what is returned is marked read, and a message marked read by one waiter is never
  returned to another; ``say`` with a wait returns everything after ours once one answers it;
- catch-up (``macula.agent.catchup``) runs at start, after every reconnect and on joining a
  room; what it fetches goes through ``_heard`` like a live delivery;
- realms (issue 13): a room lives in one realm, stored with its membership (default all-zero);
  it is tapped and published only there, so a station protecting the realm lets only members
  join or read it; a delivery from another realm is counted (``wrong_realm``), not recorded.
  Central is in the all-zero realm, and never announces a room of another realm.
- our own envelope comes back on the room's tap; it was recorded before it was published, so
  the copy is dropped before anything else (counted ``own_echoes``) when its ``message_id`` is
  one of the last ``OWN_ECHOES`` we published in that room (from our own node id only).
- ``say`` while the connection is down queues the message (``outbox``, set by the agent:
  ``macula.agent.room.outbox``): recorded at once, published later with the same message_id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from macula.agent.catchup import CatchUp, HistorySource
from macula.agent.envelope import (
    LOBBY_TOPIC,
    TALK_KINDS,
    Envelope,
    build_envelope,
    is_attested,
    is_room_topic,
    new_message_id,
    new_room_topic,
    validate,
)
from macula.agent.room.inbox import HELP_KINDS as HELP_KINDS  # re-exported
from macula.agent.room.inbox import RoomInbox as RoomInbox
from macula.agent.room.inbox import RoomsInbox as RoomsInbox  # re-exported
from macula.agent.room.inbox import RoomThread as RoomThread  # re-exported
from macula.agent.room.keys import Heard, RoomKeys
from macula.agent.room.outbox import RoomOutbox, Sent
from macula.agent.room.waits import RoomError as RoomError  # re-exported: raised by both
from macula.agent.room.waits import TranscriptWaits, UnreadBatch, answer_index
from macula.errors import MaculaError
from macula.node.node import Node
from macula.node.subscriptions import Delivery, Subscription
from macula.services.house_client import HouseClient
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.store.unread import Fit
from macula.wire.identity import ZERO_REALM

# a second catch-up this long after a reconnect: what peers published around our own
# reconnect, before the station had our replayed SUBSCRIBE (seen: 2 in 18 loaded runs of
# test_room_outbox), is in its history by then
RECHECK_AFTER_RECONNECT_S = 2.0
log = logging.getLogger("macula.agent.room.rooms")

DEFAULT_MAX_ROOMS = 20
OWN_ECHOES = 256  # our last published message ids whose echo is dropped unread


@dataclass(frozen=True, slots=True)
class EnvelopeHeard:
    """A valid envelope heard on a tap for the first time (observers are told of it)."""

    topic: str
    envelope: dict[str, Any]
    publisher: bytes
    attested: int  # 1: authenticated delivery, publisher == from


@dataclass(frozen=True, slots=True)
class RoomOpened:
    room_topic: str
    message_id: str  # of the room_opened envelope published in the room
    public: int  # 1 when also announced on central
    private: int = 0  # 1 when end-to-end encrypted (never announced)
    realm: bytes = ZERO_REALM


@dataclass(frozen=True, slots=True)
class RoomJoined:
    room_topic: str
    already_member: int  # 1 when we were in it already (nothing published)
    message_id: str | None  # of our participant_joined, None when already a member
    realm: bytes = ZERO_REALM


@dataclass(frozen=True, slots=True)
class RoomLeft:
    room_topic: str
    closed: int  # 1 when we published room_closed (openers only)
    outbox_dropped: int = 0  # our queued messages that could not be sent first (dropped)


@dataclass(frozen=True, slots=True)
class Said:
    room_topic: str
    message_id: str
    waited: int  # 1 when the call waited for a reply (then ``reply`` is it, or None)
    reply: TranscriptMessage | None = None
    heard: UnreadBatch | None = None  # after a wait: everything from others since ours
    answer_index: int | None = None  # where ``reply`` is in ``heard.messages``
    delivered: int = 1  # 0: queued in the outbox (published when connected; no wait)
    queued: int = 0  # messages in the outbox after this say


class Rooms(TranscriptWaits, RoomInbox):
    def __init__(
        self,
        node: Node,
        transcript: TranscriptStore,
        clock: Callable[[], int],
        *,
        max_rooms: int = DEFAULT_MAX_ROOMS,
        random_bytes: Callable[[int], bytes] = os.urandom,
        history: HistorySource | None = None,
    ) -> None:
        self.node = node
        self.transcript = transcript
        self.clock = clock
        self.max_rooms = max_rooms
        self.random = random_bytes
        self.me = node.identity.node_id.hex()
        self.stats: Counter[str] = Counter()
        self._taps: dict[str, tuple[Subscription, asyncio.Task[None]]] = {}
        self._realms: dict[str, bytes] = {}  # the realm of each tapped topic (absent: zero)
        self._observed: set[str] = set()  # public rooms tapped by the observer only
        self._changed = asyncio.Condition()
        self._generation = 0  # messages recorded so far (bumped under ``_changed``)
        self._group: asyncio.TaskGroup | None = None
        self.observing = False
        self.keys: RoomKeys | None = None  # private rooms; set by the agent
        self.outbox: RoomOutbox | None = None  # says while disconnected; set by the agent
        self.observers: list[Callable[[EnvelopeHeard], None]] = []  # told of each new envelope
        self.catch_up: CatchUp | None = None
        self._history = history
        self._catching: asyncio.Task[int] | None = None
        self._said: dict[tuple[str, str], None] = {}  # (topic, message_id) we published last

    # -- taps ---------------------------------------------------------------------------------

    async def start(self, group: asyncio.TaskGroup, *, observe: bool = True) -> None:
        """Tap central and every room we are in (after a restart too)."""
        self._group = group
        await self._tap(LOBBY_TOPIC)
        for membership in await self.transcript.joined_rooms():
            await self._tap(membership.room_topic, membership.realm)
        self.observing = observe
        if observe:
            for room in (await self.transcript.seen_rooms())[: self.max_rooms]:
                await self._observe(room.room_topic)
        self._start_catch_up()
        if self.outbox is not None:
            await self.outbox.start(group, published=self._published)

    # -- catch-up (macula.agent.catchup) --------------------------------------------------------

    def _start_catch_up(self) -> None:
        """Catch up now (the taps are live: nothing falls between) and after every reconnect."""
        if self.catch_up is None:
            history = self._history
            if history is None and isinstance(self.node, Node):
                history = HouseClient(self.node, self.node.dht, self.node.identity)
            if history is None:
                return
            self.catch_up = CatchUp(self, history, self._station_key)
            self.node.on_state(self._state_changed)
        self.catch_up_soon()

    async def _station_key(self) -> bytes:
        return (await self.node.session(timeout=10)).station_key

    def _state_changed(self, state: str) -> None:
        if state == "reconnected":
            self.catch_up_soon()
            self.catch_up_soon(after_s=RECHECK_AFTER_RECONNECT_S)

    def catch_up_soon(self, after_s: float = 0.0) -> None:
        """Run a catch-up in the background, after ``after_s`` (one at a time; a later call
        queues behind)."""
        if self.catch_up is not None and self._group is not None:
            self._catching = self._group.create_task(self._catch_up_logged(self.catch_up, after_s))

    @staticmethod
    async def _catch_up_logged(catch_up: CatchUp, after_s: float = 0.0) -> int:
        try:
            if after_s > 0:
                await asyncio.sleep(after_s)
            return await catch_up.run_until_done()
        except Exception:  # a background task must not take the agent's task group down
            log.exception("catch-up failed")
            catch_up.stats["crashed"] += 1
            return 0

    @property
    def generation(self) -> int:
        """How many new messages were recorded so far."""
        return self._generation

    async def stop(self) -> None:
        if self._catching is not None:
            self._catching.cancel()
        for topic in list(self._taps):
            await self._untap(topic)
        self._observed.clear()
        if self.outbox is not None:
            await self.outbox.stop()

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

    def realm_of(self, topic: str) -> bytes:
        """The realm ``topic`` is tapped and published in (the all-zero realm if not tapped)."""
        return self._realms.get(topic, ZERO_REALM)

    async def _tap(self, topic: str, realm: bytes = ZERO_REALM) -> None:
        if topic in self._taps and self.realm_of(topic) != realm:
            await self._untap(topic)  # observed on central, now joined in its realm
        if topic in self._taps or self._group is None:
            return
        sub = await self.node.subscribe(realm, topic, buffer=4096)
        task = self._group.create_task(self._pump(topic, sub))
        self._taps[topic] = (sub, task)
        if realm != ZERO_REALM:
            self._realms[topic] = realm
        with contextlib.suppress(MaculaError):  # the tap hears what is said from now on
            await self.node.flush(timeout=5)

    async def _untap(self, topic: str) -> None:
        tap = self._taps.pop(topic, None)
        self._realms.pop(topic, None)
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
        if self._own_echo(topic, delivery):
            self.stats["own_echoes"] += 1  # recorded when we published it
            return
        problems = validate(envelope)
        if problems or envelope.get("room_topic") != topic:
            self.stats["invalid_envelopes"] += 1
            log.info("ignored an invalid envelope on %s: %s", topic, "; ".join(problems))
            return
        if delivery.realm != self.realm_of(topic):
            self.stats["wrong_realm"] += 1  # the room lives in another realm: not its envelope
            return
        if not delivery.authenticated:
            self.stats["unauthenticated"] += 1  # no publisher_sig: nobody vouches for it
        heard = [Heard(envelope, delivery.publisher, delivery.authenticated)]
        if self.keys is not None and topic != LOBBY_TOPIC:
            heard = await self.keys.receive(envelope, delivery.publisher, delivery.authenticated)
        # the event's seq belongs to the envelope it carried (a key envelope releases others')
        seq = None if envelope.get("kind") == "key_distributed" else delivery.seq
        for item in heard:
            await self._heard_one(
                topic, item, seq if item.publisher == delivery.publisher else None
            )

    def _own_echo(self, topic: str, delivery: Delivery) -> bool:
        envelope = delivery.payload
        return (
            delivery.publisher == self.node.identity.node_id
            and isinstance(envelope, dict)
            and (topic, envelope.get("message_id")) in self._said
        )

    def _published(self, topic: str, message_id: str) -> None:
        self._said[(topic, message_id)] = None
        if len(self._said) > OWN_ECHOES:
            del self._said[next(iter(self._said))]

    async def _heard_one(self, topic: str, heard: Heard, event_seq: int | None = None) -> None:
        envelope = heard.envelope
        attested = heard.authenticated and is_attested(envelope, heard.publisher)
        if not attested:
            self.stats["unattested"] += 1
        new = await self._record(envelope, heard.publisher, attested, event_seq)
        if new:
            self._tell(EnvelopeHeard(topic, dict(envelope), heard.publisher, int(attested)))
        if new and attested and self.keys is not None and topic != LOBBY_TOPIC:
            followup = await self.keys.followup(envelope)
            if followup is not None:
                await self.node.publish(self.realm_of(topic), topic, followup)
        if new and attested and topic == LOBBY_TOPIC and envelope["kind"] == "room_opened":
            refs = envelope.get("refs") or []
            if refs and is_room_topic(refs[0]):
                await self.transcript.note_public_room(
                    refs[0], envelope["from"], envelope.get("purpose"), self.clock()
                )
                if self.observing:
                    await self._observe(refs[0])

    def _tell(self, heard: EnvelopeHeard) -> None:
        for observer in list(self.observers):  # must not block: they queue, never await
            try:
                observer(heard)
            except Exception:
                log.exception("a room observer failed")

    async def _record(
        self,
        envelope: Envelope | dict[str, Any],
        publisher: bytes,
        attested: bool,
        event_seq: int | None = None,
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
            event_seq=event_seq,
        )
        if new:
            async with self._changed:
                self._generation += 1
                self._changed.notify_all()
        return new

    # -- operations -----------------------------------------------------------------------------

    async def _publish(
        self, topic: str, kind: str, text: str = "", message_id: str | None = None, **fields: Any
    ) -> Envelope:
        envelope, wire = await self._sealed(topic, kind, text, message_id, **fields)
        await self._record_own(envelope)
        # confirmed: a station stopped right after this call returns still has it (history)
        await self.node.publish_confirmed(self.realm_of(topic), topic, wire)
        return envelope

    async def _sealed(
        self, topic: str, kind: str, text: str, message_id: str | None, **fields: Any
    ) -> tuple[Envelope, dict[str, Any]]:
        """Our envelope, and what to publish for it (sealed in a private room)."""
        envelope = build_envelope(
            message_id=message_id or new_message_id(self.random(16)),
            room_topic=topic,
            sender=self.node.identity.node_id,
            kind=kind,
            text=text,
            sent_at=self.clock(),
            **fields,
        )
        wire = dict(envelope)
        if self.keys is not None and topic != LOBBY_TOPIC:
            wire = await self.keys.seal(wire)  # sealed in a private room, refused without a key
        return envelope, wire

    async def _record_own(self, envelope: Envelope) -> None:
        # record first: the tap may deliver our own copy later (ignored as a duplicate)
        await self._record(envelope, self.node.identity.node_id, True)
        self._published(envelope["room_topic"], str(envelope["message_id"]))

    async def open(
        self,
        purpose: str | None = None,
        *,
        public: int = 0,
        participants: Sequence[bytes] = (),
        private: int = 0,
        realm: bytes = ZERO_REALM,
    ) -> RoomOpened:
        """A fresh room in ``realm``; ``private`` 1 makes it end-to-end encrypted, keyed for
        ``participants`` (who still have to be rung into it) and never announced."""
        keyed: dict[str, Any] | None = None
        if public and realm != ZERO_REALM:
            raise RoomError(
                "a room in a realm is never announced on central (the all-zero realm, where "
                "non-members would see it): public must be 0"
            )
        if private:
            if public:
                raise RoomError("a private room is never announced on central: public must be 0")
            if self.keys is None:
                raise RoomError("private rooms need the agent's room key store")
            keyed = await self.keys.create(participants, new_message_id(self.random(16)))
            topic = keyed["room_topic"]
        else:
            topic = new_room_topic(self.random(16))
        await self.transcript.join_room(topic, "opener", public, purpose, self.clock(), realm)
        await self._tap(topic, realm)
        if keyed is not None:
            await self.node.publish(realm, topic, keyed)
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
        flags = int(bool(public)), int(bool(private))
        return RoomOpened(topic, opened["message_id"], *flags, realm)

    async def join(self, topic: str, realm: bytes | None = None) -> RoomJoined:
        """Join ``topic`` in ``realm``; None: the realm we know it in (a membership, a ring)."""
        if not is_room_topic(topic):
            raise RoomError(f"{topic!r} is not a room topic (agents.room.<32 lowercase hex>)")
        known = await self.transcript.room_realm(topic)
        if realm is None:
            realm = ZERO_REALM if known is None else known
        member = {m.room_topic: m for m in await self.transcript.joined_rooms()}.get(topic)
        if member is not None and member.realm != realm:
            raise RoomError(
                f"you are in {topic} in realm {member.realm.hex()}, not {realm.hex()}: leave "
                "it first or omit realm"
            )
        newly = await self.transcript.join_room(topic, "participant", 0, None, self.clock(), realm)
        await self._tap(topic, realm)
        self._observed.discard(topic)
        message_id = None
        if newly:
            message_id = (await self._publish(topic, "participant_joined"))["message_id"]
            self.catch_up_soon()  # what was said just before we came (room_opened, ...)
        return RoomJoined(topic, int(not newly), message_id, realm)

    async def leave(self, topic: str, *, close: int = 0, keep_queued: int = 0) -> RoomLeft:
        """Leave ``topic``; what we queued there is sent first when connected, else dropped
        and counted (``keep_queued`` 1, shutting down: kept for the next run instead)."""
        membership = {m.room_topic: m for m in await self.transcript.joined_rooms()}.get(topic)
        if membership is None:
            raise RoomError(f"not in {topic}: nothing to leave (mesh_rooms lists your rooms)")
        if close and membership.role != "opener":
            raise RoomError("only the agent that opened a room can close it; leave it instead")
        kind = "room_closed" if close else "participant_left"
        dropped = 0
        if self.outbox is not None:
            dropped = await self.outbox.settle(topic, drop=int(not keep_queued))
        with contextlib.suppress(MaculaError):
            await self._publish(topic, kind)
        await self.transcript.leave_room(topic, self.clock())
        await self._untap(topic)
        return RoomLeft(topic, int(bool(close)), dropped)

    async def remove(self, topic: str, who: Sequence[bytes]) -> int:
        """Remove ``who`` from a private room we opened: a new key for the others, published on
        the room; returns its epoch. ``who`` cannot read what is said from then on."""
        if self.keys is None:
            raise RoomError("private rooms need the agent's room key store")
        keyed = await self.keys.remove(topic, who, new_message_id(self.random(16)))
        await self.node.publish(self.realm_of(topic), topic, keyed)
        epoch: int = keyed["room_key"]["epoch"]
        return epoch

    async def say(
        self,
        topic: str,
        kind: str,
        text: str,
        *,
        in_reply_to: str | None = None,
        refs: Sequence[str] | None = None,
        wait_reply_seconds: float = 0,
        message_id: str | None = None,
        fit: Fit | None = None,
    ) -> Said:
        """Say ``text`` in a joined room (or central); ``message_id``: one the caller made
        (``new_message_id``), for a mark that must be bound to it (``macula.agent.person``)."""
        if kind not in TALK_KINDS:
            raise RoomError(
                f"kind must be one of {sorted(TALK_KINDS)}; lifecycle kinds are the room tools'"
            )
        if topic != LOBBY_TOPIC and topic not in {
            m.room_topic for m in await self.transcript.joined_rooms()
        }:
            raise RoomError(f"not in {topic}: join it first (mesh_join_room)")
        envelope, wire = await self._sealed(
            topic, kind, text, message_id, in_reply_to=in_reply_to, refs=list(refs or ()) or None
        )
        said, realm = str(envelope["message_id"]), self.realm_of(topic)
        if self.outbox is None:
            await self._record_own(envelope)
            await self.node.publish_confirmed(realm, topic, wire)
            sent = Sent(1, 0)
        else:  # queued while the connection is down: recorded now, published later
            record = functools.partial(self._record_own, envelope)
            sent = await self.outbox.send(topic, realm, said, wire, record)
        if wait_reply_seconds <= 0 or not sent.delivered:  # a queued say waits for nothing
            return Said(topic, said, 0, delivered=sent.delivered, queued=sent.queued)
        heard = await self.wait_unread_all(
            topic,
            wait_reply_seconds,
            after_message_id=said,
            until=lambda batch: answer_index(batch.messages, said) is not None or batch.left > 0,
            fit=fit,
        )
        index = answer_index(heard.messages, said)
        reply = None if index is None else heard.messages[index]
        return Said(topic, said, 1, reply, heard, index, queued=sent.queued)

    def observed(self) -> list[str]:
        """The public rooms tapped by the observer only (not joined), sorted."""
        return sorted(self._observed)
