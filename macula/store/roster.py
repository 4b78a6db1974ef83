"""The roster: agents heard saying ``agent.hello`` (what ``mesh_agents`` lists).

Invariants:
- One row per ``node_id`` (32 bytes). ``upsert_hello`` is one ``BEGIN IMMEDIATE`` transaction:
  ``first_seen_ms`` survives every later hello, ``last_seen_ms`` never moves backwards, and the
  descriptive fields are replaced only by a hello whose sender ``at`` is not older than the
  stored one, so a late, reordered hello cannot roll them back.
- An entry unseen for more than ``MAX_AGE_MS`` (15 min) is gone: ``list`` never returns it,
  ``prune`` deletes it, and a hello after such a gap is a new sighting (fresh ``first_seen_ms``).
- ``stale`` is the int 1 exactly when ``now_ms - last_seen_ms > 3 * interval_seconds * 1000``,
  else 0 (never a bool).
- The store holds what it is given: signatures and "node_id equals the attested publisher" are
  checked by the presence layer before a hello reaches it.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Final

from macula.store.base import (
    Migration,
    Row,
    SqliteStore,
    check_node_id,
    execute,
    fetchall,
    opt_int,
    opt_text,
    page,
)

__all__ = ["MAX_AGE_MS", "HelloFields", "RosterEntry", "RosterStore"]

MAX_AGE_MS: Final = 15 * 60 * 1000
STALE_AFTER_INTERVALS: Final = 3
DEFAULT_INTERVAL_S: Final = 60
MAX_INTERVAL_S: Final = 24 * 3600

_ROSTER_V1: Final[Migration] = (
    """
    CREATE TABLE roster (
        node_id          BLOB PRIMARY KEY CHECK (length(node_id) = 32),
        operator_name    TEXT,
        session_name     TEXT,
        message          TEXT,
        model            TEXT,
        connected_via    TEXT,
        interval_seconds INTEGER NOT NULL CHECK (interval_seconds > 0),
        first_seen_ms    INTEGER NOT NULL,
        last_seen_ms     INTEGER NOT NULL,
        last_hello_at    INTEGER            -- the sender's own `at`, unix ms
    ) WITHOUT ROWID
    """,
    "CREATE INDEX roster_by_last_seen ON roster (last_seen_ms)",
)

_COLUMNS: Final = (
    "node_id, operator_name, session_name, message, model, connected_via, interval_seconds,"
    " first_seen_ms, last_seen_ms, last_hello_at"
)

_INSERT: Final = f"""
INSERT OR REPLACE INTO roster ({_COLUMNS})
VALUES (:node_id, :operator_name, :session_name, :message, :model, :connected_via,
        :interval_seconds, :now, :now, :at)
"""

_UPDATE_FIELDS: Final = """
UPDATE roster SET
    operator_name = :operator_name, session_name = :session_name, message = :message,
    model = :model, connected_via = :connected_via, interval_seconds = :interval_seconds,
    last_seen_ms = max(last_seen_ms, :now), last_hello_at = :at
