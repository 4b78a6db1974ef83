"""Typed frames of Macula wire v2 (PROTOCOL.md §3, §4, §12.3).

Every client-relevant frame type is a frozen, slotted dataclass that validates on construction.
``to_map()`` gives the complete wire map (the §3.1 envelope always present, unused envelope
slots as ``null``); ``parse_frame(map)`` gives the typed frame back or raises ``ProtocolError``
naming the field. Invariants:
- ``parse_frame(m).to_map() == m`` for every map ``parse_frame`` accepts: fields keep their wire
  types exactly (``procedure``/``topic`` travel as UTF-8 bytes and are ``str`` here; ``detail``,
  STREAM_ERROR ``code``/``message`` stay ``bytes``), and unknown keys are kept in ``extras``.
  Hence verification (which re-encodes the decoded map, §4.2) and relaying are lossless;
  ``verifies_received`` verifies over the received bytes instead when they are canonical (the
  same bytes, without the re-encoding).
- The field table of each class *is* the spec: a ``Wire`` kind per field, one generic
  ``to_map``/``parse``; no per-frame hand-written codec. The kinds and the ``Frame`` base
  (envelope, signing) are ``macula.wire.envelope``; ``Frame`` and ``PROTOCOL_VERSION`` are
  re-exported here, the one module callers import frames from.
- Time and randomness are arguments (``new_frame_id(now_ms, random10)``); nothing here reads a
  clock or an RNG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from macula.wire import cbor
from macula.wire.codes import code_name
from macula.wire.envelope import (
    ANY,
    ARRAY,
    ARRAY_B32,
    B16,
    B32,
    BOOL_TEXT,
    BYTES,
    INT,
    MAP,
    NAME,
    PROTOCOL_VERSION,
    TEXT,
    UINT,
    Frame,
    Wire,
    field_specs,
    is_int,
    nullable,
    one_of,
    optional,
    wire,
)
from macula.wire.errors import LocalProtocolError, ProtocolError
from macula.wire.framing import ReceivedMap, unsigned_body
from macula.wire.identity import DOMAIN_EVENT_PUB, DOMAIN_FRAME, Identity, uuid7, verify

CAP_STATION = 0x1


class UnknownFrameType(ProtocolError):
    """A well-formed frame of a type this side does not handle (§2.5: MUST ignore)."""


def new_frame_id(now_ms: int, random10: bytes) -> bytes:
    """A fresh UUIDv7 frame id (§12.3) from the given time and 10 random bytes."""
    return uuid7(now_ms, random10)


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
    site: Any = wire(nullable(MAP), None)
    endorsements: list[Any] = wire(ARRAY, [])
    # ours, an extra field the reference keeps and ignores (§2.5), covered by the signature:
    # the node id of the station this CONNECT is meant for (issue 27, SECURITY.md "Each claim
    # verified once"); that station binds the connection, any other refuses it; absent: unbound
    bound_to: bytes | None = wire(optional(B32), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Frame):
    FRAME_TYPE = "hello"
    SIGNER = "node_id"
    node_id: bytes = wire(B32)
    station_id: bytes = wire(B32)
    accepted: bool = wire(BOOL_TEXT)
    negotiated_capabilities: int = wire(UINT)
    refusal_code: int | None = wire(nullable(UINT), None)
    realms: list[bytes] = wire(ARRAY_B32, [])
    addresses: list[Any] = wire(ARRAY, [])
    site: Any = wire(nullable(MAP), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodbye(Frame):
    FRAME_TYPE = "goodbye"
    reason: str = wire(TEXT)
    detail: bytes | None = wire(nullable(BYTES), None)


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
    code: int = wire(Wire("uint 0..255", lambda v: is_int(v) and 0 <= v <= 255))
    reported_by: bytes = wire(B32)
    name: str = wire(TEXT, "")
    detail: bytes | None = wire(nullable(BYTES), None)
    offending_hop: bytes | None = wire(nullable(B32), None)
    source_route_partial: bytes = wire(BYTES, b"")

    def __post_init__(self) -> None:
        if self.name == "" and is_int(self.code):
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
    ttl_ms: int | None = wire(nullable(UINT), None)
    publisher_sig: bytes | None = wire(optional(BYTES), None)

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
    delivered_via: str = wire(one_of("direct", "plumtree", "dht"), "direct")
    publisher_sig: bytes | None = wire(optional(BYTES), None)
    # ours, an extra field the reference keeps and ignores (§2.5): on an EVENT relayed from a
    # linked station without publisher_sig, the node id of the station that took the PUBLISH
    # from its publisher's connection (it vouches for ``publisher``); absent otherwise
    attested_by: bytes | None = wire(optional(B32), None)

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
    mode: str = wire(one_of("server_stream", "client_stream", "bidi"))
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
    encoding: str = wire(one_of("raw", "msgpack"), "raw")
    body: Any = wire(ANY)
    signer: bytes | None = wire(optional(B32), None)

    def __post_init__(self) -> None:
        Frame.__post_init__(self)
        if self.encoding == "raw" and type(self.body) is not bytes:
            raise LocalProtocolError("bad_field", "stream_data.body must be bytes when raw")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd(_StreamSigned):
    FRAME_TYPE = "stream_end"
    stream_id: bytes = wire(B16)
    role: str = wire(one_of("send", "both"))
    signer: bytes | None = wire(optional(B32), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamError(_StreamSigned):
    FRAME_TYPE = "stream_error"
    stream_id: bytes = wire(B16)
    code: bytes = wire(BYTES)
    message: bytes = wire(BYTES, b"")
    signer: bytes | None = wire(optional(B32), None)


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
    absent = 0  # optional fields left out of the map
    for name, kind, from_wire in _parse_table(cls):
        if name not in frame_map:
            if kind.omit_when_none:
                values[name] = None
                absent += 1
                continue
            raise ProtocolError("missing_field", f"{frame_type}.{name} is missing")
        value = frame_map[name]
        if from_wire is not None:
            try:
                value = from_wire(value)
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
    extras = None
    if len(frame_map) > len(known) - absent:  # keys beyond the known ones it holds
        extras = {k: v for k, v in frame_map.items() if k not in known}
    if cls in _CHECKED_ONLY:
        # every field was checked above, which is all ``Frame.__post_init__`` would do again:
        # fill the slots directly (every field has a value here: present, or None when omitted)
        frame = object.__new__(cls)
        for name, value in values.items():
            _set(frame, name, value)
        _set(frame, "extras", MappingProxyType(extras) if extras else _EMPTY_EXTRAS)
        return frame
    if extras:
        values["extras"] = MappingProxyType(extras)
    try:
        return cls(**values)
    except LocalProtocolError as exc:  # cross-field rules (e.g. raw body must be bytes)
        raise ProtocolError(exc.reason, exc.detail) from None


_set = object.__setattr__
_EMPTY_EXTRAS: Mapping[str, Any] = MappingProxyType({})
_IDENTITY = next(f.default for f in dataclasses.fields(Wire) if f.name == "from_wire")
_PARSE_CACHE: dict[type[Frame], tuple[tuple[str, Wire, Any], ...]] = {}
# frame classes whose only construction rule is the per-field check (no ``__post_init__`` of
# their own: ERROR fills ``name``, STREAM_DATA checks a cross-field rule): parsed without
# running the checks a second time
_CHECKED_ONLY = frozenset(
    cls for cls in FRAME_TYPES.values() if cls.__post_init__ is Frame.__post_init__
)


def _parse_table(cls: type[Frame]) -> tuple[tuple[str, Wire, Any], ...]:
    """``field_specs(cls)`` with each kind's ``from_wire`` (None where it converts nothing)."""
    table = _PARSE_CACHE.get(cls)
    if table is None:
        table = tuple(
            (name, kind, None if kind.from_wire is _IDENTITY else kind.from_wire)
            for name, kind in field_specs(cls)
        )
        _PARSE_CACHE[cls] = table
    return table


