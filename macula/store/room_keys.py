"""Private rooms' keys: each room's current epoch, the keys we hold, envelopes we cannot open yet.

Invariants:
- The file is the agent's own (0600 in a 0700 directory, as every store); keys are BLOBs that
  no method logs or puts in a message; a ``RoomKey``'s repr hides its key.
- ``private_rooms`` has one row per room: its opener, our role, the current epoch with its key
  id, recipients and the signed key envelope (kept to hand on to a participant who joins).
  ``advance`` moves a room only forward: an older epoch is ``stale``, the same epoch with the
  same key id a ``duplicate``, with another key id a ``conflict``; all three change nothing.
- ``room_keys`` holds the keys we could open, one per (room, epoch); an epoch not sealed to us
  (we were removed) advances the room without a key.
- ``held`` keeps sealed envelopes of an epoch we have no key for (yet), at most
  ``held_per_room`` per room (the oldest go first), until the key comes or they age out.
- Bounded (``Bounds``, default 1,000 rooms, 30 days): ``prune`` keeps the ``max_rows`` rooms
  updated last (with their keys and held envelopes) and drops held envelopes older than
  ``max_age_ms``; it runs by itself after every ``prune_every`` changes.
- ``room`` answers from memory once it has read a topic (every room envelope sent or heard asks
  whether its room is private, so the answer must not cost a query each time): the memo holds
  at most ``ROOM_MEMO`` topics, and every write to ``private_rooms`` (``advance``, ``prune``)
  empties it; a read that a write overlapped is not remembered (``_writes`` moved). This
  process is the file's only writer (one process hosts an agent: the daemon, or the server).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import aiosqlite

from macula.agent.room.crypto import RoomKey
from macula.store.base import DAY_MS, Bounds, Migration, SqliteStore, execute, fetchall

DEFAULT_BOUNDS: Final = Bounds(max_rows=1_000, max_age_ms=30 * DAY_MS)
DEFAULT_HELD_PER_ROOM: Final = 1_000
ROOM_MEMO: Final = 4_096  # topics whose privacy ``room`` remembers

Role = Literal["opener", "participant"]
Advanced = Literal["advanced", "duplicate", "stale", "conflict"]

_V1: Final[Migration] = (
    """
    CREATE TABLE private_rooms (
        room_topic   TEXT PRIMARY KEY,
        opener_hex   TEXT NOT NULL,
        role         TEXT NOT NULL CHECK (role IN ('opener', 'participant')),
        epoch        INTEGER NOT NULL,
        key_id       TEXT NOT NULL,
        recipients   TEXT NOT NULL,        -- JSON array of 64-hex node ids
        key_envelope TEXT NOT NULL,        -- the signed key_distributed envelope (JSON)
        updated_ms   INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE room_keys (
        room_topic  TEXT NOT NULL,
        epoch       INTEGER NOT NULL,
        key_id      TEXT NOT NULL,
        key         BLOB NOT NULL CHECK (length(key) = 32),
        recipients  TEXT NOT NULL,
        received_ms INTEGER NOT NULL,
        PRIMARY KEY (room_topic, epoch)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE held (
        seq         INTEGER PRIMARY KEY,
        room_topic  TEXT NOT NULL,
        message_id  TEXT NOT NULL,
        epoch       INTEGER NOT NULL,
        envelope    TEXT NOT NULL,
        publisher   BLOB NOT NULL,
        received_ms INTEGER NOT NULL,
        UNIQUE (room_topic, message_id)
    )
    """,
    "CREATE INDEX held_by_room_epoch ON held (room_topic, epoch)",
)


@dataclass(frozen=True, slots=True)
class PrivateRoom:
    room_topic: str
    opener_hex: str
    role: Role
    epoch: int
    key_id: str
    recipients: tuple[str, ...]
    key_envelope: str
    updated_ms: int


@dataclass(frozen=True, slots=True)
class Held:
    message_id: str
    envelope: str
    publisher: bytes


def room_keys_path(transcript: Path) -> Path:
    """Where an agent's room keys live: beside its transcript (``<name>.room_keys.sqlite3``)."""
    return transcript.with_name(transcript.stem + ".room_keys.sqlite3")


class RoomKeyStore(SqliteStore):
    MIGRATIONS = (_V1,)

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        super().__init__(db, path)
        self.bounds: Bounds = DEFAULT_BOUNDS
        self.held_per_room = DEFAULT_HELD_PER_ROOM
        self._unpruned = 0
        self._rooms: dict[str, PrivateRoom | None] = {}  # the memo of ``room``
        self._writes = 0  # writes to private_rooms begun: a read they overlap is not kept

    async def room(self, topic: str) -> PrivateRoom | None:
        if topic in self._rooms:
            return self._rooms[topic]
        writes = self._writes
        found = await self._read_room(topic)
        if writes == self._writes:
            if len(self._rooms) >= ROOM_MEMO:
                self._rooms.clear()
            self._rooms[topic] = found
        return found

    def _forget_rooms(self) -> None:
        self._writes += 1
        self._rooms.clear()

    async def _read_room(self, topic: str) -> PrivateRoom | None:
        row = await self._fetchone(
            "SELECT room_topic, opener_hex, role, epoch, key_id, recipients, key_envelope,"
            " updated_ms FROM private_rooms WHERE room_topic = ?",
            (topic,),
        )
        if row is None:
            return None
        return PrivateRoom(
            str(row[0]),
            str(row[1]),
            "opener" if row[2] == "opener" else "participant",
            int(row[3]),
            str(row[4]),
            tuple(json.loads(row[5])),
            str(row[6]),
            int(row[7]),
        )

    async def key(self, topic: str, epoch: int) -> RoomKey | None:
        row = await self._fetchone(
            "SELECT epoch, key_id, recipients, key FROM room_keys"
            " WHERE room_topic = ? AND epoch = ?",
            (topic, epoch),
        )
        if row is None:
            return None
        return RoomKey(topic, int(row[0]), str(row[1]), tuple(json.loads(row[2])), bytes(row[3]))

    async def advance(
        self,
        *,
        topic: str,
        opener_hex: str,
        role: Role,
        epoch: int,
        key_id: str,
        recipients: tuple[str, ...],
        key_envelope: str,
        key: RoomKey | None,
        now_ms: int,
    ) -> Advanced:
        """Move ``topic`` to ``epoch`` (keeping ``key`` when it was sealed to us)."""
        self._forget_rooms()
        try:
            return await self._advance(topic, opener_hex, role, epoch, key_id, recipients,
                                       key_envelope, key, now_ms)  # fmt: skip
        finally:
            self._forget_rooms()

    async def _advance(
        self,
        topic: str,
        opener_hex: str,
        role: Role,
        epoch: int,
        key_id: str,
        recipients: tuple[str, ...],
        key_envelope: str,
        key: RoomKey | None,
        now_ms: int,
    ) -> Advanced:
        async with self._transaction() as db:
            rows = await fetchall(
                db, "SELECT epoch, key_id FROM private_rooms WHERE room_topic = ?", (topic,)
            )
            if rows:
                current, current_id = int(rows[0][0]), str(rows[0][1])
                if epoch < current:
                    return "stale"
                if epoch == current:
                    return "duplicate" if key_id == current_id else "conflict"
            await execute(
                db,
                "INSERT OR REPLACE INTO private_rooms (room_topic, opener_hex, role, epoch,"
                " key_id, recipients, key_envelope, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    topic,
                    opener_hex,
                    role,
                    epoch,
                    key_id,
                    json.dumps(recipients),
                    key_envelope,
                    now_ms,
                ),
            )
            if key is not None:
                await execute(
                    db,
                    "INSERT OR REPLACE INTO room_keys (room_topic, epoch, key_id, key,"
                    " recipients, received_ms) VALUES (?, ?, ?, ?, ?, ?)",
                    (topic, key.epoch, key.key_id, key.key, json.dumps(key.recipients), now_ms),
                )
        await self._changed(now_ms)
        return "advanced"

    async def hold(
        self, topic: str, message_id: str, epoch: int, envelope: str, publisher: bytes, now: int
    ) -> bool:
        """Keep a sealed envelope we cannot open yet; True if it was new."""
        async with self._transaction() as db:
            added = await execute(
                db,
                "INSERT OR IGNORE INTO held (room_topic, message_id, epoch, envelope, publisher,"
                " received_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (topic, message_id, epoch, envelope, publisher, now),
            )
            await execute(
                db,
                "DELETE FROM held WHERE seq IN (SELECT seq FROM held WHERE room_topic = ?"
                " ORDER BY seq DESC LIMIT -1 OFFSET ?)",
                (topic, self.held_per_room),
            )
        if added:
            await self._changed(now)
        return added > 0

    async def held(self, topic: str, epoch: int) -> list[Held]:
        rows = await self._fetchall(
            "SELECT message_id, envelope, publisher FROM held WHERE room_topic = ? AND epoch = ?"
            " ORDER BY seq",
            (topic, epoch),
        )
        return [Held(str(r[0]), str(r[1]), bytes(r[2])) for r in rows]

    async def release(self, topic: str, message_id: str) -> None:
        await self._execute(
            "DELETE FROM held WHERE room_topic = ? AND message_id = ?", (topic, message_id)
        )

    async def count_held(self, topic: str) -> int:
        row = await self._fetchone("SELECT count(*) FROM held WHERE room_topic = ?", (topic,))
        return int(row[0]) if row else 0

    async def _changed(self, now_ms: int) -> None:
        self._unpruned += 1
        if self._unpruned >= self.bounds.prune_every:
            await self.prune(now_ms)

    async def prune(self, now_ms: int) -> int:
        """Apply ``bounds``; return how many rooms went."""
        self._unpruned = 0
        self._forget_rooms()
        try:
            return await self._prune(now_ms)
        finally:
            self._forget_rooms()

    async def _prune(self, now_ms: int) -> int:
        async with self._transaction() as db:
            await execute(
                db,
                "DELETE FROM held WHERE received_ms < ?",
                (now_ms - self.bounds.max_age_ms,),
            )
            gone = await execute(
                db,
                "DELETE FROM private_rooms WHERE room_topic IN (SELECT room_topic FROM"
                " private_rooms ORDER BY updated_ms DESC, room_topic LIMIT -1 OFFSET ?)",
                (self.bounds.max_rows,),
            )
            for table in ("room_keys", "held"):
                await execute(
                    db,
                    f"DELETE FROM {table} WHERE room_topic NOT IN"
                    " (SELECT room_topic FROM private_rooms)",
                )
        return gone
