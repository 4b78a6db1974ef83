"""An A2A agent's answers (SDK events) read into the mesh task's state: mapped by the one table,
text only, bounded, and out-of-protocol answers named ``Malformed``."""

from __future__ import annotations

import pytest
from a2a.helpers.proto_helpers import new_text_artifact, new_text_message
from a2a.types import (
    Message,
    Part,
    Role,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

from macula.agent.task_messages import TaskLimits
from tools.a2a.answers import Change, Malformed, Reading, bounded, part_text
from tools.a2a.states import AUTH_REQUIRED_NOTE


def status(state: int, text: str | None = None, task_id: str = "t1") -> StreamResponse:
    event = TaskStatusUpdateEvent(task_id=task_id, context_id="c1", status=TaskStatus(state=state))
    if text is not None:
        event.status.message.CopyFrom(new_text_message(text, role=Role.ROLE_AGENT))
    return StreamResponse(status_update=event)


def artifact(text: str, *, append: bool = False, artifact_id: str = "a") -> StreamResponse:
    made = new_text_artifact("out", text)
    made.artifact_id = artifact_id
    update = TaskArtifactUpdateEvent(task_id="t1", context_id="c1", artifact=made, append=append)
    return StreamResponse(artifact_update=update)


def read(*events: StreamResponse, limits: TaskLimits | None = None) -> Change:
    reading = Reading(limits or TaskLimits())
    for event in events:
        reading.feed(event)
    return reading.change()


def test_a_task_then_its_updates_end_in_one_result() -> None:
    task = Task(id="t1", context_id="c1", status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    reading = Reading()
    reading.feed(StreamResponse(task=task))
    assert reading.change() == Change("submitted")
    assert (reading.task_id, reading.context_id) == ("t1", "c1")
    reading.feed(status(TaskState.TASK_STATE_WORKING, "on it"))
    assert reading.change() == Change("working", "on it")
    reading.feed(artifact("part one, "))
    reading.feed(artifact("part two", append=True))
    reading.feed(artifact("another", artifact_id="b"))
    reading.feed(status(TaskState.TASK_STATE_COMPLETED))
    assert reading.change() == Change("completed", result="part one, part two\n\nanother")


def test_every_a2a_state_maps_through_the_one_table() -> None:
    assert read(status(TaskState.TASK_STATE_INPUT_REQUIRED, "which?")) == Change(
        "input_required", "which?"
    )
    assert read(status(TaskState.TASK_STATE_INPUT_REQUIRED)).note  # a question, even unsaid
    assert read(status(TaskState.TASK_STATE_CANCELED)) == Change("canceled")
    failed = read(status(TaskState.TASK_STATE_FAILED, "cannot"))
    assert (failed.state, failed.error) == ("failed", "cannot")
    rejected = read(status(TaskState.TASK_STATE_REJECTED, "no"))
    assert rejected.state == "failed" and rejected.error is not None
    assert rejected.error.startswith("refused: the A2A agent rejected the task: no")
    auth = read(status(TaskState.TASK_STATE_AUTH_REQUIRED))
    assert (auth.state, auth.error) == ("failed", AUTH_REQUIRED_NOTE)


def test_a_direct_message_answer_is_the_result() -> None:
    message = new_text_message("42", role=Role.ROLE_AGENT)
    assert read(StreamResponse(message=message)) == Change("completed", result="42")


def test_only_bounded_text_reaches_the_task() -> None:
    limits = TaskLimits(max_result_bytes=100, max_note_bytes=40)
    done = read(
        artifact("é" * 500), status(TaskState.TASK_STATE_COMPLETED, "x" * 200), limits=limits
    )
    assert done.result is not None and done.note is not None
    assert len(done.result.encode()) <= 100 and done.result.endswith("more bytes]")
    assert len(done.note.encode()) <= 40
    assert bounded("a\x00b\x1b[31mc\nd\te", 100) == "ab[31mc\nd\te"
    file_part = Part(url="file:///etc/passwd", filename="passwd", media_type="text/plain")
    assert "left out" in part_text(file_part) and "/etc/passwd" not in part_text(file_part)
    raw = Part(raw=b"\x00\x01")
    assert "left out" in part_text(raw)
    data = Part(data=Value(string_value="v"))
    assert part_text(data) == '"v"'


def test_out_of_protocol_answers_are_malformed() -> None:
    with pytest.raises(Malformed, match="another A2A task"):
        read(
            status(TaskState.TASK_STATE_WORKING), status(TaskState.TASK_STATE_WORKING, task_id="t2")
        )
    with pytest.raises(Malformed, match="no state"):
        read(status(TaskState.TASK_STATE_UNSPECIFIED))
    with pytest.raises(Malformed, match="names no task"):
        read(status(TaskState.TASK_STATE_WORKING, task_id=""))
    with pytest.raises(Malformed, match="neither"):
        read(StreamResponse())
    with pytest.raises(Malformed, match="no state"):
        Reading().change()
    message = Message(message_id="m", role=Role.ROLE_AGENT)
    assert read(StreamResponse(message=message)) == Change("completed", result="")


def test_ids_past_the_bound_or_with_control_characters_are_malformed() -> None:
    """An agent's task and context ids are stored with the task and sent back: bounded."""
    from tools.a2a.answers import MAX_ID_CHARS
    from tools.a2a.dial import failure_of

    fine = status(TaskState.TASK_STATE_WORKING, task_id="i" * MAX_ID_CHARS)
    assert read(fine).state == "working"
    for task_id, context_id, said in (
        ("i" * (MAX_ID_CHARS + 1), "c", "task id of 257"),
        ("i" * 5_000_000, "c", "task id of 5000000"),
        ("t1\nX-Injected: 1", "c", "task id with a control"),
        ("t1", "c" * (MAX_ID_CHARS + 1), "context id of 257"),
        ("t1", "c\x00", "context id with a control"),
    ):
        event = TaskStatusUpdateEvent(
            task_id=task_id, context_id=context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
        )  # fmt: skip
        with pytest.raises(Malformed, match=said) as caught:
            read(StreamResponse(status_update=event))
        assert failure_of(caught.value).code == "a2a_malformed_answer"
        task = Task(id=task_id, context_id=context_id)
        task.status.state = TaskState.TASK_STATE_COMPLETED
        with pytest.raises(Malformed, match=said):
            Reading().task(task)
