"""The room outbox: room messages said while the connection was down, kept until published
(``macula.agent.room.outbox`` delivers them). Its own file beside the transcript
(``<name>.room_outbox.sqlite3``), so a SIGKILL of the process loses nothing queued.

Invariants:
- A row is one message we said and owe the mesh: the exact payload to publish (JSON text; in
  a private room already sealed), its room, realm and ``message_id``, keyed by ``owner`` (our
  node id) so two agents may share the file. ``(owner, room_topic, message_id)`` is unique:
  queueing one message twice keeps one row.
- Order: ``entry_id`` is the order of acceptance; a room's rows go oldest first, one at a time.
- Bounded per owner (``OutboxBounds``: rows and payload bytes): ``enqueue`` checks both and
  inserts in one ``BEGIN IMMEDIATE`` transaction, so two processes cannot overfill it; a full
  outbox raises ``OutboxFullError`` and changes nothing.
- Rows leave only by ``delivered`` (published and confirmed) or ``drop`` (the caller reports
  how many: leaving a room, goodbye). No clock inside: times are arguments.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.errors import MaculaError
from macula.store.base import Migration, SqliteStore, check_node_id

__all__ = [
    "OutboxBounds",
    "OutboxEntry",
    "OutboxFullError",
    "RoomOutboxStore",
    "room_outbox_path",
]

_V1: Final[Migration] = (
    """
    CREATE TABLE room_outbox (
        entry_id   INTEGER PRIMARY KEY,   -- order of acceptance
        owner      BLOB NOT NULL,         -- our node id
        room_topic TEXT NOT NULL,
        realm      BLOB NOT NULL,         -- the realm it is published in
        message_id TEXT NOT NULL,
        payload    TEXT NOT NULL,         -- the JSON payload to publish (sealed if private)
        size       INTEGER NOT NULL,      -- UTF-8 bytes of payload
        queued_ms  INTEGER NOT NULL,
        attempts   INTEGER NOT NULL DEFAULT 0,
        due_ms     INTEGER NOT NULL,
        last_error TEXT,
        UNIQUE (owner, room_topic, message_id)
    )
    """,
    "CREATE INDEX room_outbox_by_room ON room_outbox (owner, room_topic, entry_id)",
)


def room_outbox_path(transcript: Path) -> Path:
    """Where an agent's room outbox lives: beside its transcript."""
    return transcript.with_name(transcript.stem + ".room_outbox.sqlite3")


@dataclass(frozen=True, slots=True)
class OutboxBounds:
    """How much one agent may have queued: messages and payload bytes."""

    max_messages: int
    max_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    entry_id: int
    room_topic: str
    realm: bytes
    message_id: str
    payload: str
    size: int
    queued_ms: int
    attempts: int
    due_ms: int


class OutboxFullError(MaculaError):
    """The outbox holds as much as its bounds allow; nothing was queued."""

    retryable = True

    def __init__(self, messages: int, size: int, bounds: OutboxBounds) -> None:
        self.messages = messages
        self.size = size
        self.bounds = bounds
        super().__init__(
            f"the room outbox is full: {messages} messages, {size} bytes queued while the "
            f"connection is down (bounds {bounds.max_messages} messages, {bounds.max_bytes} "
            "bytes); nothing was said"
        )


_COLUMNS: Final = (
    "entry_id, room_topic, realm, message_id, payload, size, queued_ms, attempts, due_ms"
)


class RoomOutboxStore(SqliteStore):
    """Queued room messages per owner (see the module invariants)."""

    MIGRATIONS = (_V1,)

    async def enqueue(
        self,
        owner: bytes,
        entry: OutboxEntry,
        bounds: OutboxBounds,
    ) -> int:
        """Queue ``entry`` (its ``entry_id`` is ignored); the rows queued for ``owner`` after.
        ``OutboxFullError`` when it would pass ``bounds``; the same message again is kept once."""
        check_node_id(owner, "owner")
        size = len(entry.payload.encode())

        def work(db: sqlite3.Connection) -> int:
            count, total = db.execute(
                "SELECT count(*), coalesce(sum(size), 0) FROM room_outbox WHERE owner = ?",
                (owner,),
            ).fetchone()
            known = db.execute(
                "SELECT 1 FROM room_outbox WHERE owner = ? AND room_topic = ? AND message_id = ?",
                (owner, entry.room_topic, entry.message_id),
            ).fetchone()
            if known is not None:
                return int(count)
            if count + 1 > bounds.max_messages or total + size > bounds.max_bytes:
                raise OutboxFullError(int(count), int(total), bounds)
            db.execute(
                "INSERT INTO room_outbox (owner, room_topic, realm, message_id, payload, size,"
                " queued_ms, due_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    owner,
                    entry.room_topic,
                    entry.realm,
                    entry.message_id,
                    entry.payload,
                    size,
                    entry.queued_ms,
                    entry.due_ms,
                ),
            )
            return int(count) + 1

        return await self._atomically(work)

    async def entries(self, owner: bytes, room_topic: str | None = None) -> list[OutboxEntry]:
        """What ``owner`` has queued (in one room, or all), oldest first."""
        where = "owner = ?"
        params: list[object] = [owner]
        if room_topic is not None:
            where, params = "owner = ? AND room_topic = ?", [owner, room_topic]
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM room_outbox WHERE {where} ORDER BY entry_id", tuple(params)
        )
        return [
            OutboxEntry(
                int(r[0]),
                str(r[1]),
                bytes(r[2]),
                str(r[3]),
                str(r[4]),
                int(r[5]),
                int(r[6]),
                int(r[7]),
                int(r[8]),
            )
            for r in rows
        ]

    async def delivered(self, entry_id: int) -> None:
        await self._execute("DELETE FROM room_outbox WHERE entry_id = ?", (entry_id,))

    async def retry_later(self, entry_id: int, due_ms: int, why: str) -> None:
        await self._execute(
            "UPDATE room_outbox SET attempts = attempts + 1, due_ms = ?, last_error = ?"
            " WHERE entry_id = ?",
            (due_ms, why[:500], entry_id),
        )

    async def retry_now(self, owner: bytes, now_ms: int) -> int:
        """Make every row due now (the connection is back)."""
        return await self._execute(
            "UPDATE room_outbox SET due_ms = ? WHERE owner = ? AND due_ms > ?",
            (now_ms, owner, now_ms),
        )

    async def drop(self, owner: bytes, room_topic: str | None = None) -> int:
        """Delete what ``owner`` queued (in one room, or all); how many rows went."""
        if room_topic is None:
            return await self._execute("DELETE FROM room_outbox WHERE owner = ?", (owner,))
        return await self._execute(
            "DELETE FROM room_outbox WHERE owner = ? AND room_topic = ?", (owner, room_topic)
        )
