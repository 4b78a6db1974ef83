"""The named bounds of the MCP tools' parameters, and the parameters many tools share.

A parameter's bound is declared once, in its tool function's signature: ``Field(max_length=...)``
for text, ``Field(ge=..., le=...)`` for a number, taking the number from a constant here (or
from the library's own). pydantic writes that declaration into the JSON schema ``tools/list``
shows (``tools.server.schema`` only compacts it), and the one argument boundary
(``tools.server.arguments``) checks it before the body runs. So what a client reads is what is
enforced, and no tool body checks it again.

Invariants:
- each limit is the one the tool (or what it calls) already enforces, in characters: a limit
  counted in UTF-8 bytes (a room message, a memory, a task's values) is listed as that many
  characters, which is never tighter than the bytes check that still runs inside;
- the task limits follow ``MACULA_MCP_TASKS_*`` (``TaskLimits.from_env``): their parameters
  carry a ``TaskBound`` naming the ``TaskLimits`` field, resolved per server from its
  environment by the schema and the boundary alike;
- a parameter that takes text or a JSON value (a task's ``input``/``result``, a record type
  given by name or number) has its text arm bounded;
- no imports from the tool modules (they import their limits from here): no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import Field

from macula.agent.envelope import LOBBY_TOPIC, TALK_KINDS
from macula.agent.petnames import FIRST_WORDS, NOUNS, SECOND_WORDS
from macula.agent.task_messages import TaskLimits
from macula.errors import ConfigError
from macula.realm.records import MAX_NAME as MAX_REALM_NAME
from macula.services.limits import (
    MAX_LABEL_CHARS,
    MAX_MEMORY_CONTENT_BYTES,
    MAX_PLACE_CHARS,
    MAX_QUERY_BYTES,
)
from macula.store.task_states import STATES
from macula.wire.content import MCID_SIZE
from macula.wire.record_keys import KEY_SIZE
from macula.wire.records import RecordType

__all__ = [
    "MAX_CONTENT_NAME",
    "MAX_EXEC",
    "MAX_IDEMPOTENCY_KEY",
    "MAX_MEMORY_BYTES",
    "MAX_PROCEDURE",
    "MAX_PUT_BYTES",
    "MAX_TOPIC",
    "TaskBound",
    "task_limits",
]

MAX_IDEMPOTENCY_KEY: Final = 120
MAX_PROCEDURE: Final = 256  # a procedure name (mesh_call, mesh_serve, mesh_unserve)
MAX_EXEC: Final = 4096  # mesh_serve's command line
MAX_TOPIC: Final = 256  # a pub/sub topic (mesh_publish, mesh_watch)
MAX_PUT_BYTES: Final = 4 * 1024 * 1024  # mesh_put, once decoded
MAX_CONTENT_NAME: Final = 255  # mesh_put's name
MAX_MEMORY_BYTES: Final = MAX_MEMORY_CONTENT_BYTES  # mesh_remember's content

# what the station's house services accept (macula.services.limits, their one home)
STATION_LABEL_CHARS: Final = MAX_LABEL_CHARS
STATION_QUERY_BYTES: Final = MAX_QUERY_BYTES
STATION_PLACE_CHARS: Final = MAX_PLACE_CHARS

MAX_PATH: Final = 4096  # Linux PATH_MAX: a longer directory cannot be opened
ID_CHARS: Final = 64  # a message, ring or task id: 1..64 of [A-Za-z0-9_-]
CURSOR_CHARS: Final = 40  # a page cursor (tools.groups.paging): "s<seq>" or "t<seq>.<offset>"
ROOM_TOPIC_CHARS: Final = max(len("agents.room.") + 32, len(LOBBY_TOPIC))
# a 64-hex node id or a petname <first>_<second>_<noun>_<NNNN>
PEER_CHARS: Final = max(
    2 * 32, sum(len(max(words, key=len)) for words in (FIRST_WORDS, SECOND_WORDS, NOUNS)) + 3 + 4
)
RECORD_TYPE_CHARS: Final = max(len(t.name) for t in RecordType)  # or "0x06", "6"

MAX_PUT_BASE64: Final = (MAX_PUT_BYTES + 2) // 3 * 4  # mesh_put's content: base64 of it
REALM_CHARS: Final = max(MAX_REALM_NAME, 64)  # a realm name or its 64-hex tag
KIND_CHARS: Final = max(len(kind) for kind in TALK_KINDS)
STATE_CHARS: Final = max(len(state) for state in STATES)

# the parameters many tools share, each with its one bound (a tool adds a description with
# ``Annotated[Realm, Field(description=...)]``); idempotency_key, realm and cursor state theirs
# once, in the server instructions (tools.server.schema.LIMIT_SAID_ONCE)
IdempotencyKey = Annotated[str | None, Field(max_length=MAX_IDEMPOTENCY_KEY)]
Realm = Annotated[str | None, Field(max_length=REALM_CHARS)]
Cursor = Annotated[str | None, Field(max_length=CURSOR_CHARS)]
RoomTopic = Annotated[str, Field(max_length=ROOM_TOPIC_CHARS)]
Id = Annotated[str, Field(max_length=ID_CHARS)]  # a task, message or ring id
Peer = Annotated[str, Field(max_length=PEER_CHARS)]  # to, node_id
KeyHex = Annotated[str, Field(max_length=2 * KEY_SIZE)]
Hex64 = Annotated[str, Field(max_length=64)]  # an authority's key
McidHex = Annotated[str, Field(max_length=2 * MCID_SIZE)]


@dataclass(frozen=True)
class TaskBound:
    """In a parameter's ``Annotated``: its text is at most the server's ``TaskLimits.<field>``
    characters (``MACULA_MCP_TASKS_*``), listed as ``maxLength`` and checked at the boundary."""

    field: str

    def of(self, limits: TaskLimits) -> int:
        return int(getattr(limits, self.field))


def task_limits(env: Mapping[str, str]) -> TaskLimits:
    """The task limits ``env`` sets; the defaults if it sets them wrong (the runtime refuses
    to start with them and says why)."""
    try:
        return TaskLimits.from_env(env)
    except ConfigError:
        return TaskLimits()
