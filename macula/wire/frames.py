"""Typed frames of Macula wire v2 (PROTOCOL.md §3, §4, §12.3).

Every client-relevant frame type is a frozen, slotted dataclass that validates on construction.
``to_map()`` gives the complete wire map (the §3.1 envelope always present, unused envelope
slots as ``null``); ``parse_frame(map)`` gives the typed frame back or raises ``ProtocolError``
naming the field. Invariants:
- ``parse_frame(m).to_map() == m`` for every map ``parse_frame`` accepts: fields keep their wire
  types exactly (``procedure``/``topic`` travel as UTF-8 bytes and are ``str`` here; ``detail``,
  STREAM_ERROR ``code``/``message`` stay ``bytes``), and unknown keys are kept in ``extras``.
  Hence verification (which re-encodes the decoded map, §4.2) and relaying are lossless.
- The field table of each class *is* the spec: a ``Wire`` kind per field, one generic
  ``to_map``/``parse``; no per-frame hand-written codec.
- Time and randomness are arguments (``new_frame_id(now_ms, random10)``); nothing here reads a
  clock or an RNG.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from macula.wire import cbor
from macula.wire.codes import code_name
from macula.wire.errors import LocalProtocolError, ProtocolError, SignatureInvalid
from macula.wire.framing import frame_bytes
from macula.wire.identity import DOMAIN_EVENT_PUB, DOMAIN_FRAME, Identity, uuid7, verify

PROTOCOL_VERSION = 2
CAP_STATION = 0x1
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class UnknownFrameType(ProtocolError):
    """A well-formed frame of a type this side does not handle (§2.5: MUST ignore)."""


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


def _is_int(v: Any) -> bool:
    """An integer (IntEnum members included), never a bool (§2.2: no booleans)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _is_uint(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _bytes_n(n: int) -> Wire:
    return Wire(f"bytes({n})", lambda v: type(v) is bytes and len(v) == n)


def _nullable(kind: Wire) -> Wire:
    return Wire(
        f"{kind.describe} or null",
        lambda v: v is None or kind.check(v),
        lambda v: None if v is None else kind.to_wire(v),
        lambda v: None if v is None else kind.from_wire(v),
    )


def _optional(kind: Wire) -> Wire:
    return dataclasses.replace(_nullable(kind), omit_when_none=True)


def _enum(*values: str) -> Wire:
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
INT = Wire("int", _is_int)
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
_ALWAYS = ("version", "frame_type", "frame_id", "sent_at_ms", "capabilities")
_SIGNATURE_KEYS = ("signature", "publisher_sig")
_SIGNATURE_KEY = cbor.encode_key("signature")
_PUBLISHER_SIG_KEY = cbor.encode_key("publisher_sig")


def new_frame_id(now_ms: int, random10: bytes) -> bytes:
    """A fresh UUIDv7 frame id (§12.3) from the given time and 10 random bytes."""
    return uuid7(now_ms, random10)


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """Fields common to every frame. Subclasses declare their own with ``wire(KIND)``."""

    FRAME_TYPE: ClassVar[str] = ""
    NULL_SLOTS: ClassVar[tuple[str, ...]] = _ENVELOPE_SLOTS
    SIGNER: ClassVar[str | None] = None  # field holding the key the frame verifies against

    frame_id: bytes = wire(B16)
    sent_at_ms: int = wire(UINT)
    capabilities: int = wire(UINT, 0)
    signature: bytes | None = wire(_optional(BYTES), None)
    extras: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self) -> None:
        for name, kind in _specs(type(self)):
            value = getattr(self, name)
            if not kind.check(value):
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
        for name, kind in _specs(type(self)):
            value = getattr(self, name)
            if value is None and kind.omit_when_none:
                continue
            if not signed and name in _SIGNATURE_KEYS:
                continue
            out[name] = kind.to_wire(value)
        return out

    def signable_bytes(self) -> bytes:
        """``macula-v2-frame\\0 || canonical CBOR(map without signature/publisher_sig)`` (§4.2)."""
        return DOMAIN_FRAME + cbor.encode(self.to_map(signed=False))

    def signed_by(self: F, identity: Identity) -> F:
        return dataclasses.replace(self, signature=identity.sign(self.signable_bytes()))

    def sign_and_encode(self, identity: Identity) -> bytes:
        """``signed_by(identity).encode()`` with every field encoded once: the signed bytes
        and the frame share the same encoded pairs, the signature pair is slotted in."""
        unsigned = self.to_map()
        unsigned.pop("signature", None)
        pairs = cbor.encode_pairs(unsigned)
        signable = [pair for pair in pairs if pair[0] != _PUBLISHER_SIG_KEY]
        signature = identity.sign(DOMAIN_FRAME + cbor.join_pairs(signable))
        bisect.insort(pairs, (_SIGNATURE_KEY, cbor.encode(signature)))
        return frame_bytes(cbor.join_pairs(pairs))

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

