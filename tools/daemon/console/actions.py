"""What a person does from the console: write in a room, answer a ring, hand a task, decide a
realm join. Each takes the JSON body of one POST and returns a JSON-able result.

Invariants:
- every argument is checked here first (``ActionError`` names it: HTTP 400, nothing done);
- a person's message is signed by the home's person key and endorsed by the agent that
  publishes it (``macula.agent.person``), so every reader's view says ``from_person`` 1;
- rings are answered through ``Rings.answer_ring`` (what ``mesh_answer_ring`` does), tasks
  handed through ``Tasks.send``, realm joins decided through ``Realm.decide`` (what
  ``macula-realm approve`` does): the console adds no second way of doing any of them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from macula.agent.envelope import TALK_KINDS, is_id, is_room_topic, new_message_id
from macula.agent.person import endorse, person_ref
from macula.clock import now_ms
from macula.realm.authority import Realm, RealmError
from macula.wire.identity import Identity
from tools.groups.tasks import task_view
from tools.server.runtime import Runtime

MAX_TEXT_CHARS: Final = 16 * 1024
MAX_TITLE_CHARS: Final = 280


class ActionError(Exception):
    """A request the console cannot do; ``code`` and ``detail`` go back to the page."""

    def __init__(self, code: str, detail: str, *, retryable: int = 0) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.retryable = retryable

    def view(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "detail": self.detail,
            "retryable": self.retryable,
            "next_action": "correct the form and send it again",
        }


def text_field(body: Mapping[str, Any], name: str, limit: int, *, required: bool = True) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ActionError("invalid_argument", f"{name}: expected a non-empty string")
    if len(value) > limit:
        raise ActionError("invalid_argument", f"{name}: at most {limit} characters")
    return value


def runtime_of(runtimes: list[Runtime], body: Mapping[str, Any]) -> Runtime:
    """The hosted identity named by ``node_id`` in ``body``."""
    wanted = body.get("node_id")
    for runtime in runtimes:
        if runtime.node.identity.node_id.hex() == wanted:
            return runtime
    raise ActionError("unknown_identity", "node_id: not an identity this daemon hosts now")


async def say(runtime: Runtime, person: Identity, body: Mapping[str, Any]) -> dict[str, Any]:
    """Write in a room as the person at the console (published by ``runtime``'s agent)."""
    topic = text_field(body, "room_topic", 64)
    if not is_room_topic(topic):
        raise ActionError("invalid_argument", "room_topic: agents.room.<32 lowercase hex>")
    kind = body.get("kind", "remark_made")
    if kind not in TALK_KINDS:
        raise ActionError("invalid_argument", f"kind: one of {sorted(TALK_KINDS)}")
    text = text_field(body, "text", MAX_TEXT_CHARS)
    reply_to = body.get("in_reply_to") or None
    if reply_to is not None and not is_id(reply_to):
        raise ActionError("invalid_argument", "in_reply_to: a message id")
    identity = runtime.node.identity
    message_id = new_message_id(os.urandom(16))
    mark = person_ref(
        person,
        endorse(identity, person.node_id),
        message_id=message_id,
        room_topic=topic,
        sender_hex=identity.node_id.hex(),
        kind=str(kind),
        text=text,
    )
    await runtime.agent.ensure_present()
    said = await runtime.agent.rooms.say(
        topic, str(kind), text, in_reply_to=reply_to, refs=[mark], message_id=message_id
    )
    return {"room_topic": said.room_topic, "message_id": said.message_id, "from_person": 1}


async def answer_ring(runtime: Runtime, body: Mapping[str, Any]) -> dict[str, Any]:
    """Accept (1) or decline (2) a ring waiting under the ``ask`` policy."""
    ring_id = body.get("ring_id")
    answer = body.get("answer")
    if not is_id(ring_id):
        raise ActionError("invalid_argument", "ring_id: a ring id from the rings list")
    if type(answer) is not int or answer not in (1, 2):
        raise ActionError("invalid_argument", "answer: 1 (accept) or 2 (decline)")
    reason = text_field(body, "reason", 280, required=False) or None
    answered = await runtime.agent.rings.answer_ring(str(ring_id), answer, reason)
    return {
        "ring_id": answered.ring_id,
        "answer": answered.answer,
        "caller_notified": answered.caller_notified,
        "state": answered.state,
    }


async def hand_task(runtime: Runtime, body: Mapping[str, Any]) -> dict[str, Any]:
    """Hand a task to an agent (node id or a petname from the roster)."""
    to = text_field(body, "to", 128)
    title = text_field(body, "title", MAX_TITLE_CHARS)
    task_input = text_field(body, "input", MAX_TEXT_CHARS)
    await runtime.agent.ensure_present()
    peer = await runtime.agent.resolve(to)
    task = await runtime.agent.tasks.send(peer, title, task_input)
    return task_view(task)


async def decide_join(home: Path, body: Mapping[str, Any]) -> dict[str, Any]:
    """Approve or deny a pending join of a realm whose authority key is in ``home``."""
    name = text_field(body, "realm", 64)
    code = text_field(body, "code", 16)
    approve = body.get("approve")
    if type(approve) is not int or approve not in (0, 1):
        raise ActionError("invalid_argument", "approve: 1 (approve) or 0 (deny)")

    def decide() -> dict[str, Any]:
        realm = Realm(home, name).open()
        session = realm.decide(code, bool(approve), now_ms())
        return {"realm": name, "node_id": session.node.hex(), "status": session.status}

    try:
        return await asyncio.to_thread(decide)
    except RealmError as exc:
        raise ActionError(exc.code, exc.detail) from None
