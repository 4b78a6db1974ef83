"""How the waits' batches look to a model (``mesh_wait_room``, ``mesh_say``'s wait).

Invariants:
- ``messages`` is everything the wait took, oldest first (each marked read), ``count`` its
  length; the batch is a page (``tools.groups.paging``): cut between messages to fit the result
  (``wait_fit``, given to the agent layer, so only what is shown is marked read), a message
  too big alone (``WAIT_ITEM_CHARS``: one message is shown twice, as ``message`` or
  ``reply`` too) shortened with ``text_next_page``; ``remaining`` counts the messages still
  waiting and ``next_page`` is the ``mesh_wait_room`` call that returns them: a reply that arrived
  after a notice is in the same result;
- ``mesh_wait_room``'s ``message`` is the newest of ``messages`` (null when none);
  ``mesh_say``'s ``reply`` is the one answering what it said and ``answer_index`` its place in
  ``messages`` (null when none came: ``timed_out`` 1); no booleans, 0/1 only.
"""

from __future__ import annotations

from typing import Any

from macula.agent.room.rooms import Said
from macula.agent.room.waits import UnreadBatch
from macula.store.transcript import TranscriptMessage
from tools.groups.agent_views import message_view
from tools.groups.inbox_views import read_on
from tools.groups.paging import PAGE_CHARS, PageBudget, paged, shortened, size

WAIT_TOOL = "mesh_wait_room"
WAIT_ITEM_CHARS = (PAGE_CHARS - 1_000) // 2  # shown twice at most, with the keys around it


def shown(message: TranscriptMessage) -> dict[str, Any]:
    """A message as a wait shows it (shortened if alone too big for a page)."""
    return shortened(message_view(message), read_on(message.seq), WAIT_ITEM_CHARS)


def wait_fit(messages: list[TranscriptMessage]) -> int:
    """How many of the leading ``messages`` one page of a wait holds: the result shows one of
    them twice (``message``, ``reply``), so the largest admitted counts twice."""
    budget = PageBudget()
    largest = 0
    for taken, message in enumerate(messages):
        chars = size(shown(message))
        grown = max(largest, chars)
        if not budget.admit(chars + grown - largest):
            return taken
        largest = grown
    return len(messages)


def _listed(batch: UnreadBatch, arguments: dict[str, Any]) -> dict[str, Any]:
    messages = [shown(m) for m in batch.messages]
    listed = {"messages": messages, "count": len(messages)}
    return listed | paged(batch.left, WAIT_TOOL, arguments)


def unread_view(batch: UnreadBatch, arguments: dict[str, Any]) -> dict[str, Any]:
    """A ``mesh_wait_room`` result (without ``room_topic``); ``arguments``: the call that
    gave it (a call after a message id goes on after the newest of this page)."""
    if arguments.get("after_message_id") is not None and batch.messages:
        arguments = arguments | {"after_message_id": batch.messages[-1].message_id}
    listed = _listed(batch, arguments)
    newest = listed["messages"][-1] if listed["messages"] else None
    return listed | {"message": newest, "timed_out": int(newest is None)}


def reply_view(said: Said) -> dict[str, Any]:
    """What ``mesh_say`` adds after waiting for a reply."""
    heard = said.heard or UnreadBatch([])
    last = heard.messages[-1].message_id if heard.messages else said.message_id
    arguments = {"room_topic": said.room_topic, "after_message_id": last}
    return _listed(heard, arguments) | {
        "reply": None if said.reply is None else shown(said.reply),
        "answer_index": said.answer_index,
        "timed_out": int(said.reply is None),
    }
