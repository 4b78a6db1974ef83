"""What the agent's local stores share: paths from the environment, file modes, one connection.

Invariants:
- One aiosqlite connection per store object, in autocommit mode (``isolation_level=None``).
  Every statement and every explicit transaction runs under the store's ``asyncio.Lock``, so two
  coroutines never interleave inside one transaction; a transaction that fails or is cancelled
  queues a ``ROLLBACK`` behind whatever it left on the connection's FIFO worker.
- A statement normally runs on aiosqlite's thread: a trip there and back per statement.
  ``_atomically`` runs a whole transaction in one trip; ``inline`` work (short statements on
  small indexed tables, on the say -> wait path) runs on the loop's thread with no trip, and
  only when nothing of ours is still queued on the connection's thread (``_settled``), so the
  connection is never used by two threads at once; it never waits for another process's lock
  on the loop (busy: it goes to the thread).
- ``busy_timeout`` (5 s) is set before anything else, then the WAL journal (refused if SQLite
  cannot switch to it: another process sharing the file relies on it; the switch is retried,
  since SQLite's busy handler does not cover it) and ``synchronous=NORMAL``: a commit survives
  the process being killed; only a power loss can drop the last few.
- Two processes may share a file. Single writes are one statement (upserts, ``INSERT OR IGNORE``),
  atomic by themselves; read-modify-write runs in ``BEGIN IMMEDIATE``, so the write lock is taken
  before the read and no update is lost between processes.
- The schema is versioned by ``PRAGMA user_version``. Migrations run inside ``BEGIN IMMEDIATE``
  after re-reading the version, so two processes opening a fresh file migrate it exactly once. A
  file newer than this code is refused (``StoreError``) and left untouched.
- A missing database file is created 0600 and an existing one tightened to 0600; missing parent
  directories are created 0700, existing ones are left alone. SQLite gives ``-wal``/``-shm`` the
  database file's mode.
- No clock and no randomness inside: every timestamp is an argument.
- A store that grows from what peers send is bounded (``Bounds``): its ``prune(now_ms)`` deletes
  at most ``batch`` rows per rule, and it runs by itself after every ``prune_every`` inserts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Final, Self, TypeVar, cast

import aiosqlite

from macula.config import (
    HOME_ENV,
    RINGS_DB_ENV,
    ROSTER_DB_ENV,
    TRANSCRIPT_DB_ENV,
    macula_home,
    path_setting,
)
from macula.errors import ClosedError, ConfigError, MaculaError

__all__ = [
    "DAY_MS",
    "HOME_ENV",
    "RINGS_DB_ENV",
    "ROSTER_DB_ENV",
    "TRANSCRIPT_DB_ENV",
    "Bounds",
    "SqliteStore",
    "StoreError",
    "StorePaths",
    "paths_from_env",
]

logger = logging.getLogger("macula.store")

BUSY_TIMEOUT_MS: Final = 5000
WAL_SWITCH_PAUSE_S: Final = 0.01
WAL_SWITCH_ATTEMPTS: Final = int(BUSY_TIMEOUT_MS / 1000 / WAL_SWITCH_PAUSE_S)
DAY_MS: Final = 24 * 3600 * 1000

Row = tuple[Any, ...]
T = TypeVar("T")
Params = Mapping[str, Any] | tuple[Any, ...]
Migration = tuple[str, ...]  # the statements of one schema step, run in order


class StoreError(MaculaError):
    """A store file cannot be used: not a database, a newer schema, or SQLite failed."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much a store keeps: ``max_rows`` (per room for the transcript) and ``max_age_ms``;
    it prunes itself after every ``prune_every`` inserts, deleting at most ``batch`` rows per
    rule in one prune (more than ``prune_every``, so pruning always keeps up)."""

    max_rows: int
    max_age_ms: int
    prune_every: int = 256
    batch: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_age_ms", "prune_every", "batch"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


# --- paths ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StorePaths:
    roster: Path
    transcript: Path
    rings: Path


def paths_from_env(environ: Mapping[str, str] | None = None) -> StorePaths:
    """Where the stores live: ``$MACULA_HOME`` (default ``~/.macula``) holds ``roster.sqlite3``,
    ``transcript.sqlite3`` and ``rings.sqlite3``, each movable by its own variable.

    A variable that is set but empty, or names the wrong kind of thing, is a ``ConfigError``
    naming it. Paths are made absolute here, so a later ``chdir`` does not move a store.
    """
    env = os.environ if environ is None else environ
    home = macula_home(env)
    return StorePaths(
        roster=_db_setting(env, ROSTER_DB_ENV) or home / "roster.sqlite3",
        transcript=_db_setting(env, TRANSCRIPT_DB_ENV) or home / "transcript.sqlite3",
        rings=_db_setting(env, RINGS_DB_ENV) or home / "rings.sqlite3",
    )


def _db_setting(env: Mapping[str, str], name: str) -> Path | None:
    path = path_setting(env, name, "a database file path")
    if path is not None and path.is_dir():
        raise ConfigError(f"{name}: {path} is a directory; give a database file path")
    return path


def prepare_file(path: Path) -> None:
    """Create missing parent directories 0700 and the database file 0600 (tightened if looser)."""
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


# --- the connection ---------------------------------------------------------------------------


class SqliteStore:
    """Open/close, pragmas, ``user_version`` migrations and locked access for one store file."""

    MIGRATIONS: ClassVar[tuple[Migration, ...]] = ()

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        """Use ``await Store.open(path)``; this only wraps an already configured connection."""
        self._db = db
        self.path = path
        self._lock = asyncio.Lock()
        self._closed = False
        self._settled = True  # False: a cancelled caller's call may still be queued on the thread

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> Self:
        """Open (creating and migrating if needed) the store at ``path``."""
        target = Path(path)
        try:
            prepare_file(target)
        except OSError as exc:
            raise StoreError(f"{target}: cannot create the store file: {exc}") from exc
        # check_same_thread off: ``inline`` work runs on the loop's thread, never at the same
        # time as the connection's own thread (the lock, and ``_settled``)
        db = await aiosqlite.connect(target, isolation_level=None, check_same_thread=False)
        try:
            await _configure(db, target, cls.MIGRATIONS)
        except BaseException:
            await db.close()
            raise
        return cls(db, target)

    async def close(self) -> None:
        """Close the connection after any running operation; closing twice is a no-op."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await self._db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def schema_version(self) -> int:
        row = await self._fetchone("PRAGMA user_version")
        return int(row[0]) if row is not None else 0

    async def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: ``"ok"`` or the problems found."""
        rows = await self._fetchall("PRAGMA integrity_check")
        return "\n".join(str(row[0]) for row in rows)

    # -- locked access for the subclasses ------------------------------------------------------

    async def _execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement (atomic by itself); return the number of rows it changed."""
        async with self._locked() as db:
            try:
                async with db.execute(sql, params) as cursor:
                    return max(cursor.rowcount, 0)
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    async def _execute_one_trip(
        self, sql: str, params: Params = (), *, inline: bool = False
    ) -> int:
        """``_execute`` in one trip to the connection's thread (see ``changed``), or
        (``inline``) on the loop's thread, with no trip at all (see ``_run``)."""
        async with self._locked() as db:
            try:
                return await self._run(db, functools.partial(_changed, sql, params), inline)
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    async def _fetchall(self, sql: str, params: Params = (), *, inline: bool = False) -> list[Row]:
        async with self._locked() as db:
            try:
                if inline:
                    return await self._run(db, functools.partial(_fetched, sql, params), True)
                return _rows(await db.execute_fetchall(sql, params))
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    async def _fetchone(self, sql: str, params: Params = ()) -> Row | None:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` under the lock; any exception rolls back."""
        async with self._locked() as db:
            try:
                try:
                    await db.execute("BEGIN IMMEDIATE")
                    yield db
                    await db.execute("COMMIT")
                except BaseException:
                    await _rollback(db)
                    raise
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    async def _atomically(
        self,
        work: Callable[[sqlite3.Connection], T],
        undo: Callable[[sqlite3.Connection, T], object] | None = None,
        *,
        inline: bool = False,
    ) -> T:
        """``work(connection)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``, in one trip to the
        connection's thread (a ``_transaction`` makes a trip per statement, BEGIN and COMMIT
        included, and each trip back wakes the loop through its self-pipe), or (``inline``) on
        the loop's thread (``_run``). Any exception in ``work`` rolls back. A caller cancelled
        while the trip runs cannot stop it (it runs on the thread); when it commits,
        ``undo(connection, result)`` runs in a second trip, so a cancelled caller that gave
        ``undo`` leaves nothing changed that it was not told of."""
        async with self._locked() as db:
            outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
            try:
                if inline and await self._inline_ready(db):
                    with contextlib.suppress(_Busy):
                        return _inline(db, functools.partial(_in_transaction, db, work, None))
                return await _on_thread(db, functools.partial(_in_transaction, db, work, outcome))
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc
            except asyncio.CancelledError:
                if undo is not None:
                    await self._undone(db, outcome, undo)
                raise

    async def _run(
        self, db: aiosqlite.Connection, function: Callable[[sqlite3.Connection], T], inline: bool
    ) -> T:
        """``function(connection)`` under the lock: on the connection's thread (a trip there and
        back), or (``inline``) right here on the loop's thread. Inline saves the trip: the
        queue, the thread's wake-up, its turn for the GIL and the loop's wake-up through the
        self-pipe (0.15 ms on an idle machine, 1 ms and more when every core is busy), and
        blocks the loop while it runs: only for short statements on small, indexed tables. It
        never waits for another process's lock: busy, it goes to the thread as usual."""
        if inline and await self._inline_ready(db):
            with contextlib.suppress(_Busy):
                return _inline(db, lambda: function(db._conn))
        return await _on_thread(db, lambda: function(db._conn))

    async def _inline_ready(self, db: aiosqlite.Connection) -> bool:
        """Whether the connection is ours on this thread: nothing of ours queued on its own
        thread. After a cancelled call it may be, so one empty trip lets that run out first."""
        if not self._settled:
            await _on_thread(db, _nothing)  # the thread runs its queue in order
            self._settled = True
        return True

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[aiosqlite.Connection]:
        """The lock and the open connection; a cancelled holder may leave a call queued on the
        connection's thread (``_settled``)."""
        async with self._lock:
            db = self._connection()
            try:
                yield db
            except asyncio.CancelledError:
                self._settled = False
                raise

    async def _undone(
        self,
        db: aiosqlite.Connection,
        outcome: concurrent.futures.Future[T],
        undo: Callable[[sqlite3.Connection, T], object],
    ) -> None:
        """After a cancelled ``_atomically``: a second trip, queued behind the first (the thread
        runs its queue in order), undoes what the first committed; once queued it runs even if
        this caller is cancelled again."""

        def after() -> None:
            if outcome.done() and outcome.exception() is None:  # the trip committed
                result = outcome.result()
                _in_transaction(db, lambda connection: undo(connection, result), None)

        try:
            await _on_thread(db, after)
        except (sqlite3.Error, ValueError) as exc:  # ValueError: aiosqlite closed meanwhile
            logger.warning("%s: a cancelled write could not be undone: %s", self.path, exc)

    def _connection(self) -> aiosqlite.Connection:
        if self._closed:
            raise ClosedError(f"{self.path}: the store is closed")
        return self._db

    def _failed(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"{self.path}: {exc}")


async def fetchall(db: aiosqlite.Connection, sql: str, params: Params = ()) -> list[Row]:
    """Rows of ``sql`` on ``db`` as tuples (inside a ``_transaction``)."""
    return _rows(await db.execute_fetchall(sql, params))


async def execute(db: aiosqlite.Connection, sql: str, params: Params = ()) -> int:
    """Run ``sql`` on ``db`` (inside a ``_transaction``); return the number of rows changed."""
    async with db.execute(sql, params) as cursor:
        return max(cursor.rowcount, 0)


def _in_transaction(
    db: aiosqlite.Connection,
    work: Callable[[sqlite3.Connection], T],
    outcome: concurrent.futures.Future[T] | None,
) -> T:
    """``work`` between BEGIN IMMEDIATE and COMMIT, rolled back on any exception; its result
    (or exception) also goes to ``outcome``. On the connection's thread, or inline on the
    loop's thread when nothing of ours is queued there (``_inline_ready``)."""
    connection = db._conn  # aiosqlite's own sqlite3 connection: one thread at a time
    connection.execute("BEGIN IMMEDIATE")
    try:
        result = work(connection)
        connection.execute("COMMIT")
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        if outcome is not None:
            outcome.set_exception(exc)
        raise
    if outcome is not None:
        outcome.set_result(result)
    return result


class _Busy(Exception):
    """Inline work met another process's lock: it goes to the connection's thread instead."""


def _inline(db: aiosqlite.Connection, function: Callable[[], T]) -> T:
    """``function()`` on the loop's thread with SQLite's busy wait off (the loop never waits
    for another process): ``_Busy`` when it met a lock, having changed nothing (a failed
    statement, or a transaction rolled back), so it can run again on the thread."""
    connection = db._conn
    connection.execute("PRAGMA busy_timeout = 0")
    try:
        return function()
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):
            raise _Busy from exc
        raise
    finally:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def _nothing() -> None:
    return None


def _changed(sql: str, params: Params, connection: sqlite3.Connection) -> int:
    before = connection.total_changes
    connection.execute(sql, params).close()
    return connection.total_changes - before


def _fetched(sql: str, params: Params, connection: sqlite3.Connection) -> list[Row]:
    return _rows(connection.execute(sql, params).fetchall())


async def _on_thread(db: aiosqlite.Connection, function: Callable[[], T]) -> T:
    """Run ``function`` on ``db``'s worker thread, behind what is queued there (FIFO).
    aiosqlite has no public call for this; ``_execute`` is what its own methods use (0.22,
    locked; ``tests/unit/macula/store/test_store_one_trip.py`` pins the behaviour relied on)."""
    run = cast(Callable[[Callable[[], T]], Awaitable[T]], db._execute)
    return await run(function)


def _rows(rows: Iterable[sqlite3.Row]) -> list[Row]:
    return [tuple(row) for row in rows]


async def _rollback(db: aiosqlite.Connection) -> None:
    # Queued behind anything still running for a cancelled caller (the worker is FIFO), so it
    # also ends a transaction whose BEGIN had not yet run when the caller gave up.
    with contextlib.suppress(sqlite3.Error, ValueError):
        await db.execute("ROLLBACK")


async def _configure(
    db: aiosqlite.Connection, path: Path, migrations: tuple[Migration, ...]
) -> None:
    try:
        await db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        await _use_wal(db, path)
        await db.execute("PRAGMA synchronous = NORMAL")
        await _migrate(db, path, migrations)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open the store: {exc}") from exc


async def _use_wal(db: aiosqlite.Connection, path: Path) -> None:
    """Switch a fresh file to WAL (the mode then stays in the file).

    Switching needs an exclusive lock, and SQLite answers SQLITE_BUSY at once, without its busy
    handler, when another process is switching or migrating the same fresh file: so retry here,
    for about ``BUSY_TIMEOUT_MS`` in all, re-reading the mode first each time.
    """
    for attempt in range(WAL_SWITCH_ATTEMPTS):
        try:
            mode = await _journal_mode(db, "PRAGMA journal_mode")
            if mode != "wal":
                mode = await _journal_mode(db, "PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or attempt == WAL_SWITCH_ATTEMPTS - 1:
                raise
            await asyncio.sleep(WAL_SWITCH_PAUSE_S)
            continue
        if mode != "wal":
            raise StoreError(f"{path}: SQLite cannot use a WAL journal here (got {mode!r})")
        return


async def _journal_mode(db: aiosqlite.Connection, pragma: str) -> str:
    rows = _rows(await db.execute_fetchall(pragma))
    return str(rows[0][0]).lower() if rows else "unknown"


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


async def _user_version(db: aiosqlite.Connection) -> int:
    rows = _rows(await db.execute_fetchall("PRAGMA user_version"))
    return int(rows[0][0]) if rows else 0


def _refuse_newer(version: int, latest: int, path: Path) -> None:
    if version > latest:
        raise StoreError(
            f"{path} has schema version {version}, but this macula knows versions up to {latest}:"
            " it was written by a newer macula. Upgrade macula, or point this store elsewhere."
        )


async def _migrate(db: aiosqlite.Connection, path: Path, migrations: tuple[Migration, ...]) -> None:
    latest = len(migrations)
    version = await _user_version(db)
    _refuse_newer(version, latest, path)
    if version == latest:
        return
    await db.execute("BEGIN IMMEDIATE")
    try:
        version = await _user_version(db)  # another process may have migrated meanwhile
        _refuse_newer(version, latest, path)
        for step in range(version + 1, latest + 1):
            for statement in migrations[step - 1]:
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {step}")
        await db.execute("COMMIT")
    except BaseException:
        await _rollback(db)
        raise
    if version < latest:
        logger.info("%s: schema migrated from version %d to %d", path, version, latest)


# --- row values -------------------------------------------------------------------------------


def opt_text(value: Any) -> str | None:
    return None if value is None else str(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def check_limit(limit: int, offset: int = 0) -> None:
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must not be negative")


SQL_INT_MAX: Final = (1 << 63) - 1
SQL_INT_MIN: Final = -(1 << 63)


def sql_int(value: int) -> int:
    """``value`` clamped to SQLite's 64-bit integers (binding one outside raises
    OverflowError): past every stored time or row, the clamped bound still is."""
    return min(max(value, SQL_INT_MIN), SQL_INT_MAX)


def page(limit: int, offset: int = 0) -> tuple[int, int]:
    """``limit`` and ``offset`` checked (not negative) and clamped to SQLite's range."""
    check_limit(limit, offset)
    return sql_int(limit), sql_int(offset)


def check_flag(value: int, name: str) -> int:
    """A 0/1 flag as an int (``True``/``False`` are accepted and stored as 1/0)."""
    if value not in (0, 1):
        raise ValueError(f"{name} must be 0 or 1, not {value!r}")
    return int(value)


def check_node_id(node_id: bytes, name: str = "node_id") -> bytes:
    if type(node_id) is not bytes or len(node_id) != 32:
        raise ValueError(f"{name} must be exactly 32 bytes")
    return node_id


async def changed(db: aiosqlite.Connection, sql: str, params: Params = ()) -> int:
    """``execute`` in one trip to aiosqlite's thread instead of two (running the statement,
    then closing its cursor: each trip wakes that thread and the event loop): the rows changed,
    read from ``total_changes``. Only for tables without triggers (their changes count too),
    under the store's lock or inside its ``_transaction`` (no statement between the reads)."""
    before = db.total_changes
    await db.execute_fetchall(sql, params)
    return db.total_changes - before
