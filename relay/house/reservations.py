"""Path reservations: an agent claims paths or globs of a project, exclusively or shared, for
a time; another agent's overlapping claim is answered with who holds what, until when and why.

Advisory: the station refuses nothing on the disk; the commit guard (``tools.guard``) and the
agents read the answers. Per station: a reservation lives in the SQLite file of the station it
was made on, and binds agents that reach that station (docs/reservations.md).

Invariants:
- ``ReservationService.handle`` never raises (cancellation aside): refusals are ``Refused``,
  turned into answers by ``relay.builtins.outcome.answer``.
- Every argument is checked (``macula.services.reservation_paths``: no ``..``, no absolute
  path, bounded length and wildcards) before the caller's rate bucket or the store is touched.
- A reserve is all or nothing: one conflict and nothing is written; the answer is a RESULT
  ``{granted: 0, conflicts: [...]}``, not an error, so the holder's name, paths, expiry and
  reason reach the caller whole. Reserving a path one already holds renews it (new expiry,
  mode and reason).
- Two reservations conflict when their holders differ, at least one is exclusive and their
  globs overlap (``overlaps``, exact). A holder never conflicts with itself.
- Expired rows count for nothing: every read filters ``expires_ms > now``; a reserve deletes
  what has expired first. Quotas (``MAX_RESERVATIONS_PER_HOLDER`` per holder and project,
  ``MAX_RESERVATIONS_PER_PROJECT`` per project, ``max_total`` for the station) are checked in
  the same ``BEGIN IMMEDIATE`` transaction as the write.
- Time is ``now_ms``, an argument. Payloads carry ints and text: never booleans.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from macula.realm.records import MAX_NAME as MAX_REALM_NAME
from macula.services.house import LIST_RESERVATIONS, RELEASE_PATHS, RESERVE_PATHS
from macula.services.limits import (
    DEFAULT_RESERVATION_TTL_S,
    DEFAULT_RESERVATIONS_PAGE,
    MAX_AGENT_TEXT_CHARS,
    MAX_PROJECT_CHARS,
    MAX_RESERVATION_PATH_CHARS,
    MAX_RESERVATION_PATHS,
    MAX_RESERVATION_REASON_CHARS,
    MAX_RESERVATION_TTL_S,
    MAX_RESERVATIONS_PAGE,
    MAX_RESERVATIONS_PER_HOLDER,
    MAX_RESERVATIONS_PER_PROJECT,
    MIN_RESERVATION_TTL_S,
)
from macula.services.reservation_paths import (
    PathRefused,
    matches,
    normalise_path,
    normalise_project,
    overlaps,
)
from macula.store.base import Migration, Row, SqliteStore
from relay.builtins.arguments import (
    Args,
    arguments,
    bad_request,
    caller_id,
    integer,
    kind,
    optional_text,
    refusal,
    required,
)
from relay.builtins.outcome import Handler, Outcome, dispatch
from relay.house.buckets import TokenBuckets

__all__ = [
    "DEFAULT_MAX_TOTAL",
    "DEFAULT_RESERVE_RATE",
    "Reservation",
    "ReservationService",
    "ReservationStore",
]

logger = logging.getLogger("macula.relay.house.reservations")

DEFAULT_MAX_TOTAL: Final = 100_000  # live reservations on the station, every project
DEFAULT_RESERVE_RATE: Final = 2.0  # reserve and release calls a second per caller, burst 4x
DEFAULT_LIST_RATE: Final = 10.0  # listings a second per caller, burst 4x

_V1: Final[Migration] = (
    """
    CREATE TABLE reservations (
        id          INTEGER PRIMARY KEY,
        realm       TEXT NOT NULL,
        project     TEXT NOT NULL,
        holder      BLOB NOT NULL CHECK (length(holder) = 32),
        holder_name TEXT NOT NULL,
        path        TEXT NOT NULL,
        exclusive   INTEGER NOT NULL CHECK (exclusive IN (0, 1)),
        reason      TEXT NOT NULL,
        created_ms  INTEGER NOT NULL,
        expires_ms  INTEGER NOT NULL,
        UNIQUE (realm, project, holder, path)
    )
    """,
    "CREATE INDEX reservations_by_project ON reservations (realm, project, id)",
    "CREATE INDEX reservations_by_expiry ON reservations (expires_ms)",
)

_COLUMNS: Final = "id, holder, holder_name, path, exclusive, reason, created_ms, expires_ms"


@dataclass(frozen=True, slots=True)
class Reservation:
    id: int
    holder: bytes
    holder_name: str
    path: str
    exclusive: int
    reason: str
    created_ms: int
    expires_ms: int

    def to_wire(self) -> dict[str, object]:
        return {
            "id": self.id,
            "holder": self.holder.hex(),
            "holder_name": self.holder_name,
            "path": self.path,
            "exclusive": self.exclusive,
            "reason": self.reason,
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
        }


def _reservation(row: Row) -> Reservation:
    return Reservation(
        int(row[0]),
        bytes(row[1]),
        str(row[2]),
        str(row[3]),
        int(row[4]),
        str(row[5]),
        int(row[6]),
        int(row[7]),
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """What one reserve call asks for: ``paths`` (normalised) held by ``holder``."""

    realm: str
    project: str
    holder: bytes
    holder_name: str
    paths: tuple[str, ...]
    exclusive: int
    reason: str
    expires_ms: int


class QuotaExceeded(Exception):
    """A reserve would take a holder, a project or the station past its cap."""


def conflicts_of(claim: Claim, held: Sequence[Reservation]) -> list[dict[str, object]]:
    """Each live reservation of another holder that ``claim`` collides with, as a conflict."""
    found = []
    for other in held:
        if other.holder == claim.holder or not (claim.exclusive or other.exclusive):
            continue
        wanted = [path for path in claim.paths if overlaps(path, other.path)]
        if wanted:
            found.append(other.to_wire() | {"requested": wanted})
    return found


class ReservationStore(SqliteStore):
    """Reservations in SQLite, one row per (realm, project, holder, path)."""

    MIGRATIONS = (_V1,)

    async def reserve(
        self, claim: Claim, now_ms: int, *, max_total: int = DEFAULT_MAX_TOTAL
    ) -> list[dict[str, object]]:
        """Write ``claim`` (renewing what the holder already holds); the conflicts instead,
        nothing written, when there are any. ``QuotaExceeded`` past a cap."""

        def work(db: sqlite3.Connection) -> list[dict[str, object]]:
            db.execute("DELETE FROM reservations WHERE expires_ms <= ?", (now_ms,))
            held = [
                _reservation(row)
                for row in db.execute(
                    f"SELECT {_COLUMNS} FROM reservations WHERE realm = ? AND project = ?",
                    (claim.realm, claim.project),
                )
            ]
            conflicts = conflicts_of(claim, held)
            if conflicts:
                return conflicts
            _check_quotas(db, claim, held, max_total)
            for path in claim.paths:
                db.execute(
                    "INSERT INTO reservations (realm, project, holder, holder_name, path,"
                    " exclusive, reason, created_ms, expires_ms) VALUES (?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (realm, project, holder, path) DO UPDATE SET"
                    " holder_name = excluded.holder_name, exclusive = excluded.exclusive,"
                    " reason = excluded.reason, expires_ms = excluded.expires_ms",
                    (
                        claim.realm,
                        claim.project,
                        claim.holder,
                        claim.holder_name,
                        path,
                        claim.exclusive,
                        claim.reason,
                        now_ms,
                        claim.expires_ms,
                    ),
                )
            return []

        return await self._atomically(work)

    async def release(
        self, realm: str, project: str, holder: bytes, paths: Sequence[str] | None
    ) -> int:
        """Drop ``holder``'s reservations of ``paths`` (None: all of them) in the project."""
        where = "realm = ? AND project = ? AND holder = ?"
        params: tuple[object, ...] = (realm, project, holder)
        if paths is not None:
            where += f" AND path IN ({', '.join('?' * len(paths))})"
            params += tuple(paths)
        return await self._execute(f"DELETE FROM reservations WHERE {where}", params)

    async def live(
        self, realm: str, project: str, now_ms: int, *, after_id: int = 0
    ) -> list[Reservation]:
        """The project's unexpired reservations after ``after_id``, oldest first."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM reservations WHERE realm = ? AND project = ?"
            " AND expires_ms > ? AND id > ? ORDER BY id",
            (realm, project, now_ms, after_id),
        )
        return [_reservation(row) for row in rows]


def _check_quotas(
    db: sqlite3.Connection, claim: Claim, held: Sequence[Reservation], max_total: int
) -> None:
    mine = {r.path for r in held if r.holder == claim.holder}
    new = [path for path in claim.paths if path not in mine]
    if len(mine) + len(new) > MAX_RESERVATIONS_PER_HOLDER:
        raise QuotaExceeded(
            f"you would hold {len(mine) + len(new)} reservations in this project; the limit is"
            f" {MAX_RESERVATIONS_PER_HOLDER}: release some first"
        )
    if len(held) + len(new) > MAX_RESERVATIONS_PER_PROJECT:
        raise QuotaExceeded(
            f"this project would hold {len(held) + len(new)} reservations; the limit is"
            f" {MAX_RESERVATIONS_PER_PROJECT}: reserve a glob instead of many paths"
        )
    total = int(db.execute("SELECT count(*) FROM reservations").fetchone()[0])
    if new and total + len(new) > max_total:
        raise QuotaExceeded(f"this station holds {total} reservations, its limit is {max_total}")


# --- arguments ----------------------------------------------------------------------------


def _scope(args: Args) -> tuple[str, str]:
    raw = required(args, "project")
    if type(raw) is not str or len(raw) > MAX_PROJECT_CHARS:
        raise bad_request(f"'project' must be 1..{MAX_PROJECT_CHARS} characters of text")
    try:
        project = normalise_project(raw)
    except PathRefused as exc:
        raise bad_request(str(exc)) from None
    realm = optional_text(args, "realm", high=MAX_REALM_NAME) or ""
    return realm.strip(), project


def _paths(args: Args, *, optional: bool = False) -> tuple[str, ...] | None:
    value = args.get("paths")
    if value is None and optional:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_RESERVATION_PATHS:
        raise bad_request(
            f"'paths' must be an array of 1..{MAX_RESERVATION_PATHS} paths, got {kind(value)}"
        )
    paths: list[str] = []
    for index, item in enumerate(value):
        if type(item) is not str or len(item) > MAX_RESERVATION_PATH_CHARS + 2:
            raise bad_request(
                f"'paths[{index}]' must be text of at most {MAX_RESERVATION_PATH_CHARS} characters"
            )
        try:
            path = normalise_path(item)
        except PathRefused as exc:
            raise bad_request(f"'paths[{index}]': {exc}") from None
        if path not in paths:
            paths.append(path)
    return tuple(paths)


# --- the service --------------------------------------------------------------------------


class ReservationService:
    """``macula.reservations.reserve_v1`` / ``release_v1`` / ``list_v1`` over a store."""

    def __init__(
        self,
        store: ReservationStore,
        *,
        max_total: int = DEFAULT_MAX_TOTAL,
        rate: float = DEFAULT_RESERVE_RATE,
        list_rate: float = DEFAULT_LIST_RATE,
    ) -> None:
        if max_total <= 0 or rate <= 0 or list_rate <= 0:
            raise ValueError("max_total, rate and list_rate must be positive")
        self.store = store
        self.max_total = max_total
        self.buckets = TokenBuckets(rate, rate * 4)
        self.list_buckets = TokenBuckets(list_rate, list_rate * 4)
        self._handlers: dict[str, Handler] = {
            RESERVE_PATHS: self._reserve,
            RELEASE_PATHS: self._release,
            LIST_RESERVATIONS: self._list,
        }

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure`` by ``caller``; 0x01 if it is not ours. Never raises."""
        return await dispatch(self._handlers, procedure, (payload, caller, now_ms), logger)

    async def _reserve(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        realm, project = _scope(args)
        paths = _paths(args) or ()
        exclusive = integer(args, "exclusive", 0, 1, default=1)
        ttl = integer(
            args,
            "ttl_seconds",
            MIN_RESERVATION_TTL_S,
            MAX_RESERVATION_TTL_S,
            default=DEFAULT_RESERVATION_TTL_S,
        )
        reason = optional_text(args, "reason", high=MAX_RESERVATION_REASON_CHARS) or ""
        name = optional_text(args, "holder_name", high=MAX_AGENT_TEXT_CHARS) or ""
        holder = caller_id(caller, "bad_request")
        self.buckets.take_or_refuse(holder, now_ms, "reservations")
        claim = Claim(realm, project, holder, name, paths, exclusive, reason, now_ms + ttl * 1000)
        try:
            conflicts = await self.store.reserve(claim, now_ms, max_total=self.max_total)
        except QuotaExceeded as exc:
            raise refusal("quota_exceeded", str(exc)) from None
        if conflicts:
            return {"granted": 0, "conflicts": conflicts, "paths": list(paths)}
        return {
            "granted": 1,
            "conflicts": [],
            "paths": list(paths),
            "exclusive": exclusive,
            "expires_ms": claim.expires_ms,
        }

    async def _release(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        realm, project = _scope(args)
        paths = _paths(args, optional=True)
        holder = caller_id(caller, "bad_request")
        self.buckets.take_or_refuse(holder, now_ms, "reservations")
        released = await self.store.release(realm, project, holder, paths)
        return {"released": released}

    async def _list(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = arguments(payload)
        realm, project = _scope(args)
        limit = integer(args, "limit", 1, MAX_RESERVATIONS_PAGE, default=DEFAULT_RESERVATIONS_PAGE)
        after = integer(args, "after_id", 0, 2**62, default=0)
        touching = optional_text(args, "touching", high=MAX_RESERVATION_PATH_CHARS)
        asker = caller_id(caller, "bad_request")
        self.list_buckets.take_or_refuse(asker, now_ms, "listings")
        rows = await self.store.live(realm, project, now_ms, after_id=after)
        if touching:
            literal = touching.replace("\\", "/").strip("/")
            rows = [r for r in rows if matches(r.path, literal)]
        page = rows[:limit]
        return {
            "reservations": [r.to_wire() for r in page],
            "remaining": len(rows) - len(page),
            "now_ms": now_ms,
        }
