"""tools.stdio.guard: the depth scan and the id it answers with, without parsing the line."""

from __future__ import annotations

import json

import pytest

from tools.stdio.guard import MAX_REQUEST_DEPTH, refusal, too_deep, top_level_id


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [1, 100, MAX_REQUEST_DEPTH - 2])
def test_lines_within_the_limit_pass(depth: int) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "params": {"a": json.loads(nested(depth))}})
    assert not too_deep(line)  # the object, params, and ``depth`` arrays
    assert too_deep(line, limit=depth + 1)


@pytest.mark.parametrize("depth", [MAX_REQUEST_DEPTH, 300, 100_000])
def test_lines_past_the_limit_are_caught(depth: int) -> None:
    assert too_deep('{"id": 1, "params": ' + nested(depth) + "}")


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps("[" * 500 + '\\" {{{' + "{" * 500)  # escapes and quotes inside a string
    line = '{"id": 1, "params": {"text": ' + text + ', "more": "]]]"}}'
    assert not too_deep(line)
    assert too_deep('{"id": 1, "params": {"text": ' + text + ', "deep": ' + nested(200) + "}}")


def test_many_siblings_are_not_depth() -> None:
    assert not too_deep(json.dumps({"id": 1, "params": [[1]] * 10_000}))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"jsonrpc": "2.0", "id": 7, "params": ' + nested(300) + "}", 7),
        ('{"params": ' + nested(300) + ', "id": "abc \\" ]"}', 'abc " ]'),
        ('{"params": {"id": 5, "x": ' + nested(300) + "}}", None),  # not the top level's
        ('{"method": "x", "params": ' + nested(300) + "}", None),  # a notification
        ('{"id": true, "params": ' + nested(300) + "}", None),
        ('{"id": 1.5, "params": ' + nested(300) + "}", None),
        (nested(300), None),
    ],
)
def test_the_id_is_read_at_the_top_level_only(line: str, expected: object) -> None:
    assert top_level_id(line) == expected
    answer = json.loads(refusal(line).model_dump_json(by_alias=True))
    assert answer["id"] == expected and answer["error"]["code"] == -32600
