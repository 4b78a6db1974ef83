"""A realm's join service on the mesh (``macula-realm serve``).

It answers ``realm.<name>.join`` in the all-zero realm (non-members call it), with the
realm's authority as its node identity, and keeps the DHT in step with the realm's state file:
the directory record, and every endorsement or revocation the owner signed with
``macula-realm approve`` / ``revoke`` (run in other processes, sharing ``state.sqlite3``).

Invariants:
- Every request except ``about`` passes ``macula.realm.join.check_request`` (caller = key,
  proof fresh, bound to this realm, service and op, never replayed) before it touches state;
  a refused request is answered ``{"status": "refused", "reason", "detail"}``, never raised.
- A code leaves this process only in the answer to the ``start`` request of the node it was
  made for; it is never logged.
- A record signed in the state file reaches the DHT within ``publish_every_s`` (default 2 s)
  while the service runs; everything is re-signed and re-put every ``republish_every_ms``
  (default 1 h, the records live 48 h).
- The state file is SQLite: its calls run in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from macula.clock import MsClock, now_ms
from macula.errors import MaculaError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.realm.authority import Realm, RealmError
from macula.realm.codes import display
from macula.realm.join import (
    APPROVED,
    PENDING,
    REFUSED,
    JoinRefused,
    ReplayCache,
    check_request,
)
from macula.realm.records import join_procedure
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.realm.service")

DEFAULT_PUBLISH_EVERY_S: Final = 2.0
DEFAULT_REPUBLISH_EVERY_MS: Final = 3600 * 1000


class JoinService:
    def __init__(
        self,
        realm: Realm,
        node: Node,
        *,
        clock: MsClock = now_ms,
        replays: ReplayCache | None = None,
        publish_every_s: float = DEFAULT_PUBLISH_EVERY_S,
        republish_every_ms: int = DEFAULT_REPUBLISH_EVERY_MS,
    ) -> None:
        self.realm = realm
        self.node = node
        self.clock = clock
        self.replays = ReplayCache() if replays is None else replays
        self.publish_every_s = publish_every_s
        self.republish_every_ms = republish_every_ms
        self.procedure = join_procedure(realm.name)
        self.stats: dict[str, int] = {}
        self._last_full = 0

    def _count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1

    async def start(self) -> None:
        """Advertise the join service and put the directory record."""
        await self.node.advertise(ZERO_REALM, self.procedure, self.handle)
        await self.node.flush()
        await self.publish(full=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the DHT in step with the state file until ``stop`` (after ``start``)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.publish_every_s)
            full = self.clock() - self._last_full >= self.republish_every_ms
            try:
                await self.publish(full=full)
            except (MaculaError, OSError) as exc:
                log.warning("could not publish the realm's records yet: %s", exc)

    async def publish(self, *, full: bool = False) -> int:
        """Put what the DHT lacks; with ``full`` also re-sign the directory and every member."""
        now = self.clock()
        if full:
            await self.node.dht.put_record(self.realm.directory_record(now))
            for member in await asyncio.to_thread(self.realm.members):
                await asyncio.to_thread(self.realm.refresh, member.node, now)
            self._last_full = now
        count = 0
        for record in await asyncio.to_thread(self.realm.unpublished):
            await self.node.dht.put_record(record)
            await asyncio.to_thread(self.realm.mark_published, record)
            count += 1
        self.stats["records_published"] = self.stats.get("records_published", 0) + count
        return count

    async def handle(self, call: IncomingCall) -> dict[str, Any]:
        payload = call.payload
        now = self.clock()
        if isinstance(payload, dict) and payload.get("op") == "about":
            self._count("about")
            directory = self.realm.directory_record(now)
            return {
                "status": "ok",
                "realm": self.realm.name,
                "service": self.node.identity.node_id,
                "directory": directory.to_rpc(),
            }
        try:
            op, node = check_request(
                payload,
                name=self.realm.name,
                service_key=self.node.identity.node_id,
                caller=call.caller,
                now_ms=now,
                replays=self.replays,
            )
        except JoinRefused as exc:
            self._count(f"refused_{exc.reason}")
            return {"status": REFUSED, "reason": exc.reason, "detail": exc.detail}
        try:
            return await asyncio.to_thread(self._answer, op, node, now)
        except RealmError as exc:
            self._count(f"refused_{exc.code}")
            return {"status": REFUSED, "reason": exc.code, "detail": exc.detail}

    def _answer(self, op: str, node: bytes, now: int) -> dict[str, Any]:
        status, member = self.realm.status_of(node, now)
        if status == APPROVED and member is not None:
            self._count("answered_approved")
            return {"status": APPROVED, "endorsement": member.record.to_rpc()}
        if op == "poll":
            self._count(f"polled_{status}")
            return {"status": status}
        session = self.realm.start_session(node, now)
        self._count("sessions_started")
        log.info("join request from %s… (code not logged)", node.hex()[:16])
        return {"status": PENDING, "code": display(session.code), "expires_at": session.expires_at}
