"""The console's live feed: one server-sent-events stream per open page.

Invariants:
- the page never polls: it opens ``/events`` once (``EventSource``) and gets a ``snapshot``
  event at once, then one each time what it shows changed;
- a change is noticed at once when an agent hears a room message, a ring or a task message
  (``ChangeBell``, rung by the agent layer's observers, which must not block), and otherwise
  by comparing snapshots every ``CHECK_S`` (what an agent itself said, a realm join request):
  an unchanged snapshot is never sent again;
- a comment line every ``KEEPALIVE_S`` keeps idle proxies and the browser from closing the
  stream; the stream ends when the console closes (``ChangeBell.closed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from tools.server.runtime import Runtime

CHECK_S: Final = 0.5
KEEPALIVE_S: Final = 15.0


class ChangeBell:
    """Rung when something the console shows may have changed."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()
        self.closed = asyncio.Event()
        self._watched: set[int] = set()

    def ring(self, *_: Any) -> None:
        self._rung.set()

    def watch(self, runtimes: list[Runtime]) -> None:
        """Hang the bell on the observers of every runtime not watched yet."""
        for runtime in runtimes:
            if id(runtime.agent) in self._watched:
                continue
            self._watched.add(id(runtime.agent))
            runtime.agent.rooms.observers.append(self.ring)
            runtime.agent.rings.observers.append(self.ring)
            runtime.agent.tasks.observers.append(self.ring)

    async def wait(self, timeout: float) -> None:
        """Until rung, closed, or ``timeout`` passed; then clear the bell."""
        closing = asyncio.ensure_future(self.closed.wait())
        rung = asyncio.ensure_future(self._rung.wait())
        try:
            await asyncio.wait({closing, rung}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            for task in (closing, rung):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._rung.clear()


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event (``data`` is one line of JSON: no newline can break the frame)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def events(
    bell: ChangeBell,
    read: Callable[[], Awaitable[dict[str, Any]]],
    clock: Callable[[], float],
) -> AsyncIterator[bytes]:
    """The stream of one page: snapshots as they change, keep-alive comments between."""
    last: str | None = None
    quiet_since = clock()
    yield b"retry: 2000\n\n"
    while not bell.closed.is_set():
        view = await read()
        text = json.dumps(view, sort_keys=True)
        if text != last:
            last = text
            quiet_since = clock()
            yield sse("snapshot", view)
        elif clock() - quiet_since >= KEEPALIVE_S:
            quiet_since = clock()
            yield b": still here\n\n"
        await bell.wait(CHECK_S)
