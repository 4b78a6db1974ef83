"""The full-text index of the transcript and the tasks (issue 40) on real SQLite files: kept as
rows are written, pruned and changed; built on migration for a store written before it; the
query sanitised into quoted words, so no hostile query reaches FTS5 as syntax or fails."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from macula.agent.search import COUNT_CAP, MAX_OFFSET, SearchError, SearchRequest, search
from macula.errors import ClosedError
from macula.store.base import Bounds
from macula.store.search import (
    MAX_TERM_CHARS,
    MAX_TERMS,
    MessageHit,
    TaskHit,
    Window,
    match_expression,
    query_terms,
)
from macula.store.tasks import Task, TaskStore
from macula.store.transcript import TranscriptStore
from support.running import run

ME = b"\x01" * 32
PEER = b"\x02" * 32
NOW = 1_700_000_000_000
ROOM = "agents.room." + "a" * 32
OTHER_ROOM = "agents.room." + "b" * 32
LOBBY = "agents.lobby"


async def say(store: TranscriptStore, topic: str, message_id: str, text: str, **kw: object) -> None:
    fields = {"from_hex": "ab" * 32, "sent_at": NOW, "received_ms": NOW} | kw
    await store.record(
        room_topic=topic,
        message_id=message_id,
        kind="said",
        envelope=json.dumps({"text": text}),
        text=text,
        **fields,  # type: ignore[arg-type]
    )


def words(window_terms: str, **kw: object) -> Window:
    return Window(query_terms(window_terms), **kw)  # type: ignore[arg-type]


async def messages(
    store: TranscriptStore, window: Window, **filters: object
) -> tuple[list[MessageHit], int]:
    """The page and the count, as ``macula.agent.search`` asks for them."""
    found = await store.message_matches(window, 10_000, **filters)
    return await store.message_hits(window, [m.row for m in found]), len(found)


async def tasks_of(
    store: TaskStore, owner: bytes, window: Window, peer: bytes | None = None
) -> tuple[list[TaskHit], int]:
    found = await store.task_matches(owner, window, 10_000, peer=peer)
    return await store.task_hits(window, [m.row for m in found]), len(found)


def test_messages_are_found_by_word_room_sender_and_time(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as store:
            await say(store, ROOM, "m1", "use the branch feature-auth for the auth module")
            await say(store, OTHER_ROOM, "m2", "auth tokens expire hourly", from_hex="cd" * 32)
            await say(store, LOBBY, "m3", "hello everyone", received_ms=NOW + 5_000)
            hits, total = await messages(store, words("auth"))
            assert total == 2 and {h.message_id for h in hits} == {"m1", "m2"}
            assert all("[auth]" in h.snippet for h in hits)
            hits, total = await messages(store, words("AUTH"), room_topic=OTHER_ROOM)
            assert [h.message_id for h in hits] == ["m2"] and total == 1
            hits, _ = await messages(store, words("auth"), from_hex="ab" * 32)
            assert [h.message_id for h in hits] == ["m1"]
            hits, _ = await messages(store, words("hello"), not_room_topic=LOBBY)
            assert hits == []
            late = words("hello", since_ms=NOW + 1, until_ms=NOW + 5_000)
            assert [h.message_id for h in (await messages(store, late))[0]] == ["m3"]
            early = words("hello", until_ms=NOW + 4_999)
            assert (await messages(store, early))[1] == 0
            branch = await messages(store, words("feature auth branch"))
            assert [h.message_id for h in branch[0]] == ["m1"]  # every word required

    run(main())


def test_read_marks_and_unread_filter_and_pruning_keep_the_index_exact(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as store:
            store.bounds = Bounds(max_rows=3, max_age_ms=10**12, prune_every=1, batch=10)
            for i in range(5):
                await say(store, ROOM, f"m{i}", f"note number {i} about deploys")
            await store.prune(NOW)
            hits, total = await messages(store, words("deploys"))
            assert total == 3 and {h.message_id for h in hits} == {"m2", "m3", "m4"}
            unread, _ = await messages(store, words("deploys"), unread_only=1)
            assert len(unread) == 3 and all(h.unread == 1 for h in unread)
            await store.mark_read(ROOM, [hits[0].seq], NOW)
            assert (await messages(store, words("deploys"), unread_only=1))[1] == 2
            assert (await messages(store, words("deploys")))[1] == 3
            integrity = await store._fetchall(
                "INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)"
            )
            assert integrity == []

    run(main())


def make_task(task_id: str, title: str, **kw: object) -> Task:
    base = Task(
        task_id, "requester", PEER, title, "input", "submitted", 1, None, None, None, None, 0, 0,
        NOW, NOW,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def test_tasks_are_found_by_title_input_note_and_result_as_they_change(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TaskStore.open(tmp_path / "tasks.sqlite3") as store:
            await store.create(
                ME, make_task("t1", "rotate the staging keys"), NOW, max_open_per_peer=8
            )
            await store.create(
                ME,
                make_task("t2", "review", input={"file": "billing.py"}),
                NOW,
                max_open_per_peer=8,
            )
            hits, total = await tasks_of(store, ME, words("staging"))
            assert [h.task_id for h in hits] == ["t1"] and total == 1
            assert "[staging]" in hits[0].snippet
            assert [h.task_id for h in (await tasks_of(store, ME, words("billing")))[0]] == ["t2"]
            await store.transition(
                ME, "t1", "completed", NOW + 1, by="requester", result="rotated 12 keyfiles"
            )
            assert [h.task_id for h in (await tasks_of(store, ME, words("keyfiles")))[0]] == ["t1"]
            assert (await tasks_of(store, PEER, words("keyfiles")))[1] == 0  # another owner's
            assert (await tasks_of(store, ME, words("keyfiles"), peer=ME))[1] == 0
            store.bounds = Bounds(max_rows=1, max_age_ms=1, batch=10)
            await store.prune(ME, NOW + 10)
            assert (await tasks_of(store, ME, words("keyfiles")))[1] == 0  # pruned: gone

    run(main())


def test_a_store_written_before_the_index_is_indexed_on_migration(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"

    async def write() -> None:
        async with await TranscriptStore.open(path) as store:
            await say(store, ROOM, "old", "the release checklist lives in docs")

    run(write())
    with sqlite3.connect(path) as raw:  # back to the schema before the index
        for trigger in ("insert", "delete", "update"):
            raw.execute(f"DROP TRIGGER messages_fts_{trigger}")
        raw.execute("DROP TABLE messages_fts")
        raw.execute(f"PRAGMA user_version = {len(TranscriptStore.MIGRATIONS) - 1}")

    async def read() -> None:
        async with await TranscriptStore.open(path) as store:
            hits, _ = await messages(store, words("checklist"))
            assert [h.message_id for h in hits] == ["old"]

    run(read())


def test_query_terms_are_words_only() -> None:
    assert query_terms('auth" OR text:* NEAR(a b) -x ^y') == [
        "auth", "OR", "text", "NEAR", "a", "b", "x", "y",
    ]  # fmt: skip
    assert query_terms("") == [] and query_terms("!!! ... ---") == [] and query_terms("___") == []
    assert query_terms("Ｃａｆé naïve 東京") == ["Café", "naïve", "東京"]  # NFKC
    assert len(query_terms(" ".join(f"w{i}" for i in range(100)))) == MAX_TERMS
    assert query_terms("x" * 10_000) == ["x" * MAX_TERM_CHARS]
    assert match_expression(["a", "NEAR"]) == '"a" "NEAR"'
    with pytest.raises(ValueError):
        match_expression([])


HOSTILE = st.one_of(
    st.text(max_size=600),
    st.text(alphabet="\"*:-^()+NEARORNOTAND{} \\'\x00", max_size=80),
    st.sampled_from(['"', '""', "*", "text:foo", "NEAR(a b, 2)", "a OR b", "-a", "^a", "\x00"]),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=HOSTILE)
def test_any_query_is_answered_or_refused_as_no_words(tmp_path: Path, query: str) -> None:
    async def main() -> None:
        path = tmp_path / "h.sqlite3"
        async with (
            await TranscriptStore.open(path) as transcript,
            await TaskStore.open(tmp_path / "h-tasks.sqlite3") as tasks,
        ):
            if not (await messages(transcript, words("seeded")))[1]:
                await say(transcript, ROOM, "seed", 'seeded text with "quotes" and NEAR words')
            try:
                page = await search(transcript, tasks, ME, SearchRequest(query))
            except SearchError as exc:
                assert exc.code == "no_words" and not query_terms(query)
                assert "sqlite" not in exc.detail.lower() and "fts5" not in exc.detail.lower()
                return
            assert page.terms == query_terms(query) and page.total >= len(page.hits)

    run(main())


def test_search_pages_rank_across_sources_and_refuses_what_it_cannot_answer(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript,
            await TaskStore.open(tmp_path / "tasks.sqlite3") as tasks,
        ):
            for i in range(7):
                await say(transcript, ROOM, f"m{i}", f"migration step {i}")
            await say(transcript, LOBBY, "lob", "migration talk in the lobby")
            await tasks.create(ME, make_task("t1", "migration review"), NOW, max_open_per_peer=8)
            seen: list[str] = []
            offset = 0
            while True:
                page = await search(
                    transcript, tasks, ME, SearchRequest("migration", limit=3, offset=offset)
                )
                seen += [h.get("message_id") or h["task_id"] for h in page.hits]
                offset += len(page.hits)
                if page.remaining == 0:
                    break
            assert sorted(seen) == sorted([*(f"m{i}" for i in range(7)), "lob", "t1"])
            only = await search(transcript, tasks, ME, SearchRequest("migration", source="lobby"))
            assert [h["message_id"] for h in only.hits] == ["lob"] and only.hits[0][
                "source"
            ] == "lobby"
            rooms = await search(transcript, tasks, ME, SearchRequest("migration", source="rooms"))
            assert rooms.total == 7
            in_tasks = await search(transcript, tasks, ME, SearchRequest("review", source="tasks"))
            assert [h["task_id"] for h in in_tasks.hits] == ["t1"]
            with pytest.raises(SearchError) as deep:
                await search(transcript, tasks, ME, SearchRequest("migration", offset=10**6))
            assert deep.value.code == "too_deep"
            await transcript.close()
            with pytest.raises(ClosedError):  # answered as the tool error ``closed``
                await search(transcript, tasks, ME, SearchRequest("migration"))

    run(main())


def test_a_broken_index_is_search_failed_without_sqlite_text(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript,
            await TaskStore.open(tmp_path / "tasks.sqlite3") as tasks,
        ):
            await transcript._execute("DROP TABLE messages_fts")
            with pytest.raises(SearchError) as caught:
                await search(transcript, tasks, ME, SearchRequest("anything"))
            assert caught.value.code == "search_failed"
            assert (
                "no such table" not in caught.value.detail
                and "sqlite" not in caught.value.detail.lower()
            )

    run(main())


def test_a_broad_query_comes_newest_first_and_pages_stop_at_max_offset(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"

    async def main() -> None:
        async with (
            await TranscriptStore.open(path) as transcript,
            await TaskStore.open(tmp_path / "tasks.sqlite3") as tasks,
        ):
            with sqlite3.connect(path) as raw:  # through the table: the triggers index them
                raw.executemany(
                    "INSERT INTO messages (room_topic, message_id, from_hex, kind, text, sent_at,"
                    " received_ms, attested, envelope) VALUES (?, ?, ?, 'said', ?, ?, ?, 1, '{}')",
                    [
                        (ROOM, f"m{n}", "ab" * 32, f"common word {n}", NOW + n, NOW + n)
                        for n in range(COUNT_CAP + 100)
                    ],
                )
            first = await search(transcript, tasks, ME, SearchRequest("common", limit=3))
            assert first.newest == 1 and first.total == COUNT_CAP
            newest = f"m{COUNT_CAP + 99}"
            assert first.hits[0]["message_id"] == newest
            last = await search(transcript, tasks, ME, SearchRequest("common", offset=MAX_OFFSET))
            assert last.hits and last.total == COUNT_CAP - MAX_OFFSET
            narrow = await search(transcript, tasks, ME, SearchRequest("common 7"))
            assert narrow.newest == 0 and narrow.hits[0]["message_id"] == "m7"  # ranked

    run(main())
