"""How long each text parameter of each MCP tool may be: one table, listed and enforced.

``tools/list`` shows every string parameter with its ``maxLength`` (``tools.tool_schema``
puts it there from ``limits``), and every call crosses ``tools.tool_arguments``, which refuses
a longer string as ``invalid_argument`` ``"<parameter>: at most N characters"`` before the tool
runs. So what a client reads is what is enforced.

Invariants:
- each limit is the one the tool (or what it calls) already enforces, in characters: a limit
  counted in UTF-8 bytes (a room message, a memory, a task's values) is listed as that many
  characters, which is never tighter than the bytes check that still runs inside;
- the task limits follow ``MACULA_MCP_TASKS_*`` (``TaskLimits.from_env``), so ``limits(env)``
  is computed once per server from its environment;
- a parameter that takes text or a JSON value (a task's ``input``/``result``, a record type
  given by name or number) has its text arm bounded;
- no imports from the tool modules (they import their limits from here): no cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from macula.agent.envelope import LOBBY_TOPIC, MAX_PURPOSE_CHARS, MAX_TEXT_BYTES, TALK_KINDS
from macula.agent.petnames import FIRST_WORDS, NOUNS, SECOND_WORDS
from macula.agent.presence import MAX_TEXT
from macula.agent.proof import MAX_REASON_CHARS
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
    "limits",
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
CURSOR_CHARS: Final = 40  # a page cursor (tools.paging): "s<seq>" or "t<seq>.<offset>"
ROOM_TOPIC_CHARS: Final = max(len("agents.room.") + 32, len(LOBBY_TOPIC))
# a 64-hex node id or a petname <first>_<second>_<noun>_<NNNN>
PEER_CHARS: Final = max(
    2 * 32, sum(len(max(words, key=len)) for words in (FIRST_WORDS, SECOND_WORDS, NOUNS)) + 3 + 4
)
RECORD_TYPE_CHARS: Final = max(len(t.name) for t in RecordType)  # or "0x06", "6"

# parameter name -> limit, wherever the name is used
SHARED: Final[Mapping[str, int]] = {
    "idempotency_key": MAX_IDEMPOTENCY_KEY,
    "realm": max(MAX_REALM_NAME, 64),  # a realm name or its 64-hex tag
    "room_topic": ROOM_TOPIC_CHARS,
    "task_id": ID_CHARS,
    "in_reply_to": ID_CHARS,
    "after_message_id": ID_CHARS,
    "cursor": CURSOR_CHARS,
    "ring_id": ID_CHARS,
    "to": PEER_CHARS,
    "node_id": PEER_CHARS,
    "key_hex": 2 * KEY_SIZE,
    "authority": 64,
    "mcid_hex": 2 * MCID_SIZE,
}

# (tool, parameter) -> limit, for names that mean different things in different tools
BY_TOOL: Final[Mapping[tuple[str, str], int]] = {
    ("mesh_call", "procedure"): MAX_PROCEDURE,
    ("mesh_serve", "name"): MAX_PROCEDURE,
    ("mesh_serve", "exec"): MAX_EXEC,
    ("mesh_serve", "allow"): len("allowlist"),  # "open" or "allowlist"
    ("mesh_unserve", "name"): MAX_PROCEDURE,
    ("mesh_publish", "topic"): MAX_TOPIC,
    ("mesh_watch", "topic"): MAX_TOPIC,  # longer can never be published by mesh_publish
    ("mesh_put", "content"): (MAX_PUT_BYTES + 2) // 3 * 4,  # base64 of MAX_PUT_BYTES
    ("mesh_put", "name"): MAX_CONTENT_NAME,
    ("mesh_find_records_by_type", "record_type"): RECORD_TYPE_CHARS,
    ("mesh_hello", "operator_name"): MAX_TEXT,
    ("mesh_hello", "message"): MAX_TEXT,
    ("mesh_hello", "model"): MAX_TEXT,
    ("mesh_hello", "session_name"): MAX_TEXT,
    ("mesh_lobby_transcript", "topic"): ROOM_TOPIC_CHARS,
    ("mesh_open_room", "purpose"): MAX_PURPOSE_CHARS,
    ("mesh_ring", "purpose"): MAX_PURPOSE_CHARS,
    ("mesh_answer_ring", "reason"): MAX_REASON_CHARS,
    ("mesh_say", "text"): MAX_TEXT_BYTES,
    ("mesh_say", "kind"): max(len(kind) for kind in TALK_KINDS),
    ("mesh_remember", "content"): MAX_MEMORY_BYTES,
    ("mesh_remember", "source_label"): STATION_LABEL_CHARS,
    ("mesh_recall", "query_text"): STATION_QUERY_BYTES,
    ("mesh_remember_directory", "directory"): MAX_PATH,
    ("mesh_remember_directory", "source_prefix"): STATION_LABEL_CHARS,
    ("mesh_list_stations", "continent"): STATION_PLACE_CHARS,
    ("mesh_list_stations", "country"): STATION_PLACE_CHARS,
    ("mesh_list_stations", "city"): STATION_PLACE_CHARS,
    ("mesh_join_realm", "realm"): MAX_REALM_NAME,
    ("mesh_task_list", "role"): len("requester"),  # "requester" or "assignee"
    ("mesh_task_list", "state"): max(len(state) for state in STATES),
    ("mesh_task_update", "state"): len("input_required"),  # "working" or "input_required"
}


def limits(env: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """Every (tool, parameter) limit but the shared ones, the task limits from ``env``."""
    try:
        tasks = TaskLimits.from_env(env)
    except ConfigError:  # the runtime refuses to start with it and says why
        tasks = TaskLimits()
    return {
        **BY_TOOL,
        ("mesh_task_send", "title"): tasks.max_title_chars,
        ("mesh_task_send", "input"): tasks.max_input_bytes,
        ("mesh_task_cancel", "reason"): tasks.max_note_bytes,
        ("mesh_task_update", "note"): tasks.max_note_bytes,
        ("mesh_task_complete", "result"): tasks.max_result_bytes,
        ("mesh_task_complete", "error"): tasks.max_note_bytes,
    }


def limit_of(table: Mapping[tuple[str, str], int], tool: str, parameter: str) -> int | None:
    """The longest text ``parameter`` of ``tool`` takes, or None if it takes no text."""
    return table.get((tool, parameter), SHARED.get(parameter))
