"""``tools/list`` stays small (issue 15) without losing a caveat: its size in both description
modes, the phrases each tool must keep, the compacted schemas and the annotation hints."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from mcp_types import ListToolsResult, Tool

from tools.server.context import hints
from tools.server.schema import SHARED, TERSE_KEPT, compact
from tools.server.server import INSTRUCTIONS, build_server
from tools.server.tool_search import ALWAYS_LOADED

pytestmark = pytest.mark.anyio

# bytes of JSON, as scripts/mcp_surface.py measures them; 30,000 until the five kept-loaded
# tools carried their `_meta` (~190 bytes, tools/server/tool_search.py) and every integer its range;
# 30,250 / 20,000 until every text parameter carried its maxLength (~95 of them, ~1.5 KB;
# tools/groups/text_limits.py), the "<= 280 chars" they replace dropped from the descriptions;
# 31,750 / 21,000 until mesh_ring gained wait_answer_seconds and mesh_read_inbox named
# from_person (the console's person mark): 31,900 / 21,033 measured then
# until stop 35 the figure was json.dumps of the parsed tools (", " and ": " between items:
# 31,900 / 21,033 bytes then); now the bytes the server sends (30,366 / 19,579 at the same
# commit), the goals of issue 15 as budgets, after the limits of idempotency_key and realm
# (23 and 10 schemas) moved into the one rule the instructions state for each;
# 34,000 / 22,000 since issue 40 (mesh_search: 31,070 / 19,899 measured when it came; with the
# three reservation tools too: see the note of issue 40);
# 34,853 / 22,621 since issue 39's mesh_audit: raised by exactly what it costs (853 / 621 bytes:
# 33,167 / 21,235 measured before it, 34,020 / 21,856 with it); with issue 39's approval queue
# (mesh_approvals, pending_owner_approval in the task-state parameters: +672 / +396) and issue
# 42's A2A agents in mesh_task_send (+110 / +1), 34,802 / 22,253 measured, within them
FULL_BUDGET = 34_853
TERSE_BUDGET = 22_621

# tool -> phrases (lowercase) its description or parameter descriptions must keep, full and terse
CAVEATS: dict[str, tuple[str, ...]] = {
    "mesh_call": ("may act", "idempotency_key", "unknown_next_peer", "no booleans"),
    "mesh_serve": (
        "stranger", "stdin only", "no shell", "process group killed", "max 60", "1 mib",
        "macula_caller", "allowlist", "1: also list it in the dht",
    ),
    "mesh_publish": ("no ack", "no booleans"),
    "mesh_watch": ("authenticated", "3600", "missed", "gaps"),
    "mesh_put": ("never put secrets", "4 mib", "your own station", "strict base64"),
    "mesh_get": ("verified", "12288", "too_large", "content_invalid"),
    "mesh_find_record": ("verified",),
    "mesh_find_records": ("verified",),
    "mesh_find_records_by_type": ("verified",),
    "mesh_hello": ("public", "unverified", "secrets"),
    "mesh_agents": ("proves nothing", "self-reported"),
    "mesh_goodbye": ("for everyone", "only mesh_hello"),
    "mesh_observe_lobby": ("not joining",),
    "mesh_lobby_transcript": ("untrusted",),
    "mesh_open_room": (
        "unguessable, not encrypted", "no secrets", "nobody invited you", "private 1",
        "end-to-end", "1: also announce it on central",
    ),
    "mesh_join_room": ("nobody invited you", "unguessable, not encrypted"),
    "mesh_leave_room": ("for everyone", "opener", "private room you opened"),
    "mesh_say": (
        "nobody invited you", "unguessable, not encrypted", "no secrets", "16 kib",
        "in_reply_to",
    ),
    "mesh_wait_room": ("untrusted", "3600"),
    "mesh_read_inbox": ("untrusted", "peek", "1: leave read marks alone"),
    "mesh_ring": (
        "nobody invited you", "unguessable, not encrypted", "private 1",
        "one ring per callee every 2 s",
    ),
    "mesh_answer_ring": ("node_id and purpose", "1 accept (join), 2 decline"),
    "mesh_wait_ring": ("3600", "yours to answer"),
    "mesh_trust_agent": ("trust only", "node id", "closed still declines", "local"),
    "mesh_untrust_agent": ("local",),
    "mesh_remember": ("shared, not private", "never store secrets", "this station"),
    "mesh_reserve_paths": ("advisory", "per station", "nothing reserved", "renew"),
    "mesh_recall": ("untrusted", "this station"),
    "mesh_remember_directory": ("shared, not private", "never store secrets"),
    "mesh_join_realm": ("show the code only to",),
    "mesh_list_realms": ("credential",),
    "mesh_task_send": ("idempotency_key", "16 kb"),
    "mesh_task_cancel": ("not reversible",),
    "mesh_task_get": ("untrusted",),
    "mesh_task_update": ("untrusted", "mesh_task_complete"),
    "mesh_task_complete": ("refused", "once"),
    "mesh_task_wait": ("3600",),
    "mesh_search": ("your own", "local only", "untrusted", "no operators"),
    "mesh_approvals": ("read-only", "owner"),
}  # fmt: skip


async def listed(terse: bool) -> list[dict[str, Any]]:
    """The tools as a client holds them after ``tools/list`` (wire JSON parsed back)."""
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": "1" if terse else "0"}
    tools = await build_server(env).list_tools()
    wire = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    return [Tool.model_validate(t).model_dump(mode="json", exclude_none=True) for t in wire]


async def size(terse: bool) -> int:
    """The bytes of the ``tools/list`` result as the server sends it: the SDK's compact JSON
    (a raw stdio read of a real ``macula-mcp`` agrees within 25 bytes: scripts/mcp_surface.py)."""
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": "1" if terse else "0"}
    result = ListToolsResult(tools=await build_server(env).list_tools())
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


def visible(tool: dict[str, Any]) -> str:
    """What a model reads about one tool: its description and its parameters' descriptions."""
    params = tool["input_schema"].get("properties", {}).values()
    return " ".join([tool["description"], *(p.get("description", "") for p in params)]).lower()


