"""The argument boundary of every tool (issue 22), through the official MCP client in process,
in both protocol eras, over a real station: text is kept as text however JSON it looks, every
schema-level failure is a structured ``invalid_argument`` naming the parameter, ranges are in the
listed schema, and a task's input and result may be a JSON value that comes back as it went."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from relay.station.station import Station
from support.agentkit import ERROR_KEYS, Agent, agent
from tools.server.server import build_server

pytestmark = pytest.mark.anyio


JSONISH = '{"sum": 6}'  # what a model writes as text all the time
MODES = ["legacy", "2026-07-28"]  # the initialize era and the modern one


@asynccontextmanager
async def pair(station: Station, tmp_path: Path, mode: str) -> AsyncIterator[tuple[Agent, Agent]]:
    async with (
        agent(station, tmp_path / "alice", mode) as alice,
        agent(station, tmp_path / "bob", mode) as bob,
    ):
        yield alice, bob


async def handed(bob: Agent) -> dict[str, Any]:
    waited = await bob.ok("mesh_task_wait", wait_seconds=10)
    assert waited["changed"] == 1, waited
    task: dict[str, Any] = waited["task"]
    return task


async def outcome(alice: Agent, task_id: str) -> dict[str, Any]:
    """The requester's copy once it holds the task's outcome (each wait blocks for a change)."""
    task = await alice.ok("mesh_task_get", task_id=task_id)
    for _ in range(10):
        if task["terminal"]:
            return task
        waited = await alice.ok(
            "mesh_task_wait", task_id=task_id, after_state_seq=task["state_seq"], wait_seconds=10
        )
        task = waited["task"]
    raise AssertionError(f"no outcome: {task}")


@pytest.mark.parametrize("mode", MODES)
async def test_json_looking_text_is_kept_as_text(
    mode: str, station: Station, tmp_path: Path
) -> None:
    async with pair(station, tmp_path, mode) as (alice, bob):
        hello = await alice.ok("mesh_hello", operator_name=JSONISH, message=JSONISH)
        assert hello["profile"]["operator_name"] == JSONISH
        assert hello["profile"]["message"] == JSONISH
        bob_id = (await bob.ok("mesh_hello", operator_name="bob"))["node_id"]

        room = await alice.ok("mesh_open_room", purpose=JSONISH, wait_join_seconds=0.1)
        assert room["purpose"] == JSONISH
        await alice.ok("mesh_say", room_topic=room["room_topic"], text=JSONISH)

        remembered = await alice.ok("mesh_remember", content=JSONISH, source_label=JSONISH)
        assert remembered["source_label"] == JSONISH
        await alice.ok("mesh_recall", query_text=JSONISH)
        # a parameter that cannot take text still has a JSON string parsed for it (as the SDK)
        await alice.ok("mesh_remember", content="tagged", topics='["a", "b"]')
        await alice.ok("mesh_list_stations", continent=JSONISH)
        await alice.ok("mesh_publish", topic="boundary.t", fact=JSONISH)

        sent = await alice.ok("mesh_task_send", to=bob_id, title=JSONISH, input=JSONISH)
        assert (sent["title"], sent["input"]) == (JSONISH, JSONISH)
        task = await handed(bob)
        assert (task["title"], task["input"]) == (JSONISH, JSONISH)  # the receiver sees text
        await bob.ok("mesh_task_update", task_id=task["task_id"], state="working", note=JSONISH)
        done = await bob.ok("mesh_task_complete", task_id=task["task_id"], result=JSONISH)
        assert done["result"] == JSONISH
        assert (await outcome(alice, task["task_id"]))["result"] == JSONISH  # not {"sum": 6}

        second = await alice.ok("mesh_task_send", to=bob_id, title="t", input="x")
        await alice.ok("mesh_task_cancel", task_id=second["task_id"], reason=JSONISH)


# (tool, arguments, what the detail must name)
SCHEMA_FAILURES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("mesh_say", {"room_topic": "agents.room." + "ab" * 16, "text": 123}, ["text: "]),
    ("mesh_say", {"room_topic": ["x"], "text": {"a": 1}}, ["room_topic: ", "text: "]),
    ("mesh_hello", {"message": {"status": "ready"}}, ["message: "]),
    ("mesh_task_list", {"limit": "many"}, ["limit: "]),
    ("mesh_task_complete", {"task_id": 7, "result": "r"}, ["task_id: "]),
    ("mesh_open_room", {"participants": "alice", "public": "yes"}, ["participants: ", "public: "]),
    ("mesh_remember", {"content": "c", "topics": 5}, ["topics: "]),
    ("mesh_publish", {"topic": {"t": 1}, "fact": 1}, ["topic: "]),
    ("mesh_task_get", {"task_id": "a" * 32, "verbose": 1}, ["verbose: unknown parameter"]),
    ("mesh_say", {"text": "hi"}, ["room_topic: required"]),
    ("mesh_task_get", {}, ["task_id: required"]),
    ("mesh_task_list", {"offset": 2**63}, ["offset: "]),
    ("mesh_task_list", {"offset": -1, "limit": 101}, ["offset: ", "limit: "]),
    ("mesh_task_wait", {"wait_seconds": 10**9}, ["wait_seconds: "]),
    ("mesh_agents", {"offset": 2**64}, ["offset: "]),
    ("mesh_call", {"procedure": "p", "timeout_ms": 2**63}, ["timeout_ms: "]),
]


@pytest.mark.parametrize("mode", MODES)
async def test_schema_failures_are_structured_and_name_the_parameter(
    mode: str, station: Station, tmp_path: Path
) -> None:
    async with agent(station, tmp_path / "alice", mode) as alice:
        for tool, args, named in SCHEMA_FAILURES:
            error = await alice.refused(tool, **args)
            assert set(error) == ERROR_KEYS | {"problems"}, error  # at the boundary
            assert "; ".join(error["problems"]) == error["detail"]
            assert (error["code"], error["retryable"]) == ("invalid_argument", 0), (tool, error)
            for name in named:
                assert name in error["detail"], (tool, args, error["detail"])
            assert "validation error" not in error["detail"], error
        flood = {"x" * 10_000: 1} | {f"p{i}": 1 for i in range(30)}
        many = await alice.refused("mesh_task_get", task_id="a" * 32, **flood)
        assert "and 11 more" in many["detail"] and len(many["detail"]) < 1000, many
        edge = await alice.ok("mesh_task_list", offset=2**63 - 1, limit=100)  # the last valid
        assert edge["tasks"] == [], edge
        unknown = await alice.refused("mesh_no_such_tool")
        assert unknown["code"] == "unknown_tool"


async def test_listed_schemas_carry_the_ranges() -> None:
    tools = {tool.name: tool for tool in await build_server({}).list_tools()}
    listing = tools["mesh_task_list"].input_schema["properties"]
    assert (listing["limit"]["minimum"], listing["limit"]["maximum"]) == (1, 100)
    assert (listing["offset"]["minimum"], listing["offset"]["maximum"]) == (0, 2**63 - 1)
    wait = tools["mesh_task_wait"].input_schema["properties"]["wait_seconds"]
    assert (wait["exclusiveMinimum"], wait["maximum"]) == (0, 3600)
    for name, tool in tools.items():
        for param, spec in tool.input_schema["properties"].items():
            if spec.get("type") == "integer":
                assert "maximum" in spec or "enum" in spec, (name, param)


@pytest.mark.parametrize("mode", MODES)
async def test_task_input_and_result_objects_round_trip(
    mode: str, station: Station, tmp_path: Path
) -> None:
    asked: dict[str, Any] = {"numbers": [1, 2, 3], "op": "sum", "note": None}
    answer: dict[str, Any] = {"sum": 6, "parts": [{"n": 1}, {"n": 2}, {"n": 3}]}
    async with pair(station, tmp_path, mode) as (alice, bob):
        await alice.ok("mesh_hello", operator_name="alice")
        bob_id = (await bob.ok("mesh_hello", operator_name="bob"))["node_id"]
        sent = await alice.ok("mesh_task_send", to=bob_id, title="add them", input=asked)
        assert sent["input"] == asked and sent["delivered"] == 1
        task = await handed(bob)
        assert task["input"] == asked  # the receiver's view: the object, not its JSON text
        assert (await bob.ok("mesh_task_get", task_id=task["task_id"]))["input"] == asked
        await bob.ok("mesh_task_complete", task_id=task["task_id"], result=answer)
        assert (await outcome(alice, task["task_id"]))["result"] == answer
        got = await alice.ok("mesh_task_get", task_id=task["task_id"])
        assert (got["input"], got["result"]) == (asked, answer)

        listed = await alice.ok("mesh_task_send", to=bob_id, title="a list", input=[1, "two", 3.5])
        assert listed["input"] == [1, "two", 3.5]
        assert (await handed(bob))["input"] == [1, "two", 3.5]

        flag = await alice.refused("mesh_task_send", to=bob_id, title="t", input={"ok": True})
        assert flag["code"] == "invalid_argument" and "input.ok: " in flag["detail"]
        assert "0/1" in flag["detail"]
        answer_data = await alice.refused("mesh_task_send", task_id=sent["task_id"], input=[1])
        assert "input: an answer to a question (task_id given) is text" in answer_data["detail"]
        huge = await alice.refused(
            "mesh_task_send", to=bob_id, title="t", input={"x": "a" * 17_000}
        )
        assert "input: " in huge["detail"] and "16384" in huge["detail"]


WRONG = {"string": {"not": "text"}, "integer": "x", "number": "x", "array": 5, "object": 5}


async def test_every_tool_names_a_wrongly_typed_parameter(station: Station, tmp_path: Path) -> None:
    """The fuzz finding, for every typed parameter of every listed tool: a value of the wrong
    type is a structured invalid_argument naming it, never the SDK's text."""
    checked = 0
    async with agent(station, tmp_path / "alice", "legacy") as alice:
        for tool in (await alice.client.list_tools()).tools:
            for param, spec in tool.input_schema.get("properties", {}).items():
                if spec.get("type") not in WRONG:
                    continue  # untyped (any JSON value) or a union of types
                error = await alice.refused(tool.name, **{param: WRONG[spec["type"]]})
                assert set(error) == ERROR_KEYS | {"problems"}, error
                assert error["code"] == "invalid_argument", error
                assert f"{param}: " in error["detail"], (tool.name, param, error["detail"])
                checked += 1
    assert checked >= 100, checked


async def test_a_house_service_answers_only_in_the_house_realm(
    station: Station, tmp_path: Path
) -> None:
    """docs/client.md: in the zero realm a house service is an unknown procedure (0x01), and
    the error says where it lives; in realm macula.house it answers."""
    query = {"procedure": "macula.memory.query_v1", "args": {"query_text": "x", "top_k": 1}}
    async with agent(station, tmp_path / "alice", "legacy") as alice:
        zero = await alice.refused("mesh_call", **query)
        assert zero["code"] == "unknown_next_peer", zero
        assert "realm macula.house" in zero["next_action"]
        house = await alice.ok("mesh_call", realm="macula.house", **query)
        assert house["result"] == {"hits": []}, house
