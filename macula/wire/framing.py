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
- work is linear in the bytes fed; memory is bounded by one frame plus one read;
- every map it returns is a ``ReceivedMap`` holding the exact body it was decoded from (the
  same ``bytes`` object, no second copy), so a verifier can cut the signed bytes out of it
  (``unsigned_body``) instead of re-encoding the map, whenever those bytes are canonical.

``unsigned_body(body)`` is the canonical encoding of the body's map without its top-level
``signature``/``publisher_sig`` (§4.2), cut from ``body``, or None when ``body`` is not
canonical (§2.2: shortest heads, sorted keys, binary64 floats): then, and only then, a verifier
re-encodes the decoded map as before. For a canonical body both give the same bytes, because
decoding then re-encoding canonical CBOR gives it back byte for byte.
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


class ReceivedMap(dict[str, Any]):
    """A decoded frame map and ``body``, the received bytes it was decoded from. A map that is
    changed after decoding no longer matches its body: nothing on the receive path does so."""

    __slots__ = ("body",)

    def __init__(self, decoded: dict[str, Any], body: bytes) -> None:
        super().__init__(decoded)
        self.body = body


_SIGNATURE_KEYS = (b"\x69signature", b"\x6dpublisher_sig")  # encoded text keys (§4.2)


class _NotCanonical(Exception):
    pass


def _argument(data: bytes, pos: int, ai: int) -> tuple[int, int]:
    """A long head's argument and the position after it; a head that is not the shortest
    (§2.2) or not definite is not canonical."""
    if ai == 24:
        value, end = data[pos], pos + 1
        minimum = 24
    elif ai == 25:
        value, end = int.from_bytes(data[pos : pos + 2], "big"), pos + 2
        minimum = 0x100
    elif ai == 26:
        value, end = int.from_bytes(data[pos : pos + 4], "big"), pos + 4
        minimum = 0x10000
    elif ai == 27:
        value, end = int.from_bytes(data[pos : pos + 8], "big"), pos + 8
        minimum = 0x100000000
    else:
        raise _NotCanonical
    if value < minimum or end > len(data):
        raise _NotCanonical
    return value, end


def _skip(data: bytes, pos: int) -> int:
    """The position after the canonical item at ``pos`` (the decoder has already checked the
    body is well-formed and bounded: this walk only checks canonical form)."""
    initial = data[pos]
    pos += 1
    if initial < 0x18:  # the commonest item of a frame: a small uint
        return pos
    major = initial >> 5
    if major == 7:
        if initial == 0xF6:  # null
            return pos
        if initial == 0xFB:  # binary64, the only float of the wire
            return pos + 8
        raise _NotCanonical
    ai = initial & 0x1F
    count, pos = (ai, pos) if ai < 24 else _argument(data, pos, ai)
    if major <= 1:
        return pos
    if major <= 3:
        return pos + count
    if major == 4:
        for _ in range(count):
            pos = _skip(data, pos)
        return pos
    if major == 5:
        return _skip_pairs(data, pos, count, None)
    raise _NotCanonical


def _skip_pairs(data: bytes, pos: int, count: int, cuts: list[tuple[int, int]] | None) -> int:
    """The position after ``count`` canonical pairs at ``pos``; with ``cuts``, the spans of
    the pairs keyed ``signature``/``publisher_sig`` are added to it."""
    previous = b""
    skip = _skip
    for _ in range(count):
        start = pos
        initial = data[pos]
        if 0x60 <= initial < 0x78:  # a short text key: every key of the envelope
            pos += 1 + initial - 0x60
        else:
            pos = skip(data, pos)
        key = data[start:pos]
        if key <= previous:  # sorted by encoded key, hence no duplicates either
            raise _NotCanonical
        previous = key
        initial = data[pos]
        if initial < 0x18:  # a small uint
            pos += 1
        elif initial == 0x58 and data[pos + 1] >= 24:  # ids, realms, signatures: bytes(24..255)
            pos += 2 + data[pos + 1]
        else:
            pos = skip(data, pos)
        if cuts is not None and key in _SIGNATURE_KEYS:
            cuts.append((start, pos))
    return pos


def _map_head(count: int) -> bytes:
    """The shortest head of a map of ``count`` pairs (§2.2)."""
    if count < 24:
        return bytes((0xA0 | count,))
    for ai, width in ((24, 1), (25, 2), (26, 4)):
        if count < 1 << (8 * width):
            return bytes((0xA0 | ai,)) + count.to_bytes(width, "big")
    return b"\xbb" + count.to_bytes(8, "big")


def unsigned_body(body: bytes) -> bytes | None:
    """The canonical map of ``body`` without its top-level ``signature``/``publisher_sig``,
    cut from ``body``; None if ``body`` is not one canonical map."""
    try:
        initial = body[0]
        if initial >> 5 != 5:
            return None
        ai = initial & 0x1F
        count, pos = (ai, 1) if ai < 24 else _argument(body, 1, ai)
        first = pos
        cuts: list[tuple[int, int]] = []
        pos = _skip_pairs(body, pos, count, cuts)
        if pos != len(body):
            return None
    except (_NotCanonical, IndexError):
        return None
    if not cuts:
        return body
    parts = [_map_head(count - len(cuts))]
    at = first
    for start, end in cuts:
        parts.append(body[at:start])
        at = end
    parts.append(body[at:])
    return b"".join(parts)


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
                decoded = decode_body(body, max_depth=self.max_depth, max_items=self.max_items)
                frames.append(ReceivedMap(decoded, body))
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
