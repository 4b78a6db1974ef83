"""A task's input and result as text or a JSON value: kept as given by the store on a real
SQLite file (across a reopen, and from a store written before values were possible), their
shape rules and the size their bound counts."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from pathlib import Path
from typing import Any, TypeVar

import pytest

from macula.agent.task_messages import TaskLimits, update_body
from macula.store.task_values import (
    MAX_DEPTH,
    decode,
    encode,
    value_bytes,
    value_of,
    value_problems,
)
from macula.store.tasks import Task, TaskStore
from support.running import run

T = TypeVar("T")
ME = b"\x01" * 32
PEER = b"\x02" * 32
NOW = 1_700_000_000_000


VALUES: list[Any] = [
    '{"sum": 6}',  # text that looks like JSON stays text
    "[1, 2]",
    "",
    {"numbers": [1, 2, 3], "op": "sum", "missing": None, "deep": {"a": [{"b": "c"}]}},
    [1, "two", 3.5, None, {}],
    0,
    -7,
    2.5,
    {},
    [],
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_encode_and_decode_are_inverse_and_keep_the_form(value: Any) -> None:
    text, is_json = encode(value)
    assert is_json == int(not isinstance(value, str))
    back = decode(text, is_json)
    assert back == value and type(back) is type(value)


def test_values_round_trip_through_the_store_as_given(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"
    asked = {"numbers": [1, 2, 3], "note": None}
    answer = [{"sum": 6}, "done"]

    async def main() -> None:
        async with await TaskStore.open(path) as store:
            for i, value in enumerate(VALUES):
                made = Task.new(f"t{i}", "assignee", PEER, "title", value, delivered=1)
                stored = await store.create(ME, made, NOW, max_open_per_peer=100)
                assert stored.input == value
            await store.create(
                ME, Task.new("ask", "assignee", PEER, "t", asked), NOW, max_open_per_peer=100
            )
            done = await store.transition(
                ME, "ask", "completed", NOW + 1, by="assignee", result=answer
            )
            assert done.result == answer
            await store.create(
                ME, Task.new("sent", "requester", PEER, "t", "x"), NOW, max_open_per_peer=100
            )
            update = update_body(done) | {"task_id": "sent"}
            moved, applied = await store.apply_remote(ME, PEER, "sent", update, NOW + 2)
            assert applied == 1 and moved is not None and moved.result == answer
        async with await TaskStore.open(path) as store:  # after a restart
            for i, value in enumerate(VALUES):
                got = await store.get(ME, f"t{i}")
                assert got is not None and got.input == value
                assert type(got.input) is type(value)
            ask = await store.get(ME, "ask")
            assert ask is not None and (ask.input, ask.result) == (asked, answer)
            sent = await store.get(ME, "sent")
            assert sent is not None and sent.result == answer
            listed = await store.list_tasks(ME, limit=100)
            assert {t.task_id: t.input for t in listed}["ask"] == asked

    run(main())


class StoreBeforeValues(TaskStore):
    MIGRATIONS = TaskStore.MIGRATIONS[:1]  # the schema before input/result could be values


def test_rows_written_before_values_stay_text(tmp_path: Path) -> None:
    path = tmp_path / "tasks.sqlite3"

    async def main() -> None:
        async with await StoreBeforeValues.open(path):
            pass  # the schema as it was: no input_json/result_json columns
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "INSERT INTO tasks (owner, task_id, role, peer, title, input, state, state_seq,"
                " delivered, cancel_requested, created_ms, updated_ms)"
                " VALUES (?, 'old', 'assignee', ?, 't', '{\"a\": 1}', 'submitted', 1, 1, 0, ?, ?)",
                (ME, PEER, NOW, NOW),
            )
        async with await TaskStore.open(path) as store:  # migrated on open
            got = await store.get(ME, "old")
            assert got is not None and got.input == '{"a": 1}'  # text, as it was written
            done = await store.transition(
                ME, "old", "completed", NOW, by="assignee", result={"a": 2}
            )
            assert done.result == {"a": 2}
        async with await TaskStore.open(path) as store:
            again = await store.get(ME, "old")
            assert again is not None and (again.input, again.result) == ('{"a": 1}', {"a": 2})

    run(main())


def test_value_shapes_are_checked_naming_the_path() -> None:
    assert value_problems("input", {"a": [1, {"ok": True}]}) == [
        "input.a[1].ok: booleans are not allowed; use 0/1"
    ]
    assert value_problems("result", True) == ["result: booleans are not allowed; use 0/1"]
    assert value_problems("input", None) == ["input: null is not a value (omit it instead)"]
    assert value_problems("input", [math.nan]) == ["input[0]: a number must be finite"]
    assert value_problems("input", {1: "x"}) == ["input: object keys must be text"]
    assert value_problems("input", {"b": b"x"}) == [
        "input.b: expected text or a JSON value, not bytes"
    ]
    deep: Any = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert value_problems("input", deep) == [
        "input" + "[0]" * MAX_DEPTH + f": nested deeper than {MAX_DEPTH} levels"
    ]
    for good in VALUES:
        assert value_problems("input", good) == []
    assert value_of({"input": {"a": 1}}, "input") == {"a": 1}
    assert value_of({"input": {"a": True}}, "input") is None
    assert value_of({}, "input") is None


def test_the_bound_counts_compact_json_bytes() -> None:
    value = {"k": "é" * 10, "n": [1, 2]}
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert value_bytes(value) == len(compact.encode())
    assert value_bytes("é") == 2
    limits = TaskLimits(max_input_bytes=20, max_result_bytes=20)
    assert limits.problems(input={"a": "x" * 10}, result=[1, 2]) == []
    over = limits.problems(input={"a": "x" * 20}, result=["y" * 20])
    assert [p.split(":")[0] for p in over] == ["input", "result"]
    assert all("longer than 20 UTF-8 bytes" in p for p in over)
    assert limits.problems(input={"ok": False}) == ["input.ok: booleans are not allowed; use 0/1"]
    assert limits.problems(title={"t": 1}, note=[1]) == [  # type: ignore[arg-type]
        "title: 1..280 characters, not blank",
        "note: expected text",
    ]
