"""Pages of unread messages (issue 37): every message reached exactly once by repeating the
call, the read marks always what was returned, a page cut between items and within the result
bound, an item too large alone shortened and readable whole. Real SQLite files; the node and
the rings are stand-ins (not what these tests are about)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from macula.agent.envelope import LOBBY_TOPIC, new_room_topic
from macula.agent.room.rooms import Rooms
from macula.store.transcript import TranscriptStore
from macula.wire.identity import Identity
from support.roomkit import ME, NOW_MS, rooms_of
from support.roomkit import said as said_at
from tools.groups.inbox_views import inbox_page, text_part
from tools.groups.paging import PageBudget, parse_cursor, size
from tools.groups.wait_views import unread_view, wait_fit
from tools.server.results import MAX_RESULT_BYTES, InvalidArgument, bounded, plain
from tools.server.runtime import Runtime

SENDERS = [Identity(bytes([8 + i]) * 32) for i in range(3)]
MAX_SAY_BYTES = 16 * 1024
_seq = itertools.count(1)


async def said(rooms: Rooms, topic: str, sender: Identity, text: str, **kw: Any) -> str:
    """Record what ``sender`` said as the tap would, each later than the last; its id."""
    return await said_at(rooms, topic, sender, text, sent_at=NOW_MS + next(_seq), **kw)


def _runtime(rooms: Rooms) -> Runtime:
    async def pending() -> list[Any]:
        return []

    agent = SimpleNamespace(
        rooms=rooms, rings=SimpleNamespace(pending=pending), node=SimpleNamespace(identity=ME)
    )
    return cast(Runtime, SimpleNamespace(agent=agent))


async def _unread_ids(transcript: TranscriptStore) -> set[str]:
    rows = await transcript._fetchall(
        "SELECT message_id FROM messages WHERE read_ms IS NULL AND attested = 1 AND from_hex != ?",
        (ME.node_id.hex(),),
    )
    return {str(r[0]) for r in rows}


def _in_page(result: dict[str, Any]) -> list[str]:
    ids = [m["message_id"] for r in result["rooms"] for m in r["messages"]]
    return ids + [m["message_id"] for m in result["central_help"]]


def _texts(rng: random.Random, count: int) -> list[str]:
    """Mixed sizes up to the largest a say allows; some escape-heavy (quotes, newlines)."""
    texts = []
    for _ in range(count):
        length = rng.choice([1, 40, 300, 2_000, 9_000, MAX_SAY_BYTES])
        alphabet = rng.choice(["ab c", 'q"\\\n', "é€😀", "x"])
        text = "a" + "".join(rng.choices(alphabet, k=length))
        while len(text.encode()) > MAX_SAY_BYTES:  # the largest a say allows, in UTF-8 bytes
            text = text[: len(text) - (len(text.encode()) - MAX_SAY_BYTES + 3) // 4 - 1]
        texts.append(text)
    return texts


# -- the agent layer, any page size ------------------------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 300)),
        min_size=1,
        max_size=40,
    ),
    pages=st.lists(st.tuples(st.sampled_from(["inbox", "wait", "peek"]), st.integers(1, 7))),
)
def test_repeating_the_call_reaches_every_message_once_and_marks_only_what_it_returned(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int]],
    pages: list[tuple[str, int]],
) -> None:
    path = tmp_path_factory.mktemp("pages") / "transcript.sqlite3"

    async def scenario() -> None:
        async with await TranscriptStore.open(path) as transcript:
            rooms = rooms_of(transcript)
            topics = [new_room_topic(os.urandom(16)) for _ in range(3)]
            for topic in topics:
                await transcript.join_room(topic, "participant", 0, None, NOW_MS)
            every: set[str] = set()
            for room, sender, length in plan:
                if room == 3:  # central: only help broadcasts reach the inbox
                    mid = await said(
                        rooms, LOBBY_TOPIC, SENDERS[sender], "h" * length, kind="help_requested"
                    )
                else:
                    mid = await said(rooms, topics[room], SENDERS[sender], "m" * length)
                every.add(mid)
            returned: list[str] = []
            cycle = itertools.cycle(pages or [("inbox", 3)])
            for _ in range(len(pages)):
                how, per_page = next(cycle)
                if how == "wait":
                    topic = topics[per_page % 3]
                    batch = await rooms.wait_unread_all(topic, 0, fit=lambda m, k=per_page: k)
                    returned += [m.message_id for m in batch.messages]
                else:
                    page = await rooms.inbox(peek=int(how == "peek"), fit=lambda m, k=per_page: k)
                    shown = [m["message_id"] for r in page.rooms for m in r.messages]
                    shown += [m.message_id for m in page.central_help]
                    assert len(shown) <= per_page or per_page == 0
                    if how == "inbox":
                        returned += shown
                # the read marks are exactly what was returned, after every call
                assert await _unread_ids(transcript) == every - set(returned)
            for _ in range(len(every) + 1):  # then the same call again until nothing remains
                page = await rooms.inbox(fit=lambda m: 2)
                returned += [m["message_id"] for r in page.rooms for m in r.messages]
                returned += [m.message_id for m in page.central_help]
                assert await _unread_ids(transcript) == every - set(returned)
                if page.remaining == 0:
                    break
            assert sorted(returned) == sorted(every)  # every message, each exactly once
            assert (await rooms.inbox()).remaining == 0

    asyncio.run(scenario())


def test_a_peek_goes_on_with_its_cursor_and_marks_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            rooms = rooms_of(transcript)
            topic = new_room_topic(os.urandom(16))
            await transcript.join_room(topic, "participant", 0, None, NOW_MS)
            sent = [await said(rooms, topic, SENDERS[0], f"m{i}") for i in range(10)]
            seen: list[str] = []
            after = 0
            while True:
                page = await rooms.inbox(peek=1, after_seq=after, fit=lambda m: 3)
                seen += [m["message_id"] for r in page.rooms for m in r.messages]
                if page.after_seq is None:
                    assert page.remaining == 0
                    break
                assert page.remaining == len(sent) - len(seen)
                after = page.after_seq
            assert seen == sent and await _unread_ids(transcript) == set(sent)

    asyncio.run(scenario())


# -- the tools' pages: the real byte budget ----------------------------------------------------


def test_a_thousand_unread_of_mixed_sizes_in_two_busy_rooms_all_come_back_within_the_bound(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            rooms = rooms_of(transcript)
            runtime = _runtime(rooms)
            busy, other = (new_room_topic(os.urandom(16)) for _ in range(2))
            for topic in (busy, other):
                await transcript.join_room(topic, "participant", 0, None, NOW_MS)
            rng = random.Random(37)
            texts: dict[str, str] = {}
            for i, text in enumerate(_texts(rng, 1_000)):
                mid = await said(rooms, busy, SENDERS[i % 3], text)
                texts[mid] = text
                if i % 4 == 0:  # the second room is busy too
                    mid = await said(rooms, other, SENDERS[1], f"other {i}")
                    texts[mid] = f"other {i}"
            returned: list[str] = []
            shortened = 0
            calls = 0
            while True:
                calls += 1
                if calls % 3:
                    result = await inbox_page(runtime, 0, 0)
                    ids = _in_page(result)
                    items = [m for r in result["rooms"] for m in r["messages"]]
                else:
                    topic = busy if calls % 2 else other
                    batch = await rooms.wait_unread_all(topic, 0, fit=wait_fit)
                    result = unread_view(batch, {"room_topic": topic, "wait_seconds": 1})
                    ids = [m["message_id"] for m in result["messages"]]
                    items = result["messages"]
                # within the bound as sent: bounded() had nothing to cut
                assert size(plain(result)) <= MAX_RESULT_BYTES
                assert "truncated" not in bounded(plain(result))
                returned += ids
                assert await _unread_ids(transcript) == set(texts) - set(returned)
                for item in items:
                    if item.get("text_truncated"):
                        shortened += 1
                        whole = await _read_whole(runtime, item)
                        assert whole == texts[item["message_id"]]
                    else:
                        assert item["text"] == texts[item["message_id"]]
                if not await _unread_ids(transcript) and result["remaining"] == 0:
                    break
            assert sorted(returned) == sorted(texts)
            assert shortened > 0  # escape-heavy 16 KiB texts were shortened, and read whole

    asyncio.run(scenario())


async def _read_whole(runtime: Runtime, item: dict[str, Any]) -> str:
    """An item's text, then the rest through its text_next_page calls."""
    text = item["text"]
    call = item["text_next_page"]
    while call is not None:
        assert call["tool"] == "mesh_read_inbox"
        cursor = parse_cursor(call["arguments"]["cursor"])
        assert cursor.text_offset is not None
        part = await text_part(runtime, cursor.seq, cursor.text_offset)
        assert size(plain(part)) <= MAX_RESULT_BYTES and part["text_offset"] == len(text)
        text += part["text"]
        call = part["next_page"]
    return text


