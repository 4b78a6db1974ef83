"""The argument boundary without a server: which parameters take text, what the pre-parse
leaves alone, and how problems name their parameter."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import pytest
from mcp.server.mcpserver.tools.base import Tool
from pydantic import Field

from macula.agent.task_messages import TaskLimits
from macula.store.task_values import TaskValue
from tools.groups.text_limits import TaskBound
from tools.server.arguments import LiteralArguments, adopt, problems, takes_text, task_bounds


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (str, True),
        (str | None, True),
        (Optional[str], True),  # noqa: UP045 (the spelling under test)
        (Annotated[str | None, Field(max_length=3)], True),
        (Any, True),
        (TaskValue, True),
        (str | int, True),
        (int, False),
        (float | None, False),
        (list[str] | None, False),
        (dict[str, float] | None, False),
    ],
)
def test_takes_text(annotation: Any, text: bool) -> None:
    assert takes_text(annotation) is text


def sample(
    note: str | None = None,
    tags: list[str] | None = None,
    data: TaskValue | None = None,
    count: Annotated[int, Field(ge=1, le=5)] = 1,
) -> str:
    return "ok"


def test_text_stays_text_and_arrays_are_still_parsed() -> None:
    tool = Tool.from_function(sample)
    metadata = adopt(tool)
    assert isinstance(tool.fn_metadata, LiteralArguments) and adopt(tool) is metadata
    raw = {"note": '{"a": 1}', "tags": '["x", "y"]', "data": "[1, 2]", "count": 2}
    validated = metadata.validate_arguments(raw)
    assert validated == {"note": '{"a": 1}', "tags": ["x", "y"], "data": "[1, 2]", "count": 2}
    assert metadata.validate_arguments({"data": {"a": [1]}})["data"] == {"a": [1]}


def test_problems_name_each_parameter_and_never_echo_values() -> None:
    tool = Tool.from_function(sample)
    assert problems(tool, {"note": "fine", "count": 5}) == []
    found = problems(tool, {"note": {"secret": "s3cr3t"}, "count": 9, "tags": ["a", 7], "x": 1})
    assert found[0] == "x: unknown parameter (this tool takes note, tags, data, count)"
    assert [p.split(":")[0] for p in found[1:]] == ["note", "tags[1]", "count"]
    assert "s3cr3t" not in " ".join(found)
    assert found[-1] == "count: input should be less than or equal to 5"


def bounded(
    name: Annotated[str, Field(max_length=3)] = "a",
    kind: Annotated[str, Field(max_length=4)] | Annotated[int, Field(ge=1, le=9)] = 1,
    note: Annotated[str | None, TaskBound("max_note_bytes")] = None,
) -> str:
    return "ok"


def test_text_over_its_declared_length_is_one_problem_naming_the_limit() -> None:
    """The signature's ``max_length`` (a union's text arm too, without its other arms) and a
    ``TaskBound`` under the server's task limits: each one problem, in the same words."""
    tool = Tool.from_function(bounded)
    limits = TaskLimits(max_note_bytes=5)
    assert task_bounds(tool, limits) == {"note": 5}
    found = problems(tool, {"name": "abcd", "kind": "x" * 5, "note": "n" * 6}, limits)
    assert found == [
        "name: at most 3 characters (4 given)",
        "kind: at most 4 characters (5 given)",
        "note: at most 5 characters (6 given)",
    ]
    assert problems(tool, {"name": "abc", "kind": "xxxx", "note": "n" * 5}, limits) == []
    assert problems(tool, {"note": "n" * 6}) == []  # the default task limit is 2 KiB
