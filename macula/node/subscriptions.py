"""Subscriptions as the consumer sees them, and the local fan-out of an event to them.

Invariants:
- a ``Subscription`` buffers at most ``buffer`` events; when the consumer falls behind, the
  *oldest* buffered event is dropped and counted in ``dropped`` (a warning once per 1000);
- what a subscription missed is counted honestly, in two numbers: ``missed`` events dropped
  here (known exactly: ``dropped``), and ``gaps``, the times its session to the station broke
  while it was live. Events published during a gap are never seen and cannot be counted (a
  publisher's ``seq`` is a timestamp, not a counter); a gap whose cause was the station closing
  us as a slow consumer (GOODBYE ``slow_consumer``) is also counted in ``slow_consumer_gaps``;
- once ended (closed by its owner, or its node closed) a subscription takes no new event, and
  its consumer always sees the end: every event still buffered, then ``StopAsyncIteration``.
  The end marker never competes with events for a slot of the bounded buffer;
- ``LocalSubscriptions`` holds the intent: which (realm, topic) this node wants. Only the first
  subscription of a key and the removal of its last one need a frame to the station.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("macula.node.node")

Key = tuple[bytes, str]  # (realm, topic)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event as a subscriber sees it."""

    realm: bytes
    topic: str
    publisher: bytes
    seq: int
    payload: Any
    authenticated: bool  # publisher_sig present and valid (§4.4)
    # not authenticated: the station that vouches for ``publisher`` (it took the PUBLISH from
    # the publisher's connection): ours, or the linked station it came from; None when signed
    attested_by: bytes | None = None


class Subscription:
    """An async iterator of ``Delivery`` with a bounded buffer (see the module docstring)."""

    def __init__(
        self,
        realm: bytes,
        topic: str,
        buffer: int,
        on_close: Callable[[Subscription], Awaitable[None]],
    ) -> None:
        self.realm = realm
        self.topic = topic
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue(maxsize=buffer)
        self._on_close = on_close
        self._ended = False
        self.dropped = 0
        self.delivered = 0
        self.gaps = 0
        self.slow_consumer_gaps = 0
        self.closed = False

    def _offer(self, delivery: Delivery) -> None:
        if self._ended:
            return
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning(
                    "subscription %s: consumer too slow, %d events dropped",
                    self.topic,
                    self.dropped,
                )
        self._queue.put_nowait(delivery)
        self.delivered += 1

    @property
    def missed(self) -> int:
        """Events dropped here because the consumer fell behind (see ``gaps`` for the rest)."""
        return self.dropped

    def _gap(self, slow_consumer: bool) -> None:
        if self._ended:
            return
        self.gaps += 1
        if slow_consumer:
            self.slow_consumer_gaps += 1

    def _end(self) -> None:
        """No more events: the consumer drains what is buffered, then stops."""
        if self._ended:
            return
        self._ended = True
        if not self._queue.full():  # wakes a consumer waiting on an empty buffer
            self._queue.put_nowait(None)
        # a full buffer needs no marker: the consumer finds it empty and ended after draining

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Delivery:
        if self._ended and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if self._ended and self._queue.empty():
            self._queue.put_nowait(None)  # the end stays visible to every other reader
        if item is None:
            raise StopAsyncIteration
        return item

    async def next(self, timeout: float | None = None) -> Delivery:
        """The next delivery; ``TimeoutError`` when none arrives within ``timeout`` seconds.
        One already buffered (or the end) is returned at once, without a task or a timer."""
        if timeout is None or self._ended or not self._queue.empty():
            return await self.__anext__()
        return await asyncio.wait_for(self.__anext__(), timeout)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._on_close(self)
            self._end()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class LocalSubscriptions:
    """Every live subscription of a node, by (realm, topic); iterating yields the keys."""

    def __init__(self) -> None:
        self._by_key: dict[Key, set[Subscription]] = {}

    def __iter__(self) -> Iterator[Key]:
        return iter(self._by_key)

    def add(self, sub: Subscription) -> bool:
        """Register ``sub``; True when it is the first of its key (SUBSCRIBE needed)."""
        key = (sub.realm, sub.topic)
        first = key not in self._by_key
        self._by_key.setdefault(key, set()).add(sub)
        return first

    def discard(self, sub: Subscription) -> bool:
        """Forget ``sub``; True when it was the last of its key (UNSUBSCRIBE needed)."""
        key = (sub.realm, sub.topic)
        subs = self._by_key.get(key)
        if subs is None or sub not in subs:
            return False
        subs.discard(sub)
        if subs:
            return False
        del self._by_key[key]
        return True

    def deliver(self, delivery: Delivery) -> None:
        for sub in self._by_key.get((delivery.realm, delivery.topic), ()):
            sub._offer(delivery)

    def gap_all(self, slow_consumer: bool) -> None:
        """The session broke: every live subscription may have missed events."""
        for subs in self._by_key.values():
            for sub in subs:
                sub._gap(slow_consumer)

    def end_all(self) -> None:
        for subs in self._by_key.values():
            for sub in subs:
                sub._end()
