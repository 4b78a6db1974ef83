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
  filter or operator can be formed), all of them required, matched in ``text`` only; the room
  and sender filters are added as quoted column filters by this module, never by the caller's
  words. Nothing here reads the network.
- A search is one scan of the index: its matches newest first (rowid order, no sort), each
  with its bm25 score, at most a cap; the caller ranks or pages them. Rows and snippets are
  read for a page's matches only.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from macula.store.base import Migration, SqliteStore, sql_int

__all__ = [
    "MAX_TERMS",
    "MAX_TERM_CHARS",
    "Match",
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

# the room and the sender are indexed too (not for the model's words: those match ``text``
# only), so a room or sender filter is an intersection inside the index, not a row lookup
# per match of a common word
SEARCH_MESSAGES_V4: Final[Migration] = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5(text, room_topic, from_hex,"
    f" content = 'messages', content_rowid = 'seq', {_TOKENIZE})",
    """
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages WHEN new.text IS NOT NULL
    BEGIN
        INSERT INTO messages_fts (rowid, text, room_topic, from_hex)
            VALUES (new.seq, new.text, new.room_topic, new.from_hex);
    END
    """,
    """
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages WHEN old.text IS NOT NULL
    BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, text, room_topic, from_hex)
            VALUES ('delete', old.seq, old.text, old.room_topic, old.from_hex);
    END
    """,
    """
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF text ON messages
    BEGIN
        INSERT INTO messages_fts (messages_fts, rowid, text, room_topic, from_hex)
            SELECT 'delete', old.seq, old.text, old.room_topic, old.from_hex
            WHERE old.text IS NOT NULL;
        INSERT INTO messages_fts (rowid, text, room_topic, from_hex)
            SELECT new.seq, new.text, new.room_topic, new.from_hex WHERE new.text IS NOT NULL;
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
    return " ".join(_quoted(term) for term in terms)


def _quoted(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _message_match(terms: list[str], filters: dict[str, object]) -> str:
    """The words in ``text``, and the room and sender filters as index columns."""
    expression = f"text : ({match_expression(terms)})"
    for column, key in (("room_topic", "room_topic"), ("from_hex", "from_hex")):
        value = filters.get(key)
        if isinstance(value, str) and value:
            expression += f" AND {column} : {_quoted(value)}"
    for column, key in (("room_topic", "not_room_topic"), ("from_hex", "not_from_hex")):
        excluded = filters.get(key)
        if isinstance(excluded, str) and excluded:
            expression += f" NOT {column} : {_quoted(excluded)}"
    return expression


@dataclass(frozen=True, slots=True)
class Window:
    """What every search takes: the words and a time window (unix ms, inclusive; None: open)."""

    terms: list[str]
    since_ms: int | None = None
    until_ms: int | None = None

    def params(self) -> dict[str, object]:
        return {
            "match": match_expression(self.terms),
            "since": None if self.since_ms is None else sql_int(self.since_ms),
            "until": None if self.until_ms is None else sql_int(self.until_ms),
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


@dataclass(frozen=True, slots=True)
class TaskHit:
    task_id: str
    role: str
    peer: bytes
    title: str
    state: str
    updated_ms: int
    snippet: str


_MESSAGE_FILTER: Final = (
    " FROM messages_fts CROSS JOIN messages m ON m.seq = messages_fts.rowid"
    " WHERE messages_fts MATCH :match"
    " AND (:room IS NULL OR m.room_topic = :room)"
    " AND (:not_room IS NULL OR m.room_topic != :not_room)"
    " AND (:sender IS NULL OR m.from_hex = :sender)"
    " AND (:since IS NULL OR m.received_ms >= :since)"
    " AND (:until IS NULL OR m.received_ms <= :until)"
    " AND (:unread = 0 OR m.read_ms IS NULL)"
)
_TASK_FILTER: Final = (
    " FROM tasks_fts CROSS JOIN task_search_ids i ON i.id = tasks_fts.rowid"
    " CROSS JOIN tasks t ON t.owner = i.owner AND t.task_id = i.task_id"
    " WHERE tasks_fts MATCH :match AND t.owner = :owner"
    " AND (:peer IS NULL OR t.peer = :peer)"
    " AND (:since IS NULL OR t.updated_ms >= :since)"
    " AND (:until IS NULL OR t.updated_ms <= :until)"
)
_SNIPPET: Final = f"'{MARK_OPEN}', '{MARK_CLOSE}', '…', {SNIPPET_TOKENS}"


@dataclass(frozen=True, slots=True)
class Match:
    """One match of a query: its row (``seq``, or a task's search id), bm25 score (lower is
    better) and time (a message's ``received_ms``, a task's ``updated_ms``)."""

    row: int
    score: float
    at_ms: int


class _Searched(SqliteStore):
    """Matches in one scan of the index, newest first and at most ``cap`` (no sort of every
    match: the index is read in rowid order and stops at the cap); the rows of a page read and
    their snippets made afterwards, for those rows only."""

    async def _matches(self, sql: str, params: dict[str, object], cap: int) -> list[Match]:
        rows = await self._fetchall(sql, params | {"cap": sql_int(max(cap, 0))})
        return [Match(int(r[0]), float(r[1]), int(r[2])) for r in rows]

    async def _snippets(
        self, table: str, ids: list[int], match: object, column: int = -1
    ) -> dict[int, str]:
        if not ids:
            return {}
        marks = ", ".join("?" * len(ids))
        rows = await self._fetchall(
            f"SELECT rowid, snippet({table}, {column}, {_SNIPPET}) FROM {table}"
            f" WHERE {table} MATCH ? AND rowid IN ({marks})",
            (match, *ids),
        )
        return {int(r[0]): str(r[1] or "") for r in rows}


class MessageSearch(_Searched):
    """Search of the transcript's messages (``TranscriptStore`` inherits it; schema step 4)."""

    async def message_matches(self, window: Window, cap: int, **filters: object) -> list[Match]:
        """The messages matching every word and the filters (``room_topic``,
        ``not_room_topic``, ``from_hex``, ``not_from_hex``, ``unread_only``), newest first, at
        most ``cap``."""
        return await self._matches(
            "SELECT m.seq, bm25(messages_fts, 1.0, 0.0, 0.0), m.received_ms"
            f"{_MESSAGE_FILTER} ORDER BY messages_fts.rowid DESC LIMIT :cap",
            _message_params(window, filters),
            cap,
        )

    async def message_hits(self, window: Window, seqs: list[int]) -> list[MessageHit]:
        """The messages ``seqs`` (from ``message_matches``), in that order, with snippets."""
        if not seqs:
            return []
        marks = ", ".join("?" * len(seqs))
        rows = await self._fetchall(
            "SELECT seq, room_topic, message_id, from_hex, kind, sent_at, received_ms,"
            f" read_ms IS NULL FROM messages WHERE seq IN ({marks})",
            tuple(seqs),
        )
        words = f"text : ({match_expression(window.terms)})"
        snippets = await self._snippets("messages_fts", seqs, words, column=0)
        found = {
            int(r[0]): MessageHit(
                int(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]), int(r[6]),
                int(r[7]), snippets.get(int(r[0]), ""),
            )
            for r in rows
        }  # fmt: skip
        return [found[seq] for seq in seqs if seq in found]


def _message_params(window: Window, filters: dict[str, object]) -> dict[str, object]:
    return window.params() | {
        "match": _message_match(window.terms, filters),
        "room": filters.get("room_topic"),
        "not_room": filters.get("not_room_topic"),
        "sender": filters.get("from_hex"),
        "unread": 1 if filters.get("unread_only") else 0,
    }


class TaskSearch(_Searched):
    """Search of the tasks of one owner (``TaskStore`` inherits it; schema step 3)."""

    async def task_matches(
        self, owner: bytes, window: Window, cap: int, *, peer: bytes | None = None
    ) -> list[Match]:
        """``owner``'s tasks matching every word (in title, input, note or result), the latest
        made first, at most ``cap``; ``since``/``until`` bound the last change."""
        return await self._matches(
            f"SELECT i.id, bm25(tasks_fts), t.updated_ms{_TASK_FILTER}"
            " ORDER BY tasks_fts.rowid DESC LIMIT :cap",
            window.params() | {"owner": owner, "peer": peer},
            cap,
        )

    async def task_hits(self, window: Window, ids: list[int]) -> list[TaskHit]:
        """The tasks of ``ids`` (from ``task_matches``), in that order, with snippets."""
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        rows = await self._fetchall(
            "SELECT i.id, t.task_id, t.role, t.peer, t.title, t.state, t.updated_ms"
            " FROM task_search_ids i JOIN tasks t ON t.owner = i.owner AND t.task_id = i.task_id"
            f" WHERE i.id IN ({marks})",
            tuple(ids),
        )
        snippets = await self._snippets("tasks_fts", ids, window.params()["match"])
        found = {
            int(r[0]): TaskHit(
                str(r[1]), str(r[2]), bytes(r[3]), str(r[4]), str(r[5]), int(r[6]),
                snippets.get(int(r[0]), ""),
            )
            for r in rows
        }  # fmt: skip
        return [found[i] for i in ids if i in found]
