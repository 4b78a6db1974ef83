"""The switchable tools, by group, and the three presets: the table the owner's policy is read
against (``tools.owner.policy``).

Invariants:
- ``GROUP_TOOLS`` is the server's own grouping (one group per module of ``tools.server.server.
  GROUPS``, named by the module): a unit test holds it equal to what ``build_server`` registers,
  so a tool added later must be placed here, and is off in ``read-only`` and ``talk`` until it
  is listed in their tables (a new tool never slips into a narrower preset by default);
- every tool is switchable: nothing the model can call stays on when the owner turns it off or
  when the file is malformed (``mesh://status`` and ``mesh://policy`` are resources, not tools:
  they still say why);
- ``read-only`` holds only tools that neither write to the mesh nor serve: reading the inbox,
  rooms, rings, tasks, memory, content and records, and waiting for them (read marks and lobby
  observation are local state of this agent, not writes to the mesh);
- ``talk`` is ``read-only`` plus the presence, rooms and rings groups whole;
- ``full`` is every tool (today's behaviour; the default, also with no file).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

GROUP_TOOLS: Final[Mapping[str, tuple[str, ...]]] = {
    "rpc": ("mesh_call", "mesh_serve", "mesh_unserve"),
    "pubsub": ("mesh_publish", "mesh_watch"),
    "content": ("mesh_put", "mesh_get"),
    "dht": ("mesh_find_record", "mesh_find_records", "mesh_find_records_by_type"),
    "presence": (
        "mesh_hello", "mesh_agents", "mesh_goodbye", "mesh_observe_lobby",
        "mesh_lobby_transcript", "mesh_unobserve_lobby",
    ),
    "rooms": (
        "mesh_open_room", "mesh_join_room", "mesh_leave_room", "mesh_rooms", "mesh_say",
        "mesh_wait_room", "mesh_read_inbox",
    ),
    "rings": (
        "mesh_ring", "mesh_answer_ring", "mesh_wait_ring", "mesh_trust_agent",
        "mesh_untrust_agent",
    ),
    "memory": (
        "mesh_remember", "mesh_recall", "mesh_remember_directory", "mesh_list_stations",
        "mesh_search",
    ),
    "reservations": ("mesh_reserve_paths", "mesh_release_paths", "mesh_reservations"),
    "realms": ("mesh_join_realm", "mesh_list_realms"),
    "tasks": (
        "mesh_task_send", "mesh_task_cancel", "mesh_task_wait", "mesh_task_get",
        "mesh_task_list", "mesh_task_update", "mesh_task_complete",
    ),
    "audit": ("mesh_audit",),
    "approvals": ("mesh_approvals",),
}  # fmt: skip

TOOL_GROUP: Final[Mapping[str, str]] = {
    tool: group for group, tools in GROUP_TOOLS.items() for tool in tools
}
ALL_TOOLS: Final = frozenset(TOOL_GROUP)

READ_ONLY: Final = frozenset(
    {
        # presence: who is here, what central said
        "mesh_agents", "mesh_observe_lobby", "mesh_unobserve_lobby", "mesh_lobby_transcript",
        # rooms: what arrived (read marks are local), waiting for it
        "mesh_rooms", "mesh_read_inbox", "mesh_wait_room",
        # rings: waiting for one (answering it joins a room: talk)
        "mesh_wait_ring",
        # tasks: reading and waiting, never sending, updating or completing
        "mesh_task_wait", "mesh_task_get", "mesh_task_list",
        # memory, search, stations, reservations, realms: reading
        "mesh_recall", "mesh_search", "mesh_list_stations", "mesh_reservations",
        "mesh_list_realms",
        # content, records, topics: fetching and watching
        "mesh_get", "mesh_find_record", "mesh_find_records", "mesh_find_records_by_type",
        "mesh_watch",
        # what the owner keeps: the audit trail, what waits for approval (metadata only)
        "mesh_audit", "mesh_approvals",
    }
)  # fmt: skip

TALK: Final = READ_ONLY | frozenset(
    GROUP_TOOLS["presence"] + GROUP_TOOLS["rooms"] + GROUP_TOOLS["rings"]
)

PRESETS: Final[Mapping[str, frozenset[str]]] = {
    "full": ALL_TOOLS,
    "talk": TALK,
    "read-only": READ_ONLY,
}
DEFAULT_PRESET: Final = "full"
