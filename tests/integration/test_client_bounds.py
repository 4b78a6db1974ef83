"""The client holds its ground over a real station: a stream whose reader does not keep up
fails for that reader (nothing is dropped silently), and a node answers calls beyond its
concurrency bound with ERROR 0x08 ``upstream_congestion``; honest traffic on the same nodes
is unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from macula.errors import MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.session import StreamChannel
from macula.wire.codes import ErrorCode
from support.meshkit import REALM
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_an_overflowing_stream_fails_for_its_reader_and_tells_the_provider(
    make_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StreamChannel, "MAX_BUFFERED", 16)
    async with make_node() as provider, make_node() as caller:
        provider_side: list[StreamChannel] = []

        async def firehose(channel: StreamChannel, incoming: IncomingCall) -> None:
            provider_side.append(channel)
            for i in range(40):
                channel.send(i, encoding="msgpack")
            await eventually(lambda: channel.error is not None, message="no STREAM_ERROR")

        async def countdown(channel: StreamChannel, incoming: IncomingCall) -> None:
            for i in range(5):
                channel.send(i, encoding="msgpack")

        await provider.advertise_stream(REALM, "org.example.firehose_v1", firehose)
        await provider.advertise_stream(REALM, "org.example.countdown_v1", countdown)
        await provider.flush()
        flooded = await caller.open_stream(REALM, "org.example.firehose_v1")
        await eventually(lambda: flooded.error is not None, message="the overflow went unseen")
        assert flooded.error == ("overflow", "receiver too slow")
        received: list[object] = []
        with pytest.raises(MeshError, match="overflow: receiver too slow"):
            async for body in flooded:
                received.append(body)
        assert received == list(range(16))  # everything buffered, in order, then the failure
        with pytest.raises(MeshError, match="overflow"):  # the end stays the end
            await flooded.receive()
        await eventually(lambda: provider_side and provider_side[0].error is not None)
        assert provider_side[0].error == ("overflow", "receiver too slow")

        honest = await caller.open_stream(REALM, "org.example.countdown_v1")
        assert [body async for body in honest] == [0, 1, 2, 3, 4]
        assert honest.error is None


async def test_calls_beyond_the_bound_are_answered_busy(
    make_node: Callable[..., Node],
) -> None:
    gate = asyncio.Event()
    entered: list[int] = []
    async with make_node(max_handlers=2) as provider, make_node() as caller:

        async def slow(call: IncomingCall) -> int:
            entered.append(1)
            await gate.wait()
            return 7

        async def quick(call: IncomingCall) -> int:
            return 8

        async def one(channel: StreamChannel, incoming: IncomingCall) -> None:
            channel.send(1, encoding="msgpack")

        await provider.advertise(REALM, "org.example.slow_v1", slow)
        await provider.advertise(REALM, "org.example.quick_v1", quick)
        await provider.advertise_stream(REALM, "org.example.one_v1", one)
        await provider.flush()
        held = [asyncio.create_task(caller.call(REALM, "org.example.slow_v1", {})) for _ in "ab"]
        await eventually(lambda: len(entered) == 2)
        with pytest.raises(MeshError) as busy:
            await caller.call(REALM, "org.example.quick_v1", {})
        assert busy.value.code == ErrorCode.UPSTREAM_CONGESTION == 0x08
        assert busy.value.retryable
        assert provider.stats.calls_refused_busy == 1

        channel = await caller.open_stream(REALM, "org.example.one_v1")
        with pytest.raises(MeshError, match="upstream_congestion"):
            await asyncio.wait_for(channel.receive(), 5)
        assert provider.stats.calls_refused_busy == 2

        gate.set()
        assert [await t for t in held] == [7, 7]
        assert await caller.call(REALM, "org.example.quick_v1", {}) == 8  # room again
        channel = await caller.open_stream(REALM, "org.example.one_v1")
        assert [body async for body in channel] == [1]
        assert provider.stats.calls_served == 3
        await eventually(lambda: provider._served.in_flight == 0)


async def test_max_handlers_must_be_positive(make_node: Callable[..., Node]) -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_in_flight"):
            make_node(max_handlers=bad)
