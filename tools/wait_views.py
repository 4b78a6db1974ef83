"""How the waits' batches look to a model (``mesh_wait_room``, ``mesh_say``'s wait).

Invariants:
- ``messages`` is everything the wait took, oldest first (each marked read), ``count`` its
  length and ``left`` how many more wait unread (call again for them): a reply that arrived
  after a notice is in the same result;
- ``mesh_wait_room``'s ``message`` is the newest of ``messages`` (null when none);
  ``mesh_say``'s ``reply`` is the one answering what it said and ``answer_index`` its place in
  ``messages`` (null when none came: ``timed_out`` 1); no booleans, 0/1 only.
"""

from __future__ import annotations

from typing import Any

from macula.agent.room_waits import UnreadBatch
from macula.agent.rooms import Said
from tools.agent_views import message_view, optional_message_view


def _listed(batch: UnreadBatch) -> dict[str, Any]:
    messages = [message_view(m) for m in batch.messages]
    return {"messages": messages, "count": len(messages), "left": batch.left}


def unread_view(batch: UnreadBatch) -> dict[str, Any]:
    """A ``mesh_wait_room`` result (without ``room_topic``)."""
    listed = _listed(batch)
    newest = listed["messages"][-1] if listed["messages"] else None
    return listed | {"message": newest, "timed_out": int(newest is None)}


def reply_view(said: Said) -> dict[str, Any]:
    """What ``mesh_say`` adds after waiting for a reply."""
    return _listed(said.heard or UnreadBatch([])) | {
        "reply": optional_message_view(said.reply),
        "answer_index": said.answer_index,
        "timed_out": int(said.reply is None),
    }
