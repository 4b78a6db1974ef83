"""One wait takes every unread message at once (``Rooms.wait_unread_all``,
``TranscriptStore.take_unread``), capped by count and size with the rest counted; a notice
never answers (``answer_index``); ``say``'s wait returns once an answer is there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from macula.agent.envelope import new_room_topic
from macula.agent.room.rooms import Rooms
from macula.agent.room.waits import answer_index
from macula.node.node import Node
from macula.store.transcript import TranscriptStore
from support.roomkit import BOB, CAROL, ME, NOW_MS, envelope, said
from support.storekit import trips as trips_of
from support.waiting import eventually


def run_in(tmp_path: Path, body: Any) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "transcript.sqlite3") as transcript:
            node = cast(Node, SimpleNamespace(identity=ME))
            await body(Rooms(node, transcript, lambda: NOW_MS), transcript)

    asyncio.run(scenario())


def test_every_unread_message_at_once_oldest_first_capped_with_the_rest_counted(
    tmp_path: Path,
) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        joined = await said(rooms, topic, BOB, "", kind="participant_joined")
        await said(rooms, topic, ME, "mine are never unread")
        answer = await said(rooms, topic, BOB, "4", kind="answer_given", in_reply_to="q1")
        batch = await asyncio.wait_for(rooms.wait_unread_all(topic, 3600), 2.0)
        assert [m.message_id for m in batch.messages] == [joined, answer] and batch.left == 0
        assert (await rooms.wait_unread_all(topic, 0.05)).messages == []  # all marked read

        sent = [await said(rooms, topic, CAROL, f"n{i}") for i in range(5)]
        capped = await rooms.wait_unread_all(topic, 1, limit=3)
        assert [m.message_id for m in capped.messages] == sent[:3] and capped.left == 2
        rest = await rooms.wait_unread_all(topic, 1)
        assert [m.message_id for m in rest.messages] == sent[3:] and rest.left == 0

        big = [await said(rooms, topic, BOB, "x" * 9_000) for _ in range(3)]
        first, second = [await rooms.wait_unread_all(topic, 1) for _ in range(2)]
        assert [m.message_id for m in first.messages] == big[:1] and first.left == 2
        assert [m.message_id for m in second.messages] == big[1:2] and second.left == 1
        taken, left = await transcript.take_unread(topic, ME.node_id.hex(), NOW_MS, max_chars=1)
        assert [m.message_id for m in taken] == big[2:] and left == 0  # the first always fits

    run_in(tmp_path, body)


def test_the_answer_is_the_reply_to_it_else_the_first_talk_never_a_notice(
    tmp_path: Path,
) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await said(rooms, topic, BOB, "", kind="participant_left")
        await said(rooms, topic, CAROL, "unrelated")
        await said(rooms, topic, BOB, "yes", kind="answer_given", in_reply_to="q1")
        messages = (await rooms.wait_unread_all(topic, 1)).messages
        assert answer_index(messages, "q1") == 2  # the reply to it wins
        assert answer_index(messages, "q2") == 1  # else the first talk message
        assert answer_index(messages[:1], "q1") is None  # a notice never answers

    run_in(tmp_path, body)


def test_say_returns_everything_after_it_once_an_answer_is_there(tmp_path: Path) -> None:
    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        await transcript.join_room(topic, "participant", 0, None, NOW_MS)
        arrivals: list[asyncio.Task[str]] = []

        async def publish(realm: bytes, topic_: str, payload: dict[str, Any]) -> int:
            async def later() -> str:  # a notice first, then the answer
                await said(rooms, topic, CAROL, "", kind="participant_joined")
                mid = payload["message_id"]
                return await said(rooms, topic, BOB, "ok", kind="answer_given", in_reply_to=mid)

            arrivals.append(asyncio.create_task(later()))
            return 1

        rooms.node = cast(Node, SimpleNamespace(identity=ME, publish_confirmed=publish))
        done = await rooms.say(topic, "question_asked", "well?", wait_reply_seconds=5)
        answer = await arrivals[0]
        assert done.heard is not None
        kinds = [m.kind for m in done.heard.messages]
        assert kinds == ["participant_joined", "answer_given"] and done.answer_index == 1
        assert done.reply is not None and done.reply.message_id == answer

    run_in(tmp_path, body)


def test_recording_and_taking_a_message_cost_no_trip_to_the_sqlite_thread(
    tmp_path: Path,
) -> None:
    """On the say → wait path: a message heard and a wait's take (BEGIN, the rows with their
    count, the read marks, COMMIT) run inline on the loop's thread, whether the take finds
    something or not: no trip to the connection's thread and back."""

    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        trips = trips_of(transcript)
        env = dict(envelope(topic, BOB, "one trip"))
        assert await rooms._record(env, BOB.node_id, True, 1) is True
        assert await rooms._record(env, BOB.node_id, True, 1) is False  # a repeat: not new
        taken, left = await transcript.take_unread(topic, ME.node_id.hex(), NOW_MS)
        assert [m.message_id for m in taken] == [env["message_id"]] and left == 0
        assert await transcript.take_unread(topic, ME.node_id.hex(), NOW_MS) == ([], 0)
        assert trips == [], trips

    run_in(tmp_path, body)


def test_a_take_that_meets_another_process_lock_waits_on_the_thread_and_a_cancel_undoes_it(
    tmp_path: Path,
) -> None:
    """Another process holds the file's write lock: the inline take never waits for it on the
    loop (SQLite busy at once), it goes to the connection's thread, which waits as usual. The
    harness cancels the wait meanwhile; the lock goes; the take's trip commits on the thread
    all the same, and its read marks are undone, so nothing is marked read that nobody was
    given. A message that was already read stays read."""

    async def body(rooms: Rooms, transcript: TranscriptStore) -> None:
        topic = new_room_topic(os.urandom(16))
        old = await said(rooms, topic, BOB, "read before")
        first, _ = await transcript.take_unread(topic, ME.node_id.hex(), 1)
        assert [m.message_id for m in first] == [old]
        new = await said(rooms, topic, CAROL, "unread")
        seq_of_old = (await transcript.message(topic, old)).seq  # type: ignore[union-attr]
        other = sqlite3.connect(transcript.path, isolation_level=None)  # "another process"
        other.execute("BEGIN IMMEDIATE")
        trips = trips_of(transcript)
        taking = asyncio.ensure_future(
            transcript.take_unread(topic, ME.node_id.hex(), NOW_MS, after_seq=seq_of_old - 1)
        )
        await eventually(
            lambda: trips, interval=0
        )  # the inline attempt met the lock and went to the thread
        taking.cancel()
        other.execute("COMMIT")
        other.close()
        with contextlib.suppress(asyncio.CancelledError):
            await taking
        assert taking.cancelled()
        taken, left = await transcript.take_unread(topic, ME.node_id.hex(), NOW_MS)
        assert [m.message_id for m in taken] == [new] and left == 0  # the old one stays read

    run_in(tmp_path, body)
