"""The client refuses, before sending, a frame the station would refuse: too many CBOR items,
nested too deep, an integer CBOR cannot carry. The connection stays up (a station closes it for
such a frame) and the next call on it succeeds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from macula.errors import MeshError
from macula.node.node import Node

pytestmark = pytest.mark.anyio
REALM = bytes(32)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "name"),
    [
        (list(range(10_000)), "too_many_items"),
        ({"k": [[i] for i in range(5_000)]}, "too_many_items"),
        (nested(150), "too_deep"),  # the encoder's own limit
        (nested(100), "too_deep"),  # encodes, but the station decodes 100 levels at most
        ({"n": 1 << 64}, "int_out_of_range"),
        ([-(1 << 64) - 1], "int_out_of_range"),
    ],
)
async def test_a_frame_the_station_would_refuse_is_refused_before_sending(
    make_node: Callable[..., Node], payload: Any, name: str
) -> None:
    async with make_node() as node:
        await node.flush()
        connection = node._live()
        with pytest.raises(MeshError) as publish:
            await node.publish(REALM, "org.example.big_v1", payload)
        assert publish.value.name == name
        assert publish.value.detail  # says what was too much, and the fix
        with pytest.raises(MeshError) as call:
            await node.call(REALM, "_relay.ping", payload, timeout=5)
        assert call.value.name == name
        await node.flush()  # the station answers on the same connection: it was never closed
        assert node._live() is connection
        await node.publish(REALM, "org.example.big_v1", list(range(100)))
        await node.flush()
        assert node._live() is connection


@pytest.mark.parametrize("payload", [list(range(8_000)), nested(99)])
async def test_a_frame_within_the_station_limits_still_goes_through(
    make_node: Callable[..., Node], payload: Any
) -> None:
    async with make_node() as node:
        await node.flush()
        connection = node._live()
        await node.publish(REALM, "org.example.big_v1", payload)
        await node.flush()
        assert node._live() is connection


@pytest.mark.parametrize(
    ("result", "name"),
    [
        (list(range(10_000)), "too_many_items"),
        (nested(100), "too_deep"),
        (nested(150), "too_deep"),
        ({"n": 1 << 64}, "int_out_of_range"),
    ],
)
async def test_a_served_result_too_much_for_a_frame_is_answered_with_an_error(
    make_node: Callable[..., Node], result: Any, name: str
) -> None:
    """The caller hears why at once, rather than waiting for its timeout; the provider's
    connection stays up."""
    async with make_node() as provider, make_node() as caller:
        await provider.advertise(REALM, "org.example.heavy_v1", lambda call: result)
        await provider.flush()
        connection = provider._live()
        with pytest.raises(MeshError) as refused:
            await caller.call(REALM, "org.example.heavy_v1", None, timeout=20)
        assert refused.value.code == 0x0D and name in (refused.value.detail or ""), refused.value
        await provider.flush()
        assert provider._live() is connection
