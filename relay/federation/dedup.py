"""Which EVENTs from peer stations were already delivered here (FEDERATION.md, §7.3): pure.

An event crosses at most one station link, so a duplicate means a replay or a fault; this table
is the defence in depth. Invariants: a key ``(realm, publisher, seq)`` is remembered from its
first sighting for ``window_ms`` (time is an argument, never read), at most ``capacity`` keys
at once (past it the oldest is forgotten first); keys are kept in sighting order, so expiry
only ever looks at the front.
"""

from __future__ import annotations

from collections import OrderedDict

EventKey = tuple[bytes, bytes, int]  # (realm, publisher, seq)


class RelayedEventDedup:
    def __init__(self, window_ms: int, capacity: int) -> None:
        self.window_ms = window_ms
        self.capacity = capacity
        self._seen: OrderedDict[EventKey, int] = OrderedDict()
        self.evicted = 0  # keys forgotten early because the table was full

    def first_sighting(self, key: EventKey, now_ms: int) -> bool:
        """True the first time ``key`` is seen within the window (and remember it)."""
        self.expire(now_ms)
        if key in self._seen:
            return False
        if self.capacity <= 0:
            return True
        self._seen[key] = now_ms
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
            self.evicted += 1
        return True

    def expire(self, now_ms: int) -> None:
        oldest = now_ms - self.window_ms
        seen = self._seen
        while seen:
            key, at = next(iter(seen.items()))
            if at > oldest:
                break
            del seen[key]

    def __len__(self) -> int:
        return len(self._seen)
