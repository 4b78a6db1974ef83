"""What outlives one connection of a node: its intent and its duplicate-event window.

``Intent`` is the desired state every station this identity connects to must be told
(subscriptions, advertisements); the client core replays it after each HELLO and tells the
station only what changed since (``ClientCore.sync_intent``). ``EventDedup`` remembers the last
``window`` (realm, publisher, seq) so an event delivered twice (a reconnect, a relay retry) is
handed on once. Both are plain data: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from macula.wire.frames import Event

Key = tuple[bytes, str]  # (realm, topic) or (realm, procedure)


class Wanted(Protocol):
    """Where the client core reads the intent: a ``Node`` gives a view of its own tables
    (``Node`` keeps nothing twice); ``Intent`` is the stand-alone version."""

    @property
    def subscriptions(self) -> Iterable[Key]: ...

    @property
    def advertisements(self) -> Iterable[Key]: ...


class Intent:
    """What the station should know about this identity: replayed on every connection."""

    def __init__(self) -> None:
        self._subscriptions: dict[Key, None] = {}
        self._advertisements: dict[Key, None] = {}

    def add_subscription(self, realm: bytes, topic: str) -> bool:
        """Record the wish; ``True`` when it is new (a SUBSCRIBE is due)."""
        new = (realm, topic) not in self._subscriptions
        self._subscriptions[(realm, topic)] = None
        return new

    def drop_subscription(self, realm: bytes, topic: str) -> bool:
        return self._subscriptions.pop((realm, topic), False) is None

    def add_advertisement(self, realm: bytes, procedure: str) -> bool:
        new = (realm, procedure) not in self._advertisements
        self._advertisements[(realm, procedure)] = None
        return new

    def drop_advertisement(self, realm: bytes, procedure: str) -> bool:
        return self._advertisements.pop((realm, procedure), False) is None

    @property
    def subscriptions(self) -> list[Key]:
        return list(self._subscriptions)

    @property
    def advertisements(self) -> list[Key]:
        return list(self._advertisements)


class EventDedup:
    """The last ``window`` (realm, publisher, seq) seen; older ones are forgotten first. An
    unsigned event a linked station vouches for (``attested_by``) is keyed by that station
    too, so it never shadows the publisher's signed event or another station's."""

    def __init__(self, window: int = 4096) -> None:
        self.window = window
        self._seen: OrderedDict[tuple[bytes, bytes, int], None] = OrderedDict()
        self.duplicates = 0

    def first_time(self, event: Event) -> bool:
        who = event.publisher
        if event.publisher_sig is None and event.attested_by is not None:
            who = event.attested_by + who
        key = (event.realm, who, event.seq)
        if key in self._seen:
            self.duplicates += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)
        return True
