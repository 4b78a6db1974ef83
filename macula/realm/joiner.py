"""The client half of the join flow (``mesh_join_realm``), shaped like a device authorization.

``start(name)`` asks the realm's join service (``realm.<name>.join``, all-zero realm) who it is
(``about``: its signed directory record), sends this identity's key with a proof of possession
(``macula.realm.join``) and returns the code the person approves with ``macula-realm approve``.
A background task of the node polls until the outcome; ``wait`` picks it up.

Invariants:
- The code and link live in the ``Ticket`` returned by ``start`` and nowhere else: not on disk,
  not in logs, not in ``outcome`` views.
- The directory record must verify and name this realm; with ``authority`` given, be signed by
  it. An endorsement is stored (``MembershipStore``, 0600) only after ``check_endorsement``
  passes for this node, this realm and the directory's authority.
- One join in progress per realm; a second ``start`` while one is pending is refused
  (``in_progress``) so that its code is never shown twice.
- Polls run every ``poll_every_s`` (default 2 s) until an outcome or the session expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from macula.clock import MsClock, now_ms
from macula.errors import MaculaError
from macula.realm.join import APPROVED, EXPIRED, PENDING, REFUSED, build_request
from macula.realm.membership import Builtins, MembershipStore
from macula.realm.records import (
    Directory,
    RealmRecordError,
    check_directory,
    check_endorsement,
    join_procedure,
    name_problem,
)
from macula.wire.identity import ZERO_REALM, Identity

log = logging.getLogger("macula.realm.joiner")

DEFAULT_POLL_EVERY_S: Final = 2.0
CALL_TIMEOUT_S: Final = 10.0


class JoinError(MaculaError):
    def __init__(self, reason: str, detail: str, *, retryable: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.retryable = retryable
        self.reason = reason
        self.detail = detail


class JoinNode(Protocol):
    identity: Identity

    async def call(
        self, realm: bytes, procedure: str, payload: Any = None, *, timeout: float = ...
    ) -> Any: ...

    async def session(self, timeout: float | None = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class Ticket:
    """What the person needs to approve (returned once, by ``start``)."""

    name: str
    code: str
    link: str
    expires_at: int
    authority: bytes


@dataclass(slots=True)
class _Join:
    directory: Directory
    status: str = PENDING
    detail: str = ""
    expires_at: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


def approve_link(name: str, code: str) -> str:
    return f"macula-realm://approve?realm={name}&code={code}"


class RealmJoiner:
    def __init__(
        self,
        node: JoinNode,
        store: MembershipStore,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        *,
        clock: MsClock = now_ms,
        poll_every_s: float = DEFAULT_POLL_EVERY_S,
    ) -> None:
        self.node = node
        self.store = store
        self.spawn = spawn
        self.clock = clock
        self.poll_every_s = poll_every_s
        self._joins: dict[str, _Join] = {}

    async def _ask(self, name: str, payload: dict[str, Any]) -> dict[str, Any]:
        answer = await self.node.call(
            ZERO_REALM, join_procedure(name), payload, timeout=CALL_TIMEOUT_S
        )
        if not isinstance(answer, dict):
            raise JoinError("bad_answer", "the join service answered something that is not a map")
        if answer.get("status") == REFUSED:
            reason = str(answer.get("reason", "refused"))
            raise JoinError(reason, str(answer.get("detail", "")), retryable=reason == "busy")
        return answer

    async def _directory(self, name: str, authority: bytes | None) -> Directory:
        about = await self._ask(name, {"op": "about"})
        try:
            directory = check_directory(
                about.get("directory"), now_ms=self.clock(), name=name, authority=authority
            )
        except RealmRecordError as exc:
            raise JoinError(f"directory_{exc.reason}", exc.detail) from None
        if about.get("service") != directory.authority:
            raise JoinError("wrong_service", "the join service is not the realm's authority")
        return directory

    def in_progress(self, name: str) -> bool:
        join = self._joins.get(name)
        return join is not None and not join.done.is_set()

    async def start(self, name: str, authority: bytes | None = None) -> Ticket | dict[str, Any]:
        """A ``Ticket`` for a new pending join, or the outcome view if the service already
        holds an approval for this node (then the endorsement is stored)."""
        if problem := name_problem(name):
            raise JoinError("bad_realm", problem)
        if self.in_progress(name):
            raise JoinError("in_progress", "a join of this realm is waiting for approval already")
        directory = await self._directory(name, authority)
        request = build_request(
            self.node.identity, name, directory.authority, "start", self.clock()
        )
        answer = await self._ask(name, request)
        join = _Join(directory)
        self._joins[name] = join
        if answer.get("status") == APPROVED:
            self._settle(join, answer)
            return self.outcome(name)
        code, expires = answer.get("code"), answer.get("expires_at")
        if answer.get("status") != PENDING or type(code) is not str or type(expires) is not int:
            del self._joins[name]
            raise JoinError("bad_answer", "the join service gave no code")
        join.expires_at = expires
        self.spawn(self._poll(name, join))
        log.info("join of realm %s pending (code not logged)", name)
        return Ticket(name, code, approve_link(name, code), expires, directory.authority)

    async def _poll(self, name: str, join: _Join) -> None:
        while not join.done.is_set():
            await asyncio.sleep(self.poll_every_s)
            if self.clock() >= join.expires_at:
                join.status, join.detail = EXPIRED, "nobody approved the code in time"
                join.done.set()
                return
            request = build_request(
                self.node.identity, name, join.directory.authority, "poll", self.clock()
            )
            try:
                answer = await self._ask(name, request)
            except (MaculaError, OSError) as exc:
                log.info("join poll of realm %s failed (will retry): %s", name, exc)
                continue
            status = answer.get("status")
            if status == APPROVED:
                self._settle(join, answer)
            elif status != PENDING and isinstance(status, str):
                join.status, join.detail = status, f"the realm's owner answered {status}"
                join.done.set()

    def _settle(self, join: _Join, answer: dict[str, Any]) -> None:
        try:
            endorsement = check_endorsement(
                answer.get("endorsement"),
                realm=join.directory.realm,
                authority=join.directory.authority,
                member=self.node.identity.node_id,
                now_ms=self.clock(),
            )
        except RealmRecordError as exc:
            join.status, join.detail = "refused", f"the endorsement was refused: {exc}"
            join.done.set()
            return
        held = self.store.get(endorsement.realm)
        self.store.put(endorsement, held.joined_at if held else self.clock())
        join.status, join.detail = APPROVED, "approved: the membership is stored"
        join.done.set()
        self.spawn(self._present_now())

    async def _present_now(self) -> None:
        with contextlib.suppress(MaculaError, OSError):
            session: Builtins = await self.node.session(CALL_TIMEOUT_S)
            await self.store.present(session)

    def outcome(self, name: str) -> dict[str, Any]:
        """The view of a join (no code, no link): status, detail and the membership if any."""
        join = self._joins.get(name)
        view: dict[str, Any] = {"realm": name}
        if join is None:
            view |= {"status": "none", "detail": "no join of this realm in this process"}
        else:
            view |= {"status": join.status, "detail": join.detail or "waiting for approval"}
            membership = self.store.get(join.directory.realm)
            if membership is not None and join.status == APPROVED:
                view["membership"] = membership.view()
        return view

    async def wait(self, name: str, seconds: float) -> dict[str, Any]:
        join = self._joins.get(name)
        if join is not None and seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(join.done.wait(), seconds)
        return self.outcome(name)
