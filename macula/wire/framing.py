"""Stream framing of Macula wire v2 (PROTOCOL.md §2.1).

``frame = length (uint32, big-endian) || one CBOR map of exactly that many bytes``.

Invariants of ``FrameDecoder``:
- feed it any split of the byte stream; it returns every complete frame body (a decoded map) in
  order and keeps the rest buffered;
- a declared length above ``max_frame_size`` (never above 0xFFFFFF) is refused as soon as the
  four prefix bytes are in, before any body is buffered;
- a body that is not exactly one CBOR map (garbage, trailing bytes, another type) is refused;
- every refusal is a ``FramingError`` whose ``frames_before`` holds the complete frames that
  preceded the bad one in the same call (so nothing valid is lost); after one, the decoder is
  poisoned and raises again on every call: a broken stream never resynchronises silently
  (§2.5: close, never wedge);
- work is linear in the bytes fed; memory is bounded by one frame plus one read.
"""

from __future__ import annotations

from typing import Any

from macula.wire import cbor
from macula.wire.errors import FramingError, LocalProtocolError, ProtocolError

MAX_FRAME_SIZE = 0x00FFFFFF
PREFIX_SIZE = 4


def frame_bytes(body: bytes) -> bytes:
    """Prefix an encoded CBOR map with its length."""
    if len(body) > MAX_FRAME_SIZE:
        raise LocalProtocolError(
            "frame_too_large", f"{len(body)} bytes exceed the {MAX_FRAME_SIZE}-byte frame limit"
        )
    return len(body).to_bytes(PREFIX_SIZE, "big") + body


def decode_body(
    body: bytes, *, max_depth: int = cbor.DEFAULT_MAX_DEPTH, max_items: int = cbor.DEFAULT_MAX_ITEMS
) -> dict[str, Any]:
    """Decode one frame body; it must be exactly one CBOR map."""
    try:
        value = cbor.decode(body, max_depth=max_depth, max_items=max_items)
    except ProtocolError as exc:
        raise FramingError(exc.reason, exc.detail) from None
    if not isinstance(value, dict):
        raise FramingError("not_a_map", "a frame body must be a CBOR map")
    return value


class FrameDecoder:
    """Incremental decoder: ``feed(bytes) -> [frame maps]``; raises only ``FramingError``."""

    __slots__ = ("_buffer", "_error", "max_depth", "max_frame_size", "max_items")

    def __init__(
        self,
        *,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_depth: int = cbor.DEFAULT_MAX_DEPTH,
        max_items: int = cbor.DEFAULT_MAX_ITEMS,
    ) -> None:
        if not 1 <= max_frame_size <= MAX_FRAME_SIZE:
            raise LocalProtocolError("bad_limit", f"max_frame_size must be 1..{MAX_FRAME_SIZE}")
        self.max_frame_size = max_frame_size
        self.max_depth = max_depth
        self.max_items = max_items
        self._buffer = bytearray()
        self._error: FramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[dict[str, Any]]:
        if self._error is not None:
            raise self._error
        self._buffer += data
        frames: list[dict[str, Any]] = []
        buffer = self._buffer
        start = 0
        try:
            while len(buffer) - start >= PREFIX_SIZE:
                length = int.from_bytes(buffer[start : start + PREFIX_SIZE], "big")
                if length > self.max_frame_size:
                    raise FramingError(
                        "frame_too_large",
                        f"declared frame length {length} exceeds {self.max_frame_size}",
                    )
                end = start + PREFIX_SIZE + length
                if len(buffer) < end:
                    break
                body = bytes(buffer[start + PREFIX_SIZE : end])
                start = end
                frames.append(decode_body(body, max_depth=self.max_depth, max_items=self.max_items))
        except FramingError as exc:
            self._error = FramingError(exc.reason, exc.detail)
            self._buffer = bytearray()
            exc.frames_before = frames
            raise
        if start:
            del buffer[:start]
        return frames

    def at_frame_boundary(self) -> bool:
        """True when no partial frame is buffered (a FIN here loses nothing)."""
        return not self._buffer and self._error is None
