"""The station's record store (PROTOCOL.md §10.5): DHT records in SQLite.

The content store is ``relay.stores.content`` (re-exported here), the limits
``relay.stores.limits``. Invariants:
- ``macula.store.base.SqliteStore`` underneath: WAL journal, ``synchronous=NORMAL``; the schema
  is versioned by ``PRAGMA user_version`` and migrated forward in one transaction per step. A
  database newer than this code is refused (``StoreError``), never downgraded. Every statement
  runs under the store's lock; a put is one ``BEGIN IMMEDIATE`` transaction.
- The database file is 0600; a missing parent directory is created 0700 (SQLite gives its
  ``-wal``/``-shm`` files the mode of the database file).
- At most one row per ``(storage_key, signer)``. A put replaces the stored row only if the new
  record is newer (``macula.wire.records.is_newer``: ``created_at``, then ``version``), is
  byte-identical (an idempotent retry), or the stored one has expired. ``recency`` = 8-byte
  big-endian ``created_at`` || ``version``: its byte order is exactly ``is_newer``'s order.
  ``size`` is the length of ``body``.
- Bounds (``StoreLimits``, given per put; the station's own records are put without them): a
  put that would take its signer's unexpired rows past ``records_per_signer`` or
  ``record_bytes_per_signer``, or all rows (expired ones are reaped first) past
  ``records_total`` / ``record_bytes_total``, raises ``QuotaExceeded`` and changes nothing
  (beyond that reaping). The signer's caps are checked first; a put that does not grow what a
  cap counts (a replacement no larger than the row it replaces) is never refused by it.
- Reads never return an expired record, newest first; a bounded read returns the newest
  records whose bodies fit ``max_bytes`` together (reading only an index until then) and says
  whether it left any out. Every row is re-parsed through ``Record.from_rpc``; a row that fails
  is logged and skipped.
- The store holds what it is given: signatures and shapes are checked by the caller
  (``relay.builtins.procedures``) before anything reaches it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import aiosqlite

from macula.store.base import Migration, Row, SqliteStore, StoreError, execute, fetchall
from macula.wire import cbor
from macula.wire.errors import WireError
from macula.wire.records import Record
from relay.stores.content import ContentStats, ContentStore
from relay.stores.limits import QuotaExceeded, StoreLimits

__all__ = [
    "ContentStats",
    "ContentStore",
    "Found",
    "PutOutcome",
    "QuotaExceeded",
    "RecordStore",
    "StoreError",
    "StoreLimits",
]

logger = logging.getLogger("macula.relay.store")

INT64_MAX: Final = (1 << 63) - 1
STORAGE_KEY_SIZE: Final = 32
LIST_HEADER_BYTES: Final = 9  # the most a CBOR array header takes

PutOutcome = Literal["stored", "stale"]


@dataclass(frozen=True, slots=True)
class Found:
    """Records newest first; ``truncated`` is 1 when a bound left matching records out."""

    records: list[Record]
    truncated: int = 0


# --- records ----------------------------------------------------------------------------------

_RECORDS_V1: Final[Migration] = (
    """
    CREATE TABLE records (
        storage_key BLOB NOT NULL,
        signer      BLOB NOT NULL,
        type        INTEGER NOT NULL,
        created_at  INTEGER NOT NULL,   -- Unix ms, clamped to int64 (informational)
        expires_at  INTEGER NOT NULL,   -- Unix ms, clamped to int64
        recency     BLOB NOT NULL,      -- created_at (8 bytes, big-endian) || version (16 bytes)
        body        BLOB NOT NULL,      -- canonical CBOR of the RPC form
        PRIMARY KEY (storage_key, signer)
    ) WITHOUT ROWID
    """,
    """
    CREATE INDEX records_by_type ON records (type, recency)
    """,
    """
    CREATE INDEX records_by_expiry ON records (expires_at)
    """,
)

_RECORDS_V2: Final[Migration] = (
    "ALTER TABLE records ADD COLUMN size INTEGER NOT NULL DEFAULT 0",
    "UPDATE records SET size = length(body)",
    # covering indexes: the bounds and the bounded reads never touch a body they do not return
    "DROP INDEX records_by_type",
    "CREATE INDEX records_by_type ON records (type, recency, expires_at, size)",
    "CREATE INDEX records_by_key ON records (storage_key, recency, expires_at, size)",
    "CREATE INDEX records_by_signer ON records (signer, expires_at, size)",
)


_UPSERT_RECORD: Final = """
INSERT INTO records (storage_key, signer, type, created_at, expires_at, recency, body, size)
VALUES (:storage_key, :signer, :type, :created_at, :expires_at, :recency, :body, :size)
ON CONFLICT (storage_key, signer) DO UPDATE SET
    type = excluded.type, created_at = excluded.created_at, expires_at = excluded.expires_at,
    recency = excluded.recency, body = excluded.body, size = excluded.size
