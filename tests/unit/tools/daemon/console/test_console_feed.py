"""The console's live feed (``tools.daemon.console.feed``): a snapshot at once, a changed one as
soon
as the bell rings, an unchanged one never again, a keep-alive comment after a quiet spell, and
the end of the stream when the console closes. Time is an argument: nothing here sleeps."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tools.daemon.console.feed import KEEPALIVE_S, ChangeBell, events

pytestmark = pytest.mark.anyio


def snapshot_of(frame: bytes) -> dict[str, Any]:
    head, data = frame.decode().strip().split("\n")
    assert head == "event: snapshot"
    return dict(json.loads(data.removeprefix("data: ")))


async def test_snapshots_are_sent_when_they_change_and_only_then() -> None:
    bell = ChangeBell()
    now = [0.0]
    views = [{"n": 1}, {"n": 1}, {"n": 1}, {"n": 2}, {"n": 2}]

    async def read() -> dict[str, Any]:
        bell.ring()  # as an observer would: the next wait returns at once
        return views.pop(0) if len(views) > 1 else views[0]

    stream = events(bell, read, lambda: now[0])
    assert await anext(stream) == b"retry: 2000\n\n"
    assert snapshot_of(await anext(stream)) == {"n": 1}
    assert snapshot_of(await anext(stream)) == {"n": 2}  # the two unchanged reads: nothing
    now[0] += KEEPALIVE_S
    assert await anext(stream) == b": still here\n\n"
    bell.closed.set()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_line_break_in_the_data_cannot_split_the_event() -> None:
    bell = ChangeBell()

    async def read() -> dict[str, Any]:
        bell.closed.set()
        return {"text": "one\n\nevent: forged\ndata: {}"}

    frames = [frame async for frame in events(bell, read, lambda: 0.0)]
    assert snapshot_of(frames[1]) == {"text": "one\n\nevent: forged\ndata: {}"}


def test_the_bell_hangs_on_each_agent_once() -> None:
    def runtime() -> Any:
        parts = {name: SimpleNamespace(observers=[]) for name in ("rooms", "rings", "tasks")}
        return SimpleNamespace(agent=SimpleNamespace(**parts))

    bell = ChangeBell()
    one, two = runtime(), runtime()
    bell.watch([one])
    bell.watch([one, two])
    for agent in (one.agent, two.agent):
        assert [len(p.observers) for p in (agent.rooms, agent.rings, agent.tasks)] == [1, 1, 1]
    one.agent.rooms.observers[0]("heard")
    assert bell._rung.is_set()
