"""The station's content store (PROTOCOL.md §11): raw blocks and manifests by digest, in SQLite.

Invariants:
- ``macula.store.base.SqliteStore`` underneath (WAL, versioned schema, 0600 file); every
  statement runs under the store's lock, every put is one ``BEGIN IMMEDIATE`` transaction
  (``INSERT OR IGNORE`` first: whether it is new costs no extra round trip), a get's mark one
  ``UPDATE`` statement (atomic by itself).
- Puts are idempotent: the first copy under a digest stays.
- Every block and manifest row has exactly one ``usage`` row (kind, digest, size, last put or
  get in Unix ms); their sizes are what ``StoreLimits.content_bytes_total`` bounds.
- Under that cap a put first collects the least recently used items not used within
  ``content_keep_ms`` (oldest first); if that cannot make room it raises ``QuotaExceeded`` and
  has deleted nothing. A block bigger than the whole cap is refused the same way.
- A get given ``now_ms`` marks what it read as used; getting a manifest also marks its chunks,
  and putting one marks its chunks, so a transfer in progress keeps its blocks.
- What it holds was checked by the caller (``relay.builtins.procedures``: hashes, MCIDs); a stored
  manifest is re-parsed and re-verified on every read, a row that fails is logged and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiosqlite

from macula.store.base import Migration, SqliteStore, execute, fetchall
from macula.wire import cbor
from macula.wire.content import DIGEST_SIZE, Manifest
from macula.wire.errors import WireError
from relay.stores.limits import QuotaExceeded, StoreLimits

__all__ = ["ContentStats", "ContentStore"]

logger = logging.getLogger("macula.relay.store")

INT64_MAX: Final = (1 << 63) - 1


def _int64(value: int) -> int:
    return min(value, INT64_MAX)


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

_BLOCK: Final = 0
_MANIFEST: Final = 1

_CONTENT_V2: Final[Migration] = (
    """
    CREATE TABLE usage (
        kind     INTEGER NOT NULL,      -- 0 a block, 1 a manifest
        digest   BLOB NOT NULL,
        size     INTEGER NOT NULL,      -- bytes it holds against content_bytes_total
        accessed INTEGER NOT NULL,      -- Unix ms of its last put or get
        PRIMARY KEY (kind, digest)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX usage_by_access ON usage (accessed, kind, digest, size)",
    "INSERT INTO usage SELECT 0, digest, size, 0 FROM blocks",
    "INSERT INTO usage SELECT 1, digest, length(body), 0 FROM manifests",
)

_TABLES: Final = {_BLOCK: "blocks", _MANIFEST: "manifests"}
_COLLECT_BATCH: Final = 256
_TOUCH_BATCH: Final = 500
_TOUCH_ONE: Final = "UPDATE usage SET accessed = max(accessed, ?) WHERE kind = ? AND digest = ?"


@dataclass(frozen=True, slots=True)
class ContentStats:
    blocks: int
    bytes: int
    manifests: int


def _check_digest(digest: bytes) -> None:
    if type(digest) is not bytes or len(digest) != DIGEST_SIZE:
        raise ValueError("a content digest is exactly 32 bytes")


