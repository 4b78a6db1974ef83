"""Room history at the station: the signed EVENTs published on central and on rooms, kept
bounded, so an agent that was away fetches what it missed (``macula.history.fetch_v1``).

Invariants:
- Only a PUBLISH on ``agents.lobby`` or ``agents.room.<32 hex>`` in the all-zero realm whose
  ``publisher_sig`` is present and verifies is kept (a fetch names no realm and is open to any
  caller, so a room in a realm, which a station may protect, is never kept here), with every
  field needed to verify it again end to end (topic, realm, publisher, seq, payload as
  canonical CBOR, publisher_sig). Anything else is counted
  (``stats``), never stored. A repeat of ``(topic, realm, publisher, seq)`` is stored once.
- ``note`` is synchronous and cheap enough for the publish path: it looks at the topic and
  queues (at most ``max_pending``; beyond that it counts ``dropped_pending``) and starts a
  writer task if none runs, which lets the loop turn once (the EVENTs leave first); then
  ``write_pending`` checks the queue and stores it in one transaction (one trip to the
  store's thread), run by that task and by every fetch first, so a fetch sees every PUBLISH
  the station handled before it; ``close`` stores what is left. The writer runs through the
  injected ``spawn`` (the station's task group); a writer cancelled mid-write (the station
  stopping) puts its batch back (its trip rolled back, or committed after all: a repeat is
  ignored), so ``close`` still stores it: nothing queued is lost.
- Every kept event gets an ``id`` from one AUTOINCREMENT sequence: ids never repeat, even after
  deletions or a restart; a reader pages by ``after_id``.
- Bounded (``HistoryBounds``): per topic at most ``max_per_room`` events, in all at most
  ``max_events``, none older than ``max_age_ms``; the earliest go first. An event that goes
  leaves an ``expired`` mark (id, topic, publisher, seq, received_ms), so a reader can tell
  what it can no longer fetch; marks are bounded too (``max_expired``, age ``4 * max_age_ms``),
  and a mark that goes is added to its topic's ``forgotten`` count (reported to a reader whose
  ``after_id`` is below the highest id forgotten, with that id, ``forgotten_through_id``).
- ``handle`` never raises (cancellation aside): refusals are 0x0F ``bad_request``, 0x08
  ``rate_limited`` (per caller), via ``relay.builtins.outcome.answer``. Results carry no booleans.
- No clock inside: ``now_ms`` is an argument.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from macula.agent.envelope import is_envelope_topic
from macula.services.house import HISTORY_FETCH
from macula.services.limits import DEFAULT_HISTORY_PAGE, MAX_HISTORY_PAGE
from macula.store.base import DAY_MS, Migration, Row, SqliteStore
from macula.task_scope import Spawner, TaskScope
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.errors import ProtocolError
from macula.wire.frames import Publish, publisher_sig_valid
from macula.wire.identity import ZERO_REALM
from relay.builtins.arguments import arguments, caller_id, handler_for, integer, required, text
from relay.builtins.outcome import Outcome, Refused, answer
from relay.house.buckets import TokenBuckets

__all__ = [
    "DEFAULT_FETCH_RATE",
    "HistoryBounds",
    "HistoryService",
    "HistoryStore",
]

logger = logging.getLogger("macula.relay.house.history")

MAX_REPLY_BYTES: Final = 512 * 1024  # payload bytes in one page (at least one event is sent)
MAX_EVENT_BYTES: Final = 64 * 1024  # a larger payload is not kept (envelopes hold <= 16 KiB)
DEFAULT_FETCH_RATE: Final = 20.0  # per second per caller, burst 4x
MAX_INT64: Final = 2**63 - 1
EXPIRED_AGE_FACTOR: Final = 4


@dataclass(frozen=True, slots=True)
class HistoryBounds:
    """What the history keeps (each a ``macula-relay`` flag)."""

    max_per_room: int = 1_000
    max_events: int = 100_000
    max_age_ms: int = 7 * DAY_MS
    max_expired: int = 400_000
    max_pending: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_per_room", "max_events", "max_age_ms", "max_expired", "max_pending"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"HistoryBounds.{name} must be a positive integer, not {value!r}")


_HISTORY_V1: Final[Migration] = (
    """
    CREATE TABLE events (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        topic         TEXT NOT NULL,
        realm         BLOB NOT NULL,
        publisher     BLOB NOT NULL,
        seq           INTEGER NOT NULL,
        payload       BLOB NOT NULL,       -- canonical CBOR, as signed
        publisher_sig BLOB NOT NULL,
        received_ms   INTEGER NOT NULL,
        UNIQUE (topic, realm, publisher, seq)
    )
    """,
    "CREATE INDEX events_by_topic ON events (topic, id)",
    "CREATE INDEX events_by_received ON events (received_ms)",
    """
    CREATE TABLE expired (
        id          INTEGER PRIMARY KEY,   -- the id the event had
        topic       TEXT NOT NULL,
        publisher   BLOB NOT NULL,
        seq         INTEGER NOT NULL,
        received_ms INTEGER NOT NULL,
        expired_ms  INTEGER NOT NULL
    )
    """,
    "CREATE INDEX expired_by_topic ON expired (topic, id)",
    "CREATE INDEX expired_by_time ON expired (expired_ms)",
    """
    CREATE TABLE forgotten (
        topic      TEXT PRIMARY KEY,
        through_id INTEGER NOT NULL,       -- the highest id of a mark forgotten
        through_ms INTEGER NOT NULL,       -- the latest received_ms of a mark forgotten
        marks      INTEGER NOT NULL        -- how many marks of the topic were forgotten
    ) WITHOUT ROWID
    """,
)

_INSERT: Final = """
INSERT OR IGNORE INTO events (topic, realm, publisher, seq, payload, publisher_sig, received_ms)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""

