"""Catch-up: fetch from the station's room history what was said while we were away.

Invariants:
- It runs at start and after every reconnect, for central and every room we are in, one run
  at a time; a failure (no history service, a refusal, a broken connection) is logged and
  counted in ``stats``, never raised, and tried again from the same mark after ``RETRY_S``
  (``run_until_done``: right after a station restart its history service may not be found
  yet, and a run left to the next reconnect lost what was said meanwhile until then).
- Each fetched event is checked exactly like a live one: its ``publisher_sig`` must verify
  over (topic, realm, publisher, seq, payload), its realm must be the room's (the zero realm
  for central; a room's is stored with its membership) and its topic the room asked for; then
  it goes through the same path as a live delivery (``Rooms._heard``: validation,
  attestation, the transcript's duplicate check by ``message_id``), so the inbox
  holds every envelope once, whichever way it came. Anything else is counted, never recorded.
- Marks: per (room, station key), the history id read through, saved after every page; with no
  mark for this station a room is read from its ``joined_ms`` (central from now) less
  ``MARGIN_MS`` for clock skew.
- Gaps: an expired mark ``(publisher, seq)`` of someone else that we do not hold, and the
  marks the station forgot, are counted per room (``TranscriptStore.add_gap``), not hidden.
- Bounded: at most ``max_pages`` pages of at most ``page`` events per room per run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from macula.agent.envelope import LOBBY_TOPIC
from macula.errors import MaculaError
from macula.node.subscriptions import Delivery
from macula.services.house import HISTORY_FETCH
from macula.services.limits import DEFAULT_HISTORY_PAGE
from macula.wire.frames import publication_signable
from macula.wire.identity import ZERO_REALM, verify

if TYPE_CHECKING:
    from macula.store.transcript import TranscriptStore
    from macula.wire.identity import Identity

log = logging.getLogger("macula.agent.catchup")
RETRY_S: Final = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # then: at the next reconnect

MARGIN_MS: Final = 5 * 60 * 1000
DEFAULT_MAX_PAGES: Final = 50


class HistorySource(Protocol):
    """Where history comes from: a house-service caller
    (``macula.services.house_client.HouseClient``)."""

    async def call(self, procedure: str, payload: Any) -> Any: ...


class Identified(Protocol):
    @property
    def identity(self) -> Identity: ...


class CatchUpRooms(Protocol):
    """What catch-up uses of the rooms it fills (``macula.agent.room.rooms.Rooms``): typed here, so
    this module does not import the one that imports it."""

    @property
    def node(self) -> Identified: ...

    @property
    def transcript(self) -> TranscriptStore: ...

    @property
    def clock(self) -> Callable[[], int]: ...

    @property
    def generation(self) -> int: ...

    async def _heard(self, topic: str, delivery: Delivery) -> None: ...


class CatchUp:
    def __init__(
        self,
        rooms: CatchUpRooms,
        source: HistorySource,
        station_key: Callable[[], Any],
        *,
        page: int = DEFAULT_HISTORY_PAGE,
        max_pages: int = DEFAULT_MAX_PAGES,
    ) -> None:
        self.rooms = rooms
        self.source = source
        self.station_key = station_key  # async () -> bytes: the key of the station we are on
        self.page = page
        self.max_pages = max_pages
        self.stats: Counter[str] = Counter()
        self.runs = 0  # completed runs (tests wait on it)
        self.failed = 0  # 1: the last run stopped on a failure (its marks kept for the next)
        self._lock = asyncio.Lock()

    async def run(self) -> int:
        """Catch up central and every joined room; how many new messages were recorded."""
        async with self._lock:
            recorded = 0
            try:
                station: bytes = await self.station_key()
                transcript = self.rooms.transcript
                topics = {LOBBY_TOPIC: (self.rooms.clock(), ZERO_REALM)}
                for membership in await transcript.joined_rooms():
                    topics[membership.room_topic] = membership.joined_ms, membership.realm
                for topic, (since, realm) in topics.items():
                    recorded += await self._room(topic, station, since, realm)
                self.failed = 0
            except MaculaError as exc:
                self.stats["failed"] += 1
                self.failed = 1
                log.info("catch-up stopped: %s", exc)
            self.runs += 1
            self.stats["recorded"] += recorded
            return recorded

    async def run_until_done(
        self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    ) -> int:
        """``run``, and again after ``RETRY_S`` while it fails (the history service not found
        yet after a station restart, a dropped connection): a failed run is not left to the
        next reconnect, which may never come. How many new messages were recorded."""
        recorded = await self.run()
        for delay in RETRY_S:
            if not self.failed:
                break
            self.stats["retried"] += 1
            await sleep(delay)
            recorded += await self.run()
        return recorded

    async def _room(self, topic: str, station: bytes, joined_ms: int, realm: bytes) -> int:
        transcript = self.rooms.transcript
        mark = await transcript.catchup_mark(topic, station)
        after = mark or 0
        since = 0 if mark is not None else max(0, joined_ms - MARGIN_MS)
        recorded = lost = 0
        forgotten_through = 0
        for _ in range(self.max_pages):
            args = {"topic": topic, "after_id": after, "since_ms": since, "limit": self.page}
            page = await self.source.call(HISTORY_FETCH, args)
            if not _page_ok(page, self.page):
                self.stats["bad_pages"] += 1
                break
            for event in page["events"]:
                recorded += await self._event(topic, event, realm)
            for expired in page["expired"]:
                lost += await self._expired(topic, expired)
            if page["forgotten"] and not forgotten_through:
                lost += page["forgotten"]  # once per run: the count repeats on every page
                forgotten_through = page["forgotten_through_id"]
            after = max(after, page["next_after_id"])
            if not page["more"]:
                after = max(after, forgotten_through)  # all after ``after`` was read
                await transcript.set_catchup_mark(topic, station, after, self.rooms.clock())
                break
            await transcript.set_catchup_mark(topic, station, after, self.rooms.clock())
        await transcript.add_gap(topic, lost, self.rooms.clock())
        self.stats["lost"] += lost
        return recorded

    async def _event(self, topic: str, event: object, realm: bytes = ZERO_REALM) -> int:
        if not isinstance(event, Mapping) or not _event_ok(event, topic, realm):
            self.stats["rejected_events"] += 1
            return 0
        delivery = Delivery(
            realm=event["realm"],
            topic=topic,
            publisher=event["publisher"],
            seq=event["seq"],
            payload=event["payload"],
            authenticated=True,
        )
        before = self.rooms.generation
        await self.rooms._heard(topic, delivery)
        return int(self.rooms.generation != before)

    async def _expired(self, topic: str, mark: object) -> int:
        if not isinstance(mark, Mapping):
            return 0
        publisher, seq = mark.get("publisher"), mark.get("seq")
        if type(publisher) is not bytes or len(publisher) != 32 or type(seq) is not int:
            return 0
        if publisher == self.rooms.node.identity.node_id:
            return 0  # what we said is in our transcript already
        held = await self.rooms.transcript.has_event(topic, publisher, seq)
        return 0 if held else 1


def _page_ok(page: object, limit: int) -> bool:
    """A page shaped as ``macula.history.fetch_v1`` answers, with at most ``limit`` items."""
    if not isinstance(page, Mapping):
        return False
    lists = all(isinstance(page.get(key), list) for key in ("events", "expired"))
    if lists and len(page["events"]) + len(page["expired"]) > limit:
        return False
    ints = all(
        type(page.get(key)) is int and page[key] >= 0
        for key in ("next_after_id", "more", "forgotten", "forgotten_through_id")
    )
    return lists and ints


def _event_ok(event: Mapping[Any, Any], topic: str, realm: bytes = ZERO_REALM) -> bool:
    """The same end-to-end check a live EVENT gets (§4.4), plus: the room's realm, this topic."""
    publisher, seq, sig = event.get("publisher"), event.get("seq"), event.get("publisher_sig")
    if event.get("topic") != topic or event.get("realm") != realm:
        return False
    if type(publisher) is not bytes or len(publisher) != 32 or type(seq) is not int or seq < 0:
        return False
    if type(sig) is not bytes:
        return False
    try:
        signable = publication_signable(topic, realm, publisher, seq, event.get("payload"))
    except (ValueError, TypeError, MaculaError):
        return False
    return verify(publisher, signable, sig)
