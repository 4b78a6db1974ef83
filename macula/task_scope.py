"""Tasks one component started, run by whoever owns the task group (``Spawner``).

A component (a link manager, the station DHT, a history writer, the monitor's HTTP server) is
given a ``Spawner`` by its owner (the station's ``spawn``: its one ``asyncio.TaskGroup``) and
keeps a ``TaskScope`` over it: the scope knows which of the group's tasks are the component's,
so the component can still cancel one of them, count them, and on its own stop cancel and await
all it started, while the group stays the one owner (its stop cancels and awaits whatever is
left).

Invariants:
- a spawner either runs the coroutine (returning its task) or refuses it (returning None, e.g.
  its owner is stopping) and then closes the coroutine itself: nothing is left unawaited;
- once ``aclose`` began, the scope spawns nothing; ``aclose`` returns when every task the
  scope started is done (cancelled ones included) and never raises their errors;
- ``loop_spawner`` (a task of the running loop) is for a component used on its own, in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

__all__ = ["Spawner", "TaskScope", "loop_spawner"]


class Spawner(Protocol):
    def __call__(self, coroutine: Coroutine[Any, Any, None], /) -> asyncio.Task[None] | None:
        """Run ``coroutine`` as a task of the owner's group; None if the owner refused it."""
        ...


def loop_spawner(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A plain task of the running loop (a component that has no owner)."""
    return asyncio.get_running_loop().create_task(coroutine)


class TaskScope:
    """The tasks this component started through ``spawner``."""

    def __init__(self, spawner: Spawner | None = None) -> None:
        self._spawner: Spawner = loop_spawner if spawner is None else spawner
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def tasks(self) -> frozenset[asyncio.Task[None]]:
        """The tasks started here that are not done yet."""
        return frozenset(self._tasks)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Start ``coroutine``; its task, or None when this scope (or its owner) is closing."""
        if self._closed:
            coroutine.close()
            return None
        task = self._spawner(coroutine)
        if task is None:
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Spawn nothing more; cancel every task started here and wait until all are done."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for task in tasks:  # retrieved, so none is reported as "never retrieved"
            if not task.cancelled():
                task.exception()
