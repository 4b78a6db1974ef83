"""The agent's local stores (macula.store): roster, transcript, rings, paths, files, processes.

Real SQLite files under ``tmp_path``; coroutines run with ``asyncio.run`` (no pytest-asyncio).
Two tests start real child processes on the same files: concurrent writers, and a writer killed
with SIGKILL in the middle of its work.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import pytest

from macula.errors import ClosedError, ConfigError
from macula.store import (
    HOME_ENV,
    MAX_AGE_MS,
    RING_TTL_MS,
    RINGS_DB_ENV,
    ROSTER_DB_ENV,
    TRANSCRIPT_DB_ENV,
    HelloFields,
    RingStore,
    RosterStore,
    StoreError,
    TranscriptStore,
    paths_from_env,
)
from macula.store import base as store_base
from macula.store.base import SqliteStore
from support.paths import REPO, file_mode
from support.running import run

T = TypeVar("T")
NOW = 1_767_225_600_000
ALICE = bytes(range(1, 33))
BOB = bytes(range(33, 65))
CAROL = bytes(range(65, 97))
ROOM = "agents.room.0123456789abcdef0123456789abcdef"
LOBBY = "agents.lobby"
STORES: tuple[type[SqliteStore], ...] = (RosterStore, TranscriptStore, RingStore)


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


# --- paths from the environment ---------------------------------------------------------------


def test_paths_default_under_macula_home(tmp_path: Path) -> None:
    paths = paths_from_env({HOME_ENV: str(tmp_path / "home")})
    assert paths.roster == tmp_path / "home" / "roster.sqlite3"
    assert paths.transcript == tmp_path / "home" / "transcript.sqlite3"
    assert paths.rings == tmp_path / "home" / "rings.sqlite3"


def test_paths_default_home_is_dot_macula(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths_from_env({}).roster == tmp_path / ".macula" / "roster.sqlite3"


def test_paths_each_variable_moves_its_store(tmp_path: Path) -> None:
    env = {
        HOME_ENV: str(tmp_path / "home"),
        ROSTER_DB_ENV: str(tmp_path / "a.db"),
        TRANSCRIPT_DB_ENV: str(tmp_path / "b.db"),
        RINGS_DB_ENV: str(tmp_path / "c.db"),
    }
    paths = paths_from_env(env)
    assert (paths.roster, paths.transcript, paths.rings) == (
        tmp_path / "a.db",
        tmp_path / "b.db",
        tmp_path / "c.db",
    )
    only_rings = paths_from_env({HOME_ENV: str(tmp_path), RINGS_DB_ENV: "~/r.db"})
    assert only_rings.rings == Path("~/r.db").expanduser()
    assert only_rings.roster == tmp_path / "roster.sqlite3"


def test_paths_relative_values_become_absolute(tmp_path: Path) -> None:
    paths = paths_from_env({HOME_ENV: str(tmp_path), ROSTER_DB_ENV: "rel/roster.db"})
    assert paths.roster.is_absolute() and paths.roster == Path.cwd() / "rel" / "roster.db"


@pytest.mark.parametrize("name", [HOME_ENV, ROSTER_DB_ENV, TRANSCRIPT_DB_ENV, RINGS_DB_ENV])
@pytest.mark.parametrize("value", ["", "   "])
def test_paths_empty_value_is_a_config_error_naming_it(
    tmp_path: Path, name: str, value: str
) -> None:
    env = {HOME_ENV: str(tmp_path), name: value}
    with pytest.raises(ConfigError, match=name):
        paths_from_env(env)


def test_paths_wrong_kind_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=ROSTER_DB_ENV):
        paths_from_env({HOME_ENV: str(tmp_path), ROSTER_DB_ENV: str(tmp_path)})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=HOME_ENV):
        paths_from_env({HOME_ENV: str(tmp_path / "file")})


# --- files, modes, migrations -----------------------------------------------------------------


@pytest.mark.parametrize("store_class", STORES)
def test_file_modes_db_wal_shm_0600_in_new_0700_dirs(
    tmp_path: Path, store_class: type[SqliteStore]
) -> None:
    path = tmp_path / "a" / "b" / "store.sqlite3"

    async def main() -> None:
        async with await store_class.open(path):
            for suffix in ("", "-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                assert side.exists(), suffix
                assert file_mode(side) == 0o600, suffix

    old = os.umask(0o022)
    try:
        run(main())
    finally:
        os.umask(old)
    assert file_mode(tmp_path / "a") == 0o700
    assert file_mode(tmp_path / "a" / "b") == 0o700


def test_existing_loose_file_is_tightened_and_existing_dir_left_alone(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    path = directory / "roster.sqlite3"
    path.touch()
    os.chmod(path, 0o644)

    async def main() -> None:
        async with await RosterStore.open(path) as roster:
            assert await roster.count() == 0

    run(main())
    assert file_mode(path) == 0o600
    assert file_mode(directory) == 0o755


@pytest.mark.parametrize("store_class", STORES)
def test_migrates_an_empty_file(tmp_path: Path, store_class: type[SqliteStore]) -> None:
    path = tmp_path / "empty.sqlite3"
    path.touch()

    async def main() -> None:
        async with await store_class.open(path) as store:
            assert await store.schema_version() == len(store_class.MIGRATIONS)
            assert await store.integrity_check() == "ok"

    run(main())
    assert user_version(path) == len(store_class.MIGRATIONS)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("store_class", STORES)
def test_refuses_a_newer_schema_and_leaves_it_alone(
    tmp_path: Path, store_class: type[SqliteStore]
) -> None:
    path = tmp_path / "future.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    latest = len(store_class.MIGRATIONS)
    with pytest.raises(StoreError, match=rf"schema version 99.*up to {latest}.*newer macula"):
        run(store_class.open(path))
    assert user_version(path) == 99


def test_switching_a_fresh_file_to_wal_waits_for_another_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite answers BUSY at once, without its busy handler, when the switch to WAL meets
    another process's write lock: the store retries instead of failing to open."""
    path = tmp_path / "fresh.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("CREATE TABLE t (x)")
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO t VALUES (1)")
        monkeypatch.setattr(store_base, "WAL_SWITCH_ATTEMPTS", 1)
        with pytest.raises(StoreError, match="locked"):
            run(RosterStore.open(path))
        monkeypatch.undo()
        releaser = threading.Timer(0.2, other.execute, ("COMMIT",))
        releaser.start()
        started = time.monotonic()

        async def main() -> None:
            async with await RosterStore.open(path) as roster:
                assert await roster.schema_version() == 1

        run(main())
        assert time.monotonic() - started >= 0.15
        releaser.join()
    finally:
        other.close()


