"""The room outbox (issue 37): a room message said while the connection is down is queued,
durably (``macula.store.room_outbox``), and published when the connection is back.

Invariants:
- ``send`` publishes at once when the room has nothing queued and the node is connected,
  and returns ``delivered`` 1 once the station confirmed it (within ``SAY_CONFIRM_S``: a
  link gone silently dark holds a say that long, not the node's 10.5 s to notice). It
  queues instead, returning ``delivered`` 0, when the node is not connected, when the
  publish was not confirmed (``BrokenError``, ``CallTimeout``, ``ClosedError``: the station
  may or may not have it; retried after ``RETRY_INITIAL_MS``), or when the room already has
  messages queued (they go first: order per room). A say never waits on older messages.
- The bounds (``DEFAULT_BOUNDS``: messages and payload bytes per agent) are checked before
  the message is recorded in our transcript (``record``), counting the says being tried
  (reserved): a refused say (``OutboxFullError``) leaves nothing behind, and concurrent
  says never overfill the outbox.
- Delivery: per room oldest first, one at a time (a lock per room); the first that fails
  stops the room's round and is retried with capped exponential backoff (``RETRY_*_MS``);
  a (re)connect makes everything due at once. While the node is not connected the pump
  sleeps until a state change wakes it: no timer, no busy loop. A say never waits on the
  pump: a room the pump is sending is queued behind and the say returns.
- A queued message is published with the payload and ``message_id`` recorded when it was
  said. Receivers record a message once per ``(room_topic, message_id)``, so one published
  twice (its confirmation lost, then sent again) is still seen once; our own echo is
  dropped (``published``).
- Nothing accepted is dropped silently: rows leave only when published, or by ``settle``
  (leaving a room: what is queued there is sent first when connected; what still cannot
  go is dropped and the count returned, for the caller to report). The goodbye of a process
  shutting down (``Agent`` wind-down) keeps what cannot go for the next run instead.
- The pump runs from the agent's first mesh use (``Rooms.start``), like the task outbox:
  after a restart, queued messages go once the agent is present again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from macula.errors import BrokenError, CallTimeout, ClosedError
from macula.node.node import Node
from macula.store.room_outbox import (
    OutboxBounds,
    OutboxEntry,
    OutboxFullError,
    RoomOutboxStore,
)

log = logging.getLogger("macula.agent.room.rooms")

MAX_QUEUED_MESSAGES: Final = 100  # per agent
MAX_QUEUED_BYTES: Final = 1024 * 1024  # per agent, of payloads (a message is <= 16 KiB text)
DEFAULT_BOUNDS: Final = OutboxBounds(MAX_QUEUED_MESSAGES, MAX_QUEUED_BYTES)
RETRY_INITIAL_MS: Final = 1_000
RETRY_MAX_MS: Final = 30_000
SAY_CONFIRM_S: Final = 3.0  # a say's own publish waits this long for the confirmation
CONFIRM_TIMEOUT_S: Final = 10.0  # the pump's publish waits this long for it
UNSENT: Final = (BrokenError, CallTimeout, ClosedError)  # the station may not have it


def _nobody(topic: str, message_id: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Sent:
    delivered: int  # 1: published and confirmed now; 0: queued, published when connected
    queued: int  # messages this agent has queued (all rooms) after this one


class RoomOutbox:
    """One agent's room outbox: ``send``, ``settle`` and the pump (``start``/``stop``)."""

    def __init__(
        self,
        node: Node,
        store: RoomOutboxStore,
        clock: Callable[[], int],
        *,
        bounds: OutboxBounds = DEFAULT_BOUNDS,
    ) -> None:
        self.node = node
        self.store = store
        self.clock = clock
        self.bounds = bounds
        self.me = node.identity.node_id
        self.stats: Counter[str] = Counter()
        self.kick = asyncio.Event()
        self._published: Callable[[str, str], None] = _nobody  # told (topic, message_id)
        self._rooms: Counter[str] = Counter()  # rows queued per room (mirrors the store)
        self._bytes = 0  # payload bytes queued
        self._reserved = (0, 0)  # (messages, bytes) of says being tried right now
        self._locks: dict[str, asyncio.Lock] = {}
        self._pump: asyncio.Task[None] | None = None
        self._retry_all = False
        self._listening = False

    # -- state ----------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Messages queued, all rooms."""
        return sum(self._rooms.values())

    def queued_in(self, topic: str) -> int:
        return self._rooms.get(topic, 0)

    async def load(self) -> None:
        """Mirror what the store holds (after a restart: what the last run left queued)."""
        entries = await self.store.entries(self.me)
        self._rooms = Counter(e.room_topic for e in entries)
        self._bytes = sum(e.size for e in entries)

    async def start(
        self, group: asyncio.TaskGroup, *, published: Callable[[str, str], None] = _nobody
    ) -> None:
        """Load the queue and run the pump in ``group``; a (re)connect wakes it.
        ``published(topic, message_id)`` is told before each queued message is published."""
        self._published = published
        await self.load()
        if not self._listening:
            self.node.on_state(self.connection_changed)
            self._listening = True
        if self._pump is None:
            self._pump = group.create_task(self.run())
        self.kick.set()

    async def stop(self) -> None:
        """Stop the pump; what is queued stays queued (in the store)."""
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def connection_changed(self, state: str) -> None:
        """The node's state listener: a (re)connect makes everything due at once."""
        if state in ("connected", "reconnected"):
            self._retry_all = True
            self.kick.set()

    # -- saying -----------------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        realm: bytes,
        message_id: str,
        payload: dict[str, Any],
        record: Callable[[], Awaitable[object]],
    ) -> Sent:
        """Publish ``payload`` now, or queue it (see the module invariants). ``record`` (our
        transcript's copy) runs once the bounds allow it, before anything is published."""
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
        with self._reserve(size):
            await record()
            due = now = self.clock()
            if not self.queued_in(topic) and self.node.connected:
                try:
                    await self.node.publish_confirmed(realm, topic, payload, timeout=SAY_CONFIRM_S)
                    return Sent(1, self.queued)
                except UNSENT as exc:  # it may still land: the pump tries again a little later
                    log.info("say in %s not confirmed, queued: %s", topic, exc)
                    self.stats["unconfirmed_queued"] += 1
                    due = self.clock() + RETRY_INITIAL_MS
            entry = OutboxEntry(0, topic, realm, message_id, text, size, now, 0, due)
            await self.store.enqueue(self.me, entry, self.bounds)
            self._rooms[topic] += 1
            self._bytes += size
            self.stats["queued"] += 1
        self.kick.set()
        return Sent(0, self.queued)

    @contextlib.contextmanager
    def _reserve(self, size: int) -> Iterator[None]:
        messages, total = self._reserved
        if (
            self.queued + messages + 1 > self.bounds.max_messages
            or self._bytes + total + size > self.bounds.max_bytes
        ):
            self.stats["refused_full"] += 1
            raise OutboxFullError(self.queued, self._bytes, self.bounds)
        self._reserved = (messages + 1, total + size)
        try:
            yield
        finally:
            messages, total = self._reserved
            self._reserved = (messages - 1, total - size)

    async def settle(self, topic: str, *, drop: int = 1) -> int:
        """Before leaving ``topic``: send what it has queued (when connected), then drop what
        still could not go; how many were dropped (for the caller to report). ``drop`` 0
        (the process is shutting down): what could not go stays queued for the next run."""
        if self.queued_in(topic) and self.node.connected:
            await self.flush_room(topic)
        if not drop:
            return 0
        async with self._lock(topic):
            dropped = await self.store.drop(self.me, topic)
        if dropped:
            self.stats["dropped"] += dropped
            log.warning("left %s with %d queued messages unsent: dropped", topic, dropped)
            await self.load()
        return dropped

    # -- delivery ---------------------------------------------------------------------------------

    def _lock(self, topic: str) -> asyncio.Lock:
        return self._locks.setdefault(topic, asyncio.Lock())

    async def flush_room(self, topic: str) -> set[str]:
        """Publish ``topic``'s queued messages oldest first; stop at the first that fails.
        The message ids published."""
        sent: set[str] = set()
        async with self._lock(topic):
            for entry in await self.store.entries(self.me, topic):
                if not await self._deliver(entry):
                    break
                sent.add(entry.message_id)
        return sent

    async def _deliver(self, entry: OutboxEntry) -> bool:
        self._published(entry.room_topic, entry.message_id)  # its echo is ours
        try:
            await self.node.publish_confirmed(
                entry.realm, entry.room_topic, json.loads(entry.payload), timeout=CONFIRM_TIMEOUT_S
            )
        except UNSENT as exc:
            delay = min(RETRY_MAX_MS, RETRY_INITIAL_MS * 2 ** min(entry.attempts, 20))
            await self.store.retry_later(entry.entry_id, self.clock() + delay, str(exc))
            self.stats["retried"] += 1
            return False
        await self.store.delivered(entry.entry_id)
        self._rooms[entry.room_topic] -= 1
        if self._rooms[entry.room_topic] <= 0:
            del self._rooms[entry.room_topic]
        self._bytes -= entry.size
        self.stats["delivered"] += 1
        return True

    async def run(self) -> None:
        """Deliver what is due, then sleep until the next due time or a ``kick``; forever."""
        while True:
            self.kick.clear()
            try:
                due = await self._round()
            except Exception:  # never let the outbox take the agent's task group down
                log.exception("room outbox failed; retrying")
                due = self.clock() + RETRY_INITIAL_MS
            timeout = None if due is None else max(0.05, (due - self.clock()) / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout)

    async def _round(self) -> int | None:
        """Flush every room whose oldest message is due; when to look again (None: nothing
        queued, or not connected: a (re)connect or a new message kicks the pump)."""
        if not self.node.connected:
            return None
        if self._retry_all:
            self._retry_all = False
            await self.store.retry_now(self.me, self.clock())
        now = self.clock()
        due = [t for t, e in _heads(await self.store.entries(self.me)).items() if e.due_ms <= now]
        await asyncio.gather(*(self.flush_room(topic) for topic in due))
        if not self.node.connected:
            return None
        heads = _heads(await self.store.entries(self.me))
        return min((e.due_ms for e in heads.values()), default=None)


def _heads(entries: list[OutboxEntry]) -> dict[str, OutboxEntry]:
    """The oldest entry of each room (``entries`` oldest first)."""
    heads: dict[str, OutboxEntry] = {}
    for entry in entries:
        heads.setdefault(entry.room_topic, entry)
    return heads
