"""The tasks tables (``macula.store.tasks``): their schema, and a ``Task`` or outbox entry to
and from a row.

Invariants: ``COLUMNS`` names the columns ``row_values`` gives and ``task_from_row`` reads, in
that order; input and result are JSON values or plain text (``macula.store.task_values``), the
``*_json`` column saying which; a role read back is ``requester`` or ``assignee``, never
anything else.
"""

from __future__ import annotations

import json
from typing import Any, Final

from macula.store.base import Migration, Row, opt_int, opt_text
from macula.store.search import SEARCH_TASKS_V3
from macula.store.task_states import OutboxEntry, Role, Task
from macula.store.task_values import TaskValue, decode, encode

TASKS_V1: Final[Migration] = (
    """
    CREATE TABLE tasks (
        owner            BLOB NOT NULL CHECK (length(owner) = 32),
        task_id          TEXT NOT NULL,
        role             TEXT NOT NULL CHECK (role IN ('requester', 'assignee')),
        peer             BLOB NOT NULL CHECK (length(peer) = 32),
        title            TEXT NOT NULL,
        input            TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ('submitted', 'working',
                             'input_required', 'completed', 'failed', 'canceled')),
        state_seq        INTEGER NOT NULL CHECK (state_seq >= 1),
        note             TEXT,
        result           TEXT,
        error            TEXT,
        contact          INTEGER,
        delivered        INTEGER NOT NULL CHECK (delivered IN (0, 1)),
        cancel_requested INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
        created_ms       INTEGER NOT NULL,
        updated_ms       INTEGER NOT NULL,
        PRIMARY KEY (owner, task_id)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX tasks_by_peer ON tasks (owner, peer, role, state)",
    "CREATE INDEX tasks_by_updated ON tasks (owner, updated_ms)",
    """
    CREATE TABLE task_history (
        owner     BLOB NOT NULL,
        task_id   TEXT NOT NULL,
        state_seq INTEGER NOT NULL,
        state     TEXT NOT NULL,
        note      TEXT,
        by_role   TEXT NOT NULL,
        at_ms     INTEGER NOT NULL,
        PRIMARY KEY (owner, task_id, state_seq)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE task_keys (
        owner     BLOB NOT NULL,
        scope     TEXT NOT NULL,
        key       TEXT NOT NULL,
        digest    TEXT NOT NULL,
        task_id   TEXT NOT NULL,
        state_seq INTEGER NOT NULL,
        at_ms     INTEGER NOT NULL,
        PRIMARY KEY (owner, scope, key)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE task_outbox (
        entry_id   INTEGER PRIMARY KEY AUTOINCREMENT,
        owner      BLOB NOT NULL,
        peer       BLOB NOT NULL,
        task_id    TEXT NOT NULL,
        body       TEXT NOT NULL,
        attempts   INTEGER NOT NULL DEFAULT 0,
        next_ms    INTEGER NOT NULL,
        created_ms INTEGER NOT NULL,
        last_error TEXT
    )
    """,
    "CREATE INDEX task_outbox_by_owner ON task_outbox (owner, peer, entry_id)",
)
# input and result may be JSON values (macula.store.task_values): 1 marks the column's text as
# a JSON value's, 0 as plain text (every row written before V2)
TASKS_V2: Final[Migration] = (
    "ALTER TABLE tasks ADD COLUMN input_json INTEGER NOT NULL DEFAULT 0"
    " CHECK (input_json IN (0, 1))",
    "ALTER TABLE tasks ADD COLUMN result_json INTEGER NOT NULL DEFAULT 0"
    " CHECK (result_json IN (0, 1))",
)

# issue 39: ``pending_owner_approval`` joins the states. SQLite cannot change a CHECK, so the
# table is rebuilt (copy, drop, rename); dropping it drops its indexes and its full-text
# triggers (schema step 3), made again here. The index's own rows are untouched.
# The states are written out (not read from ``STATES``): a migration that shipped never changes;
# a later state gets a migration of its own. A unit test keeps this list equal to ``STATES``.
V4_STATES: Final = (
    "submitted", "pending_owner_approval", "working", "input_required", "completed", "failed",
    "canceled",
)  # fmt: skip
_STATE_CHECK: Final = ", ".join(f"'{state}'" for state in V4_STATES)
TASKS_V4: Final[Migration] = (
    f"""
    CREATE TABLE tasks_v4 (
        owner            BLOB NOT NULL CHECK (length(owner) = 32),
        task_id          TEXT NOT NULL,
        role             TEXT NOT NULL CHECK (role IN ('requester', 'assignee')),
        peer             BLOB NOT NULL CHECK (length(peer) = 32),
        title            TEXT NOT NULL,
        input            TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ({_STATE_CHECK})),
        state_seq        INTEGER NOT NULL CHECK (state_seq >= 1),
        note             TEXT,
        result           TEXT,
        error            TEXT,
        contact          INTEGER,
        delivered        INTEGER NOT NULL CHECK (delivered IN (0, 1)),
        cancel_requested INTEGER NOT NULL CHECK (cancel_requested IN (0, 1)),
        created_ms       INTEGER NOT NULL,
        updated_ms       INTEGER NOT NULL,
        input_json       INTEGER NOT NULL DEFAULT 0 CHECK (input_json IN (0, 1)),
        result_json      INTEGER NOT NULL DEFAULT 0 CHECK (result_json IN (0, 1)),
        PRIMARY KEY (owner, task_id)
    ) WITHOUT ROWID
    """,
    "INSERT INTO tasks_v4 (owner, task_id, role, peer, title, input, state, state_seq, note,"
    " result, error, contact, delivered, cancel_requested, created_ms, updated_ms, input_json,"
    " result_json) SELECT owner, task_id, role, peer, title, input, state, state_seq, note,"
    " result, error, contact, delivered, cancel_requested, created_ms, updated_ms, input_json,"
    " result_json FROM tasks",
    "DROP TABLE tasks",
    "ALTER TABLE tasks_v4 RENAME TO tasks",
    "CREATE INDEX tasks_by_peer ON tasks (owner, peer, role, state)",
    "CREATE INDEX tasks_by_updated ON tasks (owner, updated_ms)",
    *(step for step in SEARCH_TASKS_V3 if step.lstrip().startswith("CREATE TRIGGER")),
)

COLUMNS: Final = (
    "task_id, role, peer, title, input, state, state_seq, note, result, error, contact,"
    " delivered, cancel_requested, created_ms, updated_ms, input_json, result_json"
)


def row_values(task: Task) -> tuple[Any, ...]:
    input_text, input_json = encode(task.input)
    result_text, result_json = encode(task.result)
    return (
        task.task_id,
        task.role,
        task.peer,
        task.title,
        input_text,
        task.state,
        task.state_seq,
        task.note,
        result_text,
        task.error,
        task.contact,
        task.delivered,
        task.cancel_requested,
        task.created_ms,
        task.updated_ms,
        input_json,
        result_json,
    )


def role_of(value: object) -> Role:
    return "assignee" if value == "assignee" else "requester"


def _input(row: Row) -> TaskValue:
    value = decode(row[4], row[15])
    return "" if value is None else value  # the column is NOT NULL


def task_from_row(row: Row) -> Task:
    return Task(
        task_id=str(row[0]),
        role=role_of(row[1]),
        peer=bytes(row[2]),
        title=str(row[3]),
        input=_input(row),
        state=str(row[5]),
        state_seq=int(row[6]),
        note=opt_text(row[7]),
        result=decode(row[8], row[16]),
        error=opt_text(row[9]),
        contact=opt_int(row[10]),
        delivered=int(row[11]),
        cancel_requested=int(row[12]),
        created_ms=int(row[13]),
        updated_ms=int(row[14]),
    )


def entry_from_row(row: Row) -> OutboxEntry:
    return OutboxEntry(
        entry_id=int(row[0]),
        peer=bytes(row[1]),
        task_id=str(row[2]),
        body=dict(json.loads(str(row[3]))),
        attempts=int(row[4]),
        next_ms=int(row[5]),
    )