WHERE node_id = :node_id
"""

_TOUCH: Final = "UPDATE roster SET last_seen_ms = max(last_seen_ms, :now) WHERE node_id = :node_id"


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloFields:
    """What one ``agent.hello`` says about its sender; ``at`` is the sender's clock (unix ms)."""

    at: int
    interval_seconds: int = DEFAULT_INTERVAL_S
    operator_name: str | None = None
    session_name: str | None = None
    message: str | None = None
    model: str | None = None
    connected_via: str | None = None

    def __post_init__(self) -> None:
        if type(self.at) is not int:
            raise ValueError("at must be an int (unix ms)")
        if (
            type(self.interval_seconds) is not int
            or not 0 < self.interval_seconds <= MAX_INTERVAL_S
        ):
            raise ValueError(f"interval_seconds must be an int in 1..{MAX_INTERVAL_S}")
        for name in ("operator_name", "session_name", "message", "model", "connected_via"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be text or None")


@dataclass(frozen=True, slots=True)
class RosterEntry:
    node_id: bytes
    operator_name: str | None
    session_name: str | None
    message: str | None
    model: str | None
    connected_via: str | None
    interval_seconds: int
    first_seen_ms: int
    last_seen_ms: int
    last_hello_at: int | None
    stale: int  # 0 or 1


class RosterStore(SqliteStore):
    """Agents seen via ``agent.hello``, most recently seen first."""

    MIGRATIONS = (_ROSTER_V1,)

    async def upsert_hello(self, node_id: bytes, fields: HelloFields, now_ms: int) -> bool:
        """Record a hello from ``node_id`` heard at ``now_ms``; True if it is a new sighting
        (never seen, or unseen for longer than ``MAX_AGE_MS``)."""
        check_node_id(node_id)
        params = {
            "node_id": node_id,
            "operator_name": fields.operator_name,
            "session_name": fields.session_name,
            "message": fields.message,
            "model": fields.model,
            "connected_via": fields.connected_via,
            "interval_seconds": fields.interval_seconds,
            "at": fields.at,
            "now": now_ms,
        }
        async with self._transaction() as db:
            rows = await fetchall(
                db, "SELECT last_seen_ms, last_hello_at FROM roster WHERE node_id = ?", (node_id,)
            )
            if not rows or now_ms - int(rows[0][0]) > MAX_AGE_MS:
                await execute(db, _INSERT, params)
                return True
            stored_at = opt_int(rows[0][1])
            newer = stored_at is None or fields.at >= stored_at
            await execute(db, _UPDATE_FIELDS if newer else _TOUCH, params)
            return False

    async def remove(self, node_id: bytes) -> bool:
        """Forget ``node_id`` (it said goodbye); True if it was there."""
        check_node_id(node_id)
        return await self._execute("DELETE FROM roster WHERE node_id = ?", (node_id,)) > 0

    async def list(
        self, now_ms: int, limit: int = 100, offset: int = 0
    ) -> builtins.list[RosterEntry]:
        """Entries seen within ``MAX_AGE_MS`` of ``now_ms``, most recently seen first."""
        limit, offset = page(limit, offset)
        rows = await self._fetchall(
            f"SELECT {_COLUMNS},"
            " CASE WHEN :now - last_seen_ms > :k * interval_seconds * 1000 THEN 1 ELSE 0 END"
            " FROM roster WHERE last_seen_ms >= :now - :max_age"
            " ORDER BY last_seen_ms DESC, node_id LIMIT :limit OFFSET :offset",
            {
                "now": now_ms,
                "k": STALE_AFTER_INTERVALS,
                "max_age": MAX_AGE_MS,
                "limit": limit,
                "offset": offset,
            },
        )
        return [_entry(row) for row in rows]

    async def prune(self, now_ms: int, max_age_ms: int = MAX_AGE_MS) -> int:
        """Delete entries unseen for more than ``max_age_ms``; return how many."""
        return await self._execute(
            "DELETE FROM roster WHERE last_seen_ms < ? - ?", (now_ms, max_age_ms)
        )

    async def count(self) -> int:
        """Rows held, including ones old enough for ``prune``."""
        row = await self._fetchone("SELECT count(*) FROM roster")
        return int(row[0]) if row is not None else 0

    async def node_ids(self) -> builtins.list[bytes]:
        """Every node id held (prunable ones included), most recently seen first."""
        rows = await self._fetchall(
            "SELECT node_id FROM roster ORDER BY last_seen_ms DESC, node_id"
        )
        return [bytes(row[0]) for row in rows]


def _entry(row: Row) -> RosterEntry:
    return RosterEntry(
        node_id=bytes(row[0]),
        operator_name=opt_text(row[1]),
        session_name=opt_text(row[2]),
        message=opt_text(row[3]),
        model=opt_text(row[4]),
        connected_via=opt_text(row[5]),
        interval_seconds=int(row[6]),
        first_seen_ms=int(row[7]),
        last_seen_ms=int(row[8]),
        last_hello_at=opt_int(row[9]),
        stale=int(row[10]),
    )
