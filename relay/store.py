"""The station's durable stores (PROTOCOL.md §10.5, §11): DHT records and content, in SQLite.

Invariants:
- ``macula.store.base.SqliteStore`` underneath: WAL journal, ``synchronous=NORMAL``; the schema
  is versioned by ``PRAGMA user_version`` and migrated forward in one transaction per step. A
  database newer than this code is refused (``StoreError``), never downgraded.
- The database file is 0600; a missing parent directory is created 0700 (SQLite gives its
  ``-wal``/``-shm`` files the mode of the database file).
- Records: at most one row per ``(storage_key, signer)``. A put replaces the stored row only if
  the new record is newer (``macula.wire.records.is_newer``: ``created_at``, then ``version``),
  is byte-identical (an idempotent retry), or the stored one has expired. The decision is one
  SQL upsert, so concurrent puts cannot interleave. ``recency`` = 8-byte big-endian
  ``created_at`` || ``version``: its byte order is exactly ``is_newer``'s order.
- Reads never return an expired record, and every row is re-parsed through ``Record.from_rpc``
  (manifests through ``Manifest.from_wire`` + ``verify``); a row that fails is logged and skipped.
- The stores hold what they are given: signatures, hashes and argument shapes are checked by the
  caller (``relay.builtins``) before anything reaches them.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from macula.store.base import Migration, SqliteStore, StoreError
from macula.wire import cbor
from macula.wire.content import DIGEST_SIZE, Manifest
from macula.wire.errors import WireError
from macula.wire.records import Record

__all__ = ["ContentStats", "ContentStore", "PutOutcome", "RecordStore", "StoreError"]

logger = logging.getLogger("macula.relay.store")

INT64_MAX: Final = (1 << 63) - 1
STORAGE_KEY_SIZE: Final = 32

PutOutcome = Literal["stored", "stale"]


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


_UPSERT_RECORD: Final = """
INSERT INTO records (storage_key, signer, type, created_at, expires_at, recency, body)
VALUES (:storage_key, :signer, :type, :created_at, :expires_at, :recency, :body)
ON CONFLICT (storage_key, signer) DO UPDATE SET
    type = excluded.type, created_at = excluded.created_at, expires_at = excluded.expires_at,
    recency = excluded.recency, body = excluded.body
WHERE excluded.recency > records.recency
   OR excluded.body = records.body
   OR records.expires_at <= :now
