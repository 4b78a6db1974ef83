"""Rings, both directions: the ones we placed and the ones placed to us.

Invariants:
- One row per ``ring_id``, whatever the direction: adding a known ring id is a no-op reported as
  ``"duplicate"`` (a retried ring is not a second ring).
- ``state`` follows ``answer``: 1 accepted, 2 declined, 3 deferred (``pending``); no answer yet is
  ``pending`` too; ``unreachable`` has no answer; ``expired`` keeps the answer it had.
- Only a ``pending`` ring changes state. A pending ring whose ``expires_ms`` has come
  (``now_ms >= expires_ms``) is expired, marked so lazily by ``expire``, ``pending``,
  ``set_answer``, ``set_unreachable`` and ``get(..., now_ms)``; a ring that is pending when added
  or deferred without an expiry gets ``now_ms + RING_TTL_MS`` (24 h).
- Counting pending rings from a caller and adding one more happen in one ``BEGIN IMMEDIATE``
  transaction (``add(..., pending_limit=...)``), so two processes cannot both take the last slot.
- Bounded (``Bounds``, default ``DEFAULT_BOUNDS``: 10,000 rings, 30 days): ``prune`` deletes
  settled rings (not live ``pending``) unchanged for more than ``max_age_ms``, then the oldest
  rings beyond ``max_rows`` (settled ones first, then pending ones: many callers cannot pin
  rows). It runs by itself after every ``prune_every`` rings added.
- The store holds what it is given: proofs, policy and the peer's right to answer are checked by
  the ring layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import aiosqlite

from macula.store.base import (
    DAY_MS,
    Bounds,
    Migration,
    Row,
    SqliteStore,
    check_flag,
    check_node_id,
    execute,
    fetchall,
    opt_int,
    opt_text,
    page,
)

__all__ = [
    "ANSWER_ACCEPTED",
    "ANSWER_DECLINED",
    "ANSWER_DEFERRED",
    "DEFAULT_BOUNDS",
    "MAX_PENDING_PER_CALLER",
    "RING_TTL_MS",
    "AddOutcome",
    "Ring",
    "RingDirection",
    "RingState",
    "RingStore",
]

RingDirection = Literal["incoming", "outgoing"]
RingState = Literal["pending", "accepted", "declined", "unreachable", "expired"]
AddOutcome = Literal["added", "duplicate", "over_limit"]

ANSWER_ACCEPTED: Final = 1
ANSWER_DECLINED: Final = 2
ANSWER_DEFERRED: Final = 3
RING_TTL_MS: Final = 24 * 3600 * 1000
MAX_PENDING_PER_CALLER: Final = 3
DEFAULT_BOUNDS: Final = Bounds(max_rows=10_000, max_age_ms=30 * DAY_MS)

DIRECTIONS: Final[tuple[RingDirection, ...]] = ("incoming", "outgoing")
STATES: Final[tuple[RingState, ...]] = ("pending", "accepted", "declined", "unreachable", "expired")
_STATE_OF_ANSWER: Final[dict[int | None, RingState]] = {
    None: "pending",
    ANSWER_ACCEPTED: "accepted",
    ANSWER_DECLINED: "declined",
    ANSWER_DEFERRED: "pending",
}

_RINGS_V1: Final[Migration] = (
    """
    CREATE TABLE rings (
        ring_id         TEXT PRIMARY KEY,
        direction       TEXT NOT NULL CHECK (direction IN ('incoming', 'outgoing')),
        peer            BLOB NOT NULL CHECK (length(peer) = 32),
        purpose         TEXT,
        room_topic      TEXT,
        state           TEXT NOT NULL CHECK (state IN
                            ('pending', 'accepted', 'declined', 'unreachable', 'expired')),
        answer          INTEGER CHECK (answer IS NULL OR answer IN (1, 2, 3)),
        reason          TEXT,
        created_ms      INTEGER NOT NULL,
        updated_ms      INTEGER NOT NULL,
        expires_ms      INTEGER,
        caller_notified INTEGER CHECK (caller_notified IS NULL OR caller_notified IN (0, 1))
    ) WITHOUT ROWID
    """,
    "CREATE INDEX rings_by_state ON rings (state, expires_ms)",
    "CREATE INDEX rings_by_peer ON rings (peer, direction, state)",
    "CREATE INDEX rings_by_created ON rings (created_ms)",
)

_COLUMNS: Final = (
    "ring_id, direction, peer, purpose, room_topic, state, answer, reason, created_ms,"
    " updated_ms, expires_ms, caller_notified"
)

_EXPIRE: Final = (
    "UPDATE rings SET state = 'expired', updated_ms = :now"
    " WHERE state = 'pending' AND expires_ms IS NOT NULL AND expires_ms <= :now"
)
_LIVE: Final = "state = 'pending' AND (expires_ms IS NULL OR expires_ms > :now)"


@dataclass(frozen=True, slots=True)
class Ring:
    ring_id: str
    direction: RingDirection
    peer: bytes
    purpose: str | None
    room_topic: str | None
    state: RingState
    answer: int | None
    reason: str | None
    created_ms: int
    updated_ms: int
    expires_ms: int | None
    caller_notified: int | None  # 0, 1 or None


class RingStore(SqliteStore):
    """Rings placed and received, with their answers and expiry."""

    MIGRATIONS = (_RINGS_V1,)

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        super().__init__(db, path)
        self.bounds: Bounds = DEFAULT_BOUNDS  # set by the owner after ``open``
        self._unpruned = 0  # rings added since the last prune

    async def add(
        self,
        ring_id: str,
        direction: RingDirection,
        peer: bytes,
        now_ms: int,
        *,
        purpose: str | None = None,
        room_topic: str | None = None,
        answer: int | None = None,
        reason: str | None = None,
        expires_ms: int | None = None,
        caller_notified: int | None = None,
        pending_limit: int | None = None,
    ) -> AddOutcome:
        """Record a ring; its state follows ``answer`` (None or 3: pending, 1 accepted,
        2 declined). With ``pending_limit``, a pending ring is refused (``"over_limit"``) when
        ``peer`` already has that many live pending rings in this direction."""
        if not isinstance(ring_id, str) or not ring_id:
            raise ValueError("ring_id must be non-empty text")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        check_node_id(peer, "peer")
        state = _state_of(answer)
        if state == "pending" and expires_ms is None:
            expires_ms = now_ms + RING_TTL_MS
        params = {
            "ring_id": ring_id,
            "direction": direction,
            "peer": peer,
            "purpose": purpose,
            "room_topic": room_topic,
            "state": state,
            "answer": answer,
            "reason": reason,
            "now": now_ms,
            "expires_ms": expires_ms,
            "caller_notified": _opt_flag(caller_notified),
        }
        async with self._transaction() as db:
            if await fetchall(db, "SELECT 1 FROM rings WHERE ring_id = ?", (ring_id,)):
                return "duplicate"
            if state == "pending" and pending_limit is not None:
                live = await _count_live(db, peer, direction, now_ms)
                if live >= pending_limit:
                    return "over_limit"
            await execute(
                db,
                f"INSERT INTO rings ({_COLUMNS}) VALUES (:ring_id, :direction, :peer, :purpose,"
                " :room_topic, :state, :answer, :reason, :now, :now, :expires_ms,"
                " :caller_notified)",
                params,
            )
        self._unpruned += 1
        if self._unpruned >= self.bounds.prune_every:
            await self.prune(now_ms)
        return "added"

    async def set_answer(
        self,
        ring_id: str,
        answer: int,
        reason: str | None,
        now_ms: int,
        caller_notified: int | None = None,
    ) -> Ring | None:
        """Answer a pending ring (1 accepted, 2 declined, 3 deferred again); return it updated.
        None when no live pending ring has that id: ``get`` says why. ``caller_notified=None``
        leaves the stored value unchanged."""
        if answer not in (ANSWER_ACCEPTED, ANSWER_DECLINED, ANSWER_DEFERRED):
            raise ValueError(f"answer must be 1, 2 or 3, not {answer!r}")
        params = {
            "ring_id": ring_id,
            "state": _state_of(answer),
            "answer": answer,
            "reason": reason,
            "now": now_ms,
            "ttl": RING_TTL_MS,
            "caller_notified": _opt_flag(caller_notified),
        }
        return await self._settle(
            "UPDATE rings SET state = :state, answer = :answer, reason = :reason,"
            " updated_ms = :now, caller_notified = coalesce(:caller_notified, caller_notified),"
            " expires_ms = CASE WHEN :state = 'pending'"
            " THEN coalesce(expires_ms, :now + :ttl) ELSE expires_ms END"
            f" WHERE ring_id = :ring_id AND {_LIVE}",
            params,
        )

    async def set_unreachable(self, ring_id: str, reason: str | None, now_ms: int) -> Ring | None:
        """A pending (outgoing) ring whose callee could not be reached; None if not pending."""
        return await self._settle(
            "UPDATE rings SET state = 'unreachable', reason = :reason, updated_ms = :now"
            f" WHERE ring_id = :ring_id AND {_LIVE}",
            {"ring_id": ring_id, "reason": reason, "now": now_ms},
        )

    async def set_caller_notified(self, ring_id: str, caller_notified: int, now_ms: int) -> bool:
        """Record whether the caller heard our answer; True if the ring exists."""
        changed = await self._execute(
            "UPDATE rings SET caller_notified = ?, updated_ms = ? WHERE ring_id = ?",
            (check_flag(caller_notified, "caller_notified"), now_ms, ring_id),
        )
        return changed > 0

    async def get(self, ring_id: str, now_ms: int | None = None) -> Ring | None:
        """The ring with that id; with ``now_ms``, a pending ring that is due is expired first."""
        if now_ms is None:
            row = await self._fetchone(
                f"SELECT {_COLUMNS} FROM rings WHERE ring_id = ?", (ring_id,)
            )
            return None if row is None else _ring(row)
        async with self._transaction() as db:
            await execute(
                db, f"{_EXPIRE} AND ring_id = :ring_id", {"now": now_ms, "ring_id": ring_id}
            )
            return await _get(db, ring_id)

    async def pending(self, now_ms: int) -> list[Ring]:
        """Incoming rings still awaiting our answer, oldest first; due ones are expired first."""
        async with self._transaction() as db:
            await execute(db, _EXPIRE, {"now": now_ms})
            rows = await fetchall(
                db,
                f"SELECT {_COLUMNS} FROM rings WHERE direction = 'incoming' AND {_LIVE}"
                " ORDER BY created_ms, ring_id",
                {"now": now_ms},
            )
        return [_ring(row) for row in rows]

    async def recent(self, limit: int = 20, direction: RingDirection | None = None) -> list[Ring]:
        """The newest ``limit`` rings (of one direction, if given), newest first."""
        limit, _ = page(limit)
        where = "" if direction is None else "WHERE direction = :direction"
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM rings {where}"
            " ORDER BY created_ms DESC, ring_id DESC LIMIT :limit",
            {"direction": direction, "limit": limit},
        )
        return [_ring(row) for row in rows]

    async def expire(self, now_ms: int) -> int:
        """Mark every pending ring whose ``expires_ms`` has come as expired; return how many."""
        return await self._execute(_EXPIRE, {"now": now_ms})

    async def prune(self, now_ms: int) -> int:
        """Apply ``bounds`` (due rings are expired first); return how many rings went. Deletes
        at most ``bounds.batch`` rings per rule."""
        bounds = self.bounds
        self._unpruned = 0
        async with self._transaction() as db:
            await execute(db, _EXPIRE, {"now": now_ms})
            removed = await execute(
                db,
                "DELETE FROM rings WHERE ring_id IN (SELECT ring_id FROM rings"
                " WHERE state != 'pending' AND updated_ms < ? LIMIT ?)",
                (now_ms - bounds.max_age_ms, bounds.batch),
            )
            rows = await fetchall(db, "SELECT count(*) FROM rings")
            excess = min(int(rows[0][0]) - bounds.max_rows, bounds.batch)
            if excess > 0:
                removed += await execute(
                    db,
                    "DELETE FROM rings WHERE ring_id IN (SELECT ring_id FROM rings"
                    " ORDER BY state = 'pending', created_ms, ring_id LIMIT ?)",
                    (excess,),
                )
        return removed

    async def count_pending_from(self, peer: bytes, now_ms: int) -> int:
        """Live pending incoming rings from ``peer`` (the callee allows a few per caller)."""
        check_node_id(peer, "peer")
        row = await self._fetchone(
            f"SELECT count(*) FROM rings WHERE peer = :peer AND direction = 'incoming' AND {_LIVE}",
            {"peer": peer, "now": now_ms},
        )
        return int(row[0]) if row is not None else 0

    async def _settle(self, update: str, params: dict[str, object]) -> Ring | None:
        async with self._transaction() as db:
            await execute(db, f"{_EXPIRE} AND ring_id = :ring_id", params)
            if await execute(db, update, params) == 0:
                return None
            return await _get(db, str(params["ring_id"]))


async def _count_live(
    db: aiosqlite.Connection, peer: bytes, direction: RingDirection, now_ms: int
) -> int:
    rows = await fetchall(
        db,
        f"SELECT count(*) FROM rings WHERE peer = :peer AND direction = :direction AND {_LIVE}",
        {"peer": peer, "direction": direction, "now": now_ms},
    )
    return int(rows[0][0])


async def _get(db: aiosqlite.Connection, ring_id: str) -> Ring | None:
    rows = await fetchall(db, f"SELECT {_COLUMNS} FROM rings WHERE ring_id = ?", (ring_id,))
    return _ring(rows[0]) if rows else None


def _state_of(answer: int | None) -> RingState:
    if answer not in _STATE_OF_ANSWER:
        raise ValueError(f"answer must be 1, 2, 3 or None, not {answer!r}")
    return _STATE_OF_ANSWER[answer]


def _opt_flag(value: int | None) -> int | None:
    return None if value is None else check_flag(value, "caller_notified")


def _ring(row: Row) -> Ring:
    direction = str(row[1])
    state = str(row[5])
    if direction not in DIRECTIONS or state not in STATES:  # the CHECK constraints forbid it
        raise ValueError(f"ring {row[0]!r}: unknown direction or state {direction!r}/{state!r}")
    return Ring(
        ring_id=str(row[0]),
        direction="incoming" if direction == "incoming" else "outgoing",
        peer=bytes(row[2]),
        purpose=opt_text(row[3]),
        room_topic=opt_text(row[4]),
        state=next(s for s in STATES if s == state),
        answer=opt_int(row[6]),
        reason=opt_text(row[7]),
        created_ms=int(row[8]),
        updated_ms=int(row[9]),
        expires_ms=opt_int(row[10]),
        caller_notified=opt_int(row[11]),
    )
