"""Unread marks and catch-up in ``Rooms``, without a station: the transcript the taps fill,
and a history source that answers like ``macula.history.fetch_v1``."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from macula.agent.catchup import CatchUp
from macula.agent.envelope import LOBBY_TOPIC, new_room_topic
from macula.agent.room.rooms import RoomError, Rooms
from macula.node.node import Node
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.wire.frames import publication_signable
from macula.wire.identity import ZERO_REALM, Identity
from support.roomkit import BOB, CAROL, ME, NOW_MS, envelope, rooms_of, said

STATION = bytes([5]) * 32


def run_in(tmp_path: Path, body: Any) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "transcript.sqlite3") as transcript:
            await body(rooms_of(transcript), transcript)

    asyncio.run(scenario())


def test_an_answer_that_came_before_the_wait_is_returned_at_once(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        question = await said(rooms, topic, ME, "what is 2+2?", kind="question_asked")
        answer = await said(rooms, topic, BOB, "4", kind="answer_given", in_reply_to=question)
        hit = await asyncio.wait_for(rooms.wait_unread(topic, 3600), 2.0)
        assert hit is not None and hit.message_id == answer
        assert await rooms.wait_unread(topic, 0.05) is None  # read now: nothing more

    run_in(tmp_path, body)


def test_waits_return_unread_messages_oldest_first_then_wait(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        first = await said(rooms, topic, BOB, "one")
        await said(rooms, topic, ME, "mine are never unread")
        second = await said(rooms, topic, CAROL, "two")
        assert await transcript.unread_counts(ME.node_id.hex()) == {topic: 2}
        got = [await rooms.wait_unread(topic, 1) for _ in range(2)]
        assert [m.message_id for m in got if m] == [first, second]
        waiter = asyncio.create_task(rooms.wait_unread(topic, 5))
        await asyncio.sleep(0)  # one loop turn: the waiter reads (nothing unread) first
        third = await said(rooms, topic, BOB, "three")
        hit = await asyncio.wait_for(waiter, 2.0)
        assert hit is not None and hit.message_id == third
        assert await transcript.unread_counts(ME.node_id.hex()) == {}

    run_in(tmp_path, body)


def test_after_message_id_waits_for_what_follows_that_envelope(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        early = await said(rooms, topic, BOB, "before the question")
        question = await said(rooms, topic, ME, "question?", kind="question_asked")
        answer = await said(rooms, topic, BOB, "answer", kind="answer_given", in_reply_to=question)
        hit = await rooms.wait_unread(topic, 1, after_message_id=question)
        assert hit is not None and hit.message_id == answer
        again = await rooms.wait_unread(topic, 1, after_message_id=question)  # read or not
        assert again is not None and again.message_id == answer
        oldest = await rooms.wait_unread(topic, 1)  # the earlier one is still unread
        assert oldest is not None and oldest.message_id == early
        assert await rooms.wait_unread(topic, 0.05, after_message_id=answer) is None
        with pytest.raises(RoomError, match="not a message recorded"):
            await rooms.wait_unread(topic, 1, after_message_id="nosuchmessage")
        other = new_room_topic(os.urandom(16))
        with pytest.raises(RoomError, match="not a message recorded"):
            await rooms.wait_unread(other, 1, after_message_id=question)  # another room's

    run_in(tmp_path, body)


def test_say_waits_for_the_reply_after_its_own_envelope(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        await said(rooms, topic, BOB, "old news")
        published: list[dict[str, Any]] = []
        replies: list[asyncio.Task[str]] = []

        async def publish(realm: bytes, topic_: str, payload: dict[str, Any]) -> int:
            published.append(payload)
            answer = said(
                rooms, topic, BOB, "reply", kind="answer_given", in_reply_to=payload["message_id"]
            )
            replies.append(asyncio.create_task(answer))  # bob answers while we wait
            return 1

        rooms.node = cast(Node, SimpleNamespace(identity=ME, publish_confirmed=publish))
        done = await rooms.say(topic, "question_asked", "well?", wait_reply_seconds=5)
        assert done.reply is not None and done.reply.text == "reply"
        assert done.reply.in_reply_to == published[0]["message_id"]
        old = await rooms.wait_unread(topic, 1)  # the reply did not swallow the older unread
        assert old is not None and old.text == "old news"

    run_in(tmp_path, body)


def test_a_message_recorded_between_the_check_and_the_wait_is_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        look = transcript.take_unread
        looks = 0
        arrived: list[str] = []

        async def look_then_arrive(
            *args: Any, **kwargs: Any
        ) -> tuple[list[TranscriptMessage], int]:
            nonlocal looks
            found = await look(*args, **kwargs)
            looks += 1
            if looks == 1:  # the check saw nothing; the tap records before the wait begins
                arrived.append(await said(rooms, topic, BOB, "arrived in the gap"))
            return found

        monkeypatch.setattr(transcript, "take_unread", look_then_arrive)
        hit = await asyncio.wait_for(rooms.wait_unread(topic, 3600), 2.0)
        assert hit is not None and hit.message_id == arrived[0]
        assert looks == 2

    run_in(tmp_path, body)


def test_two_waiters_never_get_the_same_message(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        waiters = [asyncio.create_task(rooms.wait_unread(topic, 5)) for _ in range(2)]
        await asyncio.sleep(0.01)  # (let both start waiting; the claim holds either way)
        sent = {await said(rooms, topic, BOB, "a"), await said(rooms, topic, BOB, "b")}
        got = await asyncio.wait_for(asyncio.gather(*waiters), 3.0)
        assert {m.message_id for m in got if m} == sent

    run_in(tmp_path, body)


def test_inbox_marks_what_it_shows_read_unless_peeking(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        await said(rooms, topic, BOB, "hello")
        await said(rooms, LOBBY_TOPIC, BOB, "anyone?", kind="help_requested")
        peeked = await rooms.inbox(peek=1)
        assert peeked.rooms[0].unread == 1
        again = await rooms.inbox()
        assert again.rooms[0].unread == 1 and len(again.rooms[0].messages) == 1
        assert [m.text for m in again.central_help] == ["anyone?"]
        after = await rooms.inbox()  # everything was read: an empty page, nothing remains
        assert (after.rooms, after.central_help, after.remaining) == ([], [], 0)
        assert await transcript.unread_counts(ME.node_id.hex()) == {}
        assert await rooms.wait_unread(topic, 0.05) is None
        assert await rooms.wait_unread(LOBBY_TOPIC, 0.05) is None

    run_in(tmp_path, body)


def test_messages_recorded_before_the_upgrade_count_as_read(tmp_path: Path) -> None:
    path = tmp_path / "transcript.sqlite3"
    topic = new_room_topic(os.urandom(16))
    with sqlite3.connect(path) as db:  # a version-1 transcript with one message from bob
        from macula.store.transcript import _TRANSCRIPT_V1

        for statement in _TRANSCRIPT_V1:
            db.execute(statement)
        db.execute(
            "INSERT INTO messages (room_topic, message_id, from_hex, kind, sent_at, received_ms,"
            " attested, envelope) VALUES (?, 'm1', ?, 'remark_made', 1, 1, 1, '{}')",
            (topic, BOB.node_id.hex()),
        )
        db.execute("PRAGMA user_version = 1")

    async def scenario() -> None:
        async with await TranscriptStore.open(path) as transcript:
            assert await transcript.schema_version() == len(TranscriptStore.MIGRATIONS)
            assert await transcript.unread_counts(ME.node_id.hex()) == {}
            assert len(await transcript.messages(topic)) == 1

    asyncio.run(scenario())


# -- catch-up -------------------------------------------------------------------------------


class FakeHistory:
    """Pages like the station's history, from a list of (id, event-or-mark) it is given."""

    def __init__(self, topic: str = "") -> None:
        self.topic = topic  # the one room it holds history of
        self.items: list[tuple[int, dict[str, Any]]] = []
        self.forgotten = (0, 0)
        self.calls: list[dict[str, Any]] = []
        self.page = 2

    async def call(self, procedure: str, payload: Any) -> Any:
        self.calls.append(payload)
        held = self.items if payload["topic"] == self.topic else []
        later = [(i, item) for i, item in held if i > payload["after_id"]]
        taken, rest = later[: self.page], later[self.page :]
        count, through = self.forgotten
        counted = count if through > payload["after_id"] and held else 0
        return {
            "events": [item for _, item in taken if "payload" in item],
            "expired": [item for _, item in taken if "payload" not in item],
            "next_after_id": taken[-1][0] if taken else payload["after_id"],
            "more": int(bool(rest)),
            "forgotten": counted,
            "forgotten_through_id": through if counted else 0,
        }


