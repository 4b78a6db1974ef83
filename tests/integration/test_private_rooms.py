"""Private rooms over a real station: a third node subscribed to the room's topic at the wire
level receives only ciphertext; a removed participant cannot read what follows; the lobby never
shows the room to anyone not invited."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from macula.agent.room.keys import RoomKeyError
from macula.node.node import Node
from macula.node.subscriptions import Delivery
from macula.wire.identity import ZERO_REALM
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import agent_in
from support.waiting import eventually

pytestmark = pytest.mark.anyio

ASKED = "private-question-7f3a: is the migration safe?"
ANSWERED = "private-answer-9c1e: yes, behind the flag"
AFTER = "private-after-removal-41d2: bob must not read this"
TO_CAROL = "private-to-the-rest-5b77"


async def test_wire_sees_ciphertext_and_a_removed_participant_reads_nothing_more(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent_in(station, tmp_path / "alice") as alice,
        agent_in(station, tmp_path / "bob", "open") as bob,
        agent_in(station, tmp_path / "carol", "open") as carol,
        Node(new_identity(), [station.endpoint]) as eve,
    ):
        for a in (alice, bob, carol):
            await a.hello()
        await bob.node.flush()
        bob_id = bob.node.identity.node_id

        rung = await alice.rings.ring(bob_id, "the migration", private=1, wait_join_seconds=5)
        assert (rung.answer, rung.joined, rung.unreachable) == (1, 1, 0)
        room = rung.room_topic
        assert await bob.rooms.keys.is_private(room)  # type: ignore[union-attr]

        # eve learned the topic and subscribes at the wire level
        heard: list[Delivery] = []
        tap = await eve.subscribe(ZERO_REALM, room)

        async def pump() -> None:
            async for delivery in tap:
                heard.append(delivery)

        pumping = asyncio.create_task(pump())
        await eve.flush()

        asked = await alice.rooms.say(room, "question_asked", ASKED)
        got = await bob.rooms.wait(room, 5, after_ms=0, kinds={"question_asked"})
        assert got is not None and got.text == ASKED and got.attested == 1
        await bob.rooms.say(room, "answer_given", ANSWERED, in_reply_to=asked.message_id)
        reply = await alice.rooms.wait(room, 5, after_ms=0, kinds={"answer_given"})
        assert (
            reply is not None and reply.text == ANSWERED and reply.in_reply_to == asked.message_id
        )

        # alice removes bob: a new key for the rest; bob learns the epoch but not its key
        epoch = await alice.rooms.remove(room, [bob_id])
        assert epoch == 2  # bob was keyed at opening (epoch 1), so ringing him took no new one
        bob_keys = bob.rooms.keys
        assert bob_keys is not None

        async def bob_saw_the_new_epoch() -> bool:
            room_state = await bob_keys.store.room(room)
            return room_state is not None and room_state.epoch == epoch

        await eventually(bob_saw_the_new_epoch)
        await alice.rooms.say(room, "remark_made", AFTER)
        await eventually(lambda: bob_keys.stats["undecryptable"] >= 1)
        bob_texts = [m.text for m in await bob.rooms.transcript.messages(room, limit=500)]
        assert ASKED in bob_texts and AFTER not in bob_texts
        assert AFTER not in json.dumps((await bob.inbox()).rooms[0].messages)
        with pytest.raises(RoomKeyError, match="no key"):
            await bob.rooms.say(room, "remark_made", "can I still talk?")

        # what eve received: every envelope, each sealed, none of the words
        await eventually(lambda: sum("cipher" in _payload(d) for d in heard) >= 3)
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pumping
        wire = json.dumps([d.payload for d in heard])
        for secret in (ASKED, ANSWERED, AFTER, "the migration"):
            assert secret not in wire
        talk = [_payload(d) for d in heard if _payload(d).get("kind") != "key_distributed"]
        assert talk and all("cipher" in p and p["text"] == "" for p in talk)
        keyed = [_payload(d) for d in heard if _payload(d).get("kind") == "key_distributed"]
        assert keyed and all(bob_id.hex() not in p["room_key"]["sealed"] for p in keyed[-1:])

        # carol, not invited, never sees the room in the lobby; joining its topic gets her
        # nothing readable, and what she says in the clear there is refused
        assert room not in {r.room_topic for r in await carol.rooms.transcript.seen_rooms()}
        await carol.rooms.join(room)
        await alice.rooms.say(room, "remark_made", TO_CAROL)
        alice_keys = alice.rooms.keys
        assert alice_keys is not None
        await carol.rooms.say(room, "remark_made", "let me in")
        await eventually(lambda: alice_keys.stats["plaintext_refused"] >= 1)
        await eventually(lambda: carol.rooms.keys.stats["undecryptable"] >= 1)  # type: ignore[union-attr]
        carol_texts = [m.text for m in await carol.rooms.transcript.messages(room, limit=500)]
        assert TO_CAROL not in carol_texts
        alice_texts = [m.text for m in await alice.rooms.transcript.messages(room, limit=500)]
        assert "let me in" not in alice_texts


def _payload(delivery: Delivery) -> dict[str, Any]:
    return delivery.payload if isinstance(delivery.payload, dict) else {}


async def test_a_participant_who_leaves_triggers_a_new_key(
    station: Station, tmp_path: Path
) -> None:
    async with (
        agent_in(station, tmp_path / "alice") as alice,
        agent_in(station, tmp_path / "bob", "open") as bob,
        agent_in(station, tmp_path / "dave", "open") as dave,
    ):
        for a in (alice, bob, dave):
            await a.hello()
        ids = [bob.node.identity.node_id, dave.node.identity.node_id]
        opened = await alice.rooms.open("pair", private=1, participants=ids)
        room = opened.room_topic
        assert opened.private == 1 and opened.public == 0
        for callee in ids:
            rung = await alice.rings.ring(callee, "pair", room_topic=room, wait_join_seconds=5)
            assert rung.joined == 1
        await bob.rooms.leave(room)
        alice_keys, bob_keys, dave_keys = alice.rooms.keys, bob.rooms.keys, dave.rooms.keys
        assert alice_keys is not None and bob_keys is not None and dave_keys is not None

        async def dave_has_epoch_2() -> bool:
            return await dave_keys.store.key(room, 2) is not None

        await eventually(dave_has_epoch_2)
        await alice.rooms.say(room, "remark_made", AFTER)
        got = await dave.rooms.wait(room, 5, after_ms=0, kinds={"remark_made"})
        assert got is not None and got.text == AFTER
        state = await alice_keys.store.room(room)
        assert state is not None and state.epoch == 2
        assert bob.node.identity.node_id.hex() not in state.recipients
        assert await bob_keys.store.key(room, 2) is None
