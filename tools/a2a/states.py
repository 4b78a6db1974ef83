"""One table between mesh task states (``macula.store.task_states.STATES``) and A2A 1.0's
``TaskState``, both ways (docs/a2a.md shows it).

- The mesh has no ``rejected``: a send the assignee refused ends ``failed`` with a note that
  starts ``refused:`` (``macula.agent.tasks``). Such a task is ``rejected`` in A2A, and an A2A
  ``rejected`` becomes that mesh ``failed``.
- A2A ``auth-required`` has no mesh meaning (the mesh authenticates every peer itself): an A2A
  agent that asks for it has ended the task for us, ``failed`` with a note saying so.
- ``pending_owner_approval`` (the assignee's owner holds the task: issue 39) is A2A
  ``submitted``: the task is not being worked on yet. It is the one state that does not come
  back as itself (A2A ``submitted`` is mesh ``submitted``).
- ``unspecified`` is not a state: ``ValueError``.
- A2A states are protobuf enum values (ints), as the SDK hands them.
"""

from __future__ import annotations

from typing import Final

from a2a.types import TaskState

REFUSED_PREFIX: Final = "refused:"
AUTH_REQUIRED_NOTE: Final = "refused: the A2A agent asked for authentication the mesh does not give"

TO_A2A: Final[dict[str, int]] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "pending_owner_approval": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "input_required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}

FROM_A2A: Final[dict[int, str]] = {
    TaskState.TASK_STATE_SUBMITTED: "submitted",
    TaskState.TASK_STATE_WORKING: "working",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input_required",
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_REJECTED: "failed",
    TaskState.TASK_STATE_AUTH_REQUIRED: "failed",
}


def to_a2a(state: str, note: str | None = None) -> int:
    """The A2A state of a mesh task in ``state`` (``note``: its last note, which tells a
    refusal from a failure)."""
    if state == "failed" and note is not None and note.startswith(REFUSED_PREFIX):
        return TaskState.TASK_STATE_REJECTED
    try:
        return TO_A2A[state]
    except KeyError:
        raise ValueError(f"not a mesh task state: {state!r}") from None


def from_a2a(state: int) -> tuple[str, str | None]:
    """The mesh state for an A2A task in ``state``, and the note it implies (or ``None``)."""
    if state == TaskState.TASK_STATE_REJECTED:
        return "failed", REFUSED_PREFIX + " the A2A agent rejected the task"
    if state == TaskState.TASK_STATE_AUTH_REQUIRED:
        return "failed", AUTH_REQUIRED_NOTE
    try:
        return FROM_A2A[state], None
    except KeyError:
        raise ValueError(f"not an A2A task state: {state!r}") from None
