"""The frame envelope of Macula wire v2 (PROTOCOL.md §3.1, §4.2, §4.3): the ``Frame`` base class.

A frame type is a dataclass whose fields are declared with ``wire(KIND)``; the ``Wire`` kinds
here say how one field travels, and ``Frame`` turns the field table into the wire map, its
signable bytes and its signature check. The frame catalogue and ``parse_frame`` are
``macula.wire.frames``, which is also where callers import ``Frame`` from. Invariants:
- ``to_map()`` always carries the §3.1 envelope (``version``, ``frame_type``, ``frame_id``,
  ``sent_at_ms``, ``capabilities``), each unused envelope slot as ``null``, and ``extras``
  (unknown keys of a parsed frame) unchanged.
- The signable bytes are ``macula-v2-frame\\0 || canonical CBOR`` of that map without
  ``signature``/``publisher_sig`` (§4.2); ``sign_and_encode`` produces exactly the bytes of
  ``signed_by(identity).encode()``.
- A value that fails its field's ``Wire.check`` never becomes a frame (``LocalProtocolError``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from macula.wire import cbor
from macula.wire.errors import LocalProtocolError, ProtocolError, SignatureInvalid
from macula.wire.framing import frame_bytes
from macula.wire.identity import DOMAIN_FRAME, Identity, verify

PROTOCOL_VERSION = 2
_EMPTY: Mapping[str, Any] = MappingProxyType({})


# --- wire kinds: how one field travels ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wire:
    """One field's wire rule: ``check`` validates a Python value (both directions) and says why
    not; ``to_wire``/``from_wire`` convert where Python and wire types differ."""

    describe: str
    check: Callable[[Any], bool]
    to_wire: Callable[[Any], Any] = lambda v: v
    from_wire: Callable[[Any], Any] = lambda v: v
    omit_when_none: bool = False  # key absent (not null) when the value is None


def is_int(v: Any) -> bool:
    """An integer (IntEnum members included), never a bool (§2.2: no booleans)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _is_uint(v: Any) -> bool:
    return is_int(v) and v >= 0


def _bytes_n(n: int) -> Wire:
    return Wire(f"bytes({n})", lambda v: type(v) is bytes and len(v) == n)


def nullable(kind: Wire) -> Wire:
    return Wire(
        f"{kind.describe} or null",
        lambda v: v is None or kind.check(v),
        lambda v: None if v is None else kind.to_wire(v),
        lambda v: None if v is None else kind.from_wire(v),
    )


def optional(kind: Wire) -> Wire:
    return dataclasses.replace(nullable(kind), omit_when_none=True)


def one_of(*values: str) -> Wire:
    return Wire("one of " + "/".join(values), lambda v: type(v) is str and v in values)


def _utf8(v: Any) -> str:
    if type(v) is not bytes:
        raise ProtocolError("bad_field", "expected UTF-8 bytes")
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("bad_field", "bytes are not valid UTF-8") from None


B16 = _bytes_n(16)
B32 = _bytes_n(32)
BYTES = Wire("bytes", lambda v: type(v) is bytes)
TEXT = Wire("text", lambda v: type(v) is str)
UINT = Wire("uint", _is_uint)
INT = Wire("int", is_int)
ANY = Wire("any", lambda v: True)
MAP = Wire("map", lambda v: isinstance(v, Mapping))
ARRAY = Wire("array", lambda v: isinstance(v, (list, tuple)))
ARRAY_B32 = Wire(
    "array of bytes(32)",
    lambda v: isinstance(v, (list, tuple)) and all(type(x) is bytes and len(x) == 32 for x in v),
)
# A name the API treats as a string but the wire carries as UTF-8 bytes (§2.3, §3.15).
NAME = Wire("UTF-8 bytes", lambda v: type(v) is str, lambda v: v.encode("utf-8"), _utf8)
# Frame-level boolean (§2.3): text "true"/"false" on the wire.
BOOL_TEXT = Wire(
    'text "true"/"false"',
    lambda v: type(v) is bool,
    lambda v: "true" if v else "false",
    lambda v: {"true": True, "false": False}.get(v, v) if type(v) is str else v,
)


