"""Deterministic CBOR of Macula wire v2 (PROTOCOL.md §2).

Encoder invariants (what every byte we send satisfies):
- shortest integer heads, definite lengths only;
- every float is ``0xfb`` + binary64, NaN and ±Infinity refused;
- no CBOR booleans, tags, ``undefined`` or other simple values: a Python ``bool`` is sent as the
  integer 1/0 (as the reference client does), ``None`` as ``null``;
- map keys are text or integers, sorted by the bytes of their complete encoding.

Decoder invariants (what we accept from a peer):
- exactly one item, nothing after it;
- rejects booleans, ``undefined``, other simple values, tags, indefinite lengths, reserved
  additional-info values, NaN/±Infinity in any width, invalid UTF-8, map keys that are not text
  or integers, and duplicate keys;
- accepts half/single floats, non-minimal heads and unsorted keys (§2.5 "MAY accept": a signature
  over such bytes simply never verifies, because verification re-encodes canonically);
- bounded: nesting depth, total item count, and every declared length or count is checked against
  the bytes actually present *before* anything is allocated, so a hostile 16 MiB input costs at
  most linear time and memory and never recursion beyond ``max_depth``.
Every decoding failure raises ``ProtocolError``; nothing else escapes ``decode``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from macula.wire.cbor_fast import Fallback, decode_fast
from macula.wire.errors import LocalProtocolError, ProtocolError

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_MAX_ITEMS", "decode", "decode_prefix", "encode"]

DEFAULT_MAX_DEPTH = 100
DEFAULT_MAX_ITEMS = 1_000_000
_UINT64_MAX = (1 << 64) - 1
_NINT64_MIN = -(1 << 64)

_pack_d = struct.Struct(">d").pack
_unpack_d = struct.Struct(">d").unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_e = struct.Struct(">e").unpack_from
_unpack_h = struct.Struct(">H").unpack_from
_unpack_i = struct.Struct(">I").unpack_from
_unpack_q = struct.Struct(">Q").unpack_from

# Encoded text keys repeat in every frame (envelope keys): keep their encodings.
_KEY_CACHE: dict[str, bytes] = {}
_KEY_CACHE_MAX = 4096


_SMALL_HEADS = tuple(tuple(bytes(((m << 5) | v,)) for v in range(24)) for m in range(8))


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return _SMALL_HEADS[major][value]
    mt = major << 5
    if value <= 0xFF:
        return bytes((mt | 24, value))
    if value <= 0xFFFF:
        return bytes((mt | 25,)) + value.to_bytes(2, "big")
    if value <= 0xFFFFFFFF:
        return bytes((mt | 26,)) + value.to_bytes(4, "big")
    return bytes((mt | 27,)) + value.to_bytes(8, "big")


def _encode_text(value: str) -> bytes:
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError("invalid_text", f"text is not encodable as UTF-8: {exc}") from None
    return _head(3, len(raw)) + raw


def _encode_key(key: object, allow_bytes_keys: bool) -> bytes:
    if type(key) is str:
        cached = _KEY_CACHE.get(key)
        if cached is None:
            cached = _encode_text(key)
            if len(_KEY_CACHE) < _KEY_CACHE_MAX:
                _KEY_CACHE[key] = cached
        return cached
    if type(key) is int:
        return _encode_int(key)
    if allow_bytes_keys and type(key) is bytes:
        return _head(2, len(key)) + key
    raise LocalProtocolError(
        "bad_map_key", f"map keys must be text or integers, not {type(key).__name__}"
    )


def _encode_int(value: int) -> bytes:
    if value >= 0:
        if value > _UINT64_MAX:
            raise LocalProtocolError("int_out_of_range", f"{value} exceeds 2^64-1")
        return _head(0, value)
    if value < _NINT64_MIN:
        raise LocalProtocolError("int_out_of_range", f"{value} is below -2^64")
    return _head(1, -1 - value)


def _encode_into(out: list[bytes], value: object, depth: int, bkeys: bool) -> None:
    t = type(value)
    if t is dict:
        if depth <= 0:
            raise LocalProtocolError("too_deep", "value nests deeper than the encoder allows")
        _encode_map(out, value, depth, bkeys)  # type: ignore[arg-type]
    elif t is str:
        out.append(_encode_text(value))  # type: ignore[arg-type]
    elif t is bytes:
        out.append(_head(2, len(value)))  # type: ignore[arg-type]
        out.append(value)  # type: ignore[arg-type]
    elif t is int:
        out.append(_encode_int(value))  # type: ignore[arg-type]
    elif value is None:
        out.append(b"\xf6")
    elif t is bool:
        out.append(b"\x01" if value else b"\x00")
    elif t is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise LocalProtocolError("non_finite_float", f"{value} has no encoding on this wire")
        out.append(b"\xfb" + _pack_d(value))
    elif isinstance(value, (dict, Mapping)):
        if depth <= 0:
            raise LocalProtocolError("too_deep", "value nests deeper than the encoder allows")
        _encode_map(out, value, depth, bkeys)
    elif isinstance(value, (list, tuple)):
        if depth <= 0:
            raise LocalProtocolError("too_deep", "value nests deeper than the encoder allows")
        out.append(_head(4, len(value)))
        inner = depth - 1
        append = out.append
        for item in value:
            # the common scalars inline (no call per item); anything else recursively
            it = type(item)
            if it is str and len(item) < 24 and item.isascii():
                append(_SMALL_HEADS[3][len(item)])
                append(item.encode())
            elif it is int and 0 <= item < 24:
                append(_SMALL_HEADS[0][item])
            else:
                _encode_into(out, item, inner, bkeys)
    elif isinstance(value, (bytearray, memoryview)):
        raw = bytes(value)
        out.append(_head(2, len(raw)))
        out.append(raw)
    elif isinstance(value, int):
        out.append(_encode_int(int(value)))
    elif isinstance(value, str):
        out.append(_encode_text(str(value)))
    elif isinstance(value, float):
        _encode_into(out, float(value), depth, bkeys)
    else:
        raise LocalProtocolError(
            "unencodable", f"{type(value).__name__} has no encoding on Macula wire v2"
        )


_first_item = itemgetter(0)
_TEXT_HEADS = _SMALL_HEADS[3]
_UINT_HEADS = _SMALL_HEADS[0]
_BYTES_HEADS = _SMALL_HEADS[2]


def _encode_map(out: list[bytes], value: Mapping[Any, Any], depth: int, bkeys: bool) -> None:
    """A map at ``depth`` > 0: keys sorted by their encoding, common values encoded inline."""
    cache = _KEY_CACHE
    pairs = []
    for k, v in value.items():
        encoded = cache.get(k) if type(k) is str else None
        pairs.append((encoded or _encode_key(k, bkeys), v))
    # Distinct keys of a map have distinct encodings (text/int/bytes encode injectively).
    pairs.sort(key=_first_item)
    append = out.append
    append(_head(5, len(pairs)))
    inner = depth - 1
    for encoded_key, item in pairs:
        append(encoded_key)
        it = type(item)
        if it is bytes:
            size = len(item)
            append(_BYTES_HEADS[size] if size < 24 else _head(2, size))
            append(item)
        elif it is str and len(item) < 24 and item.isascii():
            append(_TEXT_HEADS[len(item)])
            append(item.encode())
        elif it is int and 0 <= item < 24:
            append(_UINT_HEADS[item])
        elif item is None:
            append(b"\xf6")
        else:
            _encode_into(out, item, inner, bkeys)


def encode(
    value: object, *, max_depth: int = DEFAULT_MAX_DEPTH, allow_bytes_keys: bool = False
) -> bytes:
    """Deterministic (canonical) CBOR encoding of ``value`` per PROTOCOL.md §2.2.

    Byte-string map keys are refused (§2.4: never in a frame, payloads included);
    ``allow_bytes_keys`` exists only to check the generic ordering rule of §2.2.
    """
    out: list[bytes] = []
    _encode_into(out, value, max_depth, allow_bytes_keys)
    return b"".join(out)


def _encode_value(value: object) -> bytes:
    """``encode(value)``, with the common scalars of a frame's fields encoded directly."""
    if type(value) is bytes:
        size = len(value)
        return (_BYTES_HEADS[size] if size < 24 else _head(2, size)) + value
    if type(value) is int and 0 <= value < 24:
        return _UINT_HEADS[value]
    if value is None:
        return b"\xf6"
    if type(value) is str and len(value) < 24 and value.isascii():
        return _TEXT_HEADS[len(value)] + value.encode()
    return encode(value)