def test_a_page_is_cut_between_items_and_always_holds_the_first() -> None:
    budget = PageBudget(100)
    assert budget.fit([150, 10]) == 1  # the first alone, even too big: a page moves on
    budget = PageBudget(100)
    assert budget.fit([40, 40, 40, 10]) == 2  # stops at the first that does not fit
    assert budget.admit(5) is False  # and admits nothing after it


@pytest.mark.parametrize("cursor", ["", "s", "s-1", "x12", "t12", "t1.", "s1 ", "s" + "9" * 19, 5])
def test_a_cursor_this_server_did_not_hand_out_is_refused(cursor: Any) -> None:
    with pytest.raises(InvalidArgument, match="cursor"):
        parse_cursor(cursor)


def test_the_inbox_result_is_plain_json(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            rooms = rooms_of(transcript)
            topic = new_room_topic(os.urandom(16))
            await transcript.join_room(topic, "participant", 0, None, NOW_MS)
            for i in range(30):
                await said(rooms, topic, SENDERS[0], "x" * 2_000 + str(i))
            result = await inbox_page(_runtime(rooms), 1, 0)
            json.dumps(result)
            assert result["remaining"] > 0 and result["next_page"]["tool"] == "mesh_read_inbox"
            arguments = result["next_page"]["arguments"]
            assert arguments["peek"] == 1 and parse_cursor(arguments["cursor"]).text_offset is None
            follow = await inbox_page(_runtime(rooms), 1, parse_cursor(arguments["cursor"]).seq)
            assert not set(_in_page(follow)) & set(_in_page(result))

    asyncio.run(scenario())