def wire(kind: Wire, default: Any = dataclasses.MISSING) -> Any:
    if default is dataclasses.MISSING:
        return field(metadata={"wire": kind})
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"wire": kind})
    return field(default=default, metadata={"wire": kind})


# --- the envelope ----------------------------------------------------------------------------

_ENVELOPE_SLOTS = ("realm", "call_id", "source_route")
_SIGNATURE_KEYS = ("signature", "publisher_sig")
_SIGNATURE_KEY = cbor.encode_key("signature")
_PUBLISHER_SIG_KEY = cbor.encode_key("publisher_sig")


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """Fields common to every frame. Subclasses declare their own with ``wire(KIND)``."""

    FRAME_TYPE: ClassVar[str] = ""
    NULL_SLOTS: ClassVar[tuple[str, ...]] = _ENVELOPE_SLOTS
    SIGNER: ClassVar[str | None] = None  # field holding the key the frame verifies against

    frame_id: bytes = wire(B16)
    sent_at_ms: int = wire(UINT)
    capabilities: int = wire(UINT, 0)
    signature: bytes | None = wire(optional(BYTES), None)
    extras: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self) -> None:
        for name, check in _checks(type(self)):
            if not check(getattr(self, name)):
                kind = dict(field_specs(type(self)))[name]
                raise LocalProtocolError(
                    "bad_field", f"{self.FRAME_TYPE}.{name} must be {kind.describe}"
                )

    def to_map(self, *, signed: bool = True) -> dict[str, Any]:
        """The complete wire map; ``signed=False`` leaves out ``signature``/``publisher_sig``."""
        out: dict[str, Any] = dict(self.extras)
        out["version"] = PROTOCOL_VERSION
        out["frame_type"] = self.FRAME_TYPE
        for slot in self.NULL_SLOTS:
            out[slot] = None
        for name, kind in field_specs(type(self)):
            value = getattr(self, name)
            if value is None and kind.omit_when_none:
                continue
            if not signed and name in _SIGNATURE_KEYS:
                continue
            out[name] = kind.to_wire(value)
        return out

    def signable_bytes(self) -> bytes:
        """``macula-v2-frame\\0 || canonical CBOR(map without signature/publisher_sig)`` (§4.2)."""
        if self.extras:
            return DOMAIN_FRAME + cbor.encode(self.to_map(signed=False))
        signed = [pair for pair in self.encoded_pairs() if pair[0] != _PUBLISHER_SIG_KEY]
        return DOMAIN_FRAME + cbor.join_pairs(signed)

    def signed_by(self: F, identity: Identity) -> F:
        return dataclasses.replace(self, signature=identity.sign(self.signable_bytes()))

    def sign_and_encode(self, identity: Identity) -> bytes:
        """``signed_by(identity).encode()`` with every field encoded once: the signed bytes
        and the frame share the same encoded pairs, the signature pair is slotted in."""
        pairs = self.encoded_pairs()
        signable = [pair for pair in pairs if pair[0] != _PUBLISHER_SIG_KEY]
        signature = identity.sign(DOMAIN_FRAME + cbor.join_pairs(signable))
        bisect.insort(pairs, (_SIGNATURE_KEY, cbor.encode(signature)))
        return frame_bytes(cbor.join_pairs(pairs))

    def encoded_pairs(self) -> list[tuple[bytes, bytes]]:
        """``cbor.encode_pairs`` of ``to_map()`` without ``signature``: the frame's fields as
        sorted (encoded key, encoded value) pairs. Without ``extras`` they are encoded straight
        from the fields in the class's precomputed key order (no map built, nothing sorted)."""
        if self.extras:
            unsigned = self.to_map()
            unsigned.pop("signature", None)
            return cbor.encode_pairs(unsigned)
        encode_value = cbor.encode_value
        pairs: list[tuple[bytes, bytes]] = []
        append = pairs.append
        for key, name, to_wire, omit, constant in _encode_table(type(self)):
            if constant is not None:
                append((key, constant))
                continue
            value = getattr(self, name)
            if value is None:
                if not omit:
                    append((key, b"\xf6"))
                continue
            if to_wire is not None:
                value = to_wire(value)
            if type(value) is bytes and len(value) < 256:  # ids, keys, signatures
                append((key, _BYTES_HEAD[len(value)] + value))
            else:
                append((key, encode_value(value)))
        return pairs

    def verifies(self, public_key: bytes) -> bool:
        """True iff ``signature`` is present, 64 bytes, and valid for ``public_key``."""
        return verify(public_key, self.signable_bytes(), self.signature)

    def expected_signer(self) -> bytes | None:
        """The key §4.3 verifies this frame against, when the frame names it; ``None`` means
        "the sending connection's key" (or the station's HELLO key on the client side)."""
        return getattr(self, self.SIGNER) if self.SIGNER else None

    def require_signed_by(self, connection_key: bytes) -> None:
        """Verify per §4.3: against the named signer field if any, else ``connection_key``."""
        key = self.expected_signer() or connection_key
        if not self.verifies(key):
            raise SignatureInvalid(
                "signature_invalid", f"{self.FRAME_TYPE} does not verify against {key.hex()}"
            )

    def encode(self) -> bytes:
        """Length-prefixed canonical CBOR, ready for a stream."""
        return frame_bytes(cbor.encode(self.to_map()))