"""

# Newest first with the running total of body sizes (over the covering index); the first row
# past the budget is kept so the caller learns the reply was cut, and dropped there.
_NEWEST: Final = """
SELECT r.body, w.running FROM (
    SELECT storage_key, signer, recency, size, sum(size) OVER (
        ORDER BY recency DESC, signer ROWS UNBOUNDED PRECEDING
    ) AS running
    FROM records WHERE {column} = :key AND expires_at > :now
) AS w JOIN records AS r ON r.storage_key = w.storage_key AND r.signer = w.signer
WHERE w.running - w.size <= :budget
ORDER BY w.recency DESC, w.signer LIMIT :limit
"""


def _int64(value: int) -> int:
    return min(value, INT64_MAX)


def _recency(record: Record) -> bytes:
    return record.created_at.to_bytes(8, "big") + record.version


@dataclass(frozen=True, slots=True)
class _Put:
    """One record put, as its row."""

    params: dict[str, object]
    signer: bytes
    recency: bytes
    body: bytes
    now: int


class RecordStore(SqliteStore):
    """DHT records by storage key, newest one per signer (§10.5 with §13 #12 closed)."""

    MIGRATIONS = (_RECORDS_V1, _RECORDS_V2)

    _totals: tuple[int, int] | None = None  # (rows, body bytes) of all rows, expired included

    async def put(
        self, record: Record, storage_key: bytes, now_ms: int, limits: StoreLimits | None = None
    ) -> PutOutcome:
        """Store ``record`` (already verified by the caller) under ``storage_key``.

        ``"stale"`` when the same signer already stored a newer, unexpired record there;
        ``QuotaExceeded`` when ``limits`` are given and the put would go past one of them.
        """
        if type(storage_key) is not bytes or len(storage_key) != STORAGE_KEY_SIZE:
            raise ValueError("a storage key is exactly 32 bytes")
        body = cbor.encode(record.to_rpc())
        recency = _recency(record)
        params: dict[str, object] = {
            "storage_key": storage_key,
            "signer": record.key,
            "type": record.type,
            "created_at": _int64(record.created_at),
            "expires_at": _int64(record.expires_at),
            "recency": recency,
            "body": body,
            "size": len(body),
        }
        put = _Put(params, record.key, recency, body, _int64(now_ms))
        try:
            async with self._transaction() as db:
                return await self._put(db, storage_key, put, limits)
        except BaseException:
            self._totals = None  # rolled back: count again next time
            raise

    async def _put(
        self, db: aiosqlite.Connection, key: bytes, put: _Put, limits: StoreLimits | None
    ) -> PutOutcome:
        size = len(put.body)
        rows, held = await self._load_totals(db)
        if limits is not None and (
            rows + 1 > limits.records_total or held + size > limits.record_bytes_total
        ):
            await self._reap(db, put.now)  # expired rows make room first
            rows, held = await self._load_totals(db)
        old = await fetchall(
            db,
            "SELECT recency, body, expires_at, size FROM records"
            " WHERE storage_key = ? AND signer = ?",
            (key, put.signer),
        )
        old_size, old_alive = 0, False
        if old:
            old_recency, old_body, old_expires, old_size = old[0]
            old_alive = old_expires > put.now
            if old_alive and put.recency <= old_recency and put.body != old_body:
                return "stale"
        after = (rows + (0 if old else 1), held - old_size + size)
        if limits is not None:
            replaced = old_size if old_alive else 0
            await _check_signer(db, put, replaced, int(old_alive), limits)
            _check_total(after, not old, size - old_size, limits)
        await execute(db, _UPSERT_RECORD, put.params)
        self._totals = after
        return "stored"

    async def _load_totals(self, db: aiosqlite.Connection) -> tuple[int, int]:
        if self._totals is None:
            row = (await fetchall(db, "SELECT count(*), coalesce(sum(size), 0) FROM records"))[0]
            self._totals = (int(row[0]), int(row[1]))
        return self._totals

    async def find(self, storage_key: bytes, now_ms: int) -> list[Record]:
        """Unexpired records under ``storage_key``, newest first (one per signer)."""
        return (await self.find_newest(storage_key, now_ms)).records

    async def find_newest(
        self, storage_key: bytes, now_ms: int, max_bytes: int | None = None
    ) -> Found:
        """Unexpired records under ``storage_key``, newest first, within ``max_bytes``."""
        return await self._newest("storage_key", storage_key, now_ms, None, max_bytes)

    async def find_by_type(self, record_type: int, now_ms: int, limit: int = 1000) -> list[Record]:
        """Unexpired records of ``record_type``, newest first, at most ``limit``."""
        return (await self.find_newest_by_type(record_type, now_ms, limit)).records

    async def find_newest_by_type(
        self, record_type: int, now_ms: int, limit: int = 1000, max_bytes: int | None = None
    ) -> Found:
        """Unexpired records of ``record_type``, newest first, at most ``limit`` within
        ``max_bytes``."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        return await self._newest("type", record_type, now_ms, limit, max_bytes)

    async def _newest(
        self, column: str, key: object, now_ms: int, limit: int | None, max_bytes: int | None
    ) -> Found:
        """``max_bytes`` bounds the CBOR array of the records' RPC forms."""
        budget = INT64_MAX if max_bytes is None else max(0, max_bytes - LIST_HEADER_BYTES)
        params = {
            "key": key,
            "now": _int64(now_ms),
            "budget": budget,
            "limit": -1 if limit is None else limit + 1,
        }
        rows = await self._fetchall(_NEWEST.format(column=column), params)
        kept = [row for row in rows if row[1] <= budget]
        if limit is not None:
            kept = kept[:limit]
        return Found(self._parse_rows(kept, now_ms), int(len(kept) < len(rows)))

    async def reap(self, now_ms: int) -> int:
        """Delete expired records; return how many."""
        async with self._transaction() as db:
            return await self._reap(db, _int64(now_ms))

    async def _reap(self, db: aiosqlite.Connection, now: int) -> int:
        self._totals = None
        return await execute(db, "DELETE FROM records WHERE expires_at <= ?", (now,))

    async def count(self) -> int:
        """Rows held, expired ones not yet reaped included."""
        row = await self._fetchone("SELECT count(*) FROM records")
        return int(row[0]) if row is not None else 0

    def _parse_rows(self, rows: Iterable[Row], now_ms: int) -> list[Record]:
        records = []
        for row in rows:
            record = _parse_record(row[0], self.path)
            if record is not None and not record.is_expired(now_ms):
                records.append(record)
        return records


async def _check_signer(
    db: aiosqlite.Connection,
    put: _Put,
    replaced_bytes: int,
    replaced_rows: int,
    limits: StoreLimits,
) -> None:
    """The signer's own caps, over its unexpired rows (checked before the station's)."""
    found = await fetchall(
        db,
        "SELECT count(*), coalesce(sum(size), 0) FROM records WHERE signer = ? AND expires_at > ?",
        (put.signer, put.now),
    )
    rows, held = int(found[0][0]), int(found[0][1])
    if not replaced_rows and rows + 1 > limits.records_per_signer:
        raise QuotaExceeded(
            f"this signer holds {rows} records here, the limit is {limits.records_per_signer}"
        )
    size = len(put.body)
    after = held - replaced_bytes + size
    if size > replaced_bytes and after > limits.record_bytes_per_signer:
        raise QuotaExceeded(
            f"this signer's records would take {after} bytes here,"
            f" the limit is {limits.record_bytes_per_signer}"
        )


def _check_total(after: tuple[int, int], new_row: bool, growth: int, limits: StoreLimits) -> None:
    rows, held = after
    if new_row and rows > limits.records_total:
        raise QuotaExceeded(f"the station holds its limit of {limits.records_total} records")
    if growth > 0 and held > limits.record_bytes_total:
        raise QuotaExceeded(
            f"the station's records would take {held} bytes, the limit is"
            f" {limits.record_bytes_total}"
        )


def _parse_record(body: object, path: Path) -> Record | None:
    """Defence in depth: what we stored must still parse as a record."""
    try:
        if not isinstance(body, bytes):
            raise WireError("bad_row", f"body is {type(body).__name__}, not bytes")
        return Record.from_rpc(cbor.decode(body))
    except WireError as exc:
        logger.warning("%s: skipping an unreadable record row: %s", path, exc)
        return None
