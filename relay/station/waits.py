"""What the station waits for: its delayed callbacks and its own calls to linked stations.

``Timers`` owns every delayed callback of the station (a connection's close after its drain,
a paused stream's resume): ``cancel_all`` cancels them at once when the station stops, and
after it nothing new is scheduled. ``StationCalls`` pairs a CALL this station made (the core's
``call_station``) with the ``StationReplied`` action that settles it; a call nothing settles in
time settles itself as failed (TEMPORARY_RELAY_FAILURE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from macula.clock import now_ms
from macula.wire.codes import ErrorCode
from relay.core.actions import Action, StationReplied
from relay.core.router import RouterCore


class Timers:
    def __init__(self) -> None:
        self._handles: set[asyncio.TimerHandle] = set()
        self.closed = False

    def later(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in ``delay_s`` seconds, unless cancelled first (or closed)."""
        if self.closed:
            return

        def fire() -> None:
            self._handles.discard(handle)
            callback()

        handle = asyncio.get_running_loop().call_later(delay_s, fire)
        self._handles.add(handle)

    def cancel_all(self) -> None:
        self.closed = True
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[asyncio.TimerHandle]:
        return iter(list(self._handles))


class StationCalls:
    def __init__(self) -> None:
        self._waiting: dict[bytes, asyncio.Future[StationReplied]] = {}

    async def ask(
        self,
        core: RouterCore,
        run: Callable[[list[Action]], None],
        call: tuple[bytes, str, object, bytes],
        timeout_s: float,
        margin_s: float,
    ) -> StationReplied:
        """CALL ``procedure`` in ``realm`` (``call``: node id, procedure, payload, realm) at a
        linked station through ``core``; how it settled. The core settles it by its deadline
        (tick); ``margin_s`` more covers a stopped ticker."""
        node_id, procedure, payload, realm = call
        now = now_ms()
        deadline = now + int(timeout_s * 1000)
        started = core.call_station(node_id, procedure, payload, deadline, now, realm=realm)
        return await self.call(started, run, timeout_s + margin_s)

    async def call(
        self,
        started: tuple[bytes, list[Action]],
        run: Callable[[list[Action]], None],
        timeout_s: float,
    ) -> StationReplied:
        """Carry out the actions of a CALL the core ``started`` (its call id and actions) and
        wait until it settles, at most ``timeout_s``."""
        call_id, actions = started
        future: asyncio.Future[StationReplied] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        run(actions)  # may settle it at once (no link)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            code = ErrorCode.TEMPORARY_RELAY_FAILURE
            return StationReplied(call_id, False, "no reply in time", code)
        finally:
            self._waiting.pop(call_id, None)

    def settled(self, reply: StationReplied) -> None:
        future = self._waiting.pop(reply.call_id, None)
        if future is not None and not future.done():
            future.set_result(reply)
