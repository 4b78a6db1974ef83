"""Every text parameter of every MCP tool is listed with its ``maxLength`` (or, for the three
shared ones, stated once in the instructions), every integer with its range (declared in the
tool's signature, named in ``tools.groups.text_limits``), and the limits are the ones enforced: the
station's own (relay/house) and the task limits the environment sets."""

from __future__ import annotations

import asyncio
from typing import Any, get_args

from macula.services import limits
from tools.groups import text_limits
from tools.server.schema import LIMIT_SAID_ONCE
from tools.server.schema import SHARED as SHARED_RULES
from tools.server.server import INSTRUCTIONS, build_server


def listed(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    tools = asyncio.run(build_server(env).list_tools())
    return {tool.name: tool.input_schema for tool in tools}


def arms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("anyOf", [spec]))


def test_every_string_has_a_max_length_and_every_integer_a_range() -> None:
    strings = integers = 0
    for tool, schema in listed({"MACULA_HOME": "/nonexistent"}).items():
        for name, spec in schema["properties"].items():
            kinds = {arm.get("type") for arm in arms(spec)}
            json_value = {"array", "object"} <= kinds  # any JSON value: bounded in bytes inside
            for arm in arms(spec):
                if arm.get("type") == "string" and name in LIMIT_SAID_ONCE:
                    assert "maxLength" not in arm, (tool, name)  # said once, in the instructions
                elif arm.get("type") == "string":
                    assert isinstance(arm.get("maxLength"), int), (tool, name, spec)
                    assert arm["maxLength"] > 0, (tool, name)
                    strings += 1
                if arm.get("type") == "integer" and not json_value:
                    bounded = "enum" in arm or (
                        ("minimum" in arm or "exclusiveMinimum" in arm) and "maximum" in arm
                    )
                    assert bounded, (tool, name, spec)
                    integers += 1
    assert strings >= 55 and integers >= 20, (strings, integers)


def test_a_limit_said_once_is_the_enforced_one_and_in_the_instructions() -> None:
    """``idempotency_key`` and ``realm`` (23 and 10 tools) carry no ``maxLength`` of their own:
    the server instructions state the limit the argument boundary enforces, once."""
    declared = {
        name: next(m.max_length for m in get_args(alias)[1].metadata)
        for name, alias in (
            ("idempotency_key", text_limits.IdempotencyKey),
            ("realm", text_limits.Realm),
            ("cursor", text_limits.Cursor),
        )
    }
    assert declared == LIMIT_SAID_ONCE
    for name, limit in LIMIT_SAID_ONCE.items():
        assert f"{limit} chars" in SHARED_RULES[name] and SHARED_RULES[name] in INSTRUCTIONS


def test_the_listed_lengths_are_the_enforced_ones() -> None:
    schemas = listed({"MACULA_HOME": "/nonexistent"})
    assert schemas["mesh_publish"]["properties"]["topic"]["maxLength"] == 256
    assert schemas["mesh_call"]["properties"]["procedure"]["maxLength"] == 256
    assert schemas["mesh_say"]["properties"]["room_topic"]["maxLength"] == len(
        "agents.room." + "0" * 32
    )
    assert schemas["mesh_put"]["properties"]["content"]["maxLength"] == 5_592_408
    record_type = schemas["mesh_find_records_by_type"]["properties"]["record_type"]
    [integer] = [arm for arm in record_type["anyOf"] if arm["type"] == "integer"]
    assert (integer["minimum"], integer["maximum"]) == (1, 255)
    # the station's limits, taken from their one home (macula.services.limits)
    assert text_limits.STATION_LABEL_CHARS == limits.MAX_LABEL_CHARS
    assert text_limits.STATION_QUERY_BYTES == limits.MAX_QUERY_BYTES
    assert text_limits.STATION_PLACE_CHARS == limits.MAX_PLACE_CHARS


def test_task_limits_follow_the_environment() -> None:
    env = {"MACULA_HOME": "/nonexistent", "MACULA_MCP_TASKS_MAX_TITLE_CHARS": "50"}
    send = listed(env)["mesh_task_send"]["properties"]
    assert send["title"]["maxLength"] == 50
    [text] = [arm for arm in send["input"]["anyOf"] if arm["type"] == "string"]
    assert text["maxLength"] == 16 * 1024
