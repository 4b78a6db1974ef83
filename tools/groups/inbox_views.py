"""``mesh_read_inbox``'s pages (``tools.groups.paging``'s rule): unread messages, never dropped.

Invariants:
- The page is made by the agent layer (``RoomInbox.inbox``) with this module's ``fit``: each
  candidate is measured as it will be shown (shortened if alone too big, plus its room's entry
  when it opens one), so the page fits the result bound and only what it holds is marked read;
- pending rings have a budget of their own (``RINGS_CHARS``) and are a page too (answered
  rings leave the list, so the next read shows the rest);
- a cursor ``t<seq>.<offset>`` reads one message's text from ``offset`` (a part at most
  ``TEXT_CHUNK_CHARS`` of JSON), marking nothing; ``s<seq>`` continues a page after ``seq``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.room.inbox import envelope_of
from macula.errors import MaculaError
from macula.store.transcript import TranscriptMessage
from tools.groups.agent_views import label, message_view, ring_view, with_petname
from tools.groups.paging import (
    PAGE_CHARS,
    TEXT_CHUNK_CHARS,
    PageBudget,
    next_call,
    page_cursor,
    shortened,
    size,
    text_cursor,
    text_prefix,
)
from tools.server.runtime import Runtime

TOOL: Final = "mesh_read_inbox"
RINGS_CHARS: Final = 3_000
ROOMS_LISTED: Final = 20  # rooms named in remaining_by_room (the rest summed under "other")
_ROOM_ENTRY: Final = 260  # a room's entry without its messages (topic, realm, counts), or more


def read_on(seq: int) -> Callable[[int], dict[str, Any] | None]:
    """The call that reads the text of the message recorded as ``seq`` from an offset."""

    def continuation(offset: int) -> dict[str, Any] | None:
        return next_call(TOOL, {"cursor": text_cursor(seq, offset)})

    return continuation


def room_item(message: dict[str, Any], seq: int) -> dict[str, Any]:
    """A threaded message of a room as the page shows it (without ``seq``)."""
    shown = with_petname({k: v for k, v in message.items() if k != "seq"})
    return shortened(shown, read_on(seq))


def help_item(message: TranscriptMessage) -> dict[str, Any]:
    return shortened(message_view(message), read_on(message.seq))


def _measured(message: TranscriptMessage) -> int:
    """The size of ``message`` as a room item (``thread_root``/``depth`` at their longest)."""
    if message.room_topic == LOBBY_TOPIC:
        return size(help_item(message))
    stand_in = envelope_of(message) | {"thread_root": message.message_id, "depth": 99}
    return size(room_item(stand_in, message.seq))


def fitter(budget: PageBudget) -> Any:
    """The ``fit`` the agent layer calls with the page's candidates."""

    def fit(candidates: list[TranscriptMessage]) -> int:
        opened: set[str] = set()

        def sizes() -> Iterator[int]:  # measured only as far as the page goes
            for message in candidates:
                extra = 0 if message.room_topic in opened else _ROOM_ENTRY
                opened.add(message.room_topic)
                yield _measured(message) + extra

        return budget.fit(sizes())

    return fit


async def inbox_page(runtime: Runtime, peek: int, after_seq: int) -> dict[str, Any]:
    agent = runtime.agent
    pending = await agent.rings.pending()
    rings = [ring_view(r) | {"peer_petname": label(r.peer.hex())} for r in pending]
    rings_budget = PageBudget(RINGS_CHARS)
    rings = rings[: rings_budget.fit(size(r) for r in rings)]
    budget = PageBudget(PAGE_CHARS - (RINGS_CHARS - rings_budget.left))
    inbox = await agent.rooms.inbox(peek=peek, after_seq=after_seq, fit=fitter(budget))
    rooms = []
    for thread in inbox.rooms:
        rooms.append(
            {
                "room_topic": thread.room_topic,
                "realm": agent.rooms.realm_of(thread.room_topic).hex(),
                "messages": [room_item(m, int(m["seq"])) for m in thread.messages],
                "unread": thread.unread,
                "lost": thread.lost,
                "remaining": thread.remaining,
            }
        )
    arguments = {"cursor": page_cursor(inbox.after_seq or 0), "peek": peek or None}
    return {
        "rooms": rooms,
        "central_help": [help_item(m) for m in inbox.central_help],
        "central_lost": inbox.central_lost,
        "rings": {"pending": rings, "remaining": len(pending) - len(rings)},
        "me": agent.node.identity.node_id.hex(),
        "poll_hint": inbox.poll_hint,
        "remaining": inbox.remaining,
        "remaining_by_room": _by_room(inbox.remaining_by_room),
        "next_page": next_call(TOOL, arguments if inbox.after_seq is not None else None),
    }


def _by_room(counts: dict[str, int]) -> dict[str, int]:
    """The rooms with unread messages past the page, the busiest ``ROOMS_LISTED`` by name."""
    busiest = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    named = dict(busiest[:ROOMS_LISTED])
    rest = sum(count for _, count in busiest[ROOMS_LISTED:])
    return named | ({"other": rest} if rest else {})


async def text_part(runtime: Runtime, seq: int, offset: int) -> dict[str, Any]:
    """One message's text from ``offset``, in a part of at most ``TEXT_CHUNK_CHARS``."""
    message = await runtime.agent.rooms.transcript.message_at(seq)
    if message is None or message.text is None or offset > len(message.text):
        raise MaculaError(
            "cursor: that message is no longer kept (pruned) or has no text there: "
            "read on with the inbox's own next_page"
        )
    text = message.text
    end = text_prefix(text, TEXT_CHUNK_CHARS, offset) if offset < len(text) else offset
    more = end < len(text)
    return {
        "room_topic": message.room_topic,
        "message_id": message.message_id,
        "from": message.from_hex,
        "from_petname": label(message.from_hex),
        "text": text[offset:end],
        "text_offset": offset,
        "text_chars": len(text),
        "text_remaining": len(text) - end,
        "next_page": next_call(TOOL, {"cursor": text_cursor(seq, end)} if more else None),
    }
