"""The transcript's read marks, catch-up marks and unfillable gaps (schema step 2 of
``transcript.sqlite3``; ``TranscriptStore`` inherits these methods).

Invariants:
- Every message has ``read_ms``: NULL while unread. A message is marked read at most once
  (``UPDATE ... WHERE read_ms IS NULL``), so of two waiters racing for one message exactly one
  gets it. Messages recorded before this step existed count as read (they were shown already).
- ``event_seq`` is the publisher's event ``seq`` (NULL for what we recorded ourselves before
  publishing); with ``publisher`` it says whether a message the station reports expired is one
  we hold.
- Catch-up marks: per ``(room_topic, station key)`` the history id read through (ids are the
  station's; another station starts from nothing). Gaps: per room, how many messages we know
  we missed and can no longer fetch, summed over catch-ups.
"""

from __future__ import annotations

from typing import Final

from macula.store.base import Migration, SqliteStore

TRANSCRIPT_V2: Final[Migration] = (
    "ALTER TABLE messages ADD COLUMN event_seq INTEGER",
    "ALTER TABLE messages ADD COLUMN read_ms INTEGER",
    "UPDATE messages SET read_ms = received_ms",
    "CREATE INDEX messages_unread ON messages (room_topic, seq) WHERE read_ms IS NULL",
    "CREATE INDEX messages_by_event ON messages (room_topic, publisher, event_seq)",
    """
    CREATE TABLE catchup_marks (
        room_topic TEXT NOT NULL,
        station    BLOB NOT NULL,
        after_id   INTEGER NOT NULL,
        caught_ms  INTEGER NOT NULL,
        PRIMARY KEY (room_topic, station)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE gaps (
        room_topic TEXT PRIMARY KEY,
        lost       INTEGER NOT NULL,
        noted_ms   INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
)


class UnreadMarks(SqliteStore):
    """Read marks, catch-up marks and gaps of a transcript (see the module invariants)."""

    async def mark_read(self, room_topic: str, seqs: list[int], now_ms: int) -> int:
        """Mark these messages (by ``seq``) of ``room_topic`` read; how many were unread."""
        if not seqs:
            return 0
        marks = ", ".join(str(int(seq)) for seq in seqs)
        return await self._execute(
            f"UPDATE messages SET read_ms = ? WHERE room_topic = ? AND seq IN ({marks})"
            " AND read_ms IS NULL",
            (now_ms, room_topic),
        )

    async def unread_counts(self, me_hex: str) -> dict[str, int]:
        """Per topic, unread attested messages from someone other than ``me_hex``."""
        rows = await self._fetchall(
            "SELECT room_topic, count(*) FROM messages WHERE read_ms IS NULL AND attested = 1"
            " AND from_hex != ? GROUP BY room_topic",
            (me_hex,),
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def has_event(self, room_topic: str, publisher: bytes, event_seq: int) -> bool:
        """True if we hold the message ``publisher`` published in ``room_topic`` as ``seq``."""
        row = await self._fetchone(
            "SELECT 1 FROM messages WHERE room_topic = ? AND publisher = ? AND event_seq = ?",
            (room_topic, publisher, event_seq),
        )
        return row is not None

    async def catchup_mark(self, room_topic: str, station: bytes) -> int | None:
        row = await self._fetchone(
            "SELECT after_id FROM catchup_marks WHERE room_topic = ? AND station = ?",
            (room_topic, station),
        )
        return None if row is None else int(row[0])

    async def set_catchup_mark(
        self, room_topic: str, station: bytes, after_id: int, now_ms: int
    ) -> None:
        await self._execute(
            "INSERT INTO catchup_marks (room_topic, station, after_id, caught_ms)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (room_topic, station) DO UPDATE SET"
            " after_id = max(after_id, excluded.after_id), caught_ms = excluded.caught_ms",
            (room_topic, station, after_id, now_ms),
        )

    async def add_gap(self, room_topic: str, lost: int, now_ms: int) -> None:
        """Note ``lost`` more messages of ``room_topic`` that cannot be fetched any more."""
        if lost <= 0:
            return
        await self._execute(
            "INSERT INTO gaps (room_topic, lost, noted_ms) VALUES (?, ?, ?)"
            " ON CONFLICT (room_topic) DO UPDATE SET lost = lost + excluded.lost,"
            " noted_ms = excluded.noted_ms",
            (room_topic, lost, now_ms),
        )

    async def gaps(self) -> dict[str, int]:
        """Per room, how many messages we know we missed for good."""
        rows = await self._fetchall("SELECT room_topic, lost FROM gaps ORDER BY room_topic")
        return {str(r[0]): int(r[1]) for r in rows}
