"""Full-text search over this agent's own records (issue 40): the transcript's messages and the
tasks, each indexed by SQLite FTS5 in its own file, kept by triggers as rows are written.

Invariants:
- ``messages_fts`` is an external-content index of ``messages.text`` (rowid = ``seq``): triggers
  add a message as it is inserted, drop it as it is deleted (pruning) and re-index it when its
  text changes; read marks (``read_ms``) touch no index. ``tasks_fts`` indexes a task's title,
  input, note and result, its rowid from ``task_search_ids`` (tasks have no rowid of their
  own); triggers keep it on insert, on a change of those four columns and on delete.
- Migrating a store indexes what it already holds (``rebuild``, and a backfill for tasks), in
  the migration's transaction.
- A query reaches FTS5 only as ``match_expression(words)``: every word a double-quoted string
  (the words are runs of letters and digits, so no ``"``, ``*``, ``:``, ``-``, ``^``, column
  filter or operator can be formed), all of them required. Nothing here reads the network.
- Results rank by ``bm25`` (lower is better), ties by the newest first; ``count`` says how many
  matched in all, so a caller can page with an offset.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from macula.store.base import Migration, Params, SqliteStore, page, sql_int

__all__ = [
    "MAX_TERMS",
    "MAX_TERM_CHARS",
    "MessageHit",
    "MessageSearch",
    "TaskHit",
    "TaskSearch",
    "match_expression",
    "query_terms",
]

MAX_TERMS: Final = 16  # words of one query used; the rest are ignored (and said so upstream)
MAX_TERM_CHARS: Final = 64  # a longer word is cut (no real word is; a hostile one may be)
SNIPPET_TOKENS: Final = 16
MARK_OPEN: Final = "["
MARK_CLOSE: Final = "]"
_WORD = re.compile(r"[^\W_]+")
_TOKENIZE: Final = "tokenize = 'unicode61 remove_diacritics 2'"

SEARCH_MESSAGES_V4: Final[Migration] = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5(text, content = 'messages',"
    f" content_rowid = 'seq', {_TOKENIZE})",
    """
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.text IS NOT NULL
    BEGIN
        INSERT INTO messages_fts (rowid, text) VALUES (new.seq, new.text);
    END
    """,
    """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.text IS NOT NULL
    BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.seq, old.text);
    END
    """,
    """
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF text ON messages
    BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, text)
            SELECT 'delete', old.seq, old.text WHERE old.text IS NOT NULL;
        INSERT INTO messages_fts (rowid, text) SELECT new.seq, new.text WHERE new.text IS NOT NULL;
    END
    """,
    "INSERT INTO messages_fts (messages_fts) VALUES ('rebuild')",
)

_TASK_ID = "(SELECT id FROM task_search_ids WHERE owner = {0}.owner AND task_id = {0}.task_id)"
_TASK_INDEX = (
    "INSERT INTO tasks_fts (rowid, title, input, note, result)"
    " SELECT id, new.title, new.input, new.note, new.result FROM task_search_ids"
    " WHERE owner = new.owner AND task_id = new.task_id;"
)
SEARCH_TASKS_V3: Final[Migration] = (
    """
    CREATE TABLE task_search_ids (
        id      INTEGER PRIMARY KEY,
        owner   BLOB NOT NULL,
        task_id TEXT NOT NULL,
        UNIQUE (owner, task_id)
    )
    """,
    f"CREATE VIRTUAL TABLE tasks_fts USING fts5(title, input, note, result, {_TOKENIZE})",
    f"""
    CREATE TRIGGER tasks_fts_insert AFTER INSERT ON tasks
    BEGIN
        INSERT OR IGNORE INTO task_search_ids (owner, task_id) VALUES (new.owner, new.task_id);
        {_TASK_INDEX}
    END
    """,
    f"""
    CREATE TRIGGER tasks_fts_update AFTER UPDATE OF title, input, note, result ON tasks
    BEGIN
        DELETE FROM tasks_fts WHERE rowid = {_TASK_ID.format("old")};
        {_TASK_INDEX}
    END
    """,
    f"""
    CREATE TRIGGER tasks_fts_delete AFTER DELETE ON tasks
    BEGIN
        DELETE FROM tasks_fts WHERE rowid = {_TASK_ID.format("old")};
        DELETE FROM task_search_ids WHERE owner = old.owner AND task_id = old.task_id;
    END
    """,
    "INSERT INTO task_search_ids (owner, task_id) SELECT owner, task_id FROM tasks",
    "INSERT INTO tasks_fts (rowid, title, input, note, result)"
    " SELECT i.id, t.title, t.input, t.note, t.result FROM tasks t"
    " JOIN task_search_ids i ON i.owner = t.owner AND i.task_id = t.task_id",
)


def query_terms(query: str) -> list[str]:
    """The words of ``query`` (NFKC, runs of letters and digits, each cut to
    ``MAX_TERM_CHARS``), at most ``MAX_TERMS``, duplicates dropped; [] when it has none."""
    if not isinstance(query, str):
        return []
    words = _WORD.findall(unicodedata.normalize("NFKC", query))
    return list(dict.fromkeys(w[:MAX_TERM_CHARS] for w in words))[:MAX_TERMS]


def match_expression(terms: list[str]) -> str:
    """The FTS5 query of ``terms``: each a quoted string (a doubled quote would escape one;
    terms hold none), all required. ``ValueError`` for no terms."""
    if not terms:
        raise ValueError("no words to search for")
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms)


@dataclass(frozen=True, slots=True)
class Window:
    """What every search takes: the words, a time window (unix ms, inclusive; None: open) and
    the page (``limit`` rows after ``offset``)."""

    terms: list[str]
    since_ms: int | None = None
    until_ms: int | None = None
    limit: int = 10
    offset: int = 0

    def params(self) -> dict[str, object]:
        limit, offset = page(self.limit, self.offset)
        return {
            "match": match_expression(self.terms),
            "since": None if self.since_ms is None else sql_int(self.since_ms),
            "until": None if self.until_ms is None else sql_int(self.until_ms),
            "limit": limit,
            "offset": offset,
        }


@dataclass(frozen=True, slots=True)
class MessageHit:
    seq: int
    room_topic: str
    message_id: str
    from_hex: str
    kind: str
    sent_at: int
    received_ms: int
    unread: int  # 0 or 1
    snippet: str
    score: float  # bm25: lower is better


@dataclass(frozen=True, slots=True)
class TaskHit:
    task_id: str
    role: str
    peer: bytes
    title: str
    state: str
    updated_ms: int
    snippet: str
    score: float


_MESSAGE_FILTER: Final = (
    " FROM messages_fts JOIN messages m ON m.seq = messages_fts.rowid"
    " WHERE messages_fts MATCH :match"
    " AND (:room IS NULL OR m.room_topic = :room)"
    " AND (:not_room IS NULL OR m.room_topic != :not_room)"
    " AND (:sender IS NULL OR m.from_hex = :sender)"
    " AND (:since IS NULL OR m.received_ms >= :since)"
    " AND (:until IS NULL OR m.received_ms <= :until)"
    " AND (:unread = 0 OR m.read_ms IS NULL)"
)
_SNIPPET: Final = f"'{MARK_OPEN}', '{MARK_CLOSE}', '…', {SNIPPET_TOKENS}"


class MessageSearch(SqliteStore):
    """Search of the transcript's messages (``TranscriptStore`` inherits it; schema step 4)."""

    async def search_messages(
        self,
        window: Window,
        *,
        room_topic: str | None = None,
        not_room_topic: str | None = None,
        from_hex: str | None = None,
        unread_only: int = 0,
    ) -> tuple[list[MessageHit], int]:
        """The page of messages matching every word, best first, and how many match in all."""
        params: Params = window.params() | {
            "room": room_topic,
            "not_room": not_room_topic,
            "sender": from_hex,
            "unread": 1 if unread_only else 0,
        }
        rows = await self._fetchall(
            "SELECT m.seq, m.room_topic, m.message_id, m.from_hex, m.kind, m.sent_at,"
            " m.received_ms, m.read_ms IS NULL,"
            f" snippet(messages_fts, 0, {_SNIPPET}), bm25(messages_fts) AS score"
            f"{_MESSAGE_FILTER} ORDER BY score, m.seq DESC LIMIT :limit OFFSET :offset",
            params,
        )
        counted = await self._fetchall(f"SELECT count(*){_MESSAGE_FILTER}", params)
        hits = [
            MessageHit(
                int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), int(r[6]),
                int(r[7]), str(r[8] or ""), float(r[9]),
            )
            for r in rows
        ]  # fmt: skip
        return hits, int(counted[0][0]) if counted else 0