_SPEC_CACHE: dict[type[Frame], tuple[tuple[str, Wire], ...]] = {}


def _specs(cls: type[Frame]) -> tuple[tuple[str, Wire], ...]:
    specs = _SPEC_CACHE.get(cls)
    if specs is None:
        specs = tuple((f.name, f.metadata["wire"]) for f in dataclasses.fields(cls) if f.metadata)
        _SPEC_CACHE[cls] = specs
    return specs


# --- frame types (§3.3-§3.14) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Connect(Frame):
    FRAME_TYPE = "connect"
    SIGNER = "node_id"
    node_id: bytes = wire(B32)
    station_id: bytes = wire(B32)
    puzzle_evidence: bytes = wire(B32)
    realms: list[bytes] = wire(ARRAY_B32, [])
    addresses: list[Any] = wire(ARRAY, [])
    site: Any = wire(_nullable(MAP), None)
    endorsements: list[Any] = wire(ARRAY, [])


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    FRAME_TYPE = "hello"
    SIGNER = "node_id"
    node_id: bytes = wire(B32)
    station_id: bytes = wire(B32)
    accepted: bool = wire(BOOL_TEXT)
    negotiated_capabilities: int = wire(UINT)
    refusal_code: int | None = wire(_nullable(UINT), None)
    realms: list[bytes] = wire(ARRAY_B32, [])
    addresses: list[Any] = wire(ARRAY, [])
    site: Any = wire(_nullable(MAP), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodbye(Frame):
    FRAME_TYPE = "goodbye"
    reason: str = wire(TEXT)
    detail: bytes | None = wire(_nullable(BYTES), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Frame):
    FRAME_TYPE = "call"
    NULL_SLOTS = ()
    SIGNER = "caller"
    call_id: bytes = wire(B16)
    procedure: str = wire(NAME)
    realm: bytes = wire(B32)
    payload: Any = wire(ANY)
    deadline_ms: int = wire(INT)
    caller: bytes = wire(B32)
    source_route: bytes = wire(BYTES, b"")
    retry_budget: int = wire(UINT, 0)
    ucan_token: bytes = wire(BYTES, b"")


@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Frame):
    FRAME_TYPE = "result"
    NULL_SLOTS = ("realm", "source_route")
    SIGNER = "responded_by"
    call_id: bytes = wire(B16)
    payload: Any = wire(ANY)
    responded_by: bytes = wire(B32)
    source_route_reverse: bytes = wire(BYTES, b"")


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Frame):
    """ERROR. ``name`` defaults to the name §9 derives from ``code``."""

    FRAME_TYPE = "error"
    NULL_SLOTS = ("realm", "source_route")
    SIGNER = "reported_by"
    call_id: bytes = wire(B16)
    code: int = wire(Wire("uint 0..255", lambda v: _is_int(v) and 0 <= v <= 255))
    reported_by: bytes = wire(B32)
    name: str = wire(TEXT, "")
    detail: bytes | None = wire(_nullable(BYTES), None)
    offending_hop: bytes | None = wire(_nullable(B32), None)
    source_route_partial: bytes = wire(BYTES, b"")

    def __post_init__(self) -> None:
        if self.name == "" and _is_int(self.code):
            object.__setattr__(self, "name", code_name(self.code))
        Frame.__post_init__(self)

    @property
    def detail_text(self) -> str | None:
        return None if self.detail is None else self.detail.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True, kw_only=True)
class Advertise(Frame):
    FRAME_TYPE = "advertise"
    NULL_SLOTS = ("call_id", "source_route")
    realm: bytes = wire(B32)
    procedure: str = wire(NAME)
    advertiser: bytes = wire(B32)
    options: Mapping[str, Any] = wire(MAP, {})


