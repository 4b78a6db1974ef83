"""The inbox of ``Rooms`` (which inherits ``RoomInbox``): a bounded page of what is unread.

Invariants:
- A page holds unread attested messages from others, in the rooms joined and central's help
  broadcasts, in arrival order (``seq``); what it holds is the leading part of that order that
  the caller's ``fit`` admits (at least one, so a page always moves on). Only what the page
  holds is marked read, after it is made (unless ``peek``): a message is never marked read
  without having been given, and a failure before the mark loses nothing.
- ``remaining`` counts what is still unread past the page, ``after_seq`` is where the next
  page starts (``seq`` of the last message shown): passing it back continues a peek; without
  it, the read marks do. Repeating the call therefore reaches every message exactly once.
- Threading (``thread_root``, ``depth``) follows ``in_reply_to`` through the transcript, not
  just the page: an answer whose question was read earlier is still at depth 1. At most
  ``MAX_ANCESTOR_LOOKUPS`` lookups per page; a chain longer than that is cut there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from macula.agent.envelope import LOBBY_TOPIC as LOBBY
from macula.agent.envelope import TALK_KINDS, poll_hint, thread
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.store.unread import Fit

HELP_KINDS: Final = frozenset({"help_requested", "help_offered"})
CANDIDATES: Final = 200  # messages read per page before ``fit`` cuts them
MAX_ANCESTOR_LOOKUPS: Final = 64
HINT_ROOMS: Final = 64  # rooms whose last talk decides ``poll_hint``


@dataclass(frozen=True, slots=True)
class RoomThread:
    """One room's messages in a page: the envelopes as received plus ``attested``,
    ``thread_root``, ``depth`` and ``seq``, threaded; ``poll_hint`` when we spoke last and
    nobody answered."""

    room_topic: str
    messages: list[dict[str, Any]]
    poll_hint: str | None
    unread: int = 0  # unread messages from others before this read
    lost: int = 0  # messages catch-up found missed for good (history expired)
    remaining: int = 0  # unread messages of this room past this page


@dataclass(frozen=True, slots=True)
class RoomsInbox:
    rooms: list[RoomThread]
    central_help: list[TranscriptMessage]  # unread help broadcasts on central, in the page
    central_lost: int = 0
    remaining: int = 0  # unread messages past this page, every room and central
    after_seq: int | None = None  # where the next page starts (None: nothing remains)
    poll_hint: str | None = None
    remaining_by_room: dict[str, int] = field(default_factory=dict)


class RoomInbox:
    """The inbox page of ``Rooms`` (the attributes are ``Rooms``')."""

    transcript: TranscriptStore
    clock: Callable[[], int]
    me: str

    async def inbox(
        self, *, peek: int = 0, after_seq: int = 0, fit: Fit | None = None
    ) -> RoomsInbox:
        """The next page of unread messages (see the module invariants)."""
        joined = [m.room_topic for m in await self.transcript.joined_rooms()]
        unread = await self.transcript.unread_counts(self.me)
        lost = await self.transcript.gaps()
        candidates, total = await self.transcript.unread_page(
            joined, self.me, lobby=LOBBY, lobby_kinds=HELP_KINDS, after_seq=after_seq,
            limit=CANDIDATES,
        )  # fmt: skip
        taken = len(candidates) if fit is None else fit(candidates)
        shown = candidates[: max(1, min(len(candidates), taken))] if candidates else []
        if not peek:
            await self.transcript.mark_read_seqs([m.seq for m in shown], self.clock())
        left = total - len(shown)
        left_by_room = _left_by_room(joined, unread, shown)
        threads = []
        for topic in dict.fromkeys(m.room_topic for m in shown if m.room_topic != LOBBY):
            mine = [m for m in shown if m.room_topic == topic]
            threads.append(
                RoomThread(
                    topic,
                    await self._threaded(topic, mine),
                    None,
                    unread.get(topic, 0),
                    lost.get(topic, 0),
                    left_by_room.pop(topic, 0),
                )
            )
        return RoomsInbox(
            threads,
            [m for m in shown if m.room_topic == LOBBY],
            lost.get(LOBBY, 0),
            left,
            shown[-1].seq if left > 0 and shown else None,
            await self._poll_hint(joined),
            left_by_room,
        )

    async def recent_threads(self, limit: int) -> list[RoomThread]:
        """Each joined room's newest ``limit`` messages threaded (read or not, ours too):
        a view for a person (the console), marking nothing."""
        unread = await self.transcript.unread_counts(self.me)
        lost = await self.transcript.gaps()
        threads = []
        for membership in await self.transcript.joined_rooms():
            topic = membership.room_topic
            raw = [envelope_of(m) for m in await self.transcript.messages(topic, limit=limit)]
            threaded = [
                {**t.message, "thread_root": t.thread_root, "depth": t.depth} for t in thread(raw)
            ]
            hint = poll_hint(raw, self.me)
            threads.append(
                RoomThread(topic, threaded, hint, unread.get(topic, 0), lost.get(topic, 0))
            )
        return threads

    async def _threaded(
        self, topic: str, messages: Sequence[TranscriptMessage]
    ) -> list[dict[str, Any]]:
        """``messages`` threaded, with the ancestors they reply to looked up for depth."""
        raw = {m.message_id: envelope_of(m) for m in messages}
        known: dict[str, dict[str, Any]] = {}
        wanted = [m.in_reply_to for m in messages if m.in_reply_to]
        lookups = 0
        while wanted and lookups < MAX_ANCESTOR_LOOKUPS:
            parent_id = wanted.pop()
            if parent_id in raw or parent_id in known:
                continue
            lookups += 1
            parent = await self.transcript.message(topic, parent_id)
            if parent is None:
                continue
            known[parent_id] = envelope_of(parent)
            if parent.in_reply_to:
                wanted.append(parent.in_reply_to)
        threaded = thread([*known.values(), *raw.values()])
        return [
            {**t.message, "thread_root": t.thread_root, "depth": t.depth}
            for t in threaded
            if t.message.get("message_id") in raw
        ]

    async def _poll_hint(self, joined: Sequence[str]) -> str | None:
        """``poll_hint`` over the last talk of each joined room (we spoke last: wait)."""
        last: list[dict[str, Any]] = []
        for topic in joined[:HINT_ROOMS]:
            recent = await self.transcript.recent(TALK_KINDS, topic, None, 1)
            last.extend(envelope_of(m) for m in recent)
        return poll_hint(last, self.me)


def envelope_of(message: TranscriptMessage) -> dict[str, Any]:
    """A recorded message as its envelope plus ``attested`` and ``seq``."""
    envelope: dict[str, Any] = json.loads(message.envelope)
    return envelope | {"attested": message.attested, "seq": message.seq}


def _left_by_room(
    joined: Sequence[str], unread: dict[str, int], shown: Sequence[TranscriptMessage]
) -> dict[str, int]:
    """Per joined room, its unread messages past the page (rooms with none left out); the
    counts were read before the marks, so they are the same with or without ``peek``."""
    taken: dict[str, int] = {}
    for message in shown:
        taken[message.room_topic] = taken.get(message.room_topic, 0) + 1
    left = {topic: unread.get(topic, 0) - taken.get(topic, 0) for topic in joined}
    return {topic: count for topic, count in left.items() if count > 0}