_TASK_FILTER: Final = (
    " FROM tasks_fts JOIN task_search_ids i ON i.id = tasks_fts.rowid"
    " JOIN tasks t ON t.owner = i.owner AND t.task_id = i.task_id"
    " WHERE tasks_fts MATCH :match AND t.owner = :owner"
    " AND (:peer IS NULL OR t.peer = :peer)"
    " AND (:since IS NULL OR t.updated_ms >= :since)"
    " AND (:until IS NULL OR t.updated_ms <= :until)"
)


class TaskSearch(SqliteStore):
    """Search of the tasks of one owner (``TaskStore`` inherits it; schema step 3)."""

    async def search_tasks(
        self, owner: bytes, window: Window, *, peer: bytes | None = None
    ) -> tuple[list[TaskHit], int]:
        """The page of ``owner``'s tasks matching every word (in title, input, note or result),
        best first, and how many match in all; ``since``/``until`` bound the last change."""
        params: Params = window.params() | {"owner": owner, "peer": peer}
        rows = await self._fetchall(
            "SELECT t.task_id, t.role, t.peer, t.title, t.state, t.updated_ms,"
            f" snippet(tasks_fts, -1, {_SNIPPET}), bm25(tasks_fts) AS score"
            f"{_TASK_FILTER} ORDER BY score, t.updated_ms DESC LIMIT :limit OFFSET :offset",
            params,
        )
        counted = await self._fetchall(f"SELECT count(*){_TASK_FILTER}", params)
        hits = [
            TaskHit(
                str(r[0]), str(r[1]), bytes(r[2]), str(r[3]), str(r[4]), int(r[5]),
                str(r[6] or ""), float(r[7]),
            )
            for r in rows
        ]  # fmt: skip
        return hits, int(counted[0][0]) if counted else 0