_KNOWN_CACHE: dict[type[Frame], frozenset[str]] = {}


def _known_keys(cls: type[Frame]) -> frozenset[str]:
    known = _KNOWN_CACHE.get(cls)
    if known is None:
        known = frozenset(
            ("version", "frame_type", *cls.NULL_SLOTS, *(name for name, _ in field_specs(cls)))
        )
        _KNOWN_CACHE[cls] = known
    return known


# --- verifying what was received (§4.2) ------------------------------------------------------


def received_signable(frame: Frame, frame_map: Mapping[str, Any]) -> bytes:
    """The bytes ``frame``'s signature covers, where ``frame = parse_frame(frame_map)``: cut
    from the received body when ``frame_map`` came from ``FrameDecoder`` (a ``ReceivedMap``)
    and that body is canonical, else re-encoded from the decoded map (§4.2). Both are the same
    bytes for a canonical body, so the verdict never depends on which is used."""
    if isinstance(frame_map, ReceivedMap):
        unsigned = unsigned_body(frame_map.body)
        if unsigned is not None:
            return DOMAIN_FRAME + unsigned
    return frame.signable_bytes()


def verifies_received(frame: Frame, frame_map: Mapping[str, Any], public_key: bytes) -> bool:
    """``frame.verifies(public_key)`` over the received bytes (``received_signable``)."""
    if type(frame.signature) is not bytes or len(frame.signature) != 64:
        return False  # no signable bytes needed to refuse it
    return verify(public_key, received_signable(frame, frame_map), frame.signature)


