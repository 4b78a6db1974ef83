"""The door's A2A task store: the SDK's in-memory one, scoped by owner (the A2A client), with a
bound: at most ``MAX_FINISHED`` finished tasks per client and agent; past it the oldest finished
is forgotten here (its mesh task, outcome included, stays in the requester's store). Open tasks
are bounded by the mesh itself (``TaskLimits.max_open_per_peer`` per client)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task, TaskState

MAX_FINISHED: Final = 1_000
FINISHED: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_REJECTED,
    }
)


class BoundedTaskStore(TaskStore):
    def __init__(self, max_finished: int = MAX_FINISHED) -> None:
        self.inner = InMemoryTaskStore()
        self.max_finished = max_finished
        self.finished: dict[str, OrderedDict[str, None]] = {}

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self.inner.save(task, context)
        if task.status.state not in FINISHED:
            return
        done = self.finished.setdefault(resolve_user_scope(context), OrderedDict())
        done[task.id] = None
        while len(done) > self.max_finished:
            oldest, _ = done.popitem(last=False)
            await self.inner.delete(oldest, context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self.finished.get(resolve_user_scope(context), OrderedDict()).pop(task_id, None)
        await self.inner.delete(task_id, context)
