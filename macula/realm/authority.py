"""A realm's own files, and what its owner does with them (``macula-realm``).

``$MACULA_HOME/realms/`` (0700) holds one 0700 folder per realm: ``authority.key`` (0600, the
Ed25519 key that signs its records) and ``state.sqlite3`` (0600), which ``macula-realm serve``
and the other ``macula-realm`` commands share: join sessions, decisions, members (with the
signed endorsement or revocation of each) and the times of wrong codes.

Invariants:
- One pending session per node; a new ``start`` replaces its code. Sessions expire after
  ``session_ttl_ms`` (default 15 min); at most ``max_pending`` (default 100) are open at once.
- ``decide`` looks a code up only when the ``GuessLimiter`` allows; an unknown code is recorded
  as a wrong guess. A decided, expired or unknown code changes nothing.
- Approving signs an endorsement with the authority key; revoking signs a revocation that
  replaces it (``macula.realm.records``). ``published`` marks which version the service has put
  in the DHT, so a record signed here reaches the DHT once, however many processes run.
- Codes are never logged; files are created 0600 in 0700 folders, and an existing key file
  with loose permissions is refused (``macula.keyfile``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from macula.keyfile import load_identity, save_identity
from macula.realm.codes import GuessLimiter, new_code, normalize
from macula.realm.records import (
    DEFAULT_ROLE,
    DEFAULT_VALID_MS,
    STATION_ROLE,
    RealmRecordError,
    build_directory,
    build_endorsement,
    build_revocation,
    name_problem,
)
from macula.wire import cbor
from macula.wire.identity import DEFAULT_PUZZLE_DIFFICULTY, Identity
from macula.wire.records import Record

DEFAULT_SESSION_TTL_MS: Final = 15 * 60 * 1000
DEFAULT_MAX_PENDING: Final = 100

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sessions (
    code TEXT PRIMARY KEY, node BLOB NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, status TEXT NOT NULL, decided_at INTEGER);
CREATE INDEX IF NOT EXISTS sessions_by_node ON sessions (node, created_at);
CREATE TABLE IF NOT EXISTS members (
    node BLOB PRIMARY KEY, role TEXT NOT NULL, joined_at INTEGER NOT NULL,
    valid_until INTEGER NOT NULL, revoked_at INTEGER, record BLOB NOT NULL,
    published BLOB);
CREATE TABLE IF NOT EXISTS wrong_codes (at INTEGER NOT NULL);
"""


