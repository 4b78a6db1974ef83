"""Rooms in a realm, without a station (issue 13): the transcript's step 3 (the realm stored
with the membership, the realm a ring invited us in), ``Rooms`` tapping and publishing in the
room's realm and dropping deliveries from another, catch-up's realm check, a ring's ``realm``
field, and the station's room history keeping the all-zero realm only."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from macula.agent.catchup import _event_ok
from macula.agent.envelope import build_envelope, new_message_id, new_room_topic
from macula.agent.proof import build_ring, validate_ring
from macula.agent.room.rooms import RoomError, Rooms
from macula.node.node import Node
from macula.node.subscriptions import Delivery
from macula.store.transcript import TranscriptStore
from macula.wire.frames import Publish, new_frame_id
from macula.wire.identity import ZERO_REALM, Identity, realm_tag
from relay.house.history import keepable

NOW_MS = 1_700_000_000_000
REALM = realm_tag("org.example.team")
ME = Identity.generate(os.urandom)
BOB = Identity.generate(os.urandom)


class FakeNode:
    """What ``Rooms`` uses of a node: subscribe and publish, recorded."""

    def __init__(self) -> None:
        self.identity = ME
        self.subscribed: list[tuple[bytes, str]] = []
        self.published: list[tuple[bytes, str, Any]] = []

    async def subscribe(self, realm: bytes, topic: str, buffer: int = 0) -> Any:
        self.subscribed.append((realm, topic))
        return SimpleNamespace(close=_nothing, __aiter__=None)

    async def publish(self, realm: bytes, topic: str, payload: Any, **_: Any) -> int:
        self.published.append((realm, topic, payload))
        return len(self.published)

    publish_confirmed = publish  # the station's confirmation is not what this is about

    async def flush(self, timeout: float = 0) -> dict[str, int]:
        return {}


async def _nothing() -> None:
    return None


def run(tmp_path: Path, body: Callable[[TranscriptStore], Awaitable[None]]) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "transcript.sqlite3") as transcript:
            await body(transcript)

    asyncio.run(scenario())


def test_a_version_2_transcript_gains_the_realm_column(tmp_path: Path) -> None:
    path = tmp_path / "transcript.sqlite3"
    topic = new_room_topic(os.urandom(16))

    async def make_v2() -> None:
        async with await TranscriptStore.open(path):
            pass

    asyncio.run(make_v2())
    with sqlite3.connect(path) as db:  # back to version 2 with one membership
        db.execute("ALTER TABLE memberships DROP COLUMN realm")
        db.execute("DROP TABLE invited_realms")
        db.execute(
            "INSERT INTO memberships (room_topic, role, public, joined_ms) VALUES (?, ?, 0, 1)",
            (topic, "participant"),
        )
        for trigger in ("insert", "delete", "update"):  # and without step 4 (issue 40's index)
            db.execute(f"DROP TRIGGER messages_fts_{trigger}")
        db.execute("DROP TABLE messages_fts")
        db.execute("PRAGMA user_version = 2")

    async def body(transcript: TranscriptStore) -> None:
        assert await transcript.schema_version() == len(TranscriptStore.MIGRATIONS)
        [membership] = await transcript.joined_rooms()
        assert membership.room_topic == topic and membership.realm == ZERO_REALM
        assert await transcript.room_realm(topic) == ZERO_REALM

    run(tmp_path, body)


def test_the_realm_is_stored_with_the_membership(tmp_path: Path) -> None:
    async def body(transcript: TranscriptStore) -> None:
        topic, invited = new_room_topic(os.urandom(16)), new_room_topic(os.urandom(16))
        assert await transcript.room_realm(topic) is None
        assert await transcript.join_room(topic, "opener", 0, None, NOW_MS, REALM)
        # joining again keeps the membership and its realm
        assert not await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        [membership] = await transcript.joined_rooms()
        assert membership.realm == REALM and membership.role == "opener"
        # a ring's realm: the first wins; a membership outranks it
        assert await transcript.note_invited_realm(invited, REALM, NOW_MS)
        assert not await transcript.note_invited_realm(invited, ZERO_REALM, NOW_MS)
        assert await transcript.room_realm(invited) == REALM
        assert await transcript.note_invited_realm(topic, ZERO_REALM, NOW_MS)
        assert await transcript.room_realm(topic) == REALM  # the membership's, not the ring's
        for bad in (b"short", "x" * 32):
            with pytest.raises(ValueError, match="32 bytes"):
                await transcript.join_room(invited, "participant", 0, None, NOW_MS, bad)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="32 bytes"):
                await transcript.note_invited_realm(invited, bad, NOW_MS)  # type: ignore[arg-type]
        # pruned with the transcript
        transcript.bounds = transcript.bounds.__class__(max_rows=10, max_age_ms=1)
        await transcript.prune(NOW_MS + 10)
        assert await transcript.room_realm(invited) is None
        assert await transcript.room_realm(topic) == REALM  # a membership is not pruned

    run(tmp_path, body)


def _envelope(topic: str, text: str, sender: Identity = BOB) -> dict[str, Any]:
    return dict(
        build_envelope(
            message_id=new_message_id(os.urandom(16)),
            room_topic=topic,
            sender=sender.node_id,
            kind="remark_made",
            text=text,
            sent_at=NOW_MS,
        )
    )


def test_rooms_tap_and_publish_in_the_rooms_realm(tmp_path: Path) -> None:
    async def body(transcript: TranscriptStore) -> None:
        node = FakeNode()
        rooms = Rooms(cast(Node, node), transcript, lambda: NOW_MS)
        rooms._group = cast(asyncio.TaskGroup, SimpleNamespace(create_task=_task))
        with pytest.raises(RoomError, match="never announced on central"):
            await rooms.open("p", public=1, realm=REALM)
        opened = await rooms.open("plan", realm=REALM)
        topic = opened.room_topic
        assert opened.realm == REALM and rooms.realm_of(topic) == REALM
        assert node.subscribed == [(REALM, topic)]
        assert [(r, t) for r, t, _ in node.published] == [(REALM, topic)]
        await rooms.say(topic, "remark_made", "hi")
        assert node.published[-1][:2] == (REALM, topic)
        # a delivery from another realm is not the room's: counted, never recorded
        stray = Delivery(ZERO_REALM, topic, BOB.node_id, 1, _envelope(topic, "stray"), True)
        await rooms._heard(topic, stray)
        assert rooms.stats["wrong_realm"] == 1
        good = Delivery(REALM, topic, BOB.node_id, 2, _envelope(topic, "in realm"), True)
        await rooms._heard(topic, good)
        texts = [m.text for m in await transcript.messages(topic)]
        assert "in realm" in texts and "stray" not in texts
        # joining it in another realm while in it is refused; joining again keeps its realm
        with pytest.raises(RoomError, match="leave it first"):
            await rooms.join(topic, ZERO_REALM)
        assert (await rooms.join(topic)).realm == REALM
        # a room a ring invited us to in a realm is joined there
        invited = new_room_topic(os.urandom(16))
        await transcript.note_invited_realm(invited, REALM, NOW_MS)
        joined = await rooms.join(invited)
        assert joined.realm == REALM and node.subscribed[-1] == (REALM, invited)
        assert node.published[-1][:2] == (REALM, invited)
        # a plain room stays in the all-zero realm
        plain = await rooms.open("plain")
        assert plain.realm == ZERO_REALM and node.subscribed[-1] == (ZERO_REALM, plain.room_topic)

    run(tmp_path, body)


def _task(coroutine: Any) -> Any:
    coroutine.close()  # the pump is not under test here
    return SimpleNamespace(cancel=lambda: None)


def test_catch_up_takes_events_of_the_rooms_realm_only() -> None:
    from macula.wire.frames import publication_signable

    topic = new_room_topic(os.urandom(16))
    payload = _envelope(topic, "x")

    def event(realm: bytes) -> dict[str, Any]:
        signable = publication_signable(topic, realm, BOB.node_id, 1, payload)
        return {
            "topic": topic,
            "realm": realm,
            "publisher": BOB.node_id,
            "seq": 1,
            "payload": payload,
            "publisher_sig": BOB.sign(signable),
        }

    assert _event_ok(event(REALM), topic, REALM)
    assert not _event_ok(event(REALM), topic)  # a zero-realm room does not take it
    assert not _event_ok(event(ZERO_REALM), topic, REALM)
    assert _event_ok(event(ZERO_REALM), topic)
    moved = {**event(ZERO_REALM), "realm": REALM}  # signed for another realm
    assert not _event_ok(moved, topic, REALM)


def test_a_ring_names_its_realm() -> None:
    topic = new_room_topic(os.urandom(16))
    plain = build_ring(ME, BOB.node_id, "p", topic, "r1", NOW_MS)
    assert "realm" not in plain
    assert "realm" not in build_ring(ME, BOB.node_id, "p", topic, "r2", NOW_MS, ZERO_REALM)
    ring = build_ring(ME, BOB.node_id, "p", topic, "r3", NOW_MS, REALM)
    assert ring["realm"] == REALM.hex() and validate_ring(ring, BOB.node_id, NOW_MS) == []
    for bad in ("ab", REALM.hex().upper(), 5):
        problems = validate_ring({**ring, "realm": bad}, BOB.node_id, NOW_MS)
        assert any(p.startswith("realm:") for p in problems), (bad, problems)


def test_the_station_history_keeps_the_zero_realm_only() -> None:
    topic = new_room_topic(os.urandom(16))

    def publish(realm: bytes) -> Publish:
        frame = Publish(
            frame_id=new_frame_id(NOW_MS, os.urandom(10)),
            sent_at_ms=NOW_MS,
            topic=topic,
            realm=realm,
            publisher=BOB.node_id,
            seq=1,
            payload=_envelope(topic, "x"),
            published_at_ms=NOW_MS,
        )
        return frame.with_publisher_sig(BOB)

    assert keepable(publish(REALM), NOW_MS) == "not_zero_realm"
    assert not isinstance(keepable(publish(ZERO_REALM), NOW_MS), str)


def test_presence_moves_to_a_realms_lobby(tmp_path: Path) -> None:
    from macula.agent.presence import GOODBYE_TOPIC, HELLO_TOPIC, Presence, Profile
    from macula.store.roster import RosterStore

    class Sub:
        closed = 0

        async def close(self) -> None:
            Sub.closed += 1

        def __aiter__(self) -> Sub:
            return self

        async def __anext__(self) -> Delivery:
            await asyncio.Event().wait()  # nothing arrives
            raise StopAsyncIteration

    node = FakeNode()

    async def subscribe(realm: bytes, topic: str, buffer: int = 0) -> Sub:
        node.subscribed.append((realm, topic))
        return Sub()

    node.subscribe = subscribe  # type: ignore[method-assign, assignment]

    async def scenario() -> None:
        async with await RosterStore.open(tmp_path / "roster.sqlite3") as roster:
            presence = Presence(cast(Node, node), roster, Profile(), lambda: NOW_MS)
            async with asyncio.TaskGroup() as group:
                await presence.start(group)
                await presence.beat()
                assert node.subscribed == [(ZERO_REALM, HELLO_TOPIC), (ZERO_REALM, GOODBYE_TOPIC)]
                await presence.start(group, realm=REALM)
                assert Sub.closed == 2  # the zero realm's feeds ended
                assert node.subscribed[2:] == [(REALM, HELLO_TOPIC), (REALM, GOODBYE_TOPIC)]
                await presence.beat()
                assert node.published[-1][:2] == (REALM, HELLO_TOPIC)
                await presence.start(group)  # no realm given: stays where it is
                assert len(node.subscribed) == 4 and presence.realm == REALM
                await presence.goodbye()
                assert node.published[-1][:2] == (REALM, GOODBYE_TOPIC)

    asyncio.run(scenario())
