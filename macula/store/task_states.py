"""The task state machine and the shapes both sides of a task share (``macula.store.tasks``).

States: ``submitted -> working <-> input_required -> completed | failed | canceled``;
``submitted -> pending_owner_approval -> submitted | failed | canceled`` when the assignee's
owner holds a task for approval (issue 39; the requester's copy shows it, the assignee keeps
the task in its approval queue, not here, until the owner decides);
``submitted`` may also go straight to ``input_required`` or an outcome, and ``working`` and
``input_required`` may repeat themselves (a progress note, another question). ``TRANSITIONS``
is the whole table. The three outcomes are terminal: nothing leaves them, so a task has exactly
one outcome. ``check_transition`` is pure and raises ``TaskError`` naming the state it is in.
No I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final, Literal

from macula.errors import MaculaError
from macula.store.base import DAY_MS, Bounds
from macula.store.task_values import TaskValue

Role = Literal["requester", "assignee"]
ROLES: Final[tuple[Role, ...]] = ("requester", "assignee")
PENDING_OWNER: Final = "pending_owner_approval"
STATES: Final = (
    "submitted",
    PENDING_OWNER,
    "working",
    "input_required",
    "completed",
    "failed",
    "canceled",
)
TERMINAL: Final = frozenset({"completed", "failed", "canceled"})
OPEN_STATES: Final = frozenset(STATES) - TERMINAL
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "submitted": frozenset({"working", "input_required", PENDING_OWNER}) | TERMINAL,
    PENDING_OWNER: frozenset({"submitted"}) | TERMINAL,
    "working": frozenset({"working", "input_required"}) | TERMINAL,
    "input_required": frozenset({"working", "input_required"}) | TERMINAL,
    "completed": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
}
DEFAULT_BOUNDS: Final = Bounds(max_rows=10_000, max_age_ms=30 * DAY_MS)
SEND_SCOPE: Final = "send"


class TaskError(MaculaError):
    """A task operation refused: ``code`` (snake_case), ``detail``, ``retryable``,
    ``next_action``; ``task`` is the task as it stands, when there is one."""

    def __init__(
        self,
        code: str,
        detail: str,
        next_action: str,
        *,
        retryable: bool = False,
        task: Task | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.next_action = next_action
        self.retryable = retryable
        self.task = task


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    role: Role
    peer: bytes
    title: str
    input: TaskValue  # text or a JSON value, as given (macula.store.task_values)
    state: str
    state_seq: int
    note: str | None
    result: TaskValue | None
    error: str | None
    contact: int | None  # assignee side: 1 sender allowed by policy, 3 deferred to the model
    delivered: int  # requester side: 1 once the assignee holds the task
    cancel_requested: int
    created_ms: int
    updated_ms: int
    replayed: int = 0  # 1 when an idempotency key returned this first outcome again

    @classmethod
    def new(
        cls,
        task_id: str,
        role: Role,
        peer: bytes,
        title: str,
        input: TaskValue,
        *,
        contact: int | None = None,
        delivered: int = 0,
    ) -> Task:
        """A task as it is submitted (``state_seq`` 1); the store sets its times."""
        return cls(
            task_id,
            role,
            peer,
            title,
            input,
            "submitted",
            1,
            None,
            None,
            None,
            contact,
            delivered,
            0,
            0,
            0,
        )


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    state_seq: int
    state: str
    note: str | None
    by: Role
    at_ms: int


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    entry_id: int
    peer: bytes
    task_id: str
    body: dict[str, Any]
    attempts: int
    next_ms: int


def check_transition(task: Task, new_state: str) -> None:
    """Refuse a change the state machine does not allow, naming the state the task is in."""
    if new_state not in TRANSITIONS:
        raise TaskError(
            "invalid_argument",
            f"state: expected one of {', '.join(STATES)}",
            "call again with a valid state",
        )
    if task.state in TERMINAL:
        raise TaskError(
            "already_terminal",
            f"task {task.task_id} already has its outcome: {task.state} (state_seq "
            f"{task.state_seq}); a task has exactly one outcome",
            "read the outcome with mesh_task_get; send a new task for more work",
            task=task,
        )
    if new_state not in TRANSITIONS[task.state]:
        raise TaskError(
            "illegal_transition",
            f"task {task.task_id} is {task.state}; it cannot become {new_state} "
            f"(allowed: {', '.join(sorted(TRANSITIONS[task.state]))})",
            "choose one of the allowed states",
            task=task,
        )


def digest(args: dict[str, Any]) -> str:
    """What an idempotency key is bound to: the arguments of its first use."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