# the tools Claude Code's tool search keeps loaded (tools/server/tool_search.py), full: issue 40's
# budget (5,504 measured before it, 5,484 once mesh_hello dropped a "<= 280 chars" its
# schema's maxLength says)
ALWAYS_LOADED_BUDGET = 5_500


@pytest.mark.parametrize("terse", [False, True])
async def test_the_always_loaded_tools_fit_their_budget(terse: bool) -> None:
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TERSE_TOOLS": "1" if terse else "0"}
    kept = [t for t in await build_server(env).list_tools() if t.name in ALWAYS_LOADED]
    assert len(kept) == len(ALWAYS_LOADED)
    measured = len(ListToolsResult(tools=kept).model_dump_json(by_alias=True, exclude_none=True))
    assert measured <= ALWAYS_LOADED_BUDGET, (terse, measured)


@pytest.mark.parametrize(("terse", "budget"), [(False, FULL_BUDGET), (True, TERSE_BUDGET)])
async def test_tools_list_fits_its_budget(terse: bool, budget: int) -> None:
    measured = await size(terse)
    assert measured <= budget, (terse, measured)


@pytest.mark.parametrize("terse", [False, True])
async def test_every_caveat_survives(terse: bool) -> None:
    tools = {tool["name"]: tool for tool in await listed(terse)}
    assert CAVEATS.keys() <= tools.keys()
    lost = [
        (name, phrase)
        for name, phrases in CAVEATS.items()
        for phrase in phrases
        if phrase not in visible(tools[name])
    ]
    assert not lost, lost


async def test_terse_keeps_only_named_parameter_descriptions_and_they_exist() -> None:
    full = {tool["name"]: tool for tool in await listed(False)}
    terse = {tool["name"]: tool for tool in await listed(True)}
    for name, param in TERSE_KEPT:
        assert full[name]["input_schema"]["properties"][param]["description"], (name, param)
        kept = terse[name]["input_schema"]["properties"][param]
        assert kept["description"] == full[name]["input_schema"]["properties"][param]["description"]
    for name, tool in terse.items():
        for param, spec in tool["input_schema"]["properties"].items():
            assert "description" not in spec or (name, param) in TERSE_KEPT, (name, param)


async def test_shared_parameters_are_explained_once_in_the_instructions() -> None:
    for rule in SHARED.values():
        assert rule in INSTRUCTIONS
    tools = await listed(False)
    for tool in tools:
        for param, spec in tool["input_schema"]["properties"].items():
            if param == "idempotency_key":
                assert "description" not in spec, tool["name"]
    names = {t["name"] for t in tools if "idempotency_key" in t["input_schema"]["properties"]}
    assert {"mesh_call", "mesh_serve", "mesh_say", "mesh_task_send"} <= names


async def test_schemas_are_compact_and_keep_types_defaults_and_required() -> None:
    for tool in await listed(False):
        schema = tool["input_schema"]
        assert "title" not in schema, tool["name"]
        for spec in schema["properties"].values():
            assert "title" not in spec and {"type": "null"} not in spec.get("anyOf", []), tool
            # a null default stays only where null is a value (an untyped JSON payload)
            assert "type" not in spec or spec.get("default", 0) is not None, tool["name"]
    serve = next(t for t in await listed(False) if t["name"] == "mesh_serve")["input_schema"]
    assert serve["required"] == ["name", "exec"]
    assert serve["properties"]["realm"] == {"type": "string"}  # its limit: said once (SHARED)
    assert serve["properties"]["rate_per_minute"]["default"] == 60


def test_compact_drops_titles_and_null_options_only() -> None:
    schema = {
        "title": "fArguments",
        "type": "object",
        "properties": {
            "a": {"title": "A", "type": "integer", "default": 1, "description": "d"},
            "b": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "B"},
            "c": {"anyOf": [{"items": {"type": "string"}, "type": "array"}, {"type": "null"}]},
            "d": {"anyOf": [{"type": "string"}, {"type": "integer"}], "title": "D"},
            "e": {"anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}]},
            "title": {"type": "string", "title": "Title"},  # a parameter named title stays
        },
        "required": ["a"],
    }
    assert compact(schema) == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "default": 1, "description": "d"},
            "b": {"type": "string"},
            "c": {"items": {"type": "string"}, "type": "array"},
            "d": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "e": {"anyOf": [{"type": "string"}, {"type": "array"}]},
            "title": {"type": "string"},
        },
        "required": ["a"],
    }


DEFAULTS = {
    "read_only_hint": False,
    "destructive_hint": True,
    "idempotent_hint": False,
    "open_world_hint": True,
}  # fmt: skip  (the MCP specification's)


@pytest.mark.parametrize("flags", list(itertools.product((False, True), repeat=4)))
def test_hints_mean_what_was_declared(flags: tuple[bool, bool, bool, bool]) -> None:
    read_only, destructive, idempotent, open_world = flags
    declared = hints(
        read_only=read_only, destructive=destructive, idempotent=idempotent, open_world=open_world
    )
    effective = {
        name: default if getattr(declared, name) is None else getattr(declared, name)
        for name, default in DEFAULTS.items()
    }
    assert effective["read_only_hint"] is read_only
    assert effective["open_world_hint"] is open_world
    if not read_only:  # destructive and idempotent mean something only on a tool that writes
        assert declared.destructive_hint is destructive  # always stated, never left to a default
        assert effective["idempotent_hint"] is idempotent
