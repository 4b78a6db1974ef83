"""The realm each room lives in (schema step 3 of ``transcript.sqlite3``; ``TranscriptStore``
inherits these methods). Issue 13: a room opened in a realm has its envelopes published and
subscribed under that realm's tag, so a station protecting the realm lets only its members
join or read it.

Invariants:
- ``memberships.realm`` is the 32-byte tag the room is tapped and published in; rooms joined
  before this step live in the all-zero realm (the column's default). It is set when the
  membership starts and never changed while it lasts (joining again keeps it).
- ``invited_realms``: the realm a ring named for a room we were invited to and have not
  joined yet (a deferred ring is answered later); one row per room, the first ring's realm
  wins (a later ring cannot move a room to another realm), pruned with the transcript.
- Every realm stored is exactly 32 bytes (``ValueError`` otherwise, before any write).
"""

from __future__ import annotations

from typing import Final

from macula.store.base import Migration
from macula.store.unread import UnreadMarks
from macula.wire.identity import ZERO_REALM

TRANSCRIPT_V3: Final[Migration] = (
    f"ALTER TABLE memberships ADD COLUMN realm BLOB NOT NULL DEFAULT X'{ZERO_REALM.hex()}'",
    """
    CREATE TABLE invited_realms (
        room_topic TEXT PRIMARY KEY,
        realm      BLOB NOT NULL,
        noted_ms   INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
)


def check_realm(realm: bytes) -> bytes:
    if type(realm) is not bytes or len(realm) != 32:
        raise ValueError("realm must be 32 bytes")
    return realm


class RoomRealms(UnreadMarks):
    """Which realm a room we are in, or were invited to, lives in (see the module invariants)."""

    async def room_realm(self, room_topic: str) -> bytes | None:
        """The realm of the room we are in, else the realm a ring invited us to it in, else
        None (unknown: the all-zero realm unless told otherwise)."""
        row = await self._fetchone(
            "SELECT realm, 0 AS rank FROM memberships WHERE room_topic = ? AND left_ms IS NULL"
            " UNION ALL SELECT realm, 1 FROM invited_realms WHERE room_topic = ?"
            " ORDER BY rank LIMIT 1",
            (room_topic, room_topic),
        )
        return None if row is None else bytes(row[0])

    async def note_invited_realm(self, room_topic: str, realm: bytes, now_ms: int) -> bool:
        """Remember that a ring invited us to ``room_topic`` in ``realm``; False if a realm
        was noted for it already (kept)."""
        added = await self._execute(
            "INSERT INTO invited_realms (room_topic, realm, noted_ms) VALUES (?, ?, ?)"
            " ON CONFLICT (room_topic) DO NOTHING",
            (room_topic, check_realm(realm), now_ms),
        )
        return added > 0