class RealmError(Exception):
    """A ``macula-realm`` operation cannot be done; ``code`` names why (for ``--json``)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Session:
    code: str
    node: bytes
    created_at: int
    expires_at: int
    status: str


@dataclass(frozen=True, slots=True)
class Member:
    node: bytes
    role: str
    joined_at: int
    valid_until: int
    revoked_at: int | None
    record: Record


def realms_dir(home: Path) -> Path:
    return home / "realms"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


class Realm:
    """One realm this home owns: its key and its state file."""

    def __init__(
        self,
        home: Path,
        name: str,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        limiter: GuessLimiter | None = None,
        session_ttl_ms: int = DEFAULT_SESSION_TTL_MS,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        if problem := name_problem(name):
            raise RealmError("bad_name", problem)
        self.name = name
        self.folder = realms_dir(home) / name
        self.key_path = self.folder / "authority.key"
        self.state_path = self.folder / "state.sqlite3"
        self.random_bytes = random_bytes
        self.limiter = limiter or GuessLimiter()
        self.session_ttl_ms = session_ttl_ms
        self.max_pending = max_pending
        self._identity: Identity | None = None

    # -- files ---------------------------------------------------------------------------------

    def create(self, difficulty: int = DEFAULT_PUZZLE_DIFFICULTY) -> Identity:
        if self.key_path.exists():
            raise RealmError("exists", f"realm {self.name!r} already exists at {self.folder}")
        _private_dir(self.folder.parent)
        _private_dir(self.folder)
        identity = Identity.generate(self.random_bytes, difficulty=difficulty)
        try:
            save_identity(self.key_path, identity, exclusive=True)
        except FileExistsError:
            raise RealmError("exists", f"realm {self.name!r} was created meanwhile") from None
        self._init_state()
        self._identity = identity
        return identity

    def exists(self) -> bool:
        return self.key_path.exists()

    @property
    def authority(self) -> Identity:
        if self._identity is None:
            if not self.exists():
                raise RealmError(
                    "no_realm", f"no realm {self.name!r} here: run macula-realm create {self.name}"
                )
            self._identity = load_identity(self.key_path)
        return self._identity

    def _init_state(self) -> None:
        if not self.state_path.exists():
            fd = os.open(self.state_path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
        os.chmod(self.state_path, 0o600)
        db = sqlite3.connect(self.state_path, timeout=10.0)
        try:
            db.executescript(_SCHEMA)
        finally:
            db.close()

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        if not self.state_path.exists():
            raise RealmError("no_realm", f"no state file at {self.state_path}")
        db = sqlite3.connect(self.state_path, timeout=10.0, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout = 10000")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def open(self) -> Realm:
        """Check the realm exists and its key is usable (0600); make sure the schema is there."""
        self.authority  # noqa: B018 (loads the key: refuses a missing or loose one)
        self._init_state()
        return self

    def _random10(self) -> bytes:
        return self.random_bytes(10)

    def directory_record(self, now_ms: int) -> Record:
        return build_directory(self.authority, self.name, now_ms=now_ms, random10=self._random10())

    # -- join sessions (the service) ---------------------------------------------------------

    def start_session(self, node: bytes, now_ms: int) -> Session:
        """A new pending session for ``node`` (replacing a pending one of it) with a new code."""
        with self._db() as db:
            db.execute(
                "UPDATE sessions SET status = 'expired' "
                "WHERE status = 'pending' AND expires_at <= ?",
                (now_ms,),
            )
            db.execute(
                "UPDATE sessions SET status = 'replaced' WHERE status = 'pending' AND node = ?",
                (node,),
            )
            (open_count,) = db.execute(
                "SELECT count(*) FROM sessions WHERE status = 'pending'"
            ).fetchone()
            if open_count >= self.max_pending:
                raise RealmError(
                    "busy", f"{open_count} join requests are waiting for a decision already"
                )
            while True:
                code = new_code(self.random_bytes)
                if db.execute("SELECT 1 FROM sessions WHERE code = ?", (code,)).fetchone() is None:
                    break
            expires = now_ms + self.session_ttl_ms
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, 'pending', NULL)",
                (code, node, now_ms, expires),
            )
        return Session(code, node, now_ms, expires, "pending")

    def status_of(self, node: bytes, now_ms: int) -> tuple[str, Member | None]:
        """The latest session's status for ``node`` (pending, approved, denied, expired,
        unknown) and its membership row when approved."""
        with self._db() as db:
            row = db.execute(
                "SELECT status, expires_at FROM sessions WHERE node = ? AND status != 'replaced' "
                "ORDER BY created_at DESC LIMIT 1",
                (node,),
            ).fetchone()
        if row is None:
            return "unknown", None
        status, expires_at = row
        if status == "pending" and expires_at <= now_ms:
            return "expired", None
        if status == "approved":
            member = self.member(node)
            if member is None or member.revoked_at is not None:
                return "revoked", member
            if member.valid_until <= now_ms:
                return "expired", member
            return "approved", member
        return str(status), None

    def pending(self, now_ms: int) -> list[Session]:
        with self._db() as db:
            rows = db.execute(
                "SELECT code, node, created_at, expires_at, status FROM sessions "
                "WHERE status = 'pending' AND expires_at > ? ORDER BY created_at",
                (now_ms,),
            ).fetchall()
        return [Session(*row) for row in rows]

    # -- the owner's decisions -----------------------------------------------------------------

    def decide(
        self,
        text: str,
        approve: bool,
        now_ms: int,
        *,
        role: str = DEFAULT_ROLE,
        valid_ms: int = DEFAULT_VALID_MS,
    ) -> Session:
        """Approve (sign an endorsement) or deny the pending session of code ``text``."""
        code = normalize(text)
        if code is None:
            raise RealmError("bad_code", "a code is 8 letters and digits, like ABCD-EFGH")
        with self._db() as db:
            wrong = [t for (t,) in db.execute("SELECT at FROM wrong_codes").fetchall()]
            wait = self.limiter.blocked_for_ms(wrong, now_ms)
            if wait > 0:
                raise RealmError(
                    "rate_limited",
                    f"too many wrong codes; try again in {wait // 1000 + 1} s",
                )
            db.execute("DELETE FROM wrong_codes WHERE at <= ?", (now_ms - self.limiter.window_ms,))
            row = db.execute(
                "SELECT code, node, created_at, expires_at, status FROM sessions WHERE code = ?",
                (code,),
            ).fetchone()
            if row is None:
                db.execute("INSERT INTO wrong_codes VALUES (?)", (now_ms,))
        if row is None:
            raise RealmError("unknown_code", "no join request has this code (a wrong guess counts)")
        session = Session(*row)
        if session.status != "pending":
            raise RealmError("decided", f"this join request is already {session.status}")
        if session.expires_at <= now_ms:
            raise RealmError("expired", "this join request expired; ask for a new code")
        if approve:
            self._endorse(session.node, role, now_ms + valid_ms, now_ms)
        with self._db() as db:
            db.execute(
                "UPDATE sessions SET status = ?, decided_at = ? WHERE code = ?",
                ("approved" if approve else "denied", now_ms, code),
            )
        return Session(
            code,
            session.node,
            session.created_at,
            session.expires_at,
            "approved" if approve else "denied",
        )

    def _endorse(
        self, node: bytes, role: str, valid_until: int, now_ms: int, joined_at: int | None = None
    ) -> Record:
        try:
            record = build_endorsement(
                self.authority,
                self.name,
                node,
                role=role,
                valid_until=valid_until,
                now_ms=now_ms,
                random10=self._random10(),
            )
        except RealmRecordError as exc:
            raise RealmError("bad_argument", exc.detail) from None
        with self._db() as db:
            db.execute(
                "INSERT INTO members VALUES (?, ?, ?, ?, NULL, ?, NULL) ON CONFLICT (node) DO "
                "UPDATE SET role = excluded.role, joined_at = excluded.joined_at, "
                "valid_until = excluded.valid_until, revoked_at = NULL, record = excluded.record",
                (
                    node,
                    role,
                    now_ms if joined_at is None else joined_at,
                    valid_until,
                    _blob(record),
                ),
            )
        return record

    def endorse_station(self, station: bytes, valid_until: int, now_ms: int) -> Record:
        """A station endorsement (role ``station``) of ``station``: it may carry this realm's
        traffic over its links. Kept like a member (``revoke`` ends it, ``serve`` publishes
        and refreshes it)."""
        return self._endorse(station, STATION_ROLE, valid_until, now_ms)

    def revoke(self, node: bytes, now_ms: int) -> Record:
        member = self.member(node)
        if member is None:
            raise RealmError("not_member", f"{node.hex()} is not a member of {self.name!r}")
        if member.revoked_at is not None:
            raise RealmError("revoked", f"{node.hex()} was revoked already")
        record = build_revocation(
            self.authority, self.name, node, now_ms=now_ms, random10=self._random10()
        )
        with self._db() as db:
            db.execute(
                "UPDATE members SET revoked_at = ?, record = ? WHERE node = ?",
                (now_ms, _blob(record), node),
            )
        return record

    def member(self, node: bytes) -> Member | None:
        with self._db() as db:
            row = db.execute(
                "SELECT node, role, joined_at, valid_until, revoked_at, record FROM members "
                "WHERE node = ?",
                (node,),
            ).fetchone()
        return None if row is None else _member(row)

    def members(self) -> list[Member]:
        with self._db() as db:
            rows = db.execute(
                "SELECT node, role, joined_at, valid_until, revoked_at, record FROM members "
                "ORDER BY joined_at"
            ).fetchall()
        return [_member(row) for row in rows]

    # -- what the service publishes ------------------------------------------------------------

    def unpublished(self) -> list[Record]:
        """Endorsements and revocations signed here that the DHT has not been given yet."""
        with self._db() as db:
            rows = db.execute("SELECT record, published FROM members").fetchall()
        records = [Record.from_rpc(cbor.decode(blob)) for blob, _ in rows]
        return [r for r, (_, done) in zip(records, rows, strict=True) if r.version != done]

    def mark_published(self, record: Record) -> None:
        member = record.payload.get("member_node")
        with self._db() as db:
            db.execute(
                "UPDATE members SET published = ? WHERE node = ? AND record = ?",
                (record.version, member, _blob(record)),
            )

    def refresh(self, node: bytes, now_ms: int) -> Record | None:
        """A freshly signed copy of ``node``'s current record (the DHT copy lives 48 h)."""
        member = self.member(node)
        if member is None:
            return None
        if member.revoked_at is not None:
            record = build_revocation(
                self.authority, self.name, node, now_ms=now_ms, random10=self._random10()
            )
        elif member.valid_until > now_ms:
            return self._endorse(node, member.role, member.valid_until, now_ms, member.joined_at)
        else:
            return None
        with self._db() as db:
            db.execute("UPDATE members SET record = ? WHERE node = ?", (_blob(record), node))
        return record


def _blob(record: Record) -> bytes:
    return cbor.encode(record.to_rpc())


def _member(row: tuple[Any, ...]) -> Member:
    node, role, joined_at, valid_until, revoked_at, blob = row
    return Member(
        node, role, joined_at, valid_until, revoked_at, Record.from_rpc(cbor.decode(blob))
    )


def list_realms(home: Path) -> list[str]:
    folder = realms_dir(home)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "authority.key").exists())
