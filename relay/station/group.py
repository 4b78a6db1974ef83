"""The station's one ``asyncio.TaskGroup``: every relay-side task runs in it.

``StationGroup.spawn`` is the station's ``macula.task_scope.Spawner``: the upkeep loops, the
built-ins, the link manager's dialers and discovery, the station DHT's loops and pushes, the
history writer and the monitor's HTTP clients all run here (each component keeps a
``TaskScope`` over it to know its own).
Invariants: a failing task is logged and never cancels the others; once ``close_to_new`` was
called (the station is stopping) nothing new runs, the coroutine is closed instead; ``finish``
cancels every task still running and returns when all are done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["StationGroup"]

log = logging.getLogger("macula.relay")


class StationGroup:
    def __init__(self) -> None:
        self._supervisor: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None
        self._running: set[asyncio.Task[None]] = set()  # spawned and not yet done
        self._closed = False

    async def open(self) -> None:
        """Open the group (held open by a supervisor task until ``finish``)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(ready))
        await ready

    async def _supervise(self, ready: asyncio.Future[None]) -> None:
        """Hold the task group open until ``finish`` cancels this task; the group then cancels
        and awaits every task in it."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            ready.set_result(None)
            await asyncio.Event().wait()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        """Run ``coroutine`` in the group (a failure is logged, never spreads); its task, or
        None once the station stops (then nothing new runs)."""
        if self._closed or self._group is None:
            coroutine.close()  # the station is stopping: no new work
            return None
        try:
            task = self._group.create_task(_logged(coroutine))
        except RuntimeError:  # the group was cancelled from outside (the loop shutting down)
            coroutine.close()
            return None
        self._running.add(task)
        task.add_done_callback(lambda _: self._ended(task, coroutine))
        return task

    def _ended(self, task: asyncio.Task[None], coroutine: Coroutine[Any, Any, None]) -> None:
        self._running.discard(task)
        coroutine.close()  # a task cancelled before it ran: its coroutine never started

    def close_to_new(self) -> None:
        """From now on nothing new is spawned."""
        self._closed = True

    async def finish(self) -> None:
        """Cancel every task still running and wait until the group is done."""
        self._closed = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.wait([supervisor])  # the group cancelled and awaited its tasks
        self._group = None

    def __len__(self) -> int:
        return len(self._running)

    def tasks(self) -> frozenset[asyncio.Task[None]]:
        return frozenset(self._running)


async def _logged(coroutine: Coroutine[Any, Any, None]) -> None:
    try:
        await coroutine
    except Exception:
        log.exception("station task failed")
