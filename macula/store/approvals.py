"""The approval queue (issue 39): inbound work held until the owner (a person) decides.

One SQLite file per agent (``approvals.sqlite3`` beside ``rings.sqlite3``), rows keyed by
``owner`` (the agent's node id) too. The agent writes items; the owner's CLI (another process,
maybe while the daemon is down) and console write decisions; the agent applies them.

Invariants:
- An item's life: ``pending`` -> ``approved`` | ``denied`` | ``expired``; nothing leaves a
  decision. ``applied`` is 0 until the agent has acted on the decision (a task handed on, a
  refusal sent); then the content is erased (it was kept for the owner only).
- Bounded: at most ``max_pending`` pending items per owner (and ``max_per_sender`` from one
  sender, so one peer cannot fill the queue); past it ``add`` raises
  ``ApprovalError("approval_queue_full")``: a clear refusal, never a silent drop. Decided rows
  are kept ``KEEP_DECIDED_MS`` (a retried request still hears its decision), then pruned, and
  at most ``MAX_DECIDED`` of them.
- ``(owner, kind, sender, ref)`` is unique: a retried request finds its item, never a second.
- An item past its ``expires_ms`` cannot be approved: ``decide`` refuses it (``expired``) and
  ``expire`` turns it ``expired``. Time is always an argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiosqlite

from macula.errors import MaculaError
from macula.store.base import (
    DAY_MS,
    Migration,
    Row,
    SqliteStore,
    check_node_id,
    execute,
    fetchall,
)

Kind = Literal["task", "call", "ring"]
KINDS: Final[tuple[Kind, ...]] = ("task", "call", "ring")
PENDING: Final = "pending"
DECISIONS: Final = ("approved", "denied")
ITEM_STATES: Final = (PENDING, "approved", "denied", "expired")
KEEP_DECIDED_MS: Final = 7 * DAY_MS
MAX_DECIDED: Final = 2_000

APPROVALS_V1: Final[Migration] = (
    """
    CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        owner       BLOB NOT NULL,
        kind        TEXT NOT NULL,
        sender      BLOB NOT NULL,
        petname     TEXT,
        ref         TEXT NOT NULL,
        size        INTEGER NOT NULL,
        received_ms INTEGER NOT NULL,
        expires_ms  INTEGER NOT NULL,
        content     TEXT,
        state       TEXT NOT NULL DEFAULT 'pending',
        reason      TEXT,
        decided_ms  INTEGER,
        decided_by  TEXT,
        applied     INTEGER NOT NULL DEFAULT 0,
        result      TEXT,
        UNIQUE (owner, kind, sender, ref)
    )
    """,
    "CREATE INDEX approvals_open ON approvals (owner, state, applied, expires_ms)",
)

_COLUMNS: Final = (
    "approval_id, owner, kind, sender, petname, ref, size, received_ms, expires_ms, content,"
    " state, reason, decided_ms, decided_by, applied, result"
)


class ApprovalError(MaculaError):
    """An approval operation refused: ``code``, ``detail``, ``next_action``, ``retryable``."""

    def __init__(self, code: str, detail: str, next_action: str, *, retryable: bool = False):
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.next_action = next_action
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Item:
    approval_id: str
    owner: bytes
    kind: Kind
    sender: bytes
    petname: str | None
    ref: str  # what the sender knows it by: a task id, a ring id, a call's key
    size: int  # bytes of the content
    received_ms: int
    expires_ms: int
    content: Any  # JSON value; None once the decision was applied (owner-only, never shown)
    state: str = PENDING
    reason: str | None = None
    decided_ms: int | None = None
    decided_by: str | None = None
    applied: int = 0
    result: Any = None  # a call's outcome, kept for the caller to fetch

    def metadata(self, now_ms: int) -> dict[str, Any]:
        """What the model may see: never the content."""
        return {
            "approval_id": self.approval_id,
            "kind": self.kind,
            "sender": self.sender.hex(),
            "petname": self.petname,
            "size": self.size,
            "age_s": max(0, now_ms - self.received_ms) // 1000,
            "expires_in_s": max(0, self.expires_ms - now_ms) // 1000,
        }


def _item(row: Row) -> Item:
    return Item(
        approval_id=str(row[0]),
        owner=bytes(row[1]),
        kind=row[2],
        sender=bytes(row[3]),
        petname=row[4],
        ref=str(row[5]),
        size=int(row[6]),
        received_ms=int(row[7]),
        expires_ms=int(row[8]),
        content=None if row[9] is None else json.loads(row[9]),
        state=str(row[10]),
        reason=row[11],
        decided_ms=row[12],
        decided_by=row[13],
        applied=int(row[14]),
        result=None if row[15] is None else json.loads(row[15]),
    )


def content_size(content: Any) -> int:
    return len(_json(content).encode("utf-8", "surrogatepass"))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ApprovalStore(SqliteStore):
    """The approval queue of every agent whose rows are in this file."""

    MIGRATIONS = (APPROVALS_V1,)

    async def add(self, item: Item, *, max_pending: int, max_per_sender: int | None = None) -> Item:
        """Queue ``item`` (state pending); the item already held for the same
        ``(owner, kind, sender, ref)`` if there is one (in whatever state it is). At most
        ``max_pending`` pending items, ``max_per_sender`` of them from one sender."""
        check_node_id(item.owner, "owner")
        check_node_id(item.sender, "sender")
        if item.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        async with self._transaction() as db:
            held = await _find(db, item.owner, item.kind, item.sender, item.ref)
            if held is not None:
                return held
            rows = await fetchall(
                db,
                "SELECT count(*) FROM approvals WHERE owner = ? AND state = 'pending'",
                (item.owner,),
            )
            if max_per_sender is not None:
                mine = await fetchall(
                    db,
                    "SELECT count(*) FROM approvals WHERE owner = ? AND sender = ?"
                    " AND state = 'pending'",
                    (item.owner, item.sender),
                )
                if int(mine[0][0]) >= max_per_sender:
                    raise ApprovalError(
                        "approval_queue_full",
                        f"{max_per_sender} of your requests already wait for the owner here",
                        "wait for the owner's decisions on them, then send again",
                        retryable=True,
                    )
            if int(rows[0][0]) >= max_pending:
                raise ApprovalError(
                    "approval_queue_full",
                    f"the owner's approval queue is full ({max_pending} items wait)",
                    "try again later, once the owner has decided some",
                    retryable=True,
                )
            await execute(
                db,
                f"INSERT INTO approvals ({_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, 0, NULL)",
                (
                    item.approval_id,
                    item.owner,
                    item.kind,
                    item.sender,
                    item.petname,
                    item.ref,
                    item.size,
                    item.received_ms,
                    item.expires_ms,
                    _json(item.content),
                ),
            )
        return item

    async def get(self, approval_id: str) -> Item | None:
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM approvals WHERE approval_id = ?", (approval_id,)
        )
        return None if row is None else _item(row)

    async def find(self, owner: bytes, kind: Kind, sender: bytes, ref: str) -> Item | None:
        async with self._locked() as db:
            return await _find(db, owner, kind, sender, ref)

    async def pending(
        self, owner: bytes | None, now_ms: int, *, limit: int = 100, offset: int = 0
    ) -> list[Item]:
        """Pending items not yet expired, oldest first (``owner`` None: every owner's)."""
        where, params = _owner_clause(owner)
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM approvals WHERE {where} state = 'pending'"
            " AND expires_ms > ? ORDER BY received_ms, approval_id LIMIT ? OFFSET ?",
            (*params, now_ms, limit, offset),
        )
        return [_item(row) for row in rows]

    async def count_pending(self, owner: bytes | None, now_ms: int) -> int:
        where, params = _owner_clause(owner)
        row = await self._fetchone(
            f"SELECT count(*) FROM approvals WHERE {where} state = 'pending' AND expires_ms > ?",
            (*params, now_ms),
        )
        return int(row[0]) if row is not None else 0

    async def decide(
        self, approval_id: str, decision: str, now_ms: int, *, by: str, reason: str | None = None
    ) -> Item:
        """The owner's decision (``approved`` or ``denied``) on a pending item; it is applied
        by the agent next. ``not_found``, ``already_decided``, ``expired`` otherwise."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}")
        async with self._transaction() as db:
            rows = await fetchall(
                db, f"SELECT {_COLUMNS} FROM approvals WHERE approval_id = ?", (approval_id,)
            )
            if not rows:
                raise ApprovalError(
                    "not_found",
                    f"no approval item {approval_id}",
                    "list the pending items: macula-mcp approvals list",
                )
            item = _item(rows[0])
            if item.state != PENDING:
                raise ApprovalError(
                    "already_decided",
                    f"approval {approval_id} is already {item.state}",
                    "nothing to do: each item is decided once",
                )
            late = item.expires_ms <= now_ms
            if late:  # recorded as such (committed), then refused
                await _set_state(db, approval_id, "expired", now_ms, "ttl", "expired")
            else:
                await _set_state(db, approval_id, decision, now_ms, by, reason)
        if late:
            raise ApprovalError(
                "expired",
                f"approval {approval_id} expired before a decision; the sender is told so",
                "nothing to do: the sender may send it again",
            )
        decided = await self.get(approval_id)
        assert decided is not None
        return decided

    async def expire(self, owner: bytes, now_ms: int) -> int:
        """Turn the pending items past their TTL ``expired`` (to be applied); how many."""
        return await self._execute(
            "UPDATE approvals SET state = 'expired', decided_ms = ?, decided_by = 'ttl',"
            " reason = 'expired' WHERE owner = ? AND state = 'pending' AND expires_ms <= ?",
            (now_ms, owner, now_ms),
        )

    async def to_apply(self, owner: bytes, limit: int = 64) -> list[Item]:
        """Decided items the agent has not acted on yet, oldest decision first."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM approvals WHERE owner = ? AND state != 'pending'"
            " AND applied = 0 ORDER BY decided_ms, approval_id LIMIT ?",
            (owner, limit),
        )
        return [_item(row) for row in rows]

    async def applied(self, approval_id: str, result: Any = None) -> None:
        """The agent acted on the decision: erase the content, keep ``result`` (a call's)."""
        await self._execute(
            "UPDATE approvals SET applied = 1, content = NULL, result = ? WHERE approval_id = ?",
            (None if result is None else _json(result), approval_id),
        )

    async def withdraw(self, approval_id: str, now_ms: int, reason: str) -> bool:
        """The sender took a pending item back (a held task canceled): decided and applied at
        once, content erased; False if it was no longer pending."""
        return (
            await self._execute(
                "UPDATE approvals SET state = 'denied', decided_ms = ?, decided_by = 'sender',"
                " reason = ?, applied = 1, content = NULL WHERE approval_id = ?"
                " AND state = 'pending'",
                (now_ms, reason, approval_id),
            )
            == 1
        )

    async def forget(self, approval_id: str) -> None:
        """Drop a decided item whose outcome is no longer kept (a call repeated later)."""
        await self._execute(
            "DELETE FROM approvals WHERE approval_id = ? AND state != 'pending'", (approval_id,)
        )

    async def next_expiry_ms(self, owner: bytes) -> int | None:
        row = await self._fetchone(
            "SELECT min(expires_ms) FROM approvals WHERE owner = ? AND state = 'pending'",
            (owner,),
        )
        return None if row is None or row[0] is None else int(row[0])

    async def prune(self, owner: bytes, now_ms: int) -> int:
        """Forget decided and applied items older than ``KEEP_DECIDED_MS``, and the oldest
        beyond ``MAX_DECIDED``."""
        async with self._transaction() as db:
            gone = await execute(
                db,
                "DELETE FROM approvals WHERE owner = ? AND applied = 1 AND decided_ms < ?",
                (owner, now_ms - KEEP_DECIDED_MS),
            )
            gone += await execute(
                db,
                "DELETE FROM approvals WHERE approval_id IN (SELECT approval_id FROM approvals"
                " WHERE owner = ? AND applied = 1 ORDER BY decided_ms DESC LIMIT -1 OFFSET ?)",
                (owner, MAX_DECIDED),
            )
        return gone


def _owner_clause(owner: bytes | None) -> tuple[str, tuple[Any, ...]]:
    return ("owner = ? AND", (owner,)) if owner is not None else ("", ())


async def _find(
    db: aiosqlite.Connection, owner: bytes, kind: str, sender: bytes, ref: str
) -> Item | None:
    rows = await fetchall(
        db,
        f"SELECT {_COLUMNS} FROM approvals WHERE owner = ? AND kind = ? AND sender = ? AND ref = ?",
        (owner, kind, sender, ref),
    )
    return _item(rows[0]) if rows else None


async def _set_state(
    db: aiosqlite.Connection,
    approval_id: str,
    state: str,
    now_ms: int,
    by: str,
    reason: str | None,
) -> None:
    await execute(
        db,
        "UPDATE approvals SET state = ?, decided_ms = ?, decided_by = ?, reason = ?"
        " WHERE approval_id = ?",
        (state, now_ms, by, reason, approval_id),
    )