@dataclass(frozen=True, slots=True, kw_only=True)
class Unadvertise(Frame):
    FRAME_TYPE = "unadvertise"
    NULL_SLOTS = ("call_id", "source_route")
    realm: bytes = wire(B32)
    procedure: str = wire(NAME)
    advertiser: bytes = wire(B32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish(Frame):
    FRAME_TYPE = "publish"
    NULL_SLOTS = ("call_id", "source_route")
    topic: str = wire(NAME)
    realm: bytes = wire(B32)
    publisher: bytes = wire(B32)
    seq: int = wire(UINT)
    payload: Any = wire(ANY)
    published_at_ms: int = wire(UINT)
    ttl_ms: int | None = wire(_nullable(UINT), None)
    publisher_sig: bytes | None = wire(_optional(BYTES), None)

    def with_publisher_sig(self, identity: Identity) -> Publish:
        """Add the end-to-end ``publisher_sig`` of §4.4 (re-sign the frame afterwards)."""
        signable = publication_signable(
            self.topic, self.realm, self.publisher, self.seq, self.payload
        )
        return dataclasses.replace(self, publisher_sig=identity.sign(signable))


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Frame):
    FRAME_TYPE = "subscribe"
    NULL_SLOTS = ("call_id", "source_route")
    topic: str = wire(NAME)
    realm: bytes = wire(B32)
    subscriber: bytes = wire(B32)
    filter: Any = wire(ANY, None)
    options: Mapping[str, Any] = wire(MAP, {})


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsubscribe(Frame):
    FRAME_TYPE = "unsubscribe"
    NULL_SLOTS = ("call_id", "source_route")
    topic: str = wire(NAME)
    realm: bytes = wire(B32)
    subscriber: bytes = wire(B32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(Frame):
    FRAME_TYPE = "event"
    NULL_SLOTS = ("call_id", "source_route")
    topic: str = wire(NAME)
    realm: bytes = wire(B32)
    publisher: bytes = wire(B32)
    seq: int = wire(UINT)
    payload: Any = wire(ANY)
    delivered_via: str = wire(_enum("direct", "plumtree", "dht"), "direct")
    publisher_sig: bytes | None = wire(_optional(BYTES), None)

    def publisher_sig_valid(self) -> bool:
        """§4.4: True only when ``publisher_sig`` is present and verifies against
        ``publisher``; absence is "not authenticated", never valid."""
        return publisher_sig_valid(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOpen(Frame):
    FRAME_TYPE = "stream_open"
    NULL_SLOTS = ("call_id",)
    SIGNER = "caller"
    stream_id: bytes = wire(B16)
    procedure: str = wire(NAME)
    realm: bytes = wire(B32)
    mode: str = wire(_enum("server_stream", "client_stream", "bidi"))
    args: Any = wire(ANY)
    deadline_ms: int = wire(INT)
    caller: bytes = wire(B32)
    source_route: bytes = wire(BYTES, b"")
    retry_budget: int = wire(UINT, 0)


class _StreamSigned(Frame):
    """STREAM_DATA/END/ERROR: verified against ``signer`` when present (§4.3)."""

    __slots__ = ()

    def expected_signer(self) -> bytes | None:
        signer: bytes | None = getattr(self, "signer", None)
        return signer


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamData(_StreamSigned):
    FRAME_TYPE = "stream_data"
    stream_id: bytes = wire(B16)
    seq: int = wire(UINT)
    encoding: str = wire(_enum("raw", "msgpack"), "raw")
    body: Any = wire(ANY)
    signer: bytes | None = wire(_optional(B32), None)

    def __post_init__(self) -> None:
        Frame.__post_init__(self)
        if self.encoding == "raw" and type(self.body) is not bytes:
            raise LocalProtocolError("bad_field", "stream_data.body must be bytes when raw")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd(_StreamSigned):
    FRAME_TYPE = "stream_end"
    stream_id: bytes = wire(B16)
    role: str = wire(_enum("send", "both"))
    signer: bytes | None = wire(_optional(B32), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamError(_StreamSigned):
    FRAME_TYPE = "stream_error"
    stream_id: bytes = wire(B16)
    code: bytes = wire(BYTES)
    message: bytes = wire(BYTES, b"")
    signer: bytes | None = wire(_optional(B32), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReply(Frame):
    FRAME_TYPE = "stream_reply"
    SIGNER = "responded_by"
    stream_id: bytes = wire(B16)
    payload: Any = wire(ANY)
    responded_by: bytes = wire(B32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Frame):
    FRAME_TYPE = "ping"
    nonce: bytes = wire(B16)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Frame):
    FRAME_TYPE = "pong"
    nonce: bytes = wire(B16)


FRAME_TYPES: Mapping[str, type[Frame]] = MappingProxyType(
    {
        cls.FRAME_TYPE: cls
        for cls in (
            Connect,
            Hello,
            Goodbye,
            Call,
            Result,
            Error,
            Advertise,
            Unadvertise,
            Publish,
            Subscribe,
            Unsubscribe,
            Event,
            StreamOpen,
            StreamData,
            StreamEnd,
            StreamError,
            StreamReply,
            Ping,
            Pong,
        )
    }
)


# --- parsing ---------------------------------------------------------------------------------


def parse_frame(frame_map: object) -> Frame:
    """Typed, validated frame from a decoded map; ``ProtocolError`` names what is wrong.

    ``UnknownFrameType`` (a ``ProtocolError``) is raised for a well-formed frame of a type we
    do not handle, so callers can ignore it as §2.5 requires.
    """
    if not isinstance(frame_map, dict):
        raise ProtocolError("not_a_map", "a frame is a CBOR map")
    frame_type = frame_map.get("frame_type")
    if type(frame_type) is not str:
        raise ProtocolError("bad_frame_type", "frame_type must be text")
    version = frame_map.get("version")
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise ProtocolError("unsupported_version", f"version must be 2, got {version!r}")
    cls = FRAME_TYPES.get(frame_type)
    if cls is None:
        raise UnknownFrameType("unknown_frame_type", f"frame_type {frame_type!r}")
    values: dict[str, Any] = {}
    for name, kind in _specs(cls):
        if name not in frame_map:
            if kind.omit_when_none:
                values[name] = None
                continue
            raise ProtocolError("missing_field", f"{frame_type}.{name} is missing")
        raw = frame_map[name]
        try:
            value = kind.from_wire(raw)
        except ProtocolError as exc:
            raise ProtocolError("bad_field", f"{frame_type}.{name}: {exc.detail}") from None
        if not kind.check(value):
            raise ProtocolError("bad_field", f"{frame_type}.{name} must be {kind.describe}")
        values[name] = value
    for slot in cls.NULL_SLOTS:
        if slot not in frame_map:
            raise ProtocolError("missing_field", f"{frame_type}.{slot} is missing")
        if frame_map[slot] is not None:
            raise ProtocolError("bad_field", f"{frame_type}.{slot} must be null")
    known = _known_keys(cls)
    extras = {k: v for k, v in frame_map.items() if k not in known}
    if extras:
        values["extras"] = MappingProxyType(extras)
    try:
        return cls(**values)
    except LocalProtocolError as exc:  # cross-field rules (e.g. raw body must be bytes)
        raise ProtocolError(exc.reason, exc.detail) from None


_KNOWN_CACHE: dict[type[Frame], frozenset[str]] = {}


def _known_keys(cls: type[Frame]) -> frozenset[str]:
    known = _KNOWN_CACHE.get(cls)
    if known is None:
        known = frozenset(
            ("version", "frame_type", *cls.NULL_SLOTS, *(name for name, _ in _specs(cls)))
        )
        _KNOWN_CACHE[cls] = known
    return known


# --- publisher signature (§4.4) --------------------------------------------------------------


def publication_signable(
    topic: str, realm: bytes, publisher: bytes, seq: int, payload: Any
) -> bytes:
    body = {
        "topic": topic.encode("utf-8"),
        "realm": realm,
        "publisher": publisher,
        "seq": seq,
        "payload": payload,
    }
    return DOMAIN_EVENT_PUB + cbor.encode(body)


def publisher_sig_valid(frame: Publish | Event) -> bool:
    if frame.publisher_sig is None:
        return False
    signable = publication_signable(
        frame.topic, frame.realm, frame.publisher, frame.seq, frame.payload
    )
    return verify(frame.publisher, signable, frame.publisher_sig)


def event_from_publish(publish: Publish, *, frame_id: bytes, sent_at_ms: int) -> Event:
    """The EVENT a station builds from a PUBLISH (§7.2 step 3), unsigned.

    ``publisher_sig`` is copied only when it is a 64-byte value.
    """
    sig = publish.publisher_sig
    return Event(
        frame_id=frame_id,
        sent_at_ms=sent_at_ms,
        topic=publish.topic,
        realm=publish.realm,
        publisher=publish.publisher,
        seq=publish.seq,
        payload=publish.payload,
        delivered_via="direct",
        publisher_sig=sig if sig is not None and len(sig) == 64 else None,
    )


__all__ = [
    "CAP_STATION",
    "FRAME_TYPES",
    "PROTOCOL_VERSION",
    "Advertise",
    "Call",
    "Connect",
    "Error",
    "Event",
    "Frame",
    "Goodbye",
    "Hello",
    "Ping",
    "Pong",
    "Publish",
    "Result",
    "StreamData",
    "StreamEnd",
    "StreamError",
    "StreamOpen",
    "StreamReply",
    "Subscribe",
    "Unadvertise",
    "UnknownFrameType",
    "Unsubscribe",
    "event_from_publish",
    "new_frame_id",
    "parse_frame",
    "publication_signable",
    "publisher_sig_valid",
]