_EXPIRE: Final = """
INSERT OR IGNORE INTO expired (id, topic, publisher, seq, received_ms, expired_ms)
SELECT id, topic, publisher, seq, received_ms, ? FROM events WHERE {where}
"""


@dataclass(frozen=True, slots=True)
class Kept:
    """One PUBLISH to keep, already checked."""

    topic: str
    realm: bytes
    publisher: bytes
    seq: int
    payload: bytes
    publisher_sig: bytes
    received_ms: int


class HistoryStore(SqliteStore):
    """The events kept, the marks of those that expired, and per topic the marks forgotten."""

    MIGRATIONS = (_HISTORY_V1,)
    MARKS_PRUNE_EVERY: ClassVar[int] = 64  # keeps between two prunes of the expired marks

    _keeps = 0
    _rows: tuple[int, int] | None = None  # (events, expired marks) as committed; None: unread

    async def keep(self, events: list[Kept], bounds: HistoryBounds, now_ms: int) -> int:
        """Store ``events`` (repeats ignored) and apply ``bounds``; how many were new. One trip
        to the store's thread (``_atomically``): a keep was eight, each waking the loop."""
        rows = [
            (e.topic, e.realm, e.publisher, e.seq, e.payload, e.publisher_sig, e.received_ms)
            for e in events
        ]
        self._keeps += 1
        marks = self._keeps % self.MARKS_PRUNE_EVERY == 0
        topics = {e.topic for e in events}

        def work(db: sqlite3.Connection) -> tuple[int, tuple[int, int]]:
            kept, marked = self._counted(db)
            before = db.total_changes
            db.executemany(_INSERT, rows)
            stored = db.total_changes - before
            return stored, _prune(db, bounds, topics, now_ms, (kept + stored, marked), marks=marks)

        stored, self._rows = await self._committed(work)
        return stored

    async def prune(self, bounds: HistoryBounds, now_ms: int) -> None:
        def work(db: sqlite3.Connection) -> tuple[int, tuple[int, int]]:
            return 0, _prune(db, bounds, set(), now_ms, self._counted(db), marks=True)

        _, self._rows = await self._committed(work)

    async def _committed(
        self, work: Callable[[sqlite3.Connection], tuple[int, tuple[int, int]]]
    ) -> tuple[int, tuple[int, int]]:
        try:
            return await self._atomically(work)
        except asyncio.CancelledError:
            self._rows = None  # it may have committed after all: counted again next time
            raise

    def _counted(self, db: sqlite3.Connection) -> tuple[int, int]:
        """(events, expired marks) in the store: counted once (the only full walk), then kept
        up to date by every write, which all go through ``keep`` and ``prune`` (on the store's
        thread, inside their transaction; the counts are kept once it committed)."""
        if self._rows is None:
            [(kept,)] = db.execute("SELECT count(*) FROM events").fetchall()
            [(marked,)] = db.execute("SELECT count(*) FROM expired").fetchall()
            return int(kept), int(marked)
        return self._rows

    async def page(
        self, topic: str, after_id: int, since_ms: int, limit: int, max_bytes: int
    ) -> dict[str, Any]:
        """Events and expired marks of ``topic`` with ``id > after_id`` received at or after
        ``since_ms``, in id order: at most ``limit`` items and ``max_bytes`` of payload."""
        params = {"topic": topic, "after": after_id, "since": since_ms, "n": limit + 1}
        where = "topic = :topic AND id > :after AND received_ms >= :since"
        events = await self._fetchall(
            "SELECT id, topic, realm, publisher, seq, payload, publisher_sig, received_ms"
            f" FROM events WHERE {where} ORDER BY id LIMIT :n",
            params,
        )
        marks = await self._fetchall(
            f"SELECT id, publisher, seq FROM expired WHERE {where} ORDER BY id LIMIT :n", params
        )
        items: list[tuple[int, Row, int]] = sorted(
            [(int(r[0]), r, 0) for r in events] + [(int(r[0]), r, 1) for r in marks],
            key=lambda item: item[0],
        )
        taken_events: list[dict[str, Any]] = []
        taken_marks: list[dict[str, Any]] = []
        size = 0
        next_id = after_id
        more = 0
        for count, (item_id, row, is_mark) in enumerate(items):
            payload_size = 0 if is_mark else len(bytes(row[5]))
            if count >= limit or (taken_events and size + payload_size > max_bytes):
                more = 1
                break
            if is_mark:
                taken_marks.append({"id": item_id, "publisher": bytes(row[1]), "seq": int(row[2])})
            else:
                taken_events.append(_event(row))
                size += payload_size
            next_id = item_id
        forgotten = await self._fetchone(
            "SELECT marks, through_id FROM forgotten"
            " WHERE topic = ? AND through_id > ? AND through_ms >= ?",
            (topic, after_id, since_ms),
        )
        return {
            "events": taken_events,
            "expired": taken_marks,
            "next_after_id": next_id,
            "more": more,
            "forgotten": int(forgotten[0]) if forgotten is not None else 0,
            "forgotten_through_id": int(forgotten[1]) if forgotten is not None else 0,
        }

    async def count(self, topic: str | None = None) -> int:
        if topic is None:
            row = await self._fetchone("SELECT count(*) FROM events")
        else:
            row = await self._fetchone("SELECT count(*) FROM events WHERE topic = ?", (topic,))
        return int(row[0]) if row is not None else 0

    async def expired_count(self, topic: str | None = None) -> int:
        if topic is None:
            row = await self._fetchone("SELECT count(*) FROM expired")
        else:
            row = await self._fetchone("SELECT count(*) FROM expired WHERE topic = ?", (topic,))
        return int(row[0]) if row is not None else 0


