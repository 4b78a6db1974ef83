"""The transcript: envelopes heard on central (``agents.lobby``) and on rooms, plus memberships.

Invariants:
- A message is identified by ``(room_topic, message_id)``. Recording it again is ignored, not an
  error, and reported as not new: one ``INSERT ... ON CONFLICT DO NOTHING``, atomic across
  processes, so two taps of the same room never store a message twice.
- Reads order messages by ``sent_at`` (the sender's clock), then ``received_ms`` (ours), then
  arrival order; a ``limit`` keeps the newest ones and returns them oldest first. ``since_ms``
  filters on ``received_ms`` (inclusive): a sender's clock cannot hide a message from a reader.
- ``refs`` and ``participants`` are stored as JSON arrays of text; ``envelope`` is the raw JSON
  text as received (checked to parse, stored unchanged); flags are the ints 0/1.
- Memberships: at most one row per room. Joining while joined keeps ``joined_ms`` and an
  opener stays the opener; leaving keeps the row with ``left_ms`` set; joining again starts anew.
- Public rooms seen on central: one row per topic; the first opener announced for a topic keeps
  it: an announcement naming another opener is ignored.
- Bounded (``Bounds``, default ``DEFAULT_BOUNDS``: 10,000 messages per room, 30 days): ``prune``
  deletes messages received more than ``max_age_ms`` ago and, per room, the earliest arrived
  (lowest ``seq``: a sender's clock cannot keep its messages in) beyond ``max_rows``; public
  rooms seen are cut to the ``max_rows`` most recently announced. It runs by itself after every
  ``prune_every`` new messages (with their ``received_ms`` as now), so a flood grows a room by
  at most ``prune_every`` rows past its bound.
- The store holds what it is given: envelope validation and attestation are the agent layer's;
  the type checks of its arguments and the JSON text arrays are ``transcript_columns``'.
- Read marks, catch-up marks and gaps: ``macula.store.unread`` (schema step 2); the realm of
  each room: ``macula.store.room_realms`` (step 3); the full-text index of the messages:
  ``macula.store.search`` (step 4). The oldest
  unread message is the first in transcript order (a message caught up late still comes in
  its place); "the first after an envelope" is by ``seq`` (arrival here), so a sender's slow
  clock cannot hide a reply.
"""

from __future__ import annotations

import json
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import aiosqlite

from macula.store.base import (
    DAY_MS,
    Bounds,
    Migration,
    Params,
    Row,
    check_flag,
    execute,
    fetchall,
    opt_int,
    opt_text,
    page,
    sql_int,
)
from macula.store.room_realms import TRANSCRIPT_V3, RoomRealms, check_realm
from macula.store.search import SEARCH_MESSAGES_V4, MessageSearch
from macula.store.transcript_columns import (
    MESSAGE_COLUMNS,
    TranscriptMessage,
    check_envelope,
    check_int,
    check_text,
    json_texts,
    message_from_row,
    opt_text_arg,
)
from macula.store.unread import TRANSCRIPT_V2
from macula.wire.identity import ZERO_REALM

__all__ = [
    "DEFAULT_BOUNDS",
    "PublicRoom",
    "RoomActivity",
    "RoomMembership",
    "RoomRole",
    "TranscriptMessage",
    "TranscriptStore",
]

DEFAULT_BOUNDS: Final = Bounds(max_rows=10_000, max_age_ms=30 * DAY_MS)

RoomRole = Literal["opener", "participant"]
ROLES: Final = ("opener", "participant")

