"""The door's task store keeps each client's tasks apart and forgets only the oldest finished."""

from __future__ import annotations

import pytest
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.types import ListTasksRequest, Task, TaskState, TaskStatus

from tools.a2a.task_store import BoundedTaskStore

pytestmark = pytest.mark.anyio


class Named(User):
    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.name


def task(ident: str, state: int) -> Task:
    return Task(id=ident, context_id="c", status=TaskStatus(state=state))  # type: ignore[arg-type]


async def test_finished_tasks_are_bounded_per_client_and_open_ones_kept() -> None:
    store = BoundedTaskStore(max_finished=2)
    crew, ops = ServerCallContext(user=Named("crew")), ServerCallContext(user=Named("ops"))
    await store.save(task("open", TaskState.TASK_STATE_WORKING), crew)
    for ident in ("a", "b", "c"):
        await store.save(task(ident, TaskState.TASK_STATE_COMPLETED), crew)
    await store.save(task("x", TaskState.TASK_STATE_FAILED), ops)
    assert await store.get("a", crew) is None  # the oldest finished, forgotten
    assert [await store.get(i, crew) is not None for i in ("open", "b", "c")] == [True] * 3
    assert await store.get("x", crew) is None and await store.get("x", ops) is not None
    listed = await store.list(ListTasksRequest(), crew)
    assert sorted(t.id for t in listed.tasks) == ["b", "c", "open"]