def encode_pairs(value: Mapping[Any, Any]) -> list[tuple[bytes, bytes]]:
    """A map's canonical encoding as sorted (encoded key, encoded value) pairs, so callers can
    encode a map once and emit it with or without some entries (see ``join_pairs``)."""
    cache = _KEY_CACHE
    pairs = []
    for k, v in value.items():
        encoded = cache.get(k) if type(k) is str else None
        pairs.append((encoded or _encode_key(k, False), _encode_value(v)))
    pairs.sort(key=_first_item)  # distinct keys have distinct encodings
    return pairs


def join_pairs(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """The canonical map made of already sorted encoded pairs."""
    return _head(5, len(pairs)) + b"".join(k + v for k, v in pairs)


encode_value = _encode_value  # one field's value, as ``encode_pairs`` encodes it


def encode_key(key: str | int) -> bytes:
    return _encode_key(key, False)


class _Decoder:
    __slots__ = ("budget", "bytes_keys", "data", "end", "pos")

    def __init__(self, data: bytes, pos: int, end: int, max_items: int, bytes_keys: bool) -> None:
        self.bytes_keys = bytes_keys
        self.data = data
        self.pos = pos
        self.end = end
        self.budget = max_items

    def fail(self, reason: str, detail: str) -> ProtocolError:
        return ProtocolError(reason, f"{detail} (at byte {self.pos})")

    def argument(self, ai: int) -> int:
        data, pos = self.data, self.pos
        if ai < 24:
            return ai
        if ai == 24:
            width = 1
        elif ai == 25:
            width = 2
        elif ai == 26:
            width = 4
        elif ai == 27:
            width = 8
        elif ai == 31:
            raise self.fail("indefinite_length", "indefinite-length items are not on this wire")
        else:
            raise self.fail("reserved_additional_info", f"additional info {ai} is reserved")
        if pos + width > self.end:
            raise self.fail("truncated", "unexpected end of input inside an item head")
        self.pos = pos + width
        if width == 1:
            return data[pos]
        if width == 2:
            return int(_unpack_h(data, pos)[0])
        if width == 4:
            return int(_unpack_i(data, pos)[0])
        return int(_unpack_q(data, pos)[0])

    def take(self, length: int) -> bytes:
        start = self.pos
        if length > self.end - start:
            raise self.fail("truncated", f"declared length {length} exceeds the remaining input")
        self.pos = start + length
        return self.data[start : start + length]

    def item(self, depth: int) -> Any:
        pos = self.pos
        if pos >= self.end:
            raise self.fail("truncated", "unexpected end of input")
        self.budget -= 1
        if self.budget < 0:
            raise self.fail("too_many_items", "the value holds more items than allowed")
        data = self.data
        initial = data[pos]
        pos += 1
        major, ai = initial >> 5, initial & 0x1F
        if ai < 24 and major != 7:  # short head: the common case, inlined
            self.pos = pos
            if major == 0:
                return ai
            if major == 3 or major == 2:
                end = pos + ai
                if end > self.end:
                    raise self.fail("truncated", f"declared length {ai} exceeds the input")
                self.pos = end
                if major == 2:
                    return data[pos:end]
                try:
                    return data[pos:end].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise self.fail("invalid_utf8", f"text is not valid UTF-8: {exc}") from None
            if major == 5:
                return self.map(ai, depth)
            if major == 1:
                return -1 - ai
            if major == 4:
                if depth <= 0:
                    raise self.fail("too_deep", "nesting exceeds the allowed depth")
                return [self.item(depth - 1) for _ in range(ai)]
            raise self.fail("tag", "tags (major type 6) are not on this wire")
        self.pos = pos
        if major == 0:
            return self.argument(ai)
        if major == 3:
            raw = self.take(self.argument(ai))
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise self.fail("invalid_utf8", f"text string is not valid UTF-8: {exc}") from None
        if major == 2:
            return self.take(self.argument(ai))
        if major == 1:
            return -1 - self.argument(ai)
        if major == 4:
            count = self.argument(ai)
            if count > self.end - self.pos:
                raise self.fail("truncated", f"array declares {count} items, input is shorter")
            if depth <= 0:
                raise self.fail("too_deep", "nesting exceeds the allowed depth")
            return [self.item(depth - 1) for _ in range(count)]
        if major == 5:
            return self.map(self.argument(ai), depth)
        if major == 6:
            raise self.fail("tag", "tags (major type 6) are not on this wire")
        return self.simple(ai)

    def map(self, count: int, depth: int) -> dict[Any, Any]:
        if count > (self.end - self.pos) // 2:
            raise self.fail("truncated", f"map declares {count} pairs, input is shorter")
        if depth <= 0:
            raise self.fail("too_deep", "nesting exceeds the allowed depth")
        result: dict[Any, Any] = {}
        item = self.item
        inner = depth - 1
        for _ in range(count):
            key_at = self.pos
            key = item(inner)
            kt = type(key)
            if kt is not str and kt is not int and not (kt is bytes and self.bytes_keys):
                self.pos = key_at
                raise self.fail("bad_map_key", f"map key of type {_kind(key)} is not allowed")
            if key in result:
                self.pos = key_at
                raise self.fail("duplicate_key", f"map key {key!r} appears twice")
            result[key] = item(inner)
        return result

    def simple(self, ai: int) -> Any:
        if ai == 22:
            return None
        if ai == 27:
            value = _unpack_d(self.take(8), 0)[0]
        elif ai == 26:
            value = _unpack_f(self.take(4), 0)[0]
        elif ai == 25:
            value = _unpack_e(self.take(2), 0)[0]
        elif ai in (20, 21):
            raise self.fail("boolean", "CBOR true/false are not on this wire (use 1/0 or text)")
        elif ai == 23:
            raise self.fail("undefined", "CBOR undefined is not on this wire")
        elif ai == 31:
            raise self.fail("indefinite_length", "break code outside an indefinite item")
        else:
            raise self.fail("simple_value", f"simple value (additional info {ai}) is not allowed")
        if not math.isfinite(value):
            raise self.fail("non_finite_float", f"{value} is not allowed on this wire")
        return float(value)


def _kind(value: object) -> str:
    return {bytes: "bytes", list: "array", dict: "map", float: "float"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def decode_prefix(
    data: bytes,
    pos: int = 0,
    end: int | None = None,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_items: int = DEFAULT_MAX_ITEMS,
    allow_bytes_keys: bool = False,
) -> tuple[Any, int]:
    """Decode one item starting at ``pos``; return it and the position just after it."""
    decoder = _Decoder(data, pos, len(data) if end is None else end, max_items, allow_bytes_keys)
    try:
        value = decoder.item(max_depth)
    except RecursionError:  # only if a caller raised max_depth beyond the interpreter's limit
        raise ProtocolError(
            "too_deep", "nesting exceeds the interpreter's recursion limit"
        ) from None
    return value, decoder.pos


def decode(
    data: bytes | bytearray | memoryview,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_items: int = DEFAULT_MAX_ITEMS,
    allow_bytes_keys: bool = False,
) -> Any:
    """Decode exactly one CBOR item occupying all of ``data`` (strict, bounded)."""
    raw = bytes(data)
    if len(raw) <= max_items:  # the item budget cannot run out: the fast path may decide
        try:
            return decode_fast(raw, max_depth, allow_bytes_keys)
        except Fallback:
            pass  # the full decoder accepts it or names what is wrong
    value, pos = decode_prefix(
        raw, 0, None, max_depth=max_depth, max_items=max_items, allow_bytes_keys=allow_bytes_keys
    )
    if pos != len(raw):
        raise ProtocolError("trailing_bytes", f"{len(raw) - pos} trailing byte(s) after the item")
    return value