_TRANSCRIPT_V1: Final[Migration] = (
    """
    CREATE TABLE messages (
        seq          INTEGER PRIMARY KEY,   -- arrival order in this file
        room_topic   TEXT NOT NULL,
        message_id   TEXT NOT NULL,
        from_hex     TEXT NOT NULL,
        kind         TEXT NOT NULL,
        text         TEXT,
        in_reply_to  TEXT,
        refs         TEXT,                  -- JSON array of text, or NULL
        participants TEXT,                  -- JSON array of text, or NULL
        purpose      TEXT,
        sent_at      INTEGER NOT NULL,      -- sender clock, unix ms
        received_ms  INTEGER NOT NULL,      -- our clock, unix ms
        publisher    BLOB,                  -- the station-reported publisher
        attested     INTEGER NOT NULL CHECK (attested IN (0, 1)),
        envelope     TEXT NOT NULL,         -- the raw envelope JSON
        UNIQUE (room_topic, message_id)
    )
    """,
    "CREATE INDEX messages_by_room_time ON messages (room_topic, sent_at, received_ms)",
    "CREATE INDEX messages_by_room_kind ON messages (room_topic, kind, received_ms)",
    "CREATE INDEX messages_by_received ON messages (received_ms)",
    """
    CREATE TABLE memberships (
        room_topic TEXT PRIMARY KEY,
        role       TEXT NOT NULL CHECK (role IN ('opener', 'participant')),
        public     INTEGER NOT NULL CHECK (public IN (0, 1)),
        purpose    TEXT,
        joined_ms  INTEGER NOT NULL,
        left_ms    INTEGER                  -- NULL while joined
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE public_rooms (
        room_topic    TEXT PRIMARY KEY,
        opener_hex    TEXT NOT NULL,
        purpose       TEXT,
        first_seen_ms INTEGER NOT NULL,
        last_seen_ms  INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
)


_INSERT_MESSAGE: Final = """
INSERT INTO messages (room_topic, message_id, from_hex, kind, text, in_reply_to, refs,
                      participants, purpose, sent_at, received_ms, publisher, attested, envelope,
                      event_seq)
VALUES (:room_topic, :message_id, :from_hex, :kind, :text, :in_reply_to, :refs,
        :participants, :purpose, :sent_at, :received_ms, :publisher, :attested, :envelope,
        :event_seq)
ON CONFLICT (room_topic, message_id) DO NOTHING
"""

_MEMBERSHIP_COLUMNS: Final = "room_topic, role, public, purpose, joined_ms, left_ms, realm"
_PUBLIC_ROOM_COLUMNS: Final = "room_topic, opener_hex, purpose, first_seen_ms, last_seen_ms"


@dataclass(frozen=True, slots=True)
class RoomActivity:
    room_topic: str
    messages: int
    last_sent_at: int
    last_received_ms: int


@dataclass(frozen=True, slots=True)
class RoomMembership:
    room_topic: str
    role: RoomRole
    public: int  # 0 or 1
    purpose: str | None
    joined_ms: int
    left_ms: int | None
    realm: bytes = ZERO_REALM  # the realm its envelopes are published and tapped in


@dataclass(frozen=True, slots=True)
class PublicRoom:
    room_topic: str
    opener_hex: str
    purpose: str | None
    first_seen_ms: int
    last_seen_ms: int


class TranscriptStore(RoomRealms, MessageSearch):
    """Messages of central and of rooms, the rooms joined, and public rooms seen on central."""

    MIGRATIONS = (_TRANSCRIPT_V1, TRANSCRIPT_V2, TRANSCRIPT_V3, SEARCH_MESSAGES_V4)

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        super().__init__(db, path)
        self.bounds: Bounds = DEFAULT_BOUNDS  # set by the owner after ``open``
        self._unpruned = 0  # new messages since the last prune

    # -- messages ------------------------------------------------------------------------------

    async def record(
        self,
        *,
        room_topic: str,
        message_id: str,
        from_hex: str,
        kind: str,
        sent_at: int,
        received_ms: int,
        envelope: str,
        text: str | None = None,
        in_reply_to: str | None = None,
        refs: Sequence[str] | None = None,
        participants: Sequence[str] | None = None,
        purpose: str | None = None,
        publisher: bytes | None = None,
        attested: int = 0,
        event_seq: int | None = None,
    ) -> bool:
        """Store one envelope; True if new, False if ``(room_topic, message_id)`` was known."""
        for name, value in (
            ("room_topic", room_topic),
            ("message_id", message_id),
            ("from_hex", from_hex),
            ("kind", kind),
        ):
            check_text(value, name)
        check_envelope(envelope)
        if publisher is not None and type(publisher) is not bytes:
            raise ValueError("publisher must be bytes or None")
        params = {
            "room_topic": room_topic,
            "message_id": message_id,
            "from_hex": from_hex,
            "kind": kind,
            "text": opt_text_arg(text, "text"),
            "in_reply_to": opt_text_arg(in_reply_to, "in_reply_to"),
            "refs": json_texts(refs, "refs"),
            "participants": json_texts(participants, "participants"),
            "purpose": opt_text_arg(purpose, "purpose"),
            "sent_at": check_int(sent_at, "sent_at"),
            "received_ms": check_int(received_ms, "received_ms"),
            "publisher": publisher,
            "attested": check_flag(attested, "attested"),
            "envelope": envelope,
            "event_seq": None if event_seq is None else check_int(event_seq, "event_seq"),
        }
        new = await self._execute_one_trip(_INSERT_MESSAGE, params, inline=True) > 0
        if new:
            self._unpruned += 1
            if self._unpruned >= self.bounds.prune_every:
                await self.prune(received_ms)
        return new

    async def messages(
        self, room_topic: str | None, since_ms: int | None = None, limit: int = 100
    ) -> list[TranscriptMessage]:
        """The newest ``limit`` messages of ``room_topic`` (every room when None) received at or
        after ``since_ms``, oldest first."""
        return await self._select([], {}, room_topic, since_ms, limit)

    async def recent(
        self, kind_in: Set[str], room_topic: str | None, since_ms: int | None, limit: int = 50
    ) -> list[TranscriptMessage]:
        """Like ``messages``, only the kinds in ``kind_in`` (e.g. help broadcasts on central)."""
        if not kind_in:
            return []
        names = {f"kind{i}": kind for i, kind in enumerate(sorted(kind_in))}
        clause = "kind IN (" + ", ".join(f":{name}" for name in names) + ")"
        return await self._select([clause], names, room_topic, since_ms, limit)

    async def before(
        self, topics: Sequence[str], before_seq: int | None, limit: int
    ) -> tuple[list[TranscriptMessage], int]:
        """The ``limit`` latest messages of ``topics`` that arrived before ``before_seq`` (all
        when None), in arrival order (``seq``), and how many arrived before those."""
        limit, _ = page(limit)
        params = {"topics": json.dumps(list(topics)), "limit": limit}
        params["before"] = 2**62 if before_seq is None else sql_int(before_seq)
        rows = await self._fetchall(
            f"SELECT {MESSAGE_COLUMNS}, count(*) OVER () FROM messages"
            " WHERE room_topic IN (SELECT value FROM json_each(:topics)) AND seq < :before"
            " ORDER BY seq DESC LIMIT :limit",
            params,
        )
        total = int(rows[0][-1]) if rows else 0
        found = [message_from_row(tuple(row[:-1]), self.path) for row in reversed(rows)]
        return found, total - len(found)

    async def last_message(self, room_topic: str) -> TranscriptMessage | None:
        """The newest message of ``room_topic`` in transcript order, if any."""
        found = await self._select([], {}, room_topic, None, 1)
        return found[0] if found else None

    async def message(self, room_topic: str, message_id: str) -> TranscriptMessage | None:
        """One message by its id, if recorded."""
        rows = await self._fetchall(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE room_topic = ? AND message_id = ?",
            (room_topic, message_id),
        )
        return message_from_row(rows[0], self.path) if rows else None

    async def rooms(self) -> list[RoomActivity]:
        """Every topic with recorded messages, most recently active (by our clock) first."""
        rows = await self._fetchall(
            "SELECT room_topic, count(*), max(sent_at), max(received_ms) FROM messages"
            " GROUP BY room_topic ORDER BY max(received_ms) DESC, room_topic"
        )
        return [RoomActivity(str(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in rows]

    async def prune(self, now_ms: int) -> int:
        """Apply ``bounds``; return how many messages went. Deletes at most ``bounds.batch``
        messages per rule; public rooms last announced, and memberships left, more than
        ``max_age_ms`` ago go too."""
        bounds = self.bounds
        cutoff = now_ms - bounds.max_age_ms
        self._unpruned = 0
        async with self._transaction() as db:
            removed = await execute(
                db,
                "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages"
                " WHERE received_ms < ? LIMIT ?)",
                (cutoff, bounds.batch),
            )
            budget = bounds.batch
            crowded = await fetchall(
                db,
                "SELECT room_topic, count(*) - :max FROM messages GROUP BY room_topic"
                " HAVING count(*) > :max ORDER BY count(*) DESC",
                {"max": bounds.max_rows},
            )
            for room_topic, excess in crowded:
                if budget <= 0:
                    break
                cut = await execute(
                    db,
                    "DELETE FROM messages WHERE seq IN (SELECT seq FROM messages"
                    " WHERE room_topic = ? ORDER BY seq LIMIT ?)",
                    (room_topic, min(int(excess), budget)),
                )
                budget -= cut
                removed += cut
            await execute(db, "DELETE FROM public_rooms WHERE last_seen_ms < ?", (cutoff,))
            await execute(
                db,
                "DELETE FROM public_rooms WHERE room_topic IN (SELECT room_topic"
                " FROM public_rooms ORDER BY last_seen_ms DESC, room_topic LIMIT -1 OFFSET ?)",
                (bounds.max_rows,),
            )
            await execute(
                db,
                "DELETE FROM memberships WHERE left_ms IS NOT NULL AND left_ms < ?",
                (cutoff,),
            )
            await execute(db, "DELETE FROM catchup_marks WHERE caught_ms < ?", (cutoff,))
            await execute(db, "DELETE FROM gaps WHERE noted_ms < ?", (cutoff,))
            await execute(db, "DELETE FROM invited_realms WHERE noted_ms < ?", (cutoff,))
        return removed

    async def _select(
        self,
        clauses: list[str],
        params: dict[str, Any],
        room_topic: str | None,
        since_ms: int | None,
        limit: int,
    ) -> list[TranscriptMessage]:
        limit, _ = page(limit)
        params = {**params, "limit": limit}
        if room_topic is not None:
            clauses = [*clauses, "room_topic = :room_topic"]
            params["room_topic"] = room_topic
        if since_ms is not None:
            clauses = [*clauses, "received_ms >= :since"]
            params["since"] = sql_int(since_ms)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._fetchall(
            f"SELECT * FROM (SELECT {MESSAGE_COLUMNS} FROM messages {where}"
            " ORDER BY sent_at DESC, received_ms DESC, seq DESC LIMIT :limit)"
            " ORDER BY sent_at, received_ms, seq",
            params,
        )
        return [message_from_row(row, self.path) for row in rows]

    # -- memberships ---------------------------------------------------------------------------

    async def join_room(
        self,
        topic: str,
        role: RoomRole,
        public: int,
        purpose: str | None,
        now_ms: int,
        realm: bytes = ZERO_REALM,
    ) -> bool:
        """Note that we are in ``topic`` (in ``realm``); True if newly joined (not already a
        member: then the membership, its realm included, is kept)."""
        check_text(topic, "topic")
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        params: Params = {
            "topic": topic,
            "role": role,
            "public": check_flag(public, "public"),
            "purpose": opt_text_arg(purpose, "purpose"),
            "now": now_ms,
            "realm": check_realm(realm),
        }
        async with self._transaction() as db:
            rows = await fetchall(
                db, "SELECT left_ms FROM memberships WHERE room_topic = ?", (topic,)
            )
            if rows and rows[0][0] is None:
                await execute(
                    db,
                    "UPDATE memberships SET public = :public,"
                    " role = CASE role WHEN 'opener' THEN 'opener' ELSE :role END,"
                    " purpose = coalesce(:purpose, purpose) WHERE room_topic = :topic",
                    params,
                )
                return False
            await execute(
                db,
                f"INSERT OR REPLACE INTO memberships ({_MEMBERSHIP_COLUMNS})"
                " VALUES (:topic, :role, :public, :purpose, :now, NULL, :realm)",
                params,
            )
            return True

    async def leave_room(self, topic: str, now_ms: int) -> bool:
        """Note that we left ``topic``; True if we were in it."""
        changed = await self._execute(
            "UPDATE memberships SET left_ms = ? WHERE room_topic = ? AND left_ms IS NULL",
            (now_ms, topic),
        )
        return changed > 0

    async def joined_rooms(self) -> list[RoomMembership]:
        """Rooms we are in, earliest joined first."""
        rows = await self._fetchall(
            f"SELECT {_MEMBERSHIP_COLUMNS} FROM memberships WHERE left_ms IS NULL"
            " ORDER BY joined_ms, room_topic",
            inline=True,
        )
        return [_membership(row) for row in rows]

    # -- public rooms seen on central ----------------------------------------------------------

    async def note_public_room(
        self, topic: str, opener_hex: str, purpose: str | None, now_ms: int
    ) -> bool:
        """Remember a ``room_opened`` announcement seen on central; True if the topic is new.
        A repeat by the same opener refreshes it; one naming another opener is ignored."""
        check_text(topic, "topic")
        check_text(opener_hex, "opener_hex")
        params: Params = {
            "topic": topic,
            "opener": opener_hex,
            "purpose": opt_text_arg(purpose, "purpose"),
            "now": now_ms,
        }
        async with self._transaction() as db:
            rows = await fetchall(
                db, "SELECT opener_hex FROM public_rooms WHERE room_topic = ?", (topic,)
            )
            if not rows:
                await execute(
                    db,
                    f"INSERT INTO public_rooms ({_PUBLIC_ROOM_COLUMNS})"
                    " VALUES (:topic, :opener, :purpose, :now, :now)",
                    params,
                )
                return True
            if rows[0][0] == opener_hex:
                await execute(
                    db,
                    "UPDATE public_rooms SET purpose = coalesce(:purpose, purpose),"
                    " last_seen_ms = max(last_seen_ms, :now) WHERE room_topic = :topic",
                    params,
                )
            return False

    async def seen_rooms(self) -> list[PublicRoom]:
        """Public rooms announced on central, most recently announced first."""
        rows = await self._fetchall(
            f"SELECT {_PUBLIC_ROOM_COLUMNS} FROM public_rooms"
            " ORDER BY last_seen_ms DESC, room_topic"
        )
        return [
            PublicRoom(str(r[0]), str(r[1]), opt_text(r[2]), int(r[3]), int(r[4])) for r in rows
        ]


# --- arguments and rows -----------------------------------------------------------------------


def _membership(row: Row) -> RoomMembership:
    role: RoomRole = "opener" if row[1] == "opener" else "participant"
    return RoomMembership(
        room_topic=str(row[0]),
        role=role,
        public=int(row[2]),
        purpose=opt_text(row[3]),
        joined_ms=int(row[4]),
        left_ms=opt_int(row[5]),
        realm=bytes(row[6]),
    )
