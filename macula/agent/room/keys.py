"""``RoomKeys``: a private room's keys as one agent holds them — making, sealing, receiving.

Invariants:
- Only a room's opener makes its keys (the topic is bound to it, ``room_crypto``): epoch 1 when
  the room opens, the next epoch whenever the participants change (someone leaves, is removed or
  is added). Each key is sealed to every participant and to the opener.
- How keys travel: to an invitee by RPC on its ring endpoint just before the ring (so it holds
  the key, and knows the room is private, before it joins or says a word; the opener learns
  whether it arrived); every new epoch on the room topic (one publish reaches every
  participant, ahead of the opener's messages sealed with it, and the station's history keeps
  it for catch-up); the current one again when a participant's ``participant_joined`` arrives.
- Sending: in a room we hold a key for, every envelope is sealed with the current key. Without
  one (removed), only a bare lifecycle envelope goes out, in the clear; talk is refused.
- Receiving: a key envelope is accepted only if signed by the room's opener and attested as
  sent by it, and only forward (an older epoch is refused). A sealed envelope opens only with
  its epoch's key, from a sender that key was sealed to and who still holds the current one;
  one of an epoch we hold no key for is held (counted ``undecryptable``) and opened when the
  key comes, never shown. Tampered or misbound ones are counted and dropped. In a private room
  a plaintext envelope is accepted only as a bare lifecycle one (no text, no fields).
- Counters in ``stats``; keys are never logged.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from macula.agent.envelope import KEY_KIND, SEALABLE, validate
from macula.agent.room.crypto import (
    KEY_BYTES,
    NONCE_BYTES,
    SALT_BYTES,
    RoomCryptoError,
    build_key_envelope,
    key_envelope_problems,
    open_body,
    open_key_envelope,
    recipients_of,
    seal_body,
    x25519_public,
)
from macula.errors import MaculaError
from macula.store.room_keys import Advanced, PrivateRoom, RoomKeyStore
from macula.wire.identity import Identity

DEFAULT_MAX_RECIPIENTS: Final = 64
BARE_LIFECYCLE: Final = frozenset({"participant_joined", "participant_left", "room_closed"})
ROOM_KEY_CALL: Final = "room_key"  # the ring endpoint's payload kind for an invitee's key


class RoomKeyError(MaculaError):
    """A private-room operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class KeyAccepted:
    outcome: Advanced | str  # advanced, duplicate, stale, conflict, or refused
    keyed: int  # 1 when the key of that epoch was sealed to us
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Heard:
    """A plaintext envelope to record, with the publisher and authentication it came with."""

    envelope: dict[str, Any]
    publisher: bytes
    authenticated: bool


