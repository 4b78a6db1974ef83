"""Tasks handed between two agents: the state machine, both sides' rows, keys and the outbox.

Invariants:
- Every change is one legal step of the state machine (``task_states.check_transition``),
  checked inside the transaction that writes it: a task has exactly one outcome.
- Every change raises ``state_seq`` by one (1 is ``submitted``) and adds a ``task_history`` row;
  a requester's copy applies the assignee's changes only forward (a lower or equal seq is a
  duplicate, never applied twice).
- Rows are keyed by ``owner`` (this agent's node id) too, so two agents may share one file.
- An idempotency key is scoped per owner and per task (``scope`` ``send`` for new tasks): the
  same key with the same arguments returns the first outcome (``replayed`` 1) and changes
  nothing; with other arguments it is ``idempotency_conflict``. Key, change and outbox entry
  commit in one transaction, so a crash never leaves one without the others.
- The outbox holds unsigned message bodies per peer, oldest first; they are signed when sent.
- Terminal tasks older than ``bounds.max_age_ms`` go, and the oldest terminal ones beyond
  ``bounds.max_rows``; open tasks are never pruned (they are bounded per peer instead).
The tables and how a task maps to a row are ``macula.store.task_rows``; the full-text index of
the tasks (schema step 3) is ``macula.store.search``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiosqlite

from macula.store.base import (
    Bounds,
    check_node_id,
    execute,
    fetchall,
    opt_text,
    page,
)
from macula.store.search import SEARCH_TASKS_V3, TaskSearch
from macula.store.task_rows import (
    COLUMNS,
    TASKS_V1,
    TASKS_V2,
    TASKS_V4,
    entry_from_row,
    role_of,
    row_values,
    task_from_row,
)
from macula.store.task_states import (
    DEFAULT_BOUNDS,
    OPEN_STATES,
    ROLES,
    SEND_SCOPE,
    STATES,
    TERMINAL,
    TRANSITIONS,
    HistoryEntry,
    OutboxEntry,
    Role,
    Task,
    TaskError,
    check_transition,
    digest,
)
from macula.store.task_values import TaskValue, encode, value_of

__all__ = [
    "DEFAULT_BOUNDS",
    "OPEN_STATES",
    "ROLES",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "HistoryEntry",
    "OutboxEntry",
    "Role",
    "Task",
    "TaskError",
    "TaskStore",
    "check_transition",
    "digest",
]

Body = Callable[[Task], dict[str, Any] | None]  # what to queue for the peer after a change


class TaskStore(TaskSearch):
    """Both sides of every task this agent sent or was handed, for one ``owner``."""

    MIGRATIONS = (TASKS_V1, TASKS_V2, SEARCH_TASKS_V3, TASKS_V4)

    def __init__(self, db: aiosqlite.Connection, path: Any) -> None:
        super().__init__(db, path)
        self.bounds: Bounds = DEFAULT_BOUNDS
        self._unpruned = 0

    # -- creating -------------------------------------------------------------------------------

    async def create(
        self,
        owner: bytes,
        task: Task,
        now_ms: int,
        *,
        max_open_per_peer: int,
        key: str | None = None,
        key_digest: str = "",
        outbox: dict[str, Any] | None = None,
        state_seq: int = 1,
    ) -> Task:
        """Record a new task (``submitted``, ``state_seq`` 1, or higher for one the owner
        approved after holding it: ``macula.agent.approvals``); its key and outbox entry with it.
        A replayed key returns the first task (``replayed`` 1); an id already held returns
        that task unchanged (``replayed`` 1) if it is the same peer's, else ``task_id_taken``.
        ``too_many_open`` when ``peer`` already has ``max_open_per_peer`` open tasks here."""
        check_node_id(owner, "owner")
        check_node_id(task.peer, "peer")
        async with self._transaction() as db:
            if key is not None:
                first = await self._replay(db, owner, SEND_SCOPE, key, key_digest)
                if first is not None:
                    return first
            existing = await _get(db, owner, task.task_id)
            if existing is not None:
                if existing.peer != task.peer or existing.role != task.role:
                    raise TaskError(
                        "task_id_taken",
                        f"task_id {task.task_id} is already used by another task",
                        "send with a fresh task_id",
                    )
                return replace(existing, replayed=1)
            open_now = await _count_open(db, owner, task.peer, task.role)
            if open_now >= max_open_per_peer:
                raise TaskError(
                    "too_many_open",
                    f"{open_now} open tasks with this peer already (max {max_open_per_peer})",
                    "wait for one to end (mesh_task_wait) or cancel one, then send again",
                    retryable=True,
                )
            stored = replace(task, state="submitted", state_seq=state_seq, created_ms=now_ms)
            stored = replace(stored, updated_ms=now_ms)
            await execute(
                db,
                f"INSERT INTO tasks (owner, {COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (owner, *row_values(stored)),
            )
            await _history(db, owner, stored, "requester")  # the requester submits
            if key is not None:
                await _remember_key(db, owner, SEND_SCOPE, key, key_digest, stored, now_ms)
            if outbox is not None:
                await _enqueue(db, owner, stored.peer, stored.task_id, outbox, now_ms)
        await self._maybe_prune(owner, now_ms)
        return stored

    # -- changing -------------------------------------------------------------------------------

    async def transition(
        self,
        owner: bytes,
        task_id: str,
        new_state: str,
        now_ms: int,
        *,
        by: Role,
        role: Role | None = None,
        note: str | None = None,
        result: TaskValue | None = None,
        error: str | None = None,
        key: str | None = None,
        key_digest: str = "",
        outbox: Body | None = None,
    ) -> Task:
        """Apply one legal change (``check_transition``) as ``state_seq + 1``; with ``role``,
        only to a task of that role. A replayed key returns the task as that change left it."""
        async with self._transaction() as db:
            if key is not None:
                first = await self._replay(db, owner, task_id, key, key_digest)
                if first is not None:
                    return first
            task = await _need(db, owner, task_id, role)
            check_transition(task, new_state)
            changed = replace(
                task,
                state=new_state,
                state_seq=task.state_seq + 1,
                note=note,
                result=result if result is not None else task.result,
                error=error if error is not None else task.error,
                updated_ms=now_ms,
            )
            await _write(db, owner, changed)
            await _history(db, owner, changed, by)
            if key is not None:
                await _remember_key(db, owner, task_id, key, key_digest, changed, now_ms)
            body = None if outbox is None else outbox(changed)
            if body is not None:
                await _enqueue(db, owner, changed.peer, task_id, body, now_ms)
        return changed

    async def apply_remote(
        self, owner: bytes, peer: bytes, task_id: str, fields: dict[str, Any], now_ms: int
    ) -> tuple[Task | None, int]:
        """The requester's copy takes the assignee's state if its ``state_seq`` is newer.
        Returns ``(task, applied 0/1)``; ``(None, 0)`` for a task we never sent to ``peer``."""
        async with self._transaction() as db:
            task = await _get(db, owner, task_id)
            if task is None or task.role != "requester" or task.peer != peer:
                return None, 0
            seq = int(fields["state_seq"])
            newer = seq > task.state_seq and task.state not in TERMINAL
            if not newer and task.delivered:
                return task, 0
            changed = replace(task, delivered=1, updated_ms=now_ms)
            if newer:
                changed = replace(
                    changed,
                    state=str(fields["state"]),
                    state_seq=seq,
                    note=opt_text(fields.get("note")),
                    result=value_of(fields, "result"),
                    error=opt_text(fields.get("error")),
                )
            await _write(db, owner, changed)
            if newer:
                await _history(db, owner, changed, "assignee")
        return changed, int(newer)

    async def set_flags(
        self,
        owner: bytes,
        task_id: str,
        now_ms: int,
        *,
        delivered: int | None = None,
        cancel_requested: int | None = None,
        key: str | None = None,
        key_digest: str = "",
        outbox: dict[str, Any] | None = None,
    ) -> Task:
        """Set the requester-side flags (and queue ``outbox``) in one step; a replayed key
        returns the task as it stands, flags unchanged."""
        async with self._transaction() as db:
            task = await _need(db, owner, task_id, None)
            if key is not None:
                first = await self._replay(db, owner, task_id, key, key_digest)
                if first is not None:
                    return replace(task, replayed=1)
            changed = replace(
                task,
                delivered=task.delivered if delivered is None else delivered,
                cancel_requested=task.cancel_requested
                if cancel_requested is None
                else cancel_requested,
                updated_ms=now_ms,
            )
            await _write(db, owner, changed)
            if key is not None:
                await _remember_key(db, owner, task_id, key, key_digest, changed, now_ms)
            if outbox is not None:
                await _enqueue(db, owner, changed.peer, task_id, outbox, now_ms)
        return changed

    # -- reading --------------------------------------------------------------------------------

    async def get(self, owner: bytes, task_id: str) -> Task | None:
        async with self._transaction() as db:
            return await _get(db, owner, task_id)

    async def history(self, owner: bytes, task_id: str) -> list[HistoryEntry]:
        rows = await self._fetchall(
            "SELECT state_seq, state, note, by_role, at_ms FROM task_history"
            " WHERE owner = ? AND task_id = ? ORDER BY state_seq",
            (owner, task_id),
        )
        return [
            HistoryEntry(int(r[0]), str(r[1]), opt_text(r[2]), role_of(r[3]), int(r[4]))
            for r in rows
        ]

    async def list_tasks(
        self,
        owner: bytes,
        *,
        role: Role | None = None,
        state: str | None = None,
        open_only: int = 0,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Task]:
        """Tasks newest change first, filtered by role, state, or open (non-terminal) only."""
        limit, offset = page(limit, offset)
        rows = await self._fetchall(
            f"SELECT {COLUMNS} FROM tasks WHERE {_task_filter(role, state, open_only)}"
            " ORDER BY updated_ms DESC, task_id LIMIT :limit OFFSET :offset",
            {"owner": owner, "role": role, "state": state, "limit": limit, "offset": offset},
        )
        return [task_from_row(row) for row in rows]

    async def count_tasks(
        self, owner: bytes, *, role: Role | None = None, state: str | None = None
    ) -> int:
        """How many tasks ``list_tasks`` with these filters would page through."""
        row = await self._fetchone(
            f"SELECT count(*) FROM tasks WHERE {_task_filter(role, state, 0)}",
            {"owner": owner, "role": role, "state": state},
        )
        return 0 if row is None else int(row[0])

    # -- the outbox -----------------------------------------------------------------------------

    async def due(self, owner: bytes, now_ms: int, limit: int = 64) -> list[OutboxEntry]:
        """The oldest entry of every peer, if due (one at a time per peer keeps the order)."""
        rows = await self._fetchall(
            "SELECT entry_id, peer, task_id, body, attempts, next_ms FROM task_outbox o"
            " WHERE owner = :owner AND entry_id = (SELECT min(entry_id) FROM task_outbox"
            " WHERE owner = :owner AND peer = o.peer) AND next_ms <= :now"
            " ORDER BY entry_id LIMIT :limit",
            {"owner": owner, "now": now_ms, "limit": limit},
        )
        return [entry_from_row(row) for row in rows]

    async def next_due_ms(self, owner: bytes) -> int | None:
        row = await self._fetchone("SELECT min(next_ms) FROM task_outbox WHERE owner = ?", (owner,))
        return None if row is None or row[0] is None else int(row[0])

    async def enqueue(
        self, owner: bytes, peer: bytes, task_id: str, body: dict[str, Any], now_ms: int
    ) -> None:
        async with self._transaction() as db:
            await _enqueue(db, owner, peer, task_id, body, now_ms)

    async def pending_outbox(self, owner: bytes) -> int:
        row = await self._fetchone("SELECT count(*) FROM task_outbox WHERE owner = ?", (owner,))
        return 0 if row is None else int(row[0])

    async def delivered(self, entry_id: int) -> None:
        await self._execute("DELETE FROM task_outbox WHERE entry_id = ?", (entry_id,))

    async def retry_later(self, entry_id: int, next_ms: int, why: str) -> None:
        await self._execute(
            "UPDATE task_outbox SET attempts = attempts + 1, next_ms = ?, last_error = ?"
            " WHERE entry_id = ?",
            (next_ms, why[:500], entry_id),
        )

    async def retry_now(self, owner: bytes, now_ms: int) -> int:
        """Make every entry due now (the peer may be back: we reconnected, or it spoke)."""
        return await self._execute(
            "UPDATE task_outbox SET next_ms = ? WHERE owner = ? AND next_ms > ?",
            (now_ms, owner, now_ms),
        )

    # -- bounds ---------------------------------------------------------------------------------

    async def prune(self, owner: bytes, now_ms: int) -> int:
        """Drop terminal tasks past ``bounds`` (age, then count), with their history."""
        bounds = self.bounds
        self._unpruned = 0
        terminal = "state IN ('completed', 'failed', 'canceled')"
        async with self._transaction() as db:
            old = await fetchall(
                db,
                f"SELECT task_id FROM tasks WHERE owner = ? AND {terminal} AND updated_ms < ?"
                " LIMIT ?",
                (owner, now_ms - bounds.max_age_ms, bounds.batch),
            )
            count = await fetchall(db, "SELECT count(*) FROM tasks WHERE owner = ?", (owner,))
            excess = min(int(count[0][0]) - len(old) - bounds.max_rows, bounds.batch)
            if excess > 0:
                old += await fetchall(
                    db,
                    f"SELECT task_id FROM tasks WHERE owner = ? AND {terminal}"
                    " AND updated_ms >= ? ORDER BY updated_ms, task_id LIMIT ?",
                    (owner, now_ms - bounds.max_age_ms, excess),
                )
            for (task_id,) in old:
                for table in ("tasks", "task_history", "task_keys"):
                    await execute(
                        db, f"DELETE FROM {table} WHERE owner = ? AND task_id = ?", (owner, task_id)
                    )
        return len(old)

    async def replay(self, owner: bytes, scope: str, key: str, key_digest: str) -> Task | None:
        """The task a used key left (``replayed`` 1), None for a fresh key;
        ``idempotency_conflict`` if it was used with other arguments."""
        async with self._transaction() as db:
            return await self._replay(db, owner, scope, key, key_digest)

    async def _maybe_prune(self, owner: bytes, now_ms: int) -> None:
        self._unpruned += 1
        if self._unpruned >= self.bounds.prune_every:
            await self.prune(owner, now_ms)

    async def _replay(
        self, db: aiosqlite.Connection, owner: bytes, scope: str, key: str, key_digest: str
    ) -> Task | None:
        rows = await fetchall(
            db,
            "SELECT digest, task_id FROM task_keys WHERE owner = ? AND scope = ? AND key = ?",
            (owner, scope, key),
        )
        if not rows:
            return None
        stored_digest, task_id = str(rows[0][0]), str(rows[0][1])
        task = await _get(db, owner, task_id)
        if stored_digest != key_digest:
            raise TaskError(
                "idempotency_conflict",
                f"idempotency_key {key!r} was already used with different arguments",
                "use a new idempotency_key for a different request",
                task=task,
            )
        if task is None:
            raise TaskError(
                "not_found",
                f"task {task_id} of idempotency_key {key!r} is gone (pruned)",
                "mesh_task_list shows the tasks kept",
            )
        return replace(task, replayed=1)


async def _get(db: aiosqlite.Connection, owner: bytes, task_id: str) -> Task | None:
    rows = await fetchall(
        db, f"SELECT {COLUMNS} FROM tasks WHERE owner = ? AND task_id = ?", (owner, task_id)
    )
    return task_from_row(rows[0]) if rows else None


async def _need(db: aiosqlite.Connection, owner: bytes, task_id: str, role: Role | None) -> Task:
    task = await _get(db, owner, task_id)
    if task is None or (role is not None and task.role != role):
        whose = "" if role is None else f" where you are the {role}"
        raise TaskError(
            "not_found",
            f"no task {task_id}{whose}",
            "check task_id with mesh_task_list",
        )
    return task


async def _count_open(db: aiosqlite.Connection, owner: bytes, peer: bytes, role: Role) -> int:
    rows = await fetchall(
        db,
        "SELECT count(*) FROM tasks WHERE owner = ? AND peer = ? AND role = ?"
        " AND state NOT IN ('completed', 'failed', 'canceled')",
        (owner, peer, role),
    )
    return int(rows[0][0])


async def _write(db: aiosqlite.Connection, owner: bytes, task: Task) -> None:
    await execute(
        db,
        "UPDATE tasks SET state = ?, state_seq = ?, note = ?, result = ?, result_json = ?,"
        " error = ?, delivered = ?, cancel_requested = ?, updated_ms = ?"
        " WHERE owner = ? AND task_id = ?",
        (
            task.state,
            task.state_seq,
            task.note,
            *encode(task.result),
            task.error,
            task.delivered,
            task.cancel_requested,
            task.updated_ms,
            owner,
            task.task_id,
        ),
    )


async def _history(db: aiosqlite.Connection, owner: bytes, task: Task, by: Role) -> None:
    await execute(
        db,
        "INSERT OR IGNORE INTO task_history (owner, task_id, state_seq, state, note, by_role,"
        " at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (owner, task.task_id, task.state_seq, task.state, task.note, by, task.updated_ms),
    )


async def _remember_key(
    db: aiosqlite.Connection,
    owner: bytes,
    scope: str,
    key: str,
    key_digest: str,
    task: Task,
    now_ms: int,
) -> None:
    await execute(
        db,
        "INSERT INTO task_keys (owner, scope, key, digest, task_id, state_seq, at_ms)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (owner, scope, key, key_digest, task.task_id, task.state_seq, now_ms),
    )


async def _enqueue(
    db: aiosqlite.Connection,
    owner: bytes,
    peer: bytes,
    task_id: str,
    body: dict[str, Any],
    now_ms: int,
) -> None:
    await execute(
        db,
        "INSERT INTO task_outbox (owner, peer, task_id, body, next_ms, created_ms)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (owner, peer, task_id, json.dumps(body, ensure_ascii=False), now_ms, now_ms),
    )


def _task_filter(role: Role | None, state: str | None, open_only: int) -> str:
    """The WHERE of a task listing (named parameters ``:owner``, ``:role``, ``:state``)."""
    where = ["owner = :owner"]
    if role is not None:
        where.append("role = :role")
    if state is not None:
        where.append("state = :state")
    if open_only:
        where.append("state NOT IN ('completed', 'failed', 'canceled')")
    return " AND ".join(where)