# --- publisher signature (§4.4) --------------------------------------------------------------


def publication_signable(
    topic: str, realm: bytes, publisher: bytes, seq: int, payload: Any
) -> bytes:
    """``DOMAIN_EVENT_PUB || CBOR{topic (UTF-8 bytes), realm, publisher, seq, payload}`` (§4.4),
    its five pairs written in their canonical order (no map built, nothing sorted)."""
    value = cbor.encode_value
    return b"".join(
        (
            _PUBLICATION_HEAD,
            _SEQ_KEY,
            value(seq),
            _REALM_KEY,
            value(realm),
            _TOPIC_KEY,
            value(topic.encode("utf-8")),
            _PAYLOAD_KEY,
            cbor.encode(payload, max_depth=_PAYLOAD_DEPTH),
            _PUBLISHER_KEY,
            value(publisher),
        )
    )


# the publication map's keys in canonical order (§2.2: by encoded key): seq, realm, topic,
# payload, publisher (tests hold this equal to encoding the map)
_SEQ_KEY, _REALM_KEY, _TOPIC_KEY, _PAYLOAD_KEY, _PUBLISHER_KEY = (
    cbor.encode_key(key) for key in ("seq", "realm", "topic", "payload", "publisher")
)
_PUBLICATION_HEAD = DOMAIN_EVENT_PUB + b"\xa5"
_PAYLOAD_DEPTH = cbor.DEFAULT_MAX_DEPTH - 1  # a value inside the map, as when the map is encoded


def publisher_sig_valid(
    frame: Publish | Event, check: Callable[[bytes, bytes, object], bool] = verify
) -> bool:
    """§4.4: ``publisher_sig`` present and valid for ``publisher``. ``check``: how it is
    verified (a client passes ``verified.publications.verify``: the same EVENT reaching
    several nodes of one process is verified once there; a station verifies each time)."""
    if frame.publisher_sig is None:
        return False
    signable = publication_signable(
        frame.topic, frame.realm, frame.publisher, frame.seq, frame.payload
    )
    return check(frame.publisher, signable, frame.publisher_sig)


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
    "received_signable",
    "verifies_received",
]