class ContentStore(SqliteStore):
    """Raw blocks and manifests by digest (§11). Puts are idempotent: the first copy stays.

    Under ``StoreLimits.content_bytes_total`` the least recently used go first (a cache: the
    owners of content put it again); ``now_ms`` marks what a put or get used.
    """

    MIGRATIONS = (_CONTENT_V1, _CONTENT_V2)

    _held: int | None = None  # bytes of all blocks and manifests

    async def put_block(
        self, digest: bytes, data: bytes, now_ms: int = 0, limits: StoreLimits | None = None
    ) -> bool:
        """Store ``data`` under ``digest`` (checked by the caller); True if it was new."""
        _check_digest(digest)
        insert = (
            "INSERT OR IGNORE INTO blocks (digest, size, data) VALUES (?, ?, ?)",
            (digest, len(data), bytes(data)),
        )
        return await self._put(_BLOCK, digest, len(data), insert, (), now_ms, limits)

    async def get_block(self, digest: bytes, now_ms: int | None = None) -> bytes | None:
        """The block under ``digest``; with ``now_ms``, it is marked used then (one UPDATE
        statement, atomic by itself: no explicit transaction's two extra round trips)."""
        row = await self._fetchone("SELECT data FROM blocks WHERE digest = ?", (digest,))
        if row is None:
            return None
        if now_ms is not None:
            await self._execute(_TOUCH_ONE, (_int64(now_ms), _BLOCK, digest))
        return bytes(row[0])

    async def has_block(self, digest: bytes) -> bool:
        return await self._fetchone("SELECT 1 FROM blocks WHERE digest = ?", (digest,)) is not None

    async def put_manifest(
        self, manifest: Manifest, now_ms: int = 0, limits: StoreLimits | None = None
    ) -> bool:
        """Store ``manifest`` (verified by the caller) under its MCID digest; True if new.

        Its chunks are marked used: they were just put, the manifest comes last.
        """
        digest = manifest.mcid.digest
        body = cbor.encode(manifest.to_wire())
        insert = ("INSERT OR IGNORE INTO manifests (digest, body) VALUES (?, ?)", (digest, body))
        chunks = [chunk.hash for chunk in manifest.chunks]
        return await self._put(_MANIFEST, digest, len(body), insert, chunks, now_ms, limits)

    async def get_manifest(self, digest: bytes, now_ms: int | None = None) -> Manifest | None:
        """The manifest under ``digest``; with ``now_ms``, it and its chunks are marked used
        (a get of the chunks follows, which must not find them collected meanwhile)."""
        row = await self._fetchone("SELECT body FROM manifests WHERE digest = ?", (digest,))
        if row is None:
            return None
        manifest = _parse_manifest(row[0], digest, self.path)
        if manifest is not None and now_ms is not None:
            await self._touch(_MANIFEST, [digest], now_ms)
            await self._touch(_BLOCK, [chunk.hash for chunk in manifest.chunks], now_ms)
        return manifest

    async def stats(self) -> ContentStats:
        row = await self._fetchone(
            "SELECT (SELECT count(*) FROM blocks), (SELECT coalesce(sum(size), 0) FROM blocks),"
            " (SELECT count(*) FROM manifests)"
        )
        if row is None:
            return ContentStats(0, 0, 0)
        return ContentStats(int(row[0]), int(row[1]), int(row[2]))

    async def held(self) -> int:
        """Bytes of all blocks and manifests: what ``content_bytes_total`` bounds."""
        row = await self._fetchone("SELECT coalesce(sum(size), 0) FROM usage")
        return int(row[0]) if row is not None else 0

    # -- inside ------------------------------------------------------------------------------

    async def _put(
        self,
        kind: int,
        digest: bytes,
        size: int,
        insert: tuple[str, tuple[object, ...]],
        chunks: Sequence[bytes],
        now_ms: int,
        limits: StoreLimits | None,
    ) -> bool:
        now = _int64(now_ms)
        try:
            async with self._transaction() as db:
                # INSERT OR IGNORE says whether it is new in the same round trip; room is made
                # after it (the new row has no usage row yet, so it cannot be a victim), and a
                # QuotaExceeded rolls the insert back with everything else.
                new = await execute(db, *insert) > 0
                if new:
                    held = await self._make_room(db, size, now, limits)
                    await execute(
                        db, "INSERT INTO usage VALUES (?, ?, ?, ?)", (kind, digest, size, now)
                    )
                    self._held = held + size
                else:
                    await _touch(db, kind, [digest], now)
                await _touch(db, _BLOCK, chunks, now)
        except BaseException:
            self._held = None  # rolled back: count again next time
            raise
        return new

    async def _make_room(
        self, db: aiosqlite.Connection, size: int, now: int, limits: StoreLimits | None
    ) -> int:
        """Collect the least recently used until ``size`` more bytes fit; the bytes then held.

        Raises ``QuotaExceeded`` (having deleted nothing) when that is not possible.
        """
        if self._held is None:
            self._held = int((await fetchall(db, "SELECT coalesce(sum(size), 0) FROM usage"))[0][0])
        held = self._held
        if limits is None or held + size <= limits.content_bytes_total:
            return held
        cap = limits.content_bytes_total
        if size > cap:
            raise QuotaExceeded(f"{size} bytes is more than this station holds ({cap} bytes)")
        victims = await _victims(db, held + size - cap, now - limits.content_keep_ms)
        if victims is None:
            raise QuotaExceeded(
                f"the station's content store is full ({cap} bytes), all of it used in the"
                f" last {limits.content_keep_ms // 1000} s; try again later"
            )
        freed = 0
        for kind, digest, victim_size in victims:
            await execute(db, f"DELETE FROM {_TABLES[kind]} WHERE digest = ?", (digest,))
            await execute(db, "DELETE FROM usage WHERE kind = ? AND digest = ?", (kind, digest))
            freed += victim_size
        logger.info("content store: collected %d items (%d bytes)", len(victims), freed)
        return held - freed

    async def _touch(self, kind: int, digests: Sequence[bytes], now_ms: int) -> None:
        if digests:
            async with self._transaction() as db:
                await _touch(db, kind, digests, _int64(now_ms))


async def _victims(
    db: aiosqlite.Connection, excess: int, before: int
) -> list[tuple[int, bytes, int]] | None:
    """The least recently used items last used before ``before`` that free ``excess`` bytes."""
    victims: list[tuple[int, bytes, int]] = []
    freed = 0
    after: tuple[int, int, bytes] = (-1, -1, b"")
    while freed < excess:
        rows = await fetchall(
            db,
            "SELECT accessed, kind, digest, size FROM usage"
            " WHERE accessed < ? AND (accessed, kind, digest) > (?, ?, ?)"
            " ORDER BY accessed, kind, digest LIMIT ?",
            (before, *after, _COLLECT_BATCH),
        )
        if not rows:
            return None
        for accessed, kind, digest, size in rows:
            victims.append((int(kind), bytes(digest), int(size)))
            freed += int(size)
            after = (int(accessed), int(kind), bytes(digest))
            if freed >= excess:
                break
    return victims


async def _touch(db: aiosqlite.Connection, kind: int, digests: Sequence[bytes], now: int) -> None:
    for start in range(0, len(digests), _TOUCH_BATCH):
        batch = digests[start : start + _TOUCH_BATCH]
        marks = ", ".join("?" * len(batch))
        await execute(
            db,
            f"UPDATE usage SET accessed = max(accessed, ?) WHERE kind = ? AND digest IN ({marks})",
            (now, kind, *batch),
        )


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
