"""What a station refuses on a control stream, checked on our side before a frame is sent.

A station closes the connection of a client whose control-stream frame is over its size, CBOR
item budget or nesting depth (``relay.core.policy``: ``max_control_frame_size``,
``max_control_frame_items``; the codec's ``DEFAULT_MAX_DEPTH``). Sending one would cost the
connection and everything on it, and a publish would still look like a success. So the client
refuses such a frame itself, with a ``MeshError`` naming what was too much and the fix.

Invariants:
- exact, not a guess: a frame whose bytes could exceed a budget (more bytes than items allowed,
  or at least as many array/map head bytes as levels allowed) is decoded with the station's
  own limits; every other frame is provably within them and costs one ``bytes.translate``;
- values CBOR cannot carry (an integer outside [-2^64, 2^64 - 1], NaN, a type with no
  encoding) and values nested past the encoder's depth are refused the same way
  (``encoding_refusal``), never as a crash;
- pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from macula.errors import MeshError
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.errors import LocalProtocolError, ProtocolError
from macula.wire.framing import PREFIX_SIZE
from macula.wire.identity import Identity

# what a station accepts on a control stream by default (relay.core.policy)
MAX_CONTROL_FRAME = 1 << 20
MAX_CONTROL_ITEMS = 8_192
MAX_DEPTH = cbor.DEFAULT_MAX_DEPTH
MAX_VALUE_DEPTH = MAX_DEPTH - 1  # a payload is a value inside the frame's map

SHARE_BY_CONTENT = "share large data with put_content (mesh_put) and send its content id"
_FIXES = {
    "payload_too_large": SHARE_BY_CONTENT,
    "too_many_items": f"send fewer values (at most {MAX_CONTROL_ITEMS} in one frame), or "
    + SHARE_BY_CONTENT,
    "too_deep": f"flatten the value: at most {MAX_VALUE_DEPTH} levels of nested lists/maps",
    "int_out_of_range": "send integers in [-2^64, 2^64 - 1]; larger ones as text",
    "non_finite_float": "send NaN and infinities as text or null",
    "unencodable": "send only JSON values (text, numbers, lists, maps, null)",
}
# every CBOR head byte of an array (major type 4) or a map (major type 5): 0x80..0xbf
_NOT_CONTAINER_HEADS = bytes(b for b in range(256) if not 0x80 <= b <= 0xBF)


def refusal(name: str, detail: str) -> MeshError:
    """A ``MeshError`` (payload_too_large, 0x0D) named ``name`` whose detail carries the fix."""
    return MeshError(ErrorCode.PAYLOAD_TOO_LARGE, f"{detail}: {_FIXES[name]}", name=name)


def encoding_refusal(exc: LocalProtocolError) -> MeshError | None:
    """The refusal for a value the encoder could not carry, or None for any other error."""
    if exc.reason not in _FIXES:
        return None
    return refusal(exc.reason, exc.detail)


def value_depth(value: object, stop_after: int = MAX_VALUE_DEPTH) -> int:
    """Levels of nested lists/maps in ``value`` (a scalar: 0, ``[0]``: 1), walked without
    recursion; the walk stops as soon as the depth exceeds ``stop_after``."""
    deepest = 0
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > stop_after:
                return deepest
        pending.extend((child, depth) for child in children)
    return deepest


def encoded(sign_and_encode: Callable[[Identity], bytes], identity: Identity) -> bytes:
    """``sign_and_encode(identity)``, a value the encoder cannot carry refused as a
    ``MeshError`` naming it (``int_out_of_range``, ``too_deep``...)."""
    try:
        return sign_and_encode(identity)
    except LocalProtocolError as exc:
        refused = encoding_refusal(exc)
        if refused is None:
            raise
        raise refused from None


def check_control_frame(
    frame_type: str,
    data: bytes,
    *,
    max_bytes: int = MAX_CONTROL_FRAME,
    max_items: int = MAX_CONTROL_ITEMS,
    max_depth: int = MAX_DEPTH,
) -> None:
    """Raise the refusal when a station would refuse ``data`` (a framed frame) on its control
    stream for its size, its item count or its nesting depth."""
    if len(data) > max_bytes:
        raise refusal(
            "payload_too_large",
            f"{frame_type} is {len(data)} bytes, over the {max_bytes} a station takes on the "
            "control stream",
        )
    body = data[PREFIX_SIZE:]
    if len(body) <= max_items and len(body.translate(None, _NOT_CONTAINER_HEADS)) < max_depth:
        return  # every item takes a byte, every level a head byte: within both budgets
    try:
        cbor.decode(body, max_depth=max_depth, max_items=max_items)
    except ProtocolError as exc:
        if exc.reason == "too_many_items":
            raise refusal(
                "too_many_items", f"{frame_type} holds more than the {max_items} CBOR items"
            ) from None
        if exc.reason == "too_deep":
            raise refusal(
                "too_deep", f"{frame_type} nests deeper than the {max_depth} levels"
            ) from None
        raise
