"""The task outbox's delivery (``macula.agent.tasks``): the messages a task change owes a peer,
signed and sent, in order per peer, with their replies applied.

Invariants:
- Per peer, due messages go oldest first and one at a time (a lock per peer); the first that
  fails stops that peer's round and is retried later with capped exponential backoff
  (``TaskLimits.retry_*``); peers are delivered side by side, so one absent peer holds up no
  other.
- A reply is verified (signed by the peer, to us) before it touches the store; an unverified
  one counts ``replies_unverified`` and is retried like any failure.
- A refused ``task_sent`` ends the requester's copy ``failed`` (``refused: ...``); the refusal
  heard is handed back to the caller that flushed.
- ``run`` never ends on an error: it logs, waits ``retry_initial_ms`` and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from macula.agent.task_messages import (
    CALL_TIMEOUT_S,
    TaskLimits,
    sign_message,
    task_endpoint,
    text_of,
    verify_message,
)
from macula.errors import MaculaError
from macula.node.node import Node
from macula.store.tasks import OutboxEntry, TaskError, TaskStore
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.agent.tasks")


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    detail: str
    retryable: int


class TaskOutbox:
    """Delivers one agent's task outbox; ``kick`` wakes ``run``, ``retry_all`` makes every
    queued message due at once on its next round."""

    def __init__(
        self,
        node: Node,
        store: TaskStore,
        clock: Callable[[], int],
        limits: TaskLimits,
        changed: Callable[[], Awaitable[None]],
        count: Callable[[str], None],
    ) -> None:
        self.node = node
        self.store = store
        self.clock = clock
        self.limits = limits
        self.me = node.identity.node_id
        self.kick = asyncio.Event()
        self.retry_all = False
        self._changed = changed  # the store changed: wake the waiters
        self._count = count
        self._peer_locks: dict[bytes, asyncio.Lock] = {}

    async def run(self) -> None:
        """Deliver what is due, then sleep until the next due time or a ``kick``; forever."""
        while True:
            self.kick.clear()
            try:
                if self.retry_all:
                    self.retry_all = False
                    await self.store.retry_now(self.me, self.clock())
                # peers side by side: one slow or absent peer does not hold up the others
                peers = {entry.peer for entry in await self.store.due(self.me, self.clock())}
                await asyncio.gather(*(self.flush_peer(peer) for peer in peers))
                due = await self.store.next_due_ms(self.me)
            except Exception:  # never let the outbox take the agent's task group down
                log.exception("task outbox failed; retrying")
                due = self.clock() + self.limits.retry_initial_ms
            timeout = None if due is None else max(0.05, (due - self.clock()) / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout)

    async def flush_peer(self, peer: bytes) -> dict[str, Refusal]:
        """Deliver ``peer``'s due messages in order; stop at the first that fails. Returns
        the refusals heard, by task id."""
        refusals: dict[str, Refusal] = {}
        lock = self._peer_locks.setdefault(peer, asyncio.Lock())
        async with lock:
            while True:
                entries = [e for e in await self.store.due(self.me, self.clock()) if e.peer == peer]
                if not entries:
                    return refusals
                delivered, refusal = await self._deliver(entries[0])
                if refusal is not None:
                    refusals[entries[0].task_id] = refusal
                if not delivered:
                    return refusals

    async def _deliver(self, entry: OutboxEntry) -> tuple[bool, Refusal | None]:
        signed = sign_message(self.node.identity, entry.peer, entry.body, self.clock())
        try:
            reply = await self.node.call(
                ZERO_REALM, task_endpoint(entry.peer), signed, timeout=CALL_TIMEOUT_S
            )
            problems = verify_message(reply, self.me, entry.peer, self.clock())
            if problems:
                self._count("replies_unverified")
                raise MaculaError("unverified reply: " + "; ".join(problems))
        except MaculaError as exc:  # not there, timed out, refused unread: later, with backoff
            delay = min(
                self.limits.retry_max_ms,
                self.limits.retry_initial_ms * 2 ** min(entry.attempts, 20),
            )
            await self.store.retry_later(entry.entry_id, self.clock() + delay, str(exc))
            self._count("deliveries_retried")
            self.kick.set()  # the pump sleeps until the new due time
            return False, None
        refusal = await self._apply_reply(entry, reply)
        await self.store.delivered(entry.entry_id)
        self._count("messages_delivered")
        return True, refusal

    async def _apply_reply(self, entry: OutboxEntry, reply: dict[str, Any]) -> Refusal | None:
        kind = reply.get("kind")
        refusal: Refusal | None = None
        if kind == "task_updated":
            await self.store.apply_remote(self.me, entry.peer, entry.task_id, reply, self.clock())
            code = text_of(reply, "refused_code")
            if code is not None:
                refusal = Refusal(code, f"the assignee refused it ({code})", 0)
        elif kind == "task_refused":
            code, why = str(reply.get("code")), str(reply.get("reason"))
            refusal = Refusal(code, why, int(reply.get("retryable") == 1))
            if entry.body.get("kind") == "task_sent":  # the assignee holds nothing: it ended
                with contextlib.suppress(TaskError):
                    await self.store.transition(
                        self.me,
                        entry.task_id,
                        "failed",
                        self.clock(),
                        by="assignee",
                        error=f"refused: {code}: {why}"[: self.limits.max_note_bytes],
                    )
        await self._changed()
        return refusal
