"""Tasks held for the owner's approval (issue 39; ``macula.agent.tasks`` documents the flow).

A task from a stranger waits in the approval queue, never in the task store, so the model
cannot read it. The sender's copy shows ``pending_owner_approval`` (``state_seq`` 2); the
owner's decision becomes ``submitted`` (approved: the task is created at ``state_seq`` 3 and
reaches the model as any task does) or ``failed`` with a note starting ``refused:``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from macula.agent.approvals import Approvals, refusal_note
from macula.agent.contact_policy import Answer
from macula.agent.task_messages import TaskLimits, refused, text_of
from macula.store.approvals import ApprovalError, Item
from macula.store.task_states import PENDING_OWNER
from macula.store.task_values import value_of
from macula.store.tasks import Task, TaskError, TaskStore


class TaskSide(Protocol):
    """What of ``macula.agent.tasks.Tasks`` the held tasks use (no import cycle)."""

    store: TaskStore
    me: bytes
    clock: Callable[[], int]
    limits: TaskLimits

    def count(self, name: str) -> None: ...

    async def arrived(self, sender: bytes, task_id: str, title: str) -> None: ...

    def kick_outbox(self) -> None: ...


class HeldTasks:
    """The task side of the approval queue: holds tasks, applies the owner's decisions."""

    def __init__(self, tasks: TaskSide, approvals: Approvals) -> None:
        self.tasks = tasks
        self.approvals = approvals
        approvals.appliers["task"] = self.decided

    async def hold(
        self, sender: bytes, task_id: str, content: dict[str, Any], contact: int
    ) -> dict[str, Any]:
        item = await self.approvals.find("task", sender, task_id)
        if item is None:
            try:
                item = await self.approvals.hold(
                    "task", sender, task_id, content | {"contact": contact}
                )
            except ApprovalError as exc:
                self.tasks.count("tasks_refused_queue_full")
                return refused(task_id, exc.code, exc.detail, int(exc.retryable))
            self.tasks.count("tasks_held_for_owner")
        if item.state in ("denied", "expired"):
            return _decided_body(task_id, "failed", refusal_note(item))
        return {
            "kind": "task_updated",
            "task_id": task_id,
            "state": PENDING_OWNER,
            "state_seq": 2,
            "note": f"held for the owner's approval (approval {item.approval_id}); "
            "the decision follows",
        }

    async def canceled(self, sender: bytes, task_id: str) -> dict[str, Any] | None:
        """The sender cancels a task still held: it leaves the queue, the sender's copy ends
        ``canceled``. None when no such task is held (the caller answers ``not_found``)."""
        item = await self.approvals.find("task", sender, task_id)
        if item is None or item.state != "pending":
            return None
        now = self.tasks.clock()
        if not await self.approvals.store.withdraw(item.approval_id, now, "canceled by the sender"):
            return None
        self.approvals.note_event("withdrawn", item)
        return _decided_body(task_id, "canceled", "canceled while it waited for the owner")

    async def decided(self, item: Item) -> None:
        """Apply the owner's decision on a held task (the approvals' applier for ``task``)."""
        now = self.tasks.clock()
        content = item.content if isinstance(item.content, dict) else {}
        title, text = text_of(content, "title"), value_of(content, "input")
        if item.state == "approved" and title is not None and text is not None:
            contact = content.get("contact")
            task = Task.new(
                item.ref,
                "assignee",
                item.sender,
                title,
                text,
                contact=contact if type(contact) is int else int(Answer.DEFERRED),
                delivered=1,
            )
            note = "the owner approved it"
            try:
                await self.tasks.store.create(
                    self.tasks.me,
                    task,
                    now,
                    max_open_per_peer=self.tasks.limits.max_open_per_peer,
                    outbox=_decided_body(item.ref, "submitted", note),
                    state_seq=3,
                )
            except TaskError as exc:
                body = _decided_body(item.ref, "failed", f"refused: {exc.code}: {exc.detail}")
                await self.tasks.store.enqueue(self.tasks.me, item.sender, item.ref, body, now)
            else:
                await self.tasks.arrived(item.sender, item.ref, title)
        else:
            body = _decided_body(item.ref, "failed", refusal_note(item))
            await self.tasks.store.enqueue(self.tasks.me, item.sender, item.ref, body, now)
        self.tasks.kick_outbox()


def _decided_body(task_id: str, state: str, note: str) -> dict[str, Any]:
    """The assignee's word on a task its owner decided (``state_seq`` 3, after
    ``pending_owner_approval``); a refusal carries its note as the error too."""
    body: dict[str, Any] = {
        "kind": "task_updated",
        "task_id": task_id,
        "state": state,
        "state_seq": 3,
        "note": note,
    }
    if state == "failed":
        body["error"] = note
    return body
