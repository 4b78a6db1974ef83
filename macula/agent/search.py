"""``mesh_search`` below the tool layer (issue 40): one ranked page over this agent's own
records: room and lobby transcripts (the inbox is their unread part) and tasks.

Invariants:
- Local only: it reads the transcript and the task store, never the network; the text of an
  end-to-end encrypted room is in the transcript in clear already and is searched there, so it
  never leaves the machine through this path.
- The query is words (``macula.store.search.query_terms``), never FTS5 syntax; no words is a
  ``SearchError`` (``no_words``), and any SQLite failure is a ``SearchError``
  (``search_failed``) whose text names no SQLite detail.
- Each source is read in one scan of its index, newest first, up to ``COUNT_CAP`` matches.
  Under the cap in all the sources are ranked together by bm25 (lower first; ties: messages
  before tasks, then the newest); at the cap the page comes newest first instead (``newest``
  1: ranking would sort every match). A page is ``limit`` hits after ``offset``; ``total``
  counts the matches read past ``offset``, so ``total - len(hits)`` remain. The offset is
  bounded (``MAX_OFFSET``), and ``MAX_OFFSET`` plus a page is under ``COUNT_CAP``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.petnames import petname
from macula.errors import MaculaError
from macula.store.base import StoreError
from macula.store.search import Match, MessageHit, TaskHit, Window, query_terms
from macula.store.tasks import TaskStore
from macula.store.transcript import TranscriptStore

__all__ = [
    "MAX_OFFSET",
    "SOURCES",
    "SearchError",
    "SearchPage",
    "SearchRequest",
    "Source",
    "search",
]

Source = Literal["rooms", "lobby", "inbox", "tasks"]
SOURCES: Final[tuple[Source, ...]] = ("rooms", "lobby", "inbox", "tasks")
MAX_OFFSET: Final = 500  # past this many hits a query is too broad to page through
# matches read per source: enough for every page (MAX_OFFSET + a page); a query with this many
# comes newest first, not ranked (ranking all of 40,000 matches takes 23 ms)
COUNT_CAP: Final = 600


class SearchError(MaculaError):
    """A query that cannot be answered: ``code`` and a ``detail`` written for the model."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    source: Source | None = None  # None: rooms, lobby and tasks
    room_topic: str | None = None  # only messages of this room (no tasks)
    sender: bytes | None = None  # messages from, tasks with, this node
    since_ms: int | None = None
    until_ms: int | None = None
    limit: int = 10
    offset: int = 0


@dataclass(frozen=True, slots=True)
class SearchPage:
    hits: list[dict[str, Any]]
    total: int  # matched past the page's offset, this page included (counts stop at a cap)
    terms: list[str]
    newest: int = 0  # 1: too many matches to rank, newest first

    @property
    def remaining(self) -> int:
        return max(self.total - len(self.hits), 0)


async def search(
    transcript: TranscriptStore, tasks: TaskStore, owner: bytes, request: SearchRequest
) -> SearchPage:
    """The page of hits for ``request`` (see the module invariants)."""
    terms = query_terms(request.query)
    if not terms:
        raise SearchError(
            "no_words",
            "query: no words to search for (letters or digits); operators and punctuation"
            " are not search syntax here",
        )
    if request.offset > MAX_OFFSET:
        raise SearchError(
            "too_deep",
            f"offset past {MAX_OFFSET} hits: narrow the query (more words, a room, a sender"
            " or a time window) instead of paging further",
        )
    window = Window(terms, request.since_ms, request.until_ms)
    try:
        return await _page(transcript, tasks, owner, request, window)
    except StoreError:
        raise SearchError(
            "search_failed", "the local search index could not answer this query"
        ) from None


async def _page(
    transcript: TranscriptStore,
    tasks: TaskStore,
    owner: bytes,
    request: SearchRequest,
    window: Window,
) -> SearchPage:
    source = request.source
    filters: dict[str, object] = {
        "room_topic": LOBBY_TOPIC if source == "lobby" else request.room_topic,
        "not_room_topic": LOBBY_TOPIC if source == "rooms" else None,
        "from_hex": None if request.sender is None else request.sender.hex(),
        "unread_only": 1 if source == "inbox" else 0,
        "not_from_hex": owner.hex() if source == "inbox" else None,  # our own: never inbox
    }
    matches: list[tuple[int, Match]] = []  # (0 message, 1 task), newest first in each
    if source != "tasks":
        found = await transcript.message_matches(window, COUNT_CAP, **filters)
        matches += [(0, m) for m in found]
    if source in (None, "tasks") and request.room_topic is None:
        taken = await tasks.task_matches(owner, window, COUNT_CAP, peer=request.sender)
        matches += [(1, m) for m in taken]
    newest = 1 if len(matches) >= COUNT_CAP else 0
    if newest:
        matches.sort(key=lambda k_m: (-k_m[1].at_ms, k_m[0], -k_m[1].row))
    else:
        matches.sort(key=lambda k_m: (k_m[1].score, k_m[0], -k_m[1].at_ms, -k_m[1].row))
    chosen = matches[request.offset : request.offset + request.limit]
    views = {
        (0, h.seq): _message_view(h)
        for h in await transcript.message_hits(window, [m.row for k, m in chosen if k == 0])
    }
    for row, hit in zip(
        [m.row for k, m in chosen if k == 1],
        await tasks.task_hits(window, [m.row for k, m in chosen if k == 1]),
        strict=False,
    ):
        views[(1, row)] = _task_view(hit)
    hits = [views[(k, m.row)] for k, m in chosen if (k, m.row) in views]
    return SearchPage(hits, max(len(matches) - request.offset, 0), window.terms, newest)


def _message_view(hit: MessageHit) -> dict[str, Any]:
    return {
        "source": "lobby" if hit.room_topic == LOBBY_TOPIC else "rooms",
        "room_topic": hit.room_topic,
        "message_id": hit.message_id,
        "from": hit.from_hex,
        "from_petname": _petname(hit.from_hex),
        "kind": hit.kind,
        "sent_at": hit.sent_at,
        "received_ms": hit.received_ms,
        "unread": hit.unread,
        "snippet": hit.snippet,
    }


def _task_view(hit: TaskHit) -> dict[str, Any]:
    return {
        "source": "tasks",
        "task_id": hit.task_id,
        "role": hit.role,
        "peer": hit.peer.hex(),
        "peer_petname": petname(hit.peer) if len(hit.peer) == 32 else None,
        "title": hit.title,
        "state": hit.state,
        "updated_ms": hit.updated_ms,
        "snippet": hit.snippet,
    }


def _petname(node_hex: str) -> str | None:
    try:
        node_id = bytes.fromhex(node_hex)
    except ValueError:
        return None
    return petname(node_id) if len(node_id) == 32 else None
