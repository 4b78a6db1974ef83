"""macula.client.send_limits: the client's copy of the station's control-frame budgets is exact."""

from __future__ import annotations

from typing import Any

import pytest

from macula.client.send_limits import check_control_frame, value_depth
from macula.errors import MeshError
from macula.wire import cbor
from macula.wire.framing import FrameDecoder, frame_bytes


def nested(depth: int) -> Any:
    value: Any = "x"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def station_accepts(data: bytes, max_items: int) -> bool:
    try:
        FrameDecoder(max_items=max_items).feed(data)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("depth", [0, 1, 2, 5, 98, 99, 100, 101])
def test_value_depth_counts_levels_without_recursion(depth: int) -> None:
    assert value_depth(nested(depth), stop_after=1000) == depth
    assert value_depth([[1], [[[2]]], {"a": []}]) == 4
    assert value_depth(nested(100_000)) == 100  # stops early, never recurses


@pytest.mark.parametrize("depth", [97, 98, 99, 100, 101])
@pytest.mark.parametrize("items", [10, 8_000, 8_180, 8_200, 9_000])
def test_the_client_refuses_exactly_what_the_station_refuses(depth: int, items: int) -> None:
    value = {"t": "x", "p": [nested(depth), list(range(items))]}
    frame = frame_bytes(cbor.encode(value, max_depth=200))
    accepted = station_accepts(frame, 8_192)
    try:
        check_control_frame("publish", frame, max_items=8_192)
    except MeshError as exc:
        assert not accepted
        assert exc.name in {"too_many_items", "too_deep"}
    else:
        assert accepted
