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

import json
import sqlite3
from collections.abc import Callable, Sequence, Set
from typing import Final

from macula.store.base import Migration, Row, SqliteStore, page, sql_int
from macula.store.transcript_columns import MESSAGE_COLUMNS, TranscriptMessage, message_from_row

# how many of the leading messages offered go into a page (a caller's byte budget)
Fit = Callable[[list[TranscriptMessage]], int]

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

    async def take_unread(
        self,
        room_topic: str,
        me_hex: str,
        now_ms: int,
        *,
        after_seq: int | None = None,
        limit: int = 20,
        max_chars: int = 16_384,
        fit: Fit | None = None,
        accept: Callable[[list[TranscriptMessage], int], bool] | None = None,
    ) -> tuple[list[TranscriptMessage], int]:
        """Attested messages of ``room_topic`` from someone other than ``me_hex``: the unread
        in transcript order, or (``after_seq``) those that arrived after that ``seq``, read or
        not; up to ``limit`` whose envelopes total at most ``max_chars`` (the first always
        fits) and, with ``fit``, of those the leading ones ``fit`` admits (at least one), marked
        read in one transaction (no other waiter gets them too), and how many more are left.
        ``accept`` (given the messages and how many are left) may refuse them all: then
        nothing is taken and nothing marked."""
        limit, _ = page(limit)
        after = None if after_seq is None else sql_int(after_seq)
        where, order = _unread_filter(after)
        params = {"room": room_topic, "me": me_hex, "after": after, "limit": limit}
        select = (
            f"SELECT {MESSAGE_COLUMNS}, read_ms IS NULL, count(*) OVER () FROM messages"
            f" WHERE {where} ORDER BY {order} LIMIT :limit"
        )  # count(*) OVER (): every row the WHERE matches, before the LIMIT

        def take(
            connection: sqlite3.Connection,
        ) -> tuple[list[TranscriptMessage], int, list[int]]:
            counted = connection.execute(select, params).fetchall()
            total = int(counted[0][-1]) if counted else 0
            rows = _within([tuple(row[:-2]) for row in counted], max_chars)
            taken = [message_from_row(row, self.path) for row in rows]
            if fit is not None and taken:
                taken = taken[: max(1, min(len(taken), fit(taken)))]
            if accept is not None and taken and not accept(taken, total - len(taken)):
                return [], total, []
            unread = zip(taken, (row[-2] for row in counted), strict=False)
            marked = [message.seq for message, was_unread in unread if was_unread]
            if marked:
                connection.execute(
                    f"UPDATE messages SET read_ms = ? WHERE seq IN ({_ints(marked)})", (now_ms,)
                )
            return taken, total, marked

        def unmark(
            connection: sqlite3.Connection, took: tuple[list[TranscriptMessage], int, list[int]]
        ) -> None:
            if took[2]:  # a cancelled take returned nothing: what it marked is unread again
                connection.execute(
                    f"UPDATE messages SET read_ms = NULL WHERE seq IN ({_ints(took[2])})"
                )

        taken, total, _ = await self._atomically(take, unmark, inline=True)
        return taken, total - len(taken)

    async def unread_page(
        self,
        topics: Sequence[str],
        me_hex: str,
        *,
        lobby: str,
        lobby_kinds: Set[str],
        after_seq: int = 0,
        limit: int = 200,
    ) -> tuple[list[TranscriptMessage], int]:
        """The inbox's candidates: unread attested messages from someone other than ``me_hex``
        in ``topics``, and on ``lobby`` those of ``lobby_kinds``, with ``seq`` > ``after_seq``,
        in arrival order (``seq``): up to ``limit`` of them, and how many match in all. Marks
        nothing (``mark_read_seqs`` marks what the caller showed)."""
        limit, _ = page(limit)
        kinds = sorted(lobby_kinds)
        names = {f"kind{i}": kind for i, kind in enumerate(kinds)}
        lobby_clause = (
            f"(room_topic = :lobby AND kind IN ({', '.join(':' + n for n in names)}))"
            if names
            else "0"
        )
        params: dict[str, object] = {
            "topics": json.dumps(list(topics)),
            "me": me_hex,
            "lobby": lobby,
            "after": sql_int(after_seq),
            "limit": limit,
            **names,
        }
        rows = await self._fetchall(
            f"SELECT {MESSAGE_COLUMNS}, count(*) OVER () FROM messages"
            " WHERE read_ms IS NULL AND attested = 1 AND from_hex != :me AND seq > :after"
            f" AND (room_topic IN (SELECT value FROM json_each(:topics)) OR {lobby_clause})"
            " ORDER BY seq LIMIT :limit",
            params,
        )
        total = int(rows[0][-1]) if rows else 0
        return [message_from_row(tuple(row[:-1]), self.path) for row in rows], total

    async def mark_read_seqs(self, seqs: Sequence[int], now_ms: int) -> int:
        """Mark these messages (by ``seq``, any room) read; how many were unread."""
        if not seqs:
            return 0
        return await self._execute(
            f"UPDATE messages SET read_ms = ? WHERE seq IN ({_ints(list(seqs))})"
            " AND read_ms IS NULL",
            (now_ms,),
        )

    async def message_at(self, seq: int) -> TranscriptMessage | None:
        """The message recorded as ``seq``, if it is still kept."""
        rows = await self._fetchall(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE seq = ?", (sql_int(seq),)
        )
        return message_from_row(rows[0], self.path) if rows else None

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


def _unread_filter(after_seq: int | None) -> tuple[str, str]:
    """WHERE and ORDER BY of the attested messages of ``:room`` from someone other than
    ``:me``: unread in transcript order, or (``after_seq``) arrived after ``:after``."""
    where = "room_topic = :room AND attested = 1 AND from_hex != :me"
    if after_seq is None:  # transcript order: what was said first
        return where + " AND read_ms IS NULL", "sent_at, received_ms, seq"
    return where + " AND seq > :after", "seq"  # a sender's clock cannot hide a reply


def _ints(values: list[int]) -> str:
    """Integers for an ``IN (...)`` list (ints only: nothing else is ever spliced into SQL)."""
    return ", ".join(str(int(value)) for value in values)


def _within(rows: list[Row], max_chars: int) -> list[Row]:
    """The leading rows whose envelopes (the last column) total at most ``max_chars``; the
    first row always."""
    kept: list[Row] = []
    used = 0
    for row in rows:
        used += len(row[-1])
        if kept and used > max_chars:
            break
        kept.append(row)
    return kept
