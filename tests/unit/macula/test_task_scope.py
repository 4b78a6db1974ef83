"""``macula.task_scope.TaskScope``: a component's tasks, run by its owner's spawner."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from macula.task_scope import TaskScope

pytestmark = pytest.mark.anyio


class Owner:
    """A spawner that records what it ran and can refuse (its owner stopping)."""

    def __init__(self) -> None:
        self.ran: list[asyncio.Task[None]] = []
        self.refusing = False

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self.refusing:
            coroutine.close()
            return None
        task = asyncio.get_running_loop().create_task(coroutine)
        self.ran.append(task)
        return task


async def test_tasks_run_through_the_owner_and_aclose_cancels_and_awaits_them() -> None:
    owner = Owner()
    scope = TaskScope(owner.spawn)
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = scope.spawn(forever())
    assert task is not None and owner.ran == [task] and scope.tasks() == {task}
    await started.wait()
    await scope.aclose()
    assert task.cancelled() and len(scope) == 0 and scope.closed


async def test_a_finished_task_leaves_the_scope_and_a_closed_scope_spawns_nothing() -> None:
    scope = TaskScope(Owner().spawn)

    async def quick() -> None:
        return None

    task = scope.spawn(quick())
    assert task is not None
    await asyncio.wait([task])
    assert len(scope) == 0
    await scope.aclose()
    late = quick()
    assert scope.spawn(late) is None
    assert late.cr_frame is None  # closed, never left unawaited


async def test_a_refusing_owner_is_reported_and_nothing_is_tracked() -> None:
    owner = Owner()
    owner.refusing = True
    scope = TaskScope(owner.spawn)

    async def work() -> None:
        return None

    assert scope.spawn(work()) is None
    assert len(scope) == 0 and owner.ran == []


async def test_aclose_swallows_a_failed_task_and_without_an_owner_uses_the_loop() -> None:
    scope = TaskScope()  # a plain loop task

    async def fails() -> None:
        raise RuntimeError("boom")

    task = scope.spawn(fails())
    assert task is not None
    await asyncio.wait([task])
    await scope.aclose()  # does not raise
    assert isinstance(task.exception(), RuntimeError)