def event(topic: str, who: Identity, env: dict[str, Any], *, seq: int) -> dict[str, Any]:
    sig = who.sign(publication_signable(topic, ZERO_REALM, who.node_id, seq, env))
    return {
        "topic": topic,
        "realm": ZERO_REALM,
        "publisher": who.node_id,
        "seq": seq,
        "payload": env,
        "publisher_sig": sig,
    }


def test_catch_up_records_verified_history_once_and_counts_what_expired(
    tmp_path: Path,
) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        history = FakeHistory(topic)

        async def station() -> bytes:
            return STATION

        catch_up = CatchUp(rooms, history, station, page=2)
        live = envelope(topic, BOB, "heard live")
        await rooms._record(live, BOB.node_id, True, 11)
        missed = [envelope(topic, BOB, f"missed {n}") for n in range(3)]
        forged = event(topic, CAROL, envelope(topic, CAROL, "forged"), seq=30)
        forged["payload"] = envelope(topic, CAROL, "swapped after signing")
        wrong_room = event(LOBBY_TOPIC, BOB, envelope(topic, BOB, "wrong topic"), seq=31)
        history.items = [
            (1, {"publisher": BOB.node_id, "seq": 10}),  # expired, never heard: lost
            (2, {"publisher": BOB.node_id, "seq": 11}),  # expired, but heard live: not lost
            (3, {"publisher": ME.node_id, "seq": 12}),  # our own: never lost
            (4, event(topic, BOB, live, seq=11)),  # heard live already: kept once
            (5, event(topic, BOB, missed[0], seq=20)),
            (6, forged),
            (7, event(topic, BOB, missed[1], seq=21)),
            (8, wrong_room),
            (9, event(topic, BOB, missed[2], seq=22)),
        ]
        history.forgotten = (4, 1)
        assert await catch_up.run() == 3
        texts = [m.text for m in await transcript.messages(topic)]
        assert sorted(texts) == sorted(["heard live", "missed 0", "missed 1", "missed 2"])
        assert catch_up.stats["rejected_events"] == 2
        assert (await transcript.gaps()) == {topic: 1 + 4}
        assert await transcript.catchup_mark(topic, STATION) == 9
        # a second run starts from the mark: nothing new, nothing counted twice
        history.calls.clear()
        assert await catch_up.run() == 0
        assert [c["after_id"] for c in history.calls if c["topic"] == topic] == [9]
        assert (await transcript.gaps()) == {topic: 5}
        unread = await transcript.unread_counts(ME.node_id.hex())
        assert unread == {topic: 4}  # what catch-up brought is unread, like a live message
        first = await rooms.wait_unread(topic, 0.1)
        assert first is not None and first.text == "heard live"

    run_in(tmp_path, body)


