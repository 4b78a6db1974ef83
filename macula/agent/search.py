"""``mesh_search`` below the tool layer (issue 40): one ranked page over this agent's own
records: room and lobby transcripts (the inbox is their unread part) and tasks.

Invariants:
- Local only: it reads the transcript and the task store, never the network; the text of an
  end-to-end encrypted room is in the transcript in clear already and is searched there, so it
  never leaves the machine through this path.
- The query is words (``macula.store.search.query_terms``), never FTS5 syntax; no words is a
  ``SearchError`` (``no_words``), and any SQLite failure is a ``SearchError``
  (``search_failed``) whose text names no SQLite detail.
- Sources ranked together by bm25 (lower first; ties: messages before tasks, then the newest).
  A page is ``limit`` hits after ``offset``; ``total`` counts every match of every source
  searched, so ``total - offset - len(hits)`` remain. The offset is bounded (``MAX_OFFSET``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Final, Literal

from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.petnames import petname
from macula.errors import MaculaError
from macula.store.base import StoreError
from macula.store.search import MessageHit, TaskHit, Window, query_terms
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
MAX_OFFSET: Final = 1_000  # past this many hits a query is too broad to page through


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
    total: int
    terms: list[str]

    @property
    def remaining(self) -> int:
        return max(self.total - len(self.hits), 0)


async def search(
    transcript: TranscriptStore, tasks: TaskStore, owner: bytes, request: SearchRequest
) -> SearchPage:
    """The page of hits for ``request`` (see the module invariants); ``SearchPage.total`` is
    what matched past ``request.offset``, this page included."""
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
    window = Window(terms, request.since_ms, request.until_ms, request.offset + request.limit)
    try:
        ranked, total = await _ranked(transcript, tasks, owner, request, window)
    except StoreError:
        raise SearchError(
            "search_failed", "the local search index could not answer this query"
        ) from None
    hits = ranked[request.offset : request.offset + request.limit]
    return SearchPage(hits, max(total - request.offset, 0), terms)


async def _ranked(
    transcript: TranscriptStore,
    tasks: TaskStore,
    owner: bytes,
    request: SearchRequest,
    window: Window,
) -> tuple[list[dict[str, Any]], int]:
    lists: list[list[tuple[float, int, int, dict[str, Any]]]] = []
    total = 0
    source = request.source
    if source != "tasks":
        found, count = await transcript.search_messages(
            window,
            room_topic=LOBBY_TOPIC if source == "lobby" else request.room_topic,
            not_room_topic=LOBBY_TOPIC if source == "rooms" else None,
            from_hex=None if request.sender is None else request.sender.hex(),
            unread_only=1 if source == "inbox" else 0,
        )
        lists.append([(h.score, 0, -h.seq, _message_view(h)) for h in found])
        total += count
    if source in (None, "tasks") and request.room_topic is None:
        taken, count = await tasks.search_tasks(owner, window, peer=request.sender)
        lists.append([(h.score, 1, -h.updated_ms, _task_view(h)) for h in taken])
        total += count
    merged = heapq.merge(*lists, key=lambda item: item[:3])
    return [view for *_, view in merged], total


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
