"""Fast path of the strict CBOR decoder (``macula.wire.cbor.decode``): frames, in CPU time.

Invariants:
- ``decode_fast`` accepts a subset of what ``cbor._Decoder`` accepts and, for what it accepts,
  returns an equal value of the same types (``tests/unit/macula/wire/test_cbor_fast.py`` checks this
  differentially); on anything else -- malformed input, a rejected construct, or merely an
  uncommon one (half/single floats, major 7 other than ``null`` and binary64, nesting past the
  limit) -- it raises ``Fallback`` and the caller re-runs the full decoder from the start, which
  then accepts or names the error exactly as before. So errors, limits and their messages are
  the full decoder's alone; this module never decides to reject anything.
- it is only used when the input has no more bytes than ``max_items`` (every item takes at
  least one byte, so the item budget cannot run out and need not be counted);
- no per-item method calls or attribute writes: one recursive function over ``(data, pos)``
  returning ``(value, next pos)``, with the common heads of map keys and values (short text,
  short bytes, small ints, ``null``) decoded inline;
- every length is checked against the end of ``data`` before slicing (a slice would silently
  truncate), and ``data`` must be ``bytes`` ending where the item must end.
"""

from __future__ import annotations

import math
import struct
from typing import Any

__all__ = ["Fallback", "decode_fast"]

_unpack_d = struct.Struct(">d").unpack_from
_from_bytes = int.from_bytes
_isfinite = math.isfinite


class Fallback(Exception):
    """Not for the fast path: decode again with the full decoder (never escapes ``cbor``)."""


def _argument(data: bytes, pos: int, ai: int) -> tuple[int, int]:
    """The head's argument for ``ai`` >= 24 (``pos`` is just after the initial byte)."""
    if ai == 24:
        return data[pos], pos + 1
    if ai == 25:
        end = pos + 2
    elif ai == 26:
        end = pos + 4
    elif ai == 27:
        end = pos + 8
    else:  # reserved additional info or indefinite length
        raise Fallback
    if end > len(data):
        raise Fallback
    return _from_bytes(data[pos:end], "big"), end


def _item(data: bytes, pos: int, depth: int, bkeys: bool) -> tuple[Any, int]:
    initial = data[pos]
    pos += 1
    major = initial >> 5
    ai = initial & 0x1F
    if major == 7:
        if initial == 0xF6:
            return None, pos
        if initial == 0xFB:
            end = pos + 8
            if end > len(data):
                raise Fallback
            value = _unpack_d(data, pos)[0]
            if not _isfinite(value):
                raise Fallback
            return value, end
        raise Fallback
    if ai >= 24:
        ai, pos = _argument(data, pos, ai)
    if major == 0:
        return ai, pos
    if major == 3:
        end = pos + ai
        if end > len(data):
            raise Fallback
        return data[pos:end].decode(), end
    if major == 2:
        end = pos + ai
        if end > len(data):
            raise Fallback
        return data[pos:end], end
    if major == 5:
        return _map(data, pos, ai, depth, bkeys)
    if major == 4:
        if depth <= 0 or ai > len(data) - pos:
            raise Fallback
        depth -= 1
        out: list[Any] = []
        append = out.append
        for _ in range(ai):
            value, pos = _item(data, pos, depth, bkeys)
            append(value)
        return out, pos
    if major == 1:
        return -1 - ai, pos
    raise Fallback  # major 6: a tag


def _map(data: bytes, pos: int, count: int, depth: int, bkeys: bool) -> tuple[Any, int]:
    if depth <= 0 or count > (len(data) - pos) // 2:
        raise Fallback
    depth -= 1
    out: dict[Any, Any] = {}
    size = len(data)
    for _ in range(count):
        initial = data[pos]
        if 0x60 <= initial < 0x78:  # text key shorter than 24 bytes: nearly every key
            end = pos + 1 + initial - 0x60
            if end > size:
                raise Fallback
            key: Any = data[pos + 1 : end].decode()
            pos = end
        else:
            key, pos = _item(data, pos, depth, bkeys)
            kind = type(key)
            if kind is not int and kind is not str and not (bkeys and kind is bytes):
                raise Fallback
        initial = data[pos]
        if initial < 0x18:
            out[key] = initial
            pos += 1
        elif initial < 0x1C:  # uint with a 1/2/4/8-byte argument (timestamps)
            out[key], pos = _argument(data, pos + 1, initial)
        elif initial == 0xF6:
            out[key] = None
            pos += 1
        elif 0x40 <= initial < 0x80 and (initial & 0x1F) <= 24:  # bytes/text shorter than 256
            if initial & 0x1F == 24:
                pos += 2
                end = pos + data[pos - 1]
            else:
                pos += 1
                end = pos + (initial & 0x1F)
            if end > size:
                raise Fallback
            out[key] = data[pos:end] if initial < 0x60 else data[pos:end].decode()
            pos = end
        else:
            out[key], pos = _item(data, pos, depth, bkeys)
    if len(out) != count:  # a key appeared twice (the later value replaced the earlier)
        raise Fallback
    return out, pos


def decode_fast(data: bytes, max_depth: int, bkeys: bool) -> Any:
    """The one item filling ``data``; ``Fallback`` when the full decoder must decide."""
    try:
        value, pos = _item(data, 0, max_depth, bkeys)
    except (IndexError, UnicodeDecodeError, RecursionError):
        raise Fallback from None
    if pos != len(data):
        raise Fallback
    return value