"""


def _int64(value: int) -> int:
    return min(value, INT64_MAX)


def _recency(record: Record) -> bytes:
    return record.created_at.to_bytes(8, "big") + record.version


class RecordStore(SqliteStore):
    """DHT records by storage key, newest one per signer (§10.5 with §13 #12 closed)."""

    MIGRATIONS = (_RECORDS_V1,)

    async def put(self, record: Record, storage_key: bytes, now_ms: int) -> PutOutcome:
        """Store ``record`` (already verified by the caller) under ``storage_key``.

        ``"stale"`` when the same signer already stored a newer, unexpired record there.
        """
        if type(storage_key) is not bytes or len(storage_key) != STORAGE_KEY_SIZE:
            raise ValueError("a storage key is exactly 32 bytes")
        params = {
            "storage_key": storage_key,
            "signer": record.key,
            "type": record.type,
            "created_at": _int64(record.created_at),
            "expires_at": _int64(record.expires_at),
            "recency": _recency(record),
            "body": cbor.encode(record.to_rpc()),
            "now": _int64(now_ms),
        }
        async with self._db.execute(_UPSERT_RECORD, params) as cursor:
            changed = cursor.rowcount
        return "stored" if changed > 0 else "stale"

    async def find(self, storage_key: bytes, now_ms: int) -> list[Record]:
        """Unexpired records under ``storage_key``, newest first (one per signer)."""
        rows = await self._db.execute_fetchall(
            "SELECT body FROM records WHERE storage_key = ? AND expires_at > ?"
            " ORDER BY recency DESC",
            (storage_key, _int64(now_ms)),
        )
        return self._parse_rows(rows, now_ms)

    async def find_by_type(self, record_type: int, now_ms: int, limit: int = 1000) -> list[Record]:
        """Unexpired records of ``record_type``, newest first, at most ``limit``."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        rows = await self._db.execute_fetchall(
            "SELECT body FROM records WHERE type = ? AND expires_at > ?"
            " ORDER BY recency DESC LIMIT ?",
            (record_type, _int64(now_ms), limit),
        )
        return self._parse_rows(rows, now_ms)

    async def reap(self, now_ms: int) -> int:
        """Delete expired records; return how many."""
        async with self._db.execute(
            "DELETE FROM records WHERE expires_at <= ?", (_int64(now_ms),)
        ) as cursor:
            return max(cursor.rowcount, 0)

    async def count(self) -> int:
        """Rows held, expired ones not yet reaped included."""
        async with self._db.execute("SELECT count(*) FROM records") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row is not None else 0

    def _parse_rows(self, rows: Iterable[sqlite3.Row], now_ms: int) -> list[Record]:
        records = []
        for row in rows:
            record = _parse_record(row[0], self.path)
            if record is not None and not record.is_expired(now_ms):
                records.append(record)
        return records


def _parse_record(body: object, path: Path) -> Record | None:
    """Defence in depth: what we stored must still parse as a record."""
    try:
        if not isinstance(body, bytes):
            raise WireError("bad_row", f"body is {type(body).__name__}, not bytes")
        return Record.from_rpc(cbor.decode(body))
    except WireError as exc:
        logger.warning("%s: skipping an unreadable record row: %s", path, exc)
        return None


# --- content ----------------------------------------------------------------------------------

_CONTENT_V1: Final[Migration] = (
    """
    CREATE TABLE blocks (
        digest BLOB PRIMARY KEY,        -- BLAKE3 of data (the raw MCID without 0x01 0x55)
        size   INTEGER NOT NULL,
        data   BLOB NOT NULL
    )
    """,
    """
    CREATE TABLE manifests (
        digest BLOB PRIMARY KEY,        -- digest of the manifest MCID (without 0x01 0x56)
        body   BLOB NOT NULL            -- canonical CBOR of the wire map (name as text)
    )
    """,
)


@dataclass(frozen=True, slots=True)
class ContentStats:
    blocks: int
    bytes: int
    manifests: int


def _check_digest(digest: bytes) -> None:
    if type(digest) is not bytes or len(digest) != DIGEST_SIZE:
        raise ValueError("a content digest is exactly 32 bytes")


class ContentStore(SqliteStore):
    """Raw blocks and manifests by digest (§11). Puts are idempotent: the first copy stays."""

    MIGRATIONS = (_CONTENT_V1,)

    async def put_block(self, digest: bytes, data: bytes) -> bool:
        """Store ``data`` under ``digest`` (checked by the caller); True if it was new."""
        _check_digest(digest)
        async with self._db.execute(
            "INSERT OR IGNORE INTO blocks (digest, size, data) VALUES (?, ?, ?)",
            (digest, len(data), bytes(data)),
        ) as cursor:
            return cursor.rowcount > 0

    async def get_block(self, digest: bytes) -> bytes | None:
        async with self._db.execute("SELECT data FROM blocks WHERE digest = ?", (digest,)) as cur:
            row = await cur.fetchone()
        return bytes(row[0]) if row is not None else None

    async def has_block(self, digest: bytes) -> bool:
        async with self._db.execute("SELECT 1 FROM blocks WHERE digest = ?", (digest,)) as cur:
            return await cur.fetchone() is not None

    async def put_manifest(self, manifest: Manifest) -> bool:
        """Store ``manifest`` (verified by the caller) under its MCID digest; True if new."""
        async with self._db.execute(
            "INSERT OR IGNORE INTO manifests (digest, body) VALUES (?, ?)",
            (manifest.mcid.digest, cbor.encode(manifest.to_wire())),
        ) as cursor:
            return cursor.rowcount > 0

    async def get_manifest(self, digest: bytes) -> Manifest | None:
        async with self._db.execute("SELECT body FROM manifests WHERE digest = ?", (digest,)) as c:
            row = await c.fetchone()
        if row is None:
            return None
        return _parse_manifest(row[0], digest, self.path)

    async def stats(self) -> ContentStats:
        async with self._db.execute(
            "SELECT (SELECT count(*) FROM blocks), (SELECT coalesce(sum(size), 0) FROM blocks),"
            " (SELECT count(*) FROM manifests)"
        ) as cursor:
            row = await cursor.fetchone()
        if row is None:
            return ContentStats(0, 0, 0)
        return ContentStats(int(row[0]), int(row[1]), int(row[2]))


def _parse_manifest(body: object, digest: bytes, path: Path) -> Manifest | None:
    """Defence in depth: a stored manifest must still parse and match its key."""
    try:
        if not isinstance(body, bytes):
            raise WireError("bad_row", f"body is {type(body).__name__}, not bytes")
        manifest = Manifest.from_wire(cbor.decode(body))
        manifest.verify()
        if manifest.mcid.digest != digest:
            raise WireError("bad_row", "manifest stored under another digest")
    except WireError as exc:
        logger.warning("%s: skipping an unreadable manifest row %s: %s", path, digest.hex(), exc)
        return None
    return manifest
