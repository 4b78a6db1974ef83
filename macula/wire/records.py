"""DHT records of Macula wire v2 (PROTOCOL.md §10): model, signature, storage rule, payloads.

The storage-key functions of §10.5 themselves are ``macula.wire.record_keys``.

Invariants:
- A record is signed over ``DOMAIN_RECORD || canonical CBOR`` of the single-letter envelope
  ``{t, k, v, c, x, p[, u]}``; ``s`` is never part of its own signable bytes (§10.3).
  Verification rebuilds the envelope from the parsed fields, never from received bytes.
- ``key`` is the signer: a record verifies against ``key`` and nothing else.
- Parsing peer input (``Record.from_rpc`` / ``Record.from_wire``) raises only ``RecordInvalid``,
  with the reason a station reports (§10.4, §6.6): ``bad_signature`` for a missing or malformed
  ``key``/``signature``, ``missing_field`` for another absent envelope field, ``bad_record`` for
  anything else malformed. ``verify`` adds ``bad_signature`` and ``expired``; payload schemas
  raise ``bad_payload``; a type whose storage key cannot be derived raises ``no_storage_rule``.
- What we build (``new_record``) has a storage rule, a positive TTL, no CBOR null and no text
  ``"undefined"`` as a payload value (§10.4, §2.6); refusals are ``LocalProtocolError``.
- Sans-I/O: time (``now_ms``) and randomness (``version`` bytes) are always arguments.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final, NamedTuple, TypeGuard

from macula.wire import cbor
from macula.wire.content import MCID_SIZE
from macula.wire.errors import LocalProtocolError, RecordInvalid, WireError
from macula.wire.identity import DOMAIN_RECORD, Identity, uuid7, verify
from macula.wire.record_keys import (
    KEY_SIZE,
    content_announcement_key,
    domain_record_key,
    foundation_realm_trust_list_key,
    foundation_seed_list_key,
    is_domain_type,
    member_endorsement_key,
    station_endpoint_key,
    storage_key_for_procedure,
)

Payload = dict[str, Any]

UINT64_MAX: Final = (1 << 64) - 1
VERSION_SIZE: Final = 16
SIGNATURE_SIZE: Final = 64
DEFAULT_TTL_MS: Final = 48 * 3600 * 1000
STATION_ENDPOINT_TTL_MS: Final = 5 * 60 * 1000


class RecordType(IntEnum):
    """Record types with a storage rule (§10.5). 0x20..0xFF are domain types (no names)."""

    NODE_RECORD = 0x01
    REALM_DIRECTORY = 0x03
    REALM_STATIONS = 0x04
    REALM_MEMBER_ENDORSEMENT = 0x05
    PROCEDURE_ADVERTISEMENT = 0x06
    TOMBSTONE = 0x0C
    FOUNDATION_SEED_LIST = 0x0D
    FOUNDATION_PARAMETER = 0x0E
    FOUNDATION_REALM_TRUST_LIST = 0x0F
    FOUNDATION_T3_ATTESTATION = 0x10
    CONTENT_ANNOUNCEMENT = 0x11
    STATION_ENDPOINT = 0x12
    ORG_DIRECTORY = 0x15
    PROCEDURE_DELEGATION = 0x16


_NAMED_TYPES: Final = frozenset(int(t) for t in RecordType)


def has_storage_rule(record_type: int) -> bool:
    """False for 0x02, 0x07-0x0B, 0x13/0x14 (retired), unassigned 0x17-0x1F and out of range."""
    return record_type in _NAMED_TYPES or is_domain_type(record_type)


def _type_label(record_type: int) -> str:
    if record_type in _NAMED_TYPES:
        return f"{RecordType(record_type).name.lower()} (0x{record_type:02x})"
    if is_domain_type(record_type):
        return f"domain type 0x{record_type:02x}"
    return f"type 0x{record_type:02x}"


def default_ttl_ms(record_type: int) -> int:
    """Default lifetime of §10.7: 5 min for station_endpoint, 48 h for everything else."""
    return STATION_ENDPOINT_TTL_MS if record_type == RecordType.STATION_ENDPOINT else DEFAULT_TTL_MS


def record_version(now_ms: int, random_bytes10: bytes) -> bytes:
    """A fresh UUIDv7 ``version`` (§10.1, same layout as a frame id)."""
    return uuid7(now_ms, random_bytes10)


def is_newer(a: Record, b: Record) -> bool:
    """True iff ``a`` supersedes ``b``: later ``created_at``, ties broken by ``version`` bytes.

    The reference store replaces regardless of age (§13 #12); a store keeping the newest record
    per signer replaces ``b`` by ``a`` only when this holds.
    """
    return (a.created_at, a.version) > (b.created_at, b.version)


# --- storage keys (§10.5): the functions live in macula.wire.record_keys ----------------------

# Types whose rule needs an input that no payload field named by PROTOCOL.md carries.
_UNDERIVABLE: Final[Mapping[int, tuple[str, str]]] = {
    RecordType.REALM_STATIONS: ("the realm id", "realm_stations_key"),
    RecordType.REALM_MEMBER_ENDORSEMENT: (
        "the realm id and member_node",
        "member_endorsement_key",
    ),
    RecordType.FOUNDATION_PARAMETER: ("param_name", "foundation_parameter_key"),
    RecordType.FOUNDATION_T3_ATTESTATION: ("station_id", "foundation_t3_attestation_key"),
    RecordType.ORG_DIRECTORY: ("the realm id and org_name", "org_directory_key"),
    RecordType.PROCEDURE_DELEGATION: ("the org key and advertiser", "procedure_delegation_key"),
}


def _no_rule(record_type: int) -> RecordInvalid:
    label = _type_label(record_type)
    if record_type in _UNDERIVABLE:
        inputs, function = _UNDERIVABLE[record_type]
        return RecordInvalid(
            "no_storage_rule",
            f"{label}: its storage key needs {inputs}, and PROTOCOL.md §10.6 names no payload "
            f"field carrying it; compute it with {function}() from known inputs",
        )
    return RecordInvalid("no_storage_rule", f"{label} has no storage-key rule (§10.5)")


# --- the record -------------------------------------------------------------------------------


class _Form(NamedTuple):
    label: str
    type: str
    key: str
    version: str
    created_at: str
    expires_at: str
    payload: str
    subject_id: str
    signature: str


_RPC: Final = _Form("RPC", *_Form._fields[1:])  # the long names are the field names
_WIRE: Final = _Form("wire", "t", "k", "v", "c", "x", "p", "u", "s")


def _is_uint(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT64_MAX


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, bytes):
        return f"bytes({len(value)})"
    names = {str: "text", int: "int", float: "float"}
    return next((n for t, n in names.items() if isinstance(value, t)), type(value).__name__)


class _Envelope(NamedTuple):
    type: int
    key: bytes
    version: bytes
    created_at: int
    expires_at: int
    payload: Mapping[str, Any]
    subject_id: bytes | None


def _check_envelope(
    record_type: object,
    key: object,
    version: object,
    created_at: object,
    expires_at: object,
    payload: object,
    subject_id: object,
    form: _Form,
) -> _Envelope | str:
    """The typed envelope fields, or a text naming the first structural problem."""
    if not _is_uint(record_type) or not 1 <= record_type <= 0xFF:
        return f"{form.type} must be an int 1..255, got {record_type!r}"
    if type(key) is not bytes or len(key) != KEY_SIZE:
        return f"{form.key} must be {KEY_SIZE} bytes, got {_kind(key)}"
    if type(version) is not bytes or len(version) != VERSION_SIZE:
        return f"{form.version} must be {VERSION_SIZE} bytes (a UUIDv7), got {_kind(version)}"
    if not _is_uint(created_at):
        return f"{form.created_at} must be a uint (Unix ms), got {_kind(created_at)}"
    if not _is_uint(expires_at):
        return f"{form.expires_at} must be a uint (Unix ms), got {_kind(expires_at)}"
    if created_at > expires_at:
        return f"{form.created_at} {created_at} is after {form.expires_at} {expires_at}"
    if not isinstance(payload, Mapping):
        return f"{form.payload} must be a map, got {_kind(payload)}"
    bad_keys = [k for k in payload if type(k) is not str]
    if bad_keys:
        return f"{form.payload} keys must be text, got a {_kind(bad_keys[0])} key"
    if subject_id is not None and type(subject_id) is not bytes:
        return f"{form.subject_id} must be bytes, got {_kind(subject_id)}"
    return _Envelope(
        int(record_type), key, version, int(created_at), int(expires_at), payload, subject_id
    )


@dataclass(frozen=True, slots=True)
class Record:
    """One DHT record (§10.1). ``signature`` is None until ``signed``; checked by ``verify``."""

    type: int
    key: bytes
    version: bytes
    created_at: int
    expires_at: int
    payload: Payload
    subject_id: bytes | None = None
    signature: bytes | None = None

    def __post_init__(self) -> None:
        checked = _check_envelope(
            self.type,
            self.key,
            self.version,
            self.created_at,
            self.expires_at,
            self.payload,
            self.subject_id,
            _RPC,
        )
        if isinstance(checked, str):
            raise LocalProtocolError("bad_record", checked)
        if not isinstance(self.payload, dict):
            raise LocalProtocolError("bad_record", "payload must be a dict")
        for name in ("type", "created_at", "expires_at"):  # IntEnum and int subclasses -> int
            object.__setattr__(self, name, int(getattr(self, name)))

    def __hash__(self) -> int:
        return hash((self.type, self.key, self.version, self.created_at, self.signature))

    # -- encodings --

    def envelope(self) -> Payload:
        """The single-letter map that is signed (§10.3), without ``s``."""
        env: Payload = {
            "t": self.type,
            "k": self.key,
            "v": self.version,
            "c": self.created_at,
            "x": self.expires_at,
            "p": self.payload,
        }
        if self.subject_id is not None:
            env["u"] = self.subject_id
        return env

    def signable_bytes(self) -> bytes:
        return DOMAIN_RECORD + cbor.encode(self.envelope())

    def to_wire(self) -> Payload:
        """Single-letter form with ``s`` (STORE/VALUE blobs between stations)."""
        return {**self.envelope(), "s": self._require_signature()}

    def to_rpc(self) -> Payload:
        """Long-name form: the payload of ``_dht.put_record`` and what ``find_record`` returns."""
        rpc: Payload = {
            "type": self.type,
            "key": self.key,
            "version": self.version,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "payload": self.payload,
            "signature": self._require_signature(),
        }
        if self.subject_id is not None:
            rpc["subject_id"] = self.subject_id
        return rpc

    def _require_signature(self) -> bytes:
        if self.signature is None:
            raise LocalProtocolError("unsigned_record", "sign the record before sending it")
        return self.signature

    @classmethod
    def from_rpc(cls, obj: object) -> Record:
        """Parse and strictly validate the RPC form; raises only ``RecordInvalid``."""
        return _parse(obj, _RPC)

    @classmethod
    def from_wire(cls, obj: object) -> Record:
        """Parse and strictly validate the single-letter form; raises only ``RecordInvalid``."""
        return _parse(obj, _WIRE)

    # -- signature and lifetime --

    def signed(self, identity: Identity) -> Record:
        """A copy signed by ``identity``, which must own ``key``."""
        if identity.node_id != self.key:
            raise LocalProtocolError("wrong_signer", "a record is signed by the owner of its key")
        return dataclasses.replace(self, signature=identity.sign(self.signable_bytes()))

    def verify(self, now_ms: int) -> None:
        """Raise ``RecordInvalid`` (``bad_signature`` or ``expired``) unless valid at ``now_ms``."""
        signature = self.signature
        if type(signature) is not bytes or len(signature) != SIGNATURE_SIZE:
            got = _kind(signature)
            raise RecordInvalid(
                "bad_signature", f"signature must be {SIGNATURE_SIZE} bytes, got {got}"
            )
        try:
            message = self.signable_bytes()
        except WireError:
            raise RecordInvalid("bad_signature", "the envelope has no canonical encoding") from None
        if not verify(self.key, message, signature):
            raise RecordInvalid("bad_signature", "the signature does not verify against key")
        if self.is_expired(now_ms):
            raise RecordInvalid("expired", f"expires_at {self.expires_at} <= now {now_ms}")

    def is_expired(self, now_ms: int) -> bool:
        return self.expires_at <= now_ms

    # -- storage --

    def storage_key(self) -> bytes:
        """The storage key of §10.5 for the types whose inputs the record itself carries."""
        t = self.type
        if t in (RecordType.NODE_RECORD, RecordType.REALM_DIRECTORY, RecordType.TOMBSTONE):
            return self.key
        if t == RecordType.PROCEDURE_ADVERTISEMENT:
            uri = self.payload.get("procedure_uri")
            if type(uri) is not str:
                raise RecordInvalid("bad_payload", "procedure_uri (text) is needed for the key")
            return storage_key_for_procedure(uri)
        if t == RecordType.CONTENT_ANNOUNCEMENT:
            mcid = self.payload.get("mcid")
            if type(mcid) is not bytes or len(mcid) != MCID_SIZE:
                raise RecordInvalid("bad_payload", "mcid (34 bytes) is needed for the key")
            return content_announcement_key(mcid)
        if t == RecordType.STATION_ENDPOINT:
            return station_endpoint_key(self.key)
        if t == RecordType.REALM_MEMBER_ENDORSEMENT:  # macula.realm puts both in the payload
            realm, member = self.payload.get("realm"), self.payload.get("member_node")
            if type(realm) is bytes and type(member) is bytes and len(realm) == len(member) == 32:
                return member_endorsement_key(realm, member)
        if t == RecordType.FOUNDATION_SEED_LIST:
            return foundation_seed_list_key(self.key)
        if t == RecordType.FOUNDATION_REALM_TRUST_LIST:
            return foundation_realm_trust_list_key(self.key)
        if is_domain_type(t):
            return domain_record_key(t, self.key, self.subject_id)
        raise _no_rule(t)


def _parse(obj: object, form: _Form) -> Record:
    if not isinstance(obj, Mapping):
        raise RecordInvalid(
            "bad_record", f"a record ({form.label} form) is a map, not {_kind(obj)}"
        )
    # The station checks key and signature first and reports both as bad_signature (§10.4).
    key, signature = obj.get(form.key), obj.get(form.signature)
    if type(key) is not bytes or len(key) != KEY_SIZE:
        got = "missing" if form.key not in obj else _kind(key)
        raise RecordInvalid("bad_signature", f"{form.key} must be {KEY_SIZE} bytes, got {got}")
    if type(signature) is not bytes or len(signature) != SIGNATURE_SIZE:
        got = "missing" if form.signature not in obj else _kind(signature)
        raise RecordInvalid(
            "bad_signature", f"{form.signature} must be {SIGNATURE_SIZE} bytes, got {got}"
        )
    for name in (form.type, form.version, form.created_at, form.expires_at, form.payload):
        if name not in obj:
            raise RecordInvalid("missing_field", f"{form.label} form record lacks {name!r}")
    checked = _check_envelope(
        obj[form.type],
        key,
        obj[form.version],
        obj[form.created_at],
        obj[form.expires_at],
        obj[form.payload],
        obj.get(form.subject_id),  # a null subject_id is read as absent
        form,
    )
    if isinstance(checked, str):
        raise RecordInvalid("bad_record", checked)
    c = checked
    body = dict(c.payload)
    try:
        cbor.encode(body)
    except WireError as exc:
        raise RecordInvalid("bad_record", f"{form.payload} is not CBOR: {exc.detail}") from None
    return Record(
        c.type, c.key, c.version, c.created_at, c.expires_at, body, c.subject_id, signature
    )


# --- building ---------------------------------------------------------------------------------


def _refuse_unsendable(value: object, path: str) -> None:
    """CBOR null (§10.4) and text "undefined" (§2.6) do not survive the reference station."""
    if value is None:
        raise LocalProtocolError(
            "null_in_record_payload",
            f"{path} is null: the reference station re-encodes it as text 'undefined' and the "
            "record fails its signature (§10.4); omit the key instead",
        )
    if isinstance(value, str) and value == "undefined":
        raise LocalProtocolError(
            "undefined_text",
            f"{path} is the text 'undefined', which the reference station turns into null (§2.6)",
        )
    if isinstance(value, Mapping):
        for k, v in value.items():
            _refuse_unsendable(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_unsendable(item, f"{path}[{i}]")


def new_record(
    identity: Identity,
    record_type: int,
    payload: Mapping[str, Any],
    *,
    now_ms: int,
    version: bytes,
    ttl_ms: int | None = None,
    subject_id: bytes | None = None,
) -> Record:
    """Build and sign a record of ``identity``, created at ``now_ms``, TTL per §10.7 by default.

    The payload is copied through canonical CBOR (tuples become lists, bools 1/0) and checked
    against §10.6 for the types it specifies.
    """
    if not _is_uint(record_type) or not has_storage_rule(record_type):
        raise LocalProtocolError("no_storage_rule", f"{record_type!r} is not a storable type")
    if subject_id is not None and not is_domain_type(record_type):
        raise LocalProtocolError("bad_record", "subject_id is only for domain types 0x20..0xFF")
    if not isinstance(payload, Mapping) or any(type(k) is not str for k in payload):
        raise LocalProtocolError("bad_record", "payload must be a map with text keys")
    body = cbor.decode(cbor.encode(payload))
    _refuse_unsendable(body, "payload")
    try:
        validate_payload(record_type, body)
    except RecordInvalid as exc:
        raise LocalProtocolError("bad_payload", exc.detail) from None
    lifetime = default_ttl_ms(record_type) if ttl_ms is None else ttl_ms
    if type(lifetime) is not int or lifetime <= 0:
        raise LocalProtocolError("bad_ttl", "ttl_ms must be a positive int")
    record = Record(
        int(record_type), identity.node_id, version, now_ms, now_ms + lifetime, body, subject_id
    )
    return record.signed(identity)


# --- payload schemas (§10.6) ------------------------------------------------------------------


class _Field(NamedTuple):
    name: str
    kind: str
    check: Callable[[object], bool]
    required: bool = True


def _is_text(value: object) -> TypeGuard[str]:
    return isinstance(value, str)


def _bytes_of(size: int) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        return type(value) is bytes and len(value) == size

    return check


def _array_of(item: Callable[[object], bool]) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        return isinstance(value, (list, tuple)) and all(item(v) for v in value)

    return check


def _is_bytes(value: object) -> bool:
    return type(value) is bytes


def _is_port(value: object) -> bool:
    return _is_uint(value) and value <= 0xFFFF


def _is_sorted_ids(value: object) -> bool:
    if not isinstance(value, (list, tuple)) or not all(_ID32(v) for v in value):
        return False
    return all(a <= b for a, b in itertools.pairwise(value))


def _is_text_or_null(value: object) -> bool:
    return value is None or isinstance(value, str)


_ID32: Final = _bytes_of(KEY_SIZE)


def _opt(name: str, kind: str, check: Callable[[object], bool]) -> _Field:
    return _Field(name, kind, check, required=False)


_SCHEMAS: Final[Mapping[int, tuple[_Field, ...]]] = {
    RecordType.PROCEDURE_ADVERTISEMENT: (
        _Field("procedure_uri", "text", _is_text),
        _Field("advertiser_node", "bytes(32)", _ID32),
        _Field("serving_station", "bytes(32)", _ID32),
        _opt("session_token_hint", "text", _is_text),
        _opt("rate_limit_qps", "uint", _is_uint),
        _opt("max_concurrency", "uint", _is_uint),
        _opt("cert_chain", "text (PEM)", _is_text),
    ),
    RecordType.STATION_ENDPOINT: (
        _Field("quic_port", "uint 0..65535", _is_port),
        _opt("host_advertised", "an array of bytes (not text)", _array_of(_is_bytes)),
        _opt("alpn", "text", _is_text),
    ),
    RecordType.CONTENT_ANNOUNCEMENT: (
        _Field("announcer_node", "bytes(32)", _ID32),
        _Field("mcid", "bytes(34)", _bytes_of(MCID_SIZE)),
        _Field("endpoint", "text (quic://host:port)", _is_text),
        _opt("name", "text", _is_text),
        _opt("size", "uint", _is_uint),
        _opt("chunk_count", "uint", _is_uint),
    ),
    RecordType.NODE_RECORD: (
        _Field("node_id", "bytes(32)", _ID32),
        _Field("station_id", "bytes(32)", _ID32),
        _Field("realms", "an array of bytes(32)", _array_of(_ID32)),
        _Field("capabilities", "uint", _is_uint),
        *(_opt(n, "text", _is_text) for n in ("caps_hint", "display_name", "hostname", "kind")),
        *(_opt(n, "text", _is_text) for n in ("endpoint", "city", "country")),
        _opt("lat", "text (not a float)", _is_text),
        _opt("lng", "text (not a float)", _is_text),
        _opt("peers", "a sorted array of bytes(32)", _is_sorted_ids),
    ),
    RecordType.TOMBSTONE: (
        _Field("superseded_key", "bytes(32)", _ID32),
        _Field("superseded_type", "uint", _is_uint),
        _Field("replaced_at", "uint", _is_uint),
        _Field("reason", "text", _is_text),
        _opt("detail", "text or null", _is_text_or_null),
    ),
}


def validate_payload(record_type: int, payload: object) -> None:
    """Check ``payload`` against §10.6 for the types it specifies (0x01, 0x06, 0x0C, 0x11, 0x12).

    Other types only need a map with text keys. Unknown extra keys are allowed. Raises
    ``RecordInvalid("bad_payload")`` listing every problem found.
    """
    label = _type_label(record_type)
    if not isinstance(payload, Mapping):
        raise RecordInvalid("bad_payload", f"{label} payload must be a map, got {_kind(payload)}")
    problems = [f"key {k!r} is not text" for k in payload if type(k) is not str]
    for field in _SCHEMAS.get(record_type, ()):
        if field.name not in payload:
            if field.required:
                problems.append(f"missing {field.name} ({field.kind})")
        elif not field.check(payload[field.name]):
            got = _kind(payload[field.name])
            problems.append(f"{field.name} must be {field.kind}, got {got}")
    if problems:
        raise RecordInvalid("bad_payload", f"{label} payload: " + "; ".join(problems))