def _event(row: Row) -> dict[str, Any]:
    return {
        "id": int(row[0]),
        "topic": str(row[1]),
        "realm": bytes(row[2]),
        "publisher": bytes(row[3]),
        "seq": int(row[4]),
        "payload": cbor.decode(bytes(row[5])),
        "publisher_sig": bytes(row[6]),
        "received_ms": int(row[7]),
    }


def _execute(db: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> int:
    return max(db.execute(sql, params).rowcount, 0)


def _expire(
    db: sqlite3.Connection, where: str, params: tuple[object, ...], now_ms: int
) -> tuple[int, int]:
    """Move the events matching ``where`` to the expired marks; (marks added, events gone)."""
    marked = _execute(db, _EXPIRE.format(where=where), (now_ms, *params))
    return marked, _execute(db, f"DELETE FROM events WHERE {where}", params)


def _prune(
    db: sqlite3.Connection,
    bounds: HistoryBounds,
    topics: set[str],
    now_ms: int,
    rows: tuple[int, int],
    *,
    marks: bool,
) -> tuple[int, int]:
    """Age, then each touched topic's cap, then the global cap; then (``marks``) the bounds of
    the expired marks. ``rows``: (events, marks) in the store before; returned as after.
    Each cap is a walk of what it removes (the oldest ids first), never of what it keeps: at
    the 100,000-event cap a walk of the newest 100,000 cost ~40 ms of CPU per room message."""
    kept, marked = rows
    expiring: list[tuple[str, tuple[object, ...]]] = [
        ("received_ms < ?", (now_ms - bounds.max_age_ms,))
    ]
    expiring += [
        (
            "id IN (SELECT id FROM events WHERE topic = ? ORDER BY id DESC LIMIT -1 OFFSET ?)",
            (topic, bounds.max_per_room),
        )
        for topic in sorted(topics)
    ]
    for where, params in expiring:
        added, gone = _expire(db, where, params, now_ms)
        marked, kept = marked + added, kept - gone
    if kept > bounds.max_events:
        oldest = "id IN (SELECT id FROM events ORDER BY id LIMIT ?)"
        added, gone = _expire(db, oldest, (kept - bounds.max_events,), now_ms)
        marked, kept = marked + added, kept - gone
    if not marks:
        return kept, marked
    marked -= _forget(db, "expired_ms < ?", (now_ms - bounds.max_age_ms * EXPIRED_AGE_FACTOR,))
    if marked > bounds.max_expired:
        oldest = "id IN (SELECT id FROM expired ORDER BY id LIMIT ?)"
        marked -= _forget(db, oldest, (marked - bounds.max_expired,))
    return kept, marked


def _forget(db: sqlite3.Connection, where: str, params: tuple[object, ...]) -> int:
    """Fold the expired marks matching ``where`` into their topics' ``forgotten`` counts, then
    remove them; how many went."""
    _execute(
        db,
        "INSERT INTO forgotten (topic, through_id, through_ms, marks)"
        f" SELECT topic, max(id), max(received_ms), count(*) FROM expired WHERE {where}"
        " GROUP BY topic ON CONFLICT (topic) DO UPDATE SET"
        " through_id = max(through_id, excluded.through_id),"
        " through_ms = max(through_ms, excluded.through_ms), marks = marks + excluded.marks",
        params,
    )
    return _execute(db, f"DELETE FROM expired WHERE {where}", params)


def keepable(frame: Publish, now_ms: int, *, sig_checked: bool = False) -> Kept | str:
    """The PUBLISH as kept, or the name of the reason it is not (a ``stats`` counter).
    ``sig_checked``: the caller already verified a present ``publisher_sig``."""
    if not is_envelope_topic(frame.topic):
        return "not_a_room"
    if frame.realm != ZERO_REALM:
        return "not_zero_realm"
    if frame.publisher_sig is None:
        return "unsigned"
    if not 0 <= frame.seq <= MAX_INT64:
        return "seq_out_of_range"
    if not sig_checked and not publisher_sig_valid(frame):
        return "bad_publisher_sig"
    try:
        payload = cbor.encode(frame.payload)
    except (ProtocolError, ValueError, TypeError):
        return "bad_payload"
    if len(payload) > MAX_EVENT_BYTES:
        return "too_large"
    return Kept(
        frame.topic,
        frame.realm,
        frame.publisher,
        frame.seq,
        payload,
        frame.publisher_sig,
        now_ms,
    )


class HistoryService:
    """``macula.history.fetch_v1`` over a ``HistoryStore``, fed by ``note`` (the station's
    publish hook)."""

    def __init__(
        self,
        store: HistoryStore,
        bounds: HistoryBounds | None = None,
        *,
        fetch_rate: float = DEFAULT_FETCH_RATE,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        clock: Callable[[], int] | None = None,
        spawn: Spawner | None = None,
    ) -> None:
        self.store = store
        self.bounds = bounds or HistoryBounds()
        self.max_reply_bytes = max_reply_bytes
        self.buckets = TokenBuckets(fetch_rate, fetch_rate * 4)
        self.stats: Counter[str] = Counter()
        self._clock = clock
        self._pending: list[tuple[Publish, int, bool]] = []  # (PUBLISH, received_ms, checked)
        self._scope = TaskScope(spawn)
        self._writer: asyncio.Task[None] | None = None  # stores the queue, then ends
        self._writing = asyncio.Lock()
        self._handlers = {HISTORY_FETCH: self._fetch}

    # -- recording ---------------------------------------------------------------------------

    def note(self, frame: Publish, now_ms: int, *, sig_checked: bool = False) -> None:
        """Queue one PUBLISH the station accepted, if it may belong in the history.
        ``sig_checked``: a present ``publisher_sig`` was verified already (the station's
        router drops a PUBLISH whose signature does not verify before the hook sees it).
        Called on the publish path, before the EVENTs leave: only the topic is looked at here;
        the checks (a verify among them) run in the writer, after the packets have gone."""
        if not is_envelope_topic(frame.topic):
            return  # most traffic: not counted, not checked
        if len(self._pending) >= self.bounds.max_pending:
            self.stats["dropped_pending"] += 1
            return
        self._pending.append((frame, now_ms, sig_checked))
        if self._writer is None or self._writer.done():
            self._writer = self._scope.spawn(self._drain())  # None: stopping, close stores it

    async def write_pending(self, now_ms: int | None = None) -> int:
        """Store what ``note`` queued and may be kept; how many were new."""
        async with self._writing:
            noted, self._pending = self._pending, []
            batch: list[Kept] = []
            checked: list[tuple[Publish, int, bool]] = []
            for frame, received_ms, sig_checked in noted:
                kept = keepable(frame, received_ms, sig_checked=sig_checked)
                if isinstance(kept, str):
                    self.stats[kept] += 1
                else:
                    batch.append(kept)
                    checked.append((frame, received_ms, True))
            if not batch:
                return 0
            now = now_ms if now_ms is not None else max(k.received_ms for k in batch)
            try:
                stored = await self.store.keep(batch, self.bounds, now)
            except asyncio.CancelledError:
                # rolled back, or committed after all: stored by the next write (close), where
                # a repeat is ignored; the checks are not made twice
                self._pending[:0] = checked
                raise
            except Exception:
                self.stats["write_failed"] += len(batch)
                raise
            self.stats["stored"] += stored
            return stored

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # the packets the PUBLISH made leave first (their flush is queued)
        while self._pending:
            try:
                await self.write_pending()
            except Exception:
                logger.exception("history: could not store %d events", len(self._pending))
                return

    async def close(self) -> None:
        """Store what is still queued (the store itself is closed by its owner)."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            await asyncio.wait([writer])  # finished, or cancelled by the station's stop
        await self._scope.aclose()  # nothing more is spawned
        await self.write_pending()

    # -- fetching ----------------------------------------------------------------------------

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure`` by ``caller``. Never raises."""
        if type(procedure) is not str or procedure not in self._handlers:
            return Outcome.error(ErrorCode.UNKNOWN_NEXT_PEER)

        async def work() -> object:
            return await handler_for(self._handlers, procedure)(payload, caller, now_ms)

        return await answer(procedure, work, logger)

    async def _fetch(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        topic = text(required(args, "topic"), "topic", high=128)
        if not is_envelope_topic(topic):
            raise Refused(
                ErrorCode.UNKNOWN_ERROR,
                "bad_request",
                "'topic' must be 'agents.lobby' or 'agents.room.<32 lowercase hex>'",
            )
        after_id = integer(args, "after_id", 0, MAX_INT64, default=0)
        since_ms = integer(args, "since_ms", 0, MAX_INT64, default=0)
        limit = integer(args, "limit", 1, MAX_HISTORY_PAGE, default=DEFAULT_HISTORY_PAGE)
        asker = caller_id(caller, "bad_request")
        self.buckets.take_or_refuse(asker, now_ms, "history fetches")
        await self.write_pending(now_ms)
        return await self.store.page(topic, after_id, since_ms, limit, self.max_reply_bytes)