F = TypeVar("F", bound=Frame)

# (encoded key, field name, to_wire or None, omit when None, encoded constant or None) per key
# of a frame class's map but ``signature``, sorted by encoded key (PROTOCOL.md §2.2)
_EncodeRow = tuple[bytes, str, Callable[[Any], Any] | None, bool, bytes | None]
_ENCODE_CACHE: dict[type[Frame], tuple[_EncodeRow, ...]] = {}
# the canonical head of a byte string of each length under 256 (PROTOCOL.md §2.2)
_BYTES_HEAD = tuple(cbor.encode(bytes(n))[: 1 if n < 24 else 2] for n in range(256))
_NO_CONVERSION = next(f.default for f in dataclasses.fields(Wire) if f.name == "to_wire")


def _encode_table(cls: type[Frame]) -> tuple[_EncodeRow, ...]:
    table = _ENCODE_CACHE.get(cls)
    if table is None:
        rows: list[_EncodeRow] = [
            (cbor.encode_key("version"), "", None, False, cbor.encode(PROTOCOL_VERSION)),
            (cbor.encode_key("frame_type"), "", None, False, cbor.encode(cls.FRAME_TYPE)),
        ]
        rows += [(cbor.encode_key(slot), "", None, False, b"\xf6") for slot in cls.NULL_SLOTS]
        for name, kind in field_specs(cls):
            if name != "signature":
                to_wire = None if kind.to_wire is _NO_CONVERSION else kind.to_wire
                rows.append((cbor.encode_key(name), name, to_wire, kind.omit_when_none, None))
        table = _ENCODE_CACHE[cls] = tuple(sorted(rows, key=lambda row: row[0]))
    return table


_SPEC_CACHE: dict[type[Frame], tuple[tuple[str, Wire], ...]] = {}


_CHECK_CACHE: dict[type[Frame], tuple[tuple[str, Callable[[Any], bool]], ...]] = {}


def _checks(cls: type[Frame]) -> tuple[tuple[str, Callable[[Any], bool]], ...]:
    """(name, check) of every field whose kind restricts its value (``ANY`` does not)."""
    checks = _CHECK_CACHE.get(cls)
    if checks is None:
        checks = tuple((name, k.check) for name, k in field_specs(cls) if k is not ANY)
        _CHECK_CACHE[cls] = checks
    return checks


def field_specs(cls: type[Frame]) -> tuple[tuple[str, Wire], ...]:
    """The ``(name, Wire)`` table of a frame class, in declaration order (computed once)."""
    specs = _SPEC_CACHE.get(cls)
    if specs is None:
        specs = tuple((f.name, f.metadata["wire"]) for f in dataclasses.fields(cls) if f.metadata)
        _SPEC_CACHE[cls] = specs
    return specs