def test_catch_up_reads_a_new_station_from_when_we_joined(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS - 1000)
        history = FakeHistory()

        async def station() -> bytes:
            return STATION

        await CatchUp(rooms, history, station).run()
        asked = {c["topic"]: c for c in history.calls}
        assert asked[topic]["after_id"] == 0
        assert 0 < asked[topic]["since_ms"] < NOW_MS - 1000
        assert asked[LOBBY_TOPIC]["since_ms"] < NOW_MS

    run_in(tmp_path, body)


def test_catch_up_survives_a_source_that_fails_or_answers_nonsense(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        from macula.errors import BrokenError

        class Broken:
            async def call(self, procedure: str, payload: Any) -> Any:
                raise BrokenError("no station")

        class Nonsense:
            async def call(self, procedure: str, payload: Any) -> Any:
                return {"events": "nope"}

        async def station() -> bytes:
            return STATION

        broken = CatchUp(rooms, Broken(), station)
        assert await broken.run() == 0 and broken.stats["failed"] == 1
        nonsense = CatchUp(rooms, Nonsense(), station)
        assert await nonsense.run() == 0 and nonsense.stats["bad_pages"] == 1

        class Flood(FakeHistory):  # more items than asked for: refused whole
            async def call(self, procedure: str, payload: Any) -> Any:
                marks = [{"publisher": BOB.node_id, "seq": n} for n in range(5)]
                return await super().call(procedure, payload) | {"expired": marks}

        flood = CatchUp(rooms, Flood(LOBBY_TOPIC), station, page=2)
        assert await flood.run() == 0 and flood.stats["bad_pages"] == 1
        assert await transcript.gaps() == {}
        assert await transcript.catchup_mark(LOBBY_TOPIC, STATION) is None

    run_in(tmp_path, body)


def test_a_failed_catch_up_is_tried_again_until_the_history_answers(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        from macula.errors import BrokenError

        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        missed = envelope(topic, BOB, "said while the station restarted")

        class NotYet(FakeHistory):  # no history service found yet, twice; then it answers
            failures = 2

            async def call(self, procedure: str, payload: Any) -> Any:
                if self.failures:
                    self.failures -= 1
                    raise BrokenError("macula.history.fetch_v1: nobody serves it yet")
                return await super().call(procedure, payload)

        history = NotYet(topic)
        history.items = [(1, event(topic, BOB, missed, seq=5))]
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        async def station() -> bytes:
            return STATION

        catch_up = CatchUp(rooms, history, station)
        assert await catch_up.run_until_done(sleep) == 1
        assert (catch_up.stats["failed"], catch_up.stats["retried"], catch_up.failed) == (2, 2, 0)
        assert slept == [0.25, 0.5]
        [message] = await transcript.messages(topic)
        assert message.text == "said while the station restarted"

        class Never:
            async def call(self, procedure: str, payload: Any) -> Any:
                raise BrokenError("no station")

        gone = CatchUp(rooms, Never(), station)
        slept.clear()
        assert await gone.run_until_done(sleep) == 0 and gone.failed == 1
        assert len(slept) == 8 and sum(slept) < 65  # bounded: then the next reconnect tries

    run_in(tmp_path, body)
