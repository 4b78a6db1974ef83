"""The CBOR codec as it was before the fast paths (test-only reference, never imported by code).

``encode`` is the previous encoder verbatim; ``decode`` runs only the full strict decoder
(``cbor._Decoder`` through ``decode_prefix``), never the fast path. The differential tests in
``test_cbor_fast.py`` check that the production codec agrees with both on random inputs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

from macula.wire.cbor import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS, decode_prefix
from macula.wire.errors import LocalProtocolError, ProtocolError

_UINT64_MAX = (1 << 64) - 1
_NINT64_MIN = -(1 << 64)
_pack_d = struct.Struct(">d").pack

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
    if t is str:
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
        # Distinct keys of a dict have distinct encodings (text/int/bytes encode injectively),
        # so sorting the pairs never compares two values.
        pairs = sorted([(_encode_key(k, bkeys), v) for k, v in value.items()], key=_first)
        out.append(_head(5, len(pairs)))
        for encoded_key, item in pairs:
            out.append(encoded_key)
            _encode_into(out, item, depth - 1, bkeys)
    elif isinstance(value, (list, tuple)):
        if depth <= 0:
            raise LocalProtocolError("too_deep", "value nests deeper than the encoder allows")
        out.append(_head(4, len(value)))
        for item in value:
            _encode_into(out, item, depth - 1, bkeys)
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


def _first(pair: tuple[bytes, object]) -> bytes:
    return pair[0]


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


def encode_pairs(value: Mapping[Any, Any]) -> list[tuple[bytes, bytes]]:
    return sorted((_encode_key(k, False), encode(v)) for k, v in value.items())


def decode(
    data: bytes | bytearray | memoryview,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_items: int = DEFAULT_MAX_ITEMS,
    allow_bytes_keys: bool = False,
) -> Any:
    """``cbor.decode`` without its fast path: the full decoder alone."""
    raw = bytes(data)
    value, pos = decode_prefix(
        raw, 0, None, max_depth=max_depth, max_items=max_items, allow_bytes_keys=allow_bytes_keys
    )
    if pos != len(raw):
        raise ProtocolError("trailing_bytes", f"{len(raw) - pos} trailing byte(s) after the item")
    return value