def test_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"this is not a database, just some bytes" * 100)
    with pytest.raises(StoreError, match="cannot open the store: file is not a database"):
        run(RosterStore.open(path))


def test_later_migration_keeps_rows_and_a_failed_step_rolls_back(tmp_path: Path) -> None:
    class RosterV2(RosterStore):
        MIGRATIONS = (*RosterStore.MIGRATIONS, ("CREATE TABLE extra (x INTEGER)",))

    class Broken(SqliteStore):
        MIGRATIONS = (("CREATE TABLE a (x)",), ("CREATE TABLE b (",))

    path = tmp_path / "roster.sqlite3"

    async def main() -> None:
        async with await RosterStore.open(path) as v1:
            await v1.upsert_hello(ALICE, HelloFields(at=NOW), NOW)
        async with await RosterV2.open(path) as v2:
            assert await v2.schema_version() == 2
            assert await v2.node_ids() == [ALICE]
        with pytest.raises(StoreError, match="newer macula"):
            await RosterStore.open(path)
        with pytest.raises(StoreError):
            await Broken.open(tmp_path / "broken.sqlite3")

    run(main())
    assert user_version(tmp_path / "broken.sqlite3") == 0
    with sqlite3.connect(tmp_path / "broken.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_close_is_idempotent_and_a_closed_store_says_so(tmp_path: Path) -> None:
    async def main() -> None:
        roster = await RosterStore.open(tmp_path / "r.sqlite3")
        async with roster:
            await roster.upsert_hello(ALICE, HelloFields(at=NOW), NOW)
        await roster.close()
        with pytest.raises(ClosedError):
            await roster.count()
        async with await RosterStore.open(tmp_path / "r.sqlite3") as again:
            assert await again.count() == 1  # durable across a reopen

    run(main())


def test_concurrent_coroutines_on_one_store(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            outcomes = await asyncio.gather(
                *(
                    rings.add(f"r{i}", "incoming", ALICE, NOW, answer=3, pending_limit=3)
                    for i in range(20)
                ),
                *(rings.pending(NOW) for _ in range(5)),
            )
            assert outcomes[:20].count("added") == 3
            assert await rings.count_pending_from(ALICE, NOW) == 3

    run(main())


def test_cancelled_operations_leave_no_transaction_behind(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            for steps in range(8):  # cancel at every point of a transaction's life
                task = asyncio.create_task(
                    rings.add(f"c{steps}", "incoming", ALICE, NOW, answer=3, pending_limit=100)
                )
                for _ in range(steps):
                    await asyncio.sleep(0)  # sleep: one scheduler step (the cancel point)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                assert await rings.add(f"ok{steps}", "outgoing", BOB, NOW) == "added"
            assert len(await rings.recent(100, direction="outgoing")) == 8
            assert await rings.integrity_check() == "ok"
        with sqlite3.connect(tmp_path / "rings.sqlite3") as db:  # nothing left locked
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")

    run(main())


# --- roster -----------------------------------------------------------------------------------


def hello(at: int, **fields: Any) -> HelloFields:
    return HelloFields(at=at, **fields)


def test_roster_upsert_keeps_first_seen_and_updates_the_rest(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            first = hello(NOW - 5, operator_name="ann", session_name="s1", model="m1")
            assert await roster.upsert_hello(ALICE, first, NOW) is True
            later = hello(
                NOW + 995,
                operator_name="ann",
                session_name="s2",
                message="hi",
                model="m2",
                connected_via="claude-code 1.2.3",
                interval_seconds=30,
            )
            assert await roster.upsert_hello(ALICE, later, NOW + 1000) is False
            [entry] = await roster.list(NOW + 1000)
            assert entry.node_id == ALICE
            assert (entry.operator_name, entry.session_name, entry.message) == ("ann", "s2", "hi")
            assert (entry.model, entry.connected_via) == ("m2", "claude-code 1.2.3")
            assert entry.interval_seconds == 30
            assert (entry.first_seen_ms, entry.last_seen_ms) == (NOW, NOW + 1000)
            assert entry.last_hello_at == NOW + 995
            assert entry.stale == 0

    run(main())


def test_roster_an_older_hello_refreshes_last_seen_only(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            await roster.upsert_hello(ALICE, hello(NOW, message="new"), NOW)
            assert not await roster.upsert_hello(ALICE, hello(NOW - 60_000, message="old"), NOW + 5)
            [entry] = await roster.list(NOW + 5)
            assert (entry.message, entry.last_hello_at, entry.last_seen_ms) == ("new", NOW, NOW + 5)
            await roster.upsert_hello(ALICE, hello(NOW + 7, message="newer"), NOW + 2)
            [entry] = await roster.list(NOW + 5)
            assert (entry.message, entry.last_seen_ms) == ("newer", NOW + 5)  # never backwards

    run(main())


def test_roster_stale_boundary_is_three_intervals(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            await roster.upsert_hello(ALICE, hello(NOW, interval_seconds=60), NOW)
            await roster.upsert_hello(BOB, hello(NOW, interval_seconds=10), NOW)
            at_limit = {e.node_id: e.stale for e in await roster.list(NOW + 30_000)}
            assert at_limit == {ALICE: 0, BOB: 0}
            just_past = {e.node_id: e.stale for e in await roster.list(NOW + 30_001)}
            assert just_past == {ALICE: 0, BOB: 1}
            [a] = [e for e in await roster.list(NOW + 180_000) if e.node_id == ALICE]
            assert a.stale == 0 and type(a.stale) is int
            [a] = [e for e in await roster.list(NOW + 180_001) if e.node_id == ALICE]
            assert a.stale == 1 and type(a.stale) is int

    run(main())


def test_roster_prune_and_list_boundary_is_fifteen_minutes(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            await roster.upsert_hello(ALICE, hello(NOW), NOW)
            await roster.upsert_hello(BOB, hello(NOW), NOW + 1)
            edge = NOW + MAX_AGE_MS
            assert [e.node_id for e in await roster.list(edge)] == [BOB, ALICE]
            assert await roster.prune(edge) == 0
            assert [e.node_id for e in await roster.list(edge + 1)] == [BOB]
            assert await roster.count() == 2  # list() never writes
            assert await roster.prune(edge + 1) == 1
            assert await roster.node_ids() == [BOB]
            assert await roster.prune(edge + 1, max_age_ms=0) == 1
            assert await roster.count() == 0

    run(main())


def test_roster_hello_after_a_long_gap_is_a_new_sighting(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            assert await roster.upsert_hello(ALICE, hello(NOW), NOW)
            back = NOW + MAX_AGE_MS
            assert not await roster.upsert_hello(ALICE, hello(back), back)
            gone = back + MAX_AGE_MS + 1
            assert await roster.upsert_hello(ALICE, hello(gone), gone)
            [entry] = await roster.list(gone)
            assert entry.first_seen_ms == gone

    run(main())


def test_roster_order_paging_count_node_ids_and_remove(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            for i, node in enumerate((ALICE, BOB, CAROL)):
                await roster.upsert_hello(node, hello(NOW + i), NOW + i)
            now = NOW + 10
            assert [e.node_id for e in await roster.list(now)] == [CAROL, BOB, ALICE]
            assert [e.node_id for e in await roster.list(now, limit=1, offset=1)] == [BOB]
            assert await roster.list(now, limit=0) == []
            assert await roster.count() == 3
            assert await roster.node_ids() == [CAROL, BOB, ALICE]
            assert await roster.remove(BOB) is True
            assert await roster.remove(BOB) is False
            assert await roster.node_ids() == [CAROL, ALICE]
            with pytest.raises(ValueError):
                await roster.list(now, limit=-1)

    run(main())


def test_roster_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        HelloFields(at=NOW, interval_seconds=0)
    with pytest.raises(ValueError, match="operator_name"):
        HelloFields(at=NOW, operator_name=b"x")  # type: ignore[arg-type]

    async def main() -> None:
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            with pytest.raises(ValueError, match="32 bytes"):
                await roster.upsert_hello(ALICE[:31], hello(NOW), NOW)

    run(main())


# --- transcript -------------------------------------------------------------------------------


def envelope(message_id: str, **extra: Any) -> str:
    return json.dumps({"message_id": message_id, **extra})


async def say(
    transcript: TranscriptStore,
    message_id: str,
    sent_at: int,
    received_ms: int,
    room: str = ROOM,
    kind: str = "remark_made",
) -> bool:
    return await transcript.record(
        room_topic=room,
        message_id=message_id,
        from_hex=ALICE.hex(),
        kind=kind,
        sent_at=sent_at,
        received_ms=received_ms,
        envelope=envelope(message_id),
        text=f"text of {message_id}",
    )


def test_transcript_records_every_field(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            raw = envelope("m1", kind="room_opened", note="ünïcode")
            new = await transcript.record(
                room_topic=ROOM,
                message_id="m1",
                from_hex=BOB.hex(),
                kind="room_opened",
                sent_at=NOW - 3,
                received_ms=NOW,
                envelope=raw,
                text="hello",
                in_reply_to="m0",
                refs=["mcid1", "mcid2"],
                participants=(ALICE.hex(), BOB.hex()),
                purpose="review the plan",
                publisher=BOB,
                attested=True,
            )
            assert new is True
            [msg] = await transcript.messages(ROOM)
            assert (msg.room_topic, msg.message_id, msg.from_hex) == (ROOM, "m1", BOB.hex())
            assert (msg.kind, msg.text, msg.in_reply_to) == ("room_opened", "hello", "m0")
            assert msg.refs == ("mcid1", "mcid2")
            assert msg.participants == (ALICE.hex(), BOB.hex())
            assert msg.purpose == "review the plan"
            assert (msg.sent_at, msg.received_ms, msg.publisher) == (NOW - 3, NOW, BOB)
            assert msg.attested == 1 and type(msg.attested) is int
            assert msg.envelope == raw
            await say(transcript, "m2", NOW, NOW)
            [_, plain] = await transcript.messages(ROOM)
            assert (plain.refs, plain.participants, plain.publisher, plain.attested) == (
                None,
                None,
                None,
                0,
            )

    run(main())


def test_transcript_duplicate_message_id_is_ignored_per_room(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await say(transcript, "m1", NOW, NOW) is True
            assert await say(transcript, "m1", NOW + 5, NOW + 5) is False
            assert await say(transcript, "m1", NOW, NOW, room=LOBBY) is True
            [kept] = await transcript.messages(ROOM)
            assert kept.sent_at == NOW  # the first copy stays
            assert len(await transcript.messages(None)) == 2

    run(main())


def test_transcript_order_limit_since_and_rooms(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            await say(transcript, "c", NOW + 30, NOW + 1)
            await say(transcript, "a", NOW + 10, NOW + 3)
            await say(transcript, "b2", NOW + 20, NOW + 5)
            await say(transcript, "b1", NOW + 20, NOW + 4)
            await say(transcript, "b0", NOW + 20, NOW + 4)  # same sent and received: arrival
            await say(transcript, "x", NOW + 15, NOW + 2, room=LOBBY)

            def ids(msgs: list[Any]) -> list[str]:
                return [m.message_id for m in msgs]

            assert ids(await transcript.messages(ROOM)) == ["a", "b1", "b0", "b2", "c"]
            assert ids(await transcript.messages(ROOM, limit=2)) == ["b2", "c"]
            assert ids(await transcript.messages(ROOM, since_ms=NOW + 4)) == ["b1", "b0", "b2"]
            assert ids(await transcript.messages(ROOM, since_ms=NOW + 6)) == []
            assert ids(await transcript.messages(None)) == ["a", "x", "b1", "b0", "b2", "c"]
            last = await transcript.last_message(ROOM)
            assert last is not None and last.message_id == "c"
            assert await transcript.last_message("agents.room.none") is None
            rooms = await transcript.rooms()
            assert [(r.room_topic, r.messages) for r in rooms] == [(ROOM, 5), (LOBBY, 1)]
            assert (rooms[0].last_sent_at, rooms[0].last_received_ms) == (NOW + 30, NOW + 5)

    run(main())


def test_transcript_recent_by_kind(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            await say(transcript, "h1", NOW, NOW, room=LOBBY, kind="help_requested")
            await say(transcript, "o1", NOW + 1, NOW + 1, room=LOBBY, kind="help_offered")
            await say(transcript, "r1", NOW + 2, NOW + 2, room=LOBBY, kind="room_opened")
            await say(transcript, "h2", NOW + 3, NOW + 3, room=ROOM, kind="help_requested")
            await say(transcript, "h3", NOW + 4, NOW + 4, room=LOBBY, kind="help_requested")
            kinds = {"help_requested", "help_offered"}
            found = await transcript.recent(kinds, LOBBY, None)
            assert [m.message_id for m in found] == ["h1", "o1", "h3"]
            found = await transcript.recent(kinds, LOBBY, NOW + 1, limit=1)
            assert [m.message_id for m in found] == ["h3"]
            found = await transcript.recent({"help_requested"}, None, None)
            assert [m.message_id for m in found] == ["h1", "h2", "h3"]
            assert await transcript.recent(set(), LOBBY, None) == []

    run(main())


def test_transcript_memberships(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await transcript.join_room(ROOM, "opener", 1, "plan", NOW) is True
            assert await transcript.join_room("agents.room.b", "participant", 0, None, NOW + 1)
            again = await transcript.join_room(ROOM, "participant", 0, None, NOW + 2)
            assert again is False
            [room, other] = await transcript.joined_rooms()
            assert (room.room_topic, room.role, room.public) == (ROOM, "opener", 0)
            assert (room.purpose, room.joined_ms, room.left_ms) == ("plan", NOW, None)
            assert other.room_topic == "agents.room.b" and other.role == "participant"
            assert await transcript.leave_room(ROOM, NOW + 3) is True
            assert await transcript.leave_room(ROOM, NOW + 4) is False
            assert await transcript.leave_room("agents.room.never", NOW) is False
            assert [r.room_topic for r in await transcript.joined_rooms()] == ["agents.room.b"]
            assert await transcript.join_room(ROOM, "participant", 1, None, NOW + 5) is True
            rejoined = [r for r in await transcript.joined_rooms() if r.room_topic == ROOM]
            assert [(r.role, r.joined_ms, r.purpose) for r in rejoined] == [
                ("participant", NOW + 5, None)
            ]
            with pytest.raises(ValueError, match="role"):
                await transcript.join_room(ROOM, "owner", 0, None, NOW)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="public"):
                await transcript.join_room(ROOM, "opener", 2, None, NOW)

    run(main())


def test_transcript_public_rooms_seen_on_central(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await transcript.note_public_room(ROOM, ALICE.hex(), "plan", NOW) is True
            assert await transcript.note_public_room("agents.room.b", BOB.hex(), None, NOW + 1)
            assert not await transcript.note_public_room(ROOM, ALICE.hex(), None, NOW + 2)
            assert not await transcript.note_public_room(ROOM, BOB.hex(), "hijack", NOW + 3)
            seen = await transcript.seen_rooms()
            assert [r.room_topic for r in seen] == [ROOM, "agents.room.b"]
            assert (seen[0].opener_hex, seen[0].purpose) == (ALICE.hex(), "plan")
            assert (seen[0].first_seen_ms, seen[0].last_seen_ms) == (NOW, NOW + 2)

    run(main())


def test_transcript_prune_boundary(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            await say(transcript, "old", NOW, NOW - 1)
            await say(transcript, "edge", NOW, NOW)
            await transcript.note_public_room("agents.room.old", ALICE.hex(), None, NOW - 1)
            await transcript.note_public_room("agents.room.new", ALICE.hex(), None, NOW)
            await transcript.join_room("agents.room.left", "participant", 0, None, NOW - 9)
            await transcript.leave_room("agents.room.left", NOW - 1)
            await transcript.join_room("agents.room.in", "participant", 0, None, NOW - 9)
            assert await transcript.prune(NOW + transcript.bounds.max_age_ms) == 1
            assert [m.message_id for m in await transcript.messages(ROOM)] == ["edge"]
            assert [r.room_topic for r in await transcript.seen_rooms()] == ["agents.room.new"]
            assert [r.room_topic for r in await transcript.joined_rooms()] == ["agents.room.in"]
            assert await say(transcript, "old", NOW, NOW + 1) is True  # forgotten, so new again

    run(main())


def test_transcript_rejects_bad_arguments(tmp_path: Path) -> None:
    async def main() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            base: dict[str, Any] = {
                "room_topic": ROOM,
                "message_id": "m",
                "from_hex": ALICE.hex(),
                "kind": "remark_made",
                "sent_at": NOW,
                "received_ms": NOW,
                "envelope": "{}",
            }
            for bad, match in (
                ({"envelope": "{not json"}, "envelope"),
                ({"refs": "mcid"}, "refs"),
                ({"participants": [1]}, "participants"),
                ({"attested": 2}, "attested"),
                ({"message_id": ""}, "message_id"),
                ({"sent_at": 1.5}, "sent_at"),
                ({"publisher": "ab"}, "publisher"),
            ):
                with pytest.raises(ValueError, match=match):
                    await transcript.record(**{**base, **bad})
            assert await transcript.messages(None) == []

    run(main())


# --- rings ------------------------------------------------------------------------------------


def test_rings_add_get_and_duplicates(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            added = await rings.add(
                "r1", "incoming", ALICE, NOW, purpose="chat", room_topic=ROOM, answer=3
            )
            assert added == "added"
            assert await rings.add("r1", "outgoing", BOB, NOW + 1) == "duplicate"
            ring = await rings.get("r1")
            assert ring is not None
            assert (ring.ring_id, ring.direction, ring.peer) == ("r1", "incoming", ALICE)
            assert (ring.purpose, ring.room_topic, ring.state, ring.answer) == (
                "chat",
                ROOM,
                "pending",
                3,
            )
            assert (ring.created_ms, ring.updated_ms, ring.expires_ms) == (
                NOW,
                NOW,
                NOW + RING_TTL_MS,
            )
            assert ring.reason is None and ring.caller_notified is None
            await rings.add("r2", "incoming", BOB, NOW, answer=1, caller_notified=1)
            r2 = await rings.get("r2")
            assert r2 is not None and (r2.state, r2.expires_ms, r2.caller_notified) == (
                "accepted",
                None,
                1,
            )
            await rings.add("r3", "incoming", BOB, NOW, answer=2, reason="closed")
            r3 = await rings.get("r3")
            assert r3 is not None and (r3.state, r3.reason) == ("declined", "closed")
            assert await rings.get("missing") is None

    run(main())


def test_rings_set_answer_only_on_live_pending(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            await rings.add("out", "outgoing", BOB, NOW)
            deferred = await rings.set_answer("out", 3, None, NOW + 1)
            assert deferred is not None and (deferred.state, deferred.answer) == ("pending", 3)
            done = await rings.set_answer("out", 1, "sure", NOW + 2, caller_notified=1)
            assert done is not None
            assert (done.state, done.answer, done.reason) == ("accepted", 1, "sure")
            assert (done.updated_ms, done.caller_notified, done.created_ms) == (NOW + 2, 1, NOW)
            assert await rings.set_answer("out", 2, "changed my mind", NOW + 3) is None
            assert await rings.set_answer("missing", 1, None, NOW) is None
            await rings.add("in", "incoming", ALICE, NOW, answer=3, caller_notified=0)
            declined = await rings.set_answer("in", 2, "busy", NOW + 4)
            assert declined is not None
            assert (declined.state, declined.caller_notified) == ("declined", 0)  # kept
            assert await rings.set_caller_notified("in", 1, NOW + 5) is True
            assert await rings.set_caller_notified("missing", 1, NOW + 5) is False
            got = await rings.get("in")
            assert got is not None and (got.caller_notified, got.updated_ms) == (1, NOW + 5)
            with pytest.raises(ValueError, match="answer"):
                await rings.set_answer("in", 4, None, NOW)

    run(main())


def test_rings_unreachable(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            await rings.add("out", "outgoing", BOB, NOW)
            ring = await rings.set_unreachable("out", "no route", NOW + 1)
            assert ring is not None and (ring.state, ring.answer, ring.reason) == (
                "unreachable",
                None,
                "no route",
            )
            assert await rings.set_unreachable("out", "again", NOW + 2) is None
            assert await rings.set_answer("out", 1, None, NOW + 3) is None

    run(main())


def test_rings_deferred_incoming_expire_after_24_hours(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            await rings.add("r1", "incoming", ALICE, NOW, answer=3)
            await rings.add("r2", "incoming", BOB, NOW + 10, answer=3)
            await rings.add("out", "outgoing", CAROL, NOW + 20)
            due = NOW + RING_TTL_MS
            assert [r.ring_id for r in await rings.pending(due - 1)] == ["r1", "r2"]
            assert [r.ring_id for r in await rings.pending(due)] == ["r2"]  # marked lazily
            r1 = await rings.get("r1")
            assert r1 is not None and (r1.state, r1.answer, r1.updated_ms) == ("expired", 3, due)
            assert await rings.set_answer("r2", 1, None, due + 10) is None  # due now: expired
            r2 = await rings.get("r2")
            assert r2 is not None and r2.state == "expired"
            assert await rings.expire(due + 20) == 1  # the outgoing one
            assert await rings.expire(due + 20) == 0
            await rings.add("r3", "incoming", ALICE, NOW, answer=3, expires_ms=NOW + 5)
            before = await rings.get("r3")
            assert before is not None and before.state == "pending"  # get without now: as stored
            after = await rings.get("r3", NOW + 5)
            assert after is not None and after.state == "expired"

    run(main())


def test_rings_pending_per_caller(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            for i in range(3):
                assert await rings.add(f"a{i}", "incoming", ALICE, NOW + i, answer=3) == "added"
            await rings.add("b0", "incoming", BOB, NOW, answer=3)
            await rings.add("o0", "outgoing", ALICE, NOW)
            await rings.add("ok", "incoming", ALICE, NOW, answer=1)
            assert await rings.count_pending_from(ALICE, NOW + 5) == 3
            assert await rings.count_pending_from(BOB, NOW + 5) == 1
            assert await rings.count_pending_from(CAROL, NOW + 5) == 0
            over = await rings.add("a3", "incoming", ALICE, NOW + 5, answer=3, pending_limit=3)
            assert over == "over_limit"
            assert await rings.get("a3") is None
            accepted = await rings.add("a3", "incoming", ALICE, NOW + 5, answer=1, pending_limit=3)
            assert accepted == "added"  # the limit counts pending rings only
            await rings.set_answer("a0", 2, None, NOW + 6)
            assert await rings.count_pending_from(ALICE, NOW + 6) == 2
            assert await rings.add("a4", "incoming", ALICE, NOW + 6, pending_limit=3) == "added"
            assert await rings.count_pending_from(ALICE, NOW + 1 + RING_TTL_MS) == 2  # a1 due
            assert await rings.add("b1", "incoming", BOB, NOW, answer=3, pending_limit=1) == (
                "over_limit"
            )

    run(main())


def test_rings_recent(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            await rings.add("r1", "incoming", ALICE, NOW)
            await rings.add("r2", "outgoing", BOB, NOW + 1)
            await rings.add("r3", "incoming", CAROL, NOW + 2)
            assert [r.ring_id for r in await rings.recent()] == ["r3", "r2", "r1"]
            assert [r.ring_id for r in await rings.recent(2)] == ["r3", "r2"]
            assert [r.ring_id for r in await rings.recent(direction="incoming")] == ["r3", "r1"]
            assert await rings.recent(0) == []

    run(main())


def test_rings_reject_bad_arguments(tmp_path: Path) -> None:
    async def main() -> None:
        async with await RingStore.open(tmp_path / "rings.sqlite3") as rings:
            with pytest.raises(ValueError, match="direction"):
                await rings.add("r", "sideways", ALICE, NOW)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="peer"):
                await rings.add("r", "incoming", b"short", NOW)
            with pytest.raises(ValueError, match="answer"):
                await rings.add("r", "incoming", ALICE, NOW, answer=0)
            with pytest.raises(ValueError, match="caller_notified"):
                await rings.add("r", "incoming", ALICE, NOW, caller_notified=5)
            with pytest.raises(ValueError, match="ring_id"):
                await rings.add("", "incoming", ALICE, NOW)
            assert await rings.recent() == []

    run(main())


# --- two processes on the same files ----------------------------------------------------------

WRITER = r"""
import asyncio, pathlib, sys, time
from macula.store import RingStore, TranscriptStore

async def main(directory: str, tag: str, count: int) -> None:
    d = pathlib.Path(directory)
    (d / f"ready-{tag}").touch()
    deadline = time.monotonic() + 30
    while not (d / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("never told to go")
        await asyncio.sleep(0.002)  # polling interval: until the go file exists
    peer = bytes(range(1, 33))
    shared_new = added = 0
    async with await TranscriptStore.open(d / "t.sqlite3") as transcript, \
            await RingStore.open(d / "r.sqlite3") as rings:
        async def record(message_id: str, i: int) -> bool:
            return await transcript.record(
                room_topic="agents.room.shared", message_id=message_id, from_hex=tag,
                kind="remark_made", sent_at=i, received_ms=i,
                envelope='{"message_id": "%s"}' % message_id, text=tag)
        for i in range(count):
            await record(f"{tag}-{i}", i)
            if i % 10 == 0:
                shared_new += await record(f"shared-{i // 10}", i)
            if i % 100 == 0:
                outcome = await rings.add(f"{tag}-ring-{i}", "incoming", peer, 0, answer=3,
                                          pending_limit=3)
                added += outcome == "added"
    print(shared_new, added)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""

KILLED_WRITER = r"""
import asyncio, pathlib, sys
from macula.store import HelloFields, RosterStore, TranscriptStore

async def main(directory: str) -> None:
    d = pathlib.Path(directory)
    padding = "x" * 4000
    async with await TranscriptStore.open(d / "t.sqlite3") as transcript, \
            await RosterStore.open(d / "r.sqlite3") as roster:
        i = 0
        while True:
            await transcript.record(
                room_topic="agents.room.k", message_id=f"m-{i}", from_hex="k",
                kind="remark_made", sent_at=i, received_ms=i,
                envelope='{"pad": "%s"}' % padding, text=padding)
            await roster.upsert_hello(i.to_bytes(32, "big"), HelloFields(at=i), i)
            sys.stdout.write(f"{i}\n")
            sys.stdout.flush()
            i += 1

asyncio.run(main(sys.argv[1]))
"""


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_write_the_same_files_concurrently(tmp_path: Path) -> None:
    count = 500
    children = [spawn(WRITER, str(tmp_path), tag, str(count)) for tag in ("p1", "p2")]
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{tag}").exists() for tag in ("p1", "p2")):
            assert time.monotonic() < deadline, "children never got ready"
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            time.sleep(0.005)  # polling interval: until both children are ready
        (tmp_path / "go").touch()  # both open the fresh files (and migrate) at the same time
        outputs = [c.communicate(timeout=60) for c in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for child, (_out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
    shared_new = sum(int(out.split()[0]) for out, _ in outputs)
    rings_added = sum(int(out.split()[1]) for out, _ in outputs)
    assert shared_new == count // 10  # each shared message was new in exactly one process
    assert rings_added == 3  # the pending limit held across processes

    async def check() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await transcript.integrity_check() == "ok"
            stored = await transcript.messages(None, limit=10_000)
            ids = {m.message_id for m in stored}
            assert len(stored) == 2 * count + count // 10
            for tag in ("p1", "p2"):
                assert {f"{tag}-{i}" for i in range(count)} <= ids
        async with await RingStore.open(tmp_path / "r.sqlite3") as rings:
            assert await rings.count_pending_from(bytes(range(1, 33)), 0) == 3

    run(check())


def test_a_writer_killed_mid_write_loses_nothing_it_committed(tmp_path: Path) -> None:
    child = spawn(KILLED_WRITER, str(tmp_path))
    acked = -1
    try:
        assert child.stdout is not None
        while acked < 300:
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else "child exited"
            acked = int(line)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / "t.sqlite3-wal").stat().st_size > 0  # reopening recovers from the WAL
    acked = max([acked, *(int(line) for line in rest.split())])

    async def check() -> None:
        async with await TranscriptStore.open(tmp_path / "t.sqlite3") as transcript:
            assert await transcript.integrity_check() == "ok"
            stored = await transcript.messages("agents.room.k", limit=100_000)
            ids = {m.message_id for m in stored}
            assert {f"m-{i}" for i in range(acked + 1)} <= ids
            assert await transcript.record(
                room_topic="agents.room.k",
                message_id="after",
                from_hex="p",
                kind="remark_made",
                sent_at=0,
                received_ms=0,
                envelope="{}",
            )
        async with await RosterStore.open(tmp_path / "r.sqlite3") as roster:
            assert await roster.integrity_check() == "ok"
            assert await roster.count() >= acked + 1
            await roster.upsert_hello(ALICE, HelloFields(at=NOW), NOW)

    run(check())
