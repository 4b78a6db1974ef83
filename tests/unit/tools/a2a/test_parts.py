"""A2A parts to a mesh task's value: text and data taken, files refused, the mesh bounds kept."""

from __future__ import annotations

import pytest
from a2a.helpers.proto_helpers import (
    new_data_part,
    new_message,
    new_raw_part,
    new_text_part,
    new_url_part,
)
from a2a.types import Part, Role
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError

from macula.agent.task_messages import TaskLimits
from tools.a2a.parts import message_value, title_for, value_part

LIMITS = TaskLimits()


def message(*parts: Part) -> object:
    return new_message(list(parts), role=Role.ROLE_USER)


def test_text_and_data_become_the_tasks_input() -> None:
    assert message_value(message(new_text_part("a"), new_text_part("b")), LIMITS) == "a\nb"
    data = {"n": 4326, "xs": [1, 2.5]}
    assert message_value(message(new_data_part(data)), LIMITS) == data  # whole numbers stay ints
    mixed = message_value(message(new_text_part("see"), new_data_part({"k": 1})), LIMITS)
    assert mixed == 'see\n{"k":1}'
    assert message_value(message(new_data_part({"k": 1})), LIMITS, answer=True) == '{"k":1}'


@pytest.mark.parametrize(
    "part", [new_raw_part(b"\x00"), new_url_part("file:///etc/passwd"), new_url_part("http://x")]
)
def test_file_parts_are_refused(part: Part) -> None:
    with pytest.raises(ContentTypeNotSupportedError):
        message_value(message(part), LIMITS)


def test_blank_boolean_and_oversized_are_refused() -> None:
    for bad in (message(), message(new_text_part("  ")), message(new_data_part({"ok": True}))):
        with pytest.raises(InvalidParamsError):
            message_value(bad, LIMITS)  # type: ignore[arg-type]
    with pytest.raises(InvalidParamsError, match="longer than 100"):
        message_value(message(new_text_part("x" * 101)), TaskLimits(max_input_bytes=100))


def test_title_and_result_parts() -> None:
    title = title_for("crew", "fix\n  the   bug " + "x" * 500, LIMITS)
    assert title.startswith("A2A from crew: fix the bug x") and len(title) <= 280
    assert title_for("crew", {"a": 1}, TaskLimits(max_title_chars=20)) == 'A2A from crew: {"a":'
    assert value_part("done").text == "done"
    assert value_part({"a": 1}).HasField("data")