class RoomKeys:
    def __init__(
        self,
        identity: Identity,
        store: RoomKeyStore,
        clock: Callable[[], int],
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        max_recipients: int = DEFAULT_MAX_RECIPIENTS,
    ) -> None:
        self.identity = identity
        self.store = store
        self.clock = clock
        self.random = random_bytes
        self.max_recipients = max_recipients
        self.me = identity.node_id.hex()
        self.stats: Counter[str] = Counter()
        self._rekeying = asyncio.Lock()  # one new epoch at a time (a leave and a removal race)

    # -- the opener ---------------------------------------------------------------------------

    async def create(self, participants: Sequence[bytes], message_id: str) -> dict[str, Any]:
        """A fresh private room: epoch 1 sealed to ``participants`` and us; its key envelope."""
        salt = self.random(SALT_BYTES)
        return await self._distribute(salt, 1, participants, message_id)

    async def rekey(
        self, topic: str, participants: Sequence[bytes], message_id: str
    ) -> dict[str, Any]:
        """The next epoch of a room we opened, sealed to ``participants`` (and us)."""
        async with self._rekeying:
            return await self._rekey(await self._opened(topic), participants, message_id)

    async def _rekey(
        self, room: PrivateRoom, participants: Sequence[bytes], message_id: str
    ) -> dict[str, Any]:
        salt = bytes.fromhex(json.loads(room.key_envelope)["room_key"]["salt"])
        return await self._distribute(salt, room.epoch + 1, participants, message_id)

    async def remove(self, topic: str, who: Sequence[bytes], message_id: str) -> dict[str, Any]:
        """The next epoch without ``who``: they cannot open what is said from now on."""
        gone = {node.hex() for node in who}
        async with self._rekeying:
            room = await self._opened(topic)
            if self.me in gone:
                raise RoomKeyError("you opened this room: close it instead of removing you")
            missing = sorted(gone - set(room.recipients))
            if missing:
                raise RoomKeyError(f"not participants of {topic}: {', '.join(missing)}")
            remaining = [bytes.fromhex(n) for n in room.recipients if n not in gone]
            return await self._rekey(room, remaining, message_id)

    async def invitation(
        self, topic: str, invitee: bytes, message_id: str
    ) -> tuple[dict[str, Any] | None, int]:
        """The key envelope to hand ``invitee`` before ringing it into ``topic`` (None for a
        room that is not private), and 1 when it took a new epoch to add them (publish it)."""
        room = await self.store.room(topic)
        if room is None:
            return None, 0
        if room.role != "opener":
            raise RoomKeyError(
                f"{topic} is private and only its opener can invite into it; ask them to ring"
            )
        if invitee.hex() in room.recipients:
            return json.loads(room.key_envelope), 0
        everyone = [bytes.fromhex(n) for n in room.recipients] + [invitee]
        return await self.rekey(topic, everyone, message_id), 1

    async def _opened(self, topic: str) -> PrivateRoom:
        room = await self.store.room(topic)
        if room is None:
            raise RoomKeyError(f"{topic} is not a private room of yours")
        if room.role != "opener":
            raise RoomKeyError(f"only the opener of {topic} changes its participants")
        return room

    async def _distribute(
        self, salt: bytes, epoch: int, participants: Sequence[bytes], message_id: str
    ) -> dict[str, Any]:
        recipients = list(dict.fromkeys([self.identity.node_id, *participants]))
        if len(recipients) > self.max_recipients:
            raise RoomKeyError(f"a private room has at most {self.max_recipients} participants")
        for node in recipients:
            try:
                x25519_public(node)
            except RoomCryptoError as exc:
                raise RoomKeyError(f"{node.hex()}: {exc}") from None
        envelope = build_key_envelope(
            self.identity,
            message_id=message_id,
            salt=salt,
            epoch=epoch,
            key=self.random(KEY_BYTES),
            recipients=recipients,
            sent_at=self.clock(),
        )
        accepted = await self.accept(envelope, self.identity.node_id)
        if accepted.outcome != "advanced" or not accepted.keyed:
            raise RoomKeyError(f"the new room key was not kept ({accepted.outcome})")
        return envelope

    # -- everyone -------------------------------------------------------------------------------

    async def accept(self, envelope: object, attested_sender: bytes | None) -> KeyAccepted:
        """Take a key envelope (from the room topic or an invitation by RPC)."""
        problems = key_envelope_problems(envelope, attested_sender)
        own = None
        if not problems:
            assert isinstance(envelope, dict)
            try:
                own = open_key_envelope(envelope, self.identity)
            except RoomCryptoError as exc:
                problems = [str(exc)]
        if problems:
            self.stats["key_envelopes_refused"] += 1
            return KeyAccepted("refused", 0, tuple(problems))
        assert isinstance(envelope, dict)
        room_key = envelope["room_key"]
        outcome = await self.store.advance(
            topic=envelope["room_topic"],
            opener_hex=envelope["from"],
            role="opener" if envelope["from"] == self.me else "participant",
            epoch=room_key["epoch"],
            key_id=room_key["key_id"],
            recipients=recipients_of(envelope),
            key_envelope=json.dumps(envelope, sort_keys=True),
            key=own,
            now_ms=self.clock(),
        )
        self.stats[f"key_envelopes_{outcome}"] += 1
        if outcome == "advanced" and own is None:
            self.stats["epochs_without_our_key"] += 1  # we were removed
        return KeyAccepted(outcome, int(own is not None))

    async def is_private(self, topic: str) -> bool:
        return await self.store.room(topic) is not None

    async def seal(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """What to publish for ``envelope``: itself in a room that is not private, else sealed
        with the current key; ``RoomKeyError`` when we hold none and it is not bare lifecycle."""
        room = await self.store.room(envelope["room_topic"])
        if room is None:
            return dict(envelope)
        key = await self.store.key(room.room_topic, room.epoch)
        if key is None:
            if _bare_lifecycle(envelope):
                return dict(envelope)
            raise RoomKeyError(
                f"{room.room_topic} is private and you hold no key for its epoch {room.epoch}: "
                "you were removed, or the key has not reached you yet (ask its opener to ring you)"
            )
        return seal_body(envelope, key, self.random(NONCE_BYTES))

    async def receive(
        self, envelope: dict[str, Any], publisher: bytes, authenticated: bool
    ) -> list[Heard]:
        """What a valid envelope heard on a room topic comes to: the plaintext envelopes to
        record (none for a key envelope, a held or a refused one; more when a key releases
        held ones)."""
        topic = envelope["room_topic"]
        if envelope["kind"] == KEY_KIND:
            if not authenticated:
                self.stats["key_envelopes_refused"] += 1
                return []
            accepted = await self.accept(envelope, publisher)
            if accepted.outcome == "advanced" and accepted.keyed:
                return await self._release(topic, envelope["room_key"]["epoch"])
            return []
        if "cipher" in envelope:
            if not authenticated:
                self.stats["sealed_unauthenticated"] += 1
                return []
            opened = await self._open(envelope, publisher)
            return [] if opened is None else [Heard(opened, publisher, True)]
        if await self.store.room(topic) is not None and not _bare_lifecycle(envelope):
            self.stats["plaintext_refused"] += 1
            return []
        return [Heard(envelope, publisher, authenticated)]

    async def followup(self, envelope: dict[str, Any]) -> dict[str, Any] | None:
        """What the opener publishes after an attested plaintext ``envelope`` from someone
        else: the current key again for a participant who joined, a new epoch when one left."""
        room = await self.store.room(envelope["room_topic"])
        sender = envelope["from"]
        if room is None or room.role != "opener" or sender == self.me:
            return None
        if sender not in room.recipients:
            return None
        if envelope["kind"] == "participant_joined":
            return dict(json.loads(room.key_envelope))
        if envelope["kind"] != "participant_left":
            return None
        async with self._rekeying:
            room = await self._opened(room.room_topic)  # as it is now (a removal may have run)
            if sender not in room.recipients:
                return None
            remaining = [bytes.fromhex(n) for n in room.recipients if n != sender]
            return await self._rekey(room, remaining, self.random(16).hex())

    async def undecryptable(self, topic: str) -> int:
        return await self.store.count_held(topic)

    async def _open(self, envelope: dict[str, Any], publisher: bytes) -> dict[str, Any] | None:
        topic = envelope["room_topic"]
        epoch = envelope["cipher"]["epoch"]
        key = await self.store.key(topic, epoch)
        if key is None:
            self.stats["undecryptable"] += 1
            await self.store.hold(
                topic,
                envelope["message_id"],
                epoch,
                json.dumps(envelope, sort_keys=True),
                publisher,
                self.clock(),
            )
            return None
        try:
            opened = open_body(envelope, key)
        except RoomCryptoError as exc:
            self.stats[f"sealed_refused_{str(exc).replace(' ', '_')}"] += 1
            return None
        room = await self.store.room(topic)
        sender = opened["from"]
        if sender not in key.recipients or (
            room is not None and room.epoch != epoch and sender not in room.recipients
        ):
            self.stats["sealed_from_non_participant"] += 1
            return None
        return opened

    async def _release(self, topic: str, epoch: int) -> list[Heard]:
        released = []
        for held in await self.store.held(topic, epoch):
            await self.store.release(topic, held.message_id)
            envelope = json.loads(held.envelope)
            if validate(envelope):
                continue
            opened = await self._open(envelope, held.publisher)
            if opened is not None:
                released.append(Heard(opened, held.publisher, True))
        return released


def _bare_lifecycle(envelope: dict[str, Any]) -> bool:
    """A lifecycle envelope that says nothing (no text, no optional field)."""
    return (
        envelope.get("kind") in BARE_LIFECYCLE
        and envelope.get("text") == ""
        and not any(key in envelope for key in (*SEALABLE[1:], "cipher", "room_key"))
    )
