"""Idempotency receipts: the same key with the same arguments returns the stored result.

Keys are 1-120 characters, scoped per tool. A key reused with different arguments is refused.
Receipts live in SQLite (survive a restart) and are capped (oldest dropped first).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from macula.store.base import Migration, SqliteStore

MAX_RECEIPTS: Final = 10_000

_V1: Final[Migration] = (
    """
    CREATE TABLE receipts (
        tool        TEXT NOT NULL,
        key         TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        result      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        PRIMARY KEY (tool, key)
    )
    """,
    "CREATE INDEX receipts_by_age ON receipts (created_ms)",
)


def args_digest(args: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()


class ReceiptStore(SqliteStore):
    MIGRATIONS = (_V1,)

    async def find(self, tool: str, key: str) -> tuple[str, dict[str, Any]] | None:
        """``(args digest, stored result)`` for ``(tool, key)``, if any."""
        row = await self._fetchone(
            "SELECT args_sha256, result FROM receipts WHERE tool = ? AND key = ?", (tool, key)
        )
        if row is None:
            return None
        return str(row[0]), dict(json.loads(str(row[1])))

    async def store(
        self, tool: str, key: str, digest: str, result: dict[str, Any], now_ms: int
    ) -> None:
        await self._execute(
            "INSERT OR IGNORE INTO receipts (tool, key, args_sha256, result, created_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            (tool, key, digest, json.dumps(result), now_ms),
        )
        await self._execute(
            "DELETE FROM receipts WHERE rowid IN (SELECT rowid FROM receipts"
            " ORDER BY created_ms DESC LIMIT -1 OFFSET ?)",
            (MAX_RECEIPTS,),
        )
