"""``relay.station.sibling_links.until_lost``: the probe of a link between two workers, over a fake
connection (byte counters the test moves, pings it answers or not)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from macula.quic.transport import FrameProtocol
from relay.station.sibling_links import until_lost


class FakeLink:
    def __init__(self, answers: list[bool], moving: bool = False) -> None:
        self.answers = answers  # what each ping gets; past the list: unanswered
        self.moving = moving
        self.bytes = 0
        self.pings = 0
        self.closed: list[str] = []
        self.lost = asyncio.Event()

    def stream_bytes(self) -> tuple[int, int]:
        if self.moving:
            self.bytes += 1
        return self.bytes, 0

    async def acknowledged(self, timeout_s: float) -> bool:
        self.pings += 1
        await asyncio.sleep(0)  # one loop turn, as a real acknowledgement yields
        return self.answers[self.pings - 1] if self.pings <= len(self.answers) else False

    def close_connection(self, reason: str = "") -> None:
        self.closed.append(reason)
        self.lost.set()  # the connection ends: the station's forget sets ``lost``


async def _probe(link: FakeLink, **kw: Any) -> None:
    conn = cast(FrameProtocol, link)
    await asyncio.wait_for(until_lost(conn, link.lost, interval_s=0.001, **kw), 5)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_quiet_link_is_closed_after_three_pings_unanswered_in_a_row(
    anyio_backend: str,
) -> None:
    link = FakeLink([True, False, False, True, False, False, False])
    await _probe(link, timeout_s=0.001)
    assert link.pings == 7  # the answered fourth ping started the count again
    assert link.closed == ["worker did not acknowledge a ping"]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_link_moving_bytes_is_never_pinged(anyio_backend: str) -> None:
    link = FakeLink([], moving=True)
    probing = asyncio.create_task(_probe(link, timeout_s=0.001))
    while link.bytes < 20:  # twenty looks at the counters
        await asyncio.sleep(0.001)  # polled predicate: the probe runs between looks
    link.lost.set()
    await probing
    assert link.pings == 0 and link.closed == []
