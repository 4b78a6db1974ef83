"""DHT records (PROTOCOL.md §10) against vectors/records.json, bad cases and properties."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.errors import LocalProtocolError, RecordInvalid
from macula.wire.identity import DOMAIN_RECORD, Identity
from macula.wire.record_keys import (
    content_announcement_key,
    domain_record_key,
    foundation_parameter_key,
    foundation_realm_trust_list_key,
    foundation_seed_list_key,
    foundation_t3_attestation_key,
    is_domain_type,
    member_endorsement_key,
    org_directory_key,
    procedure_delegation_key,
    realm_stations_key,
    signer_storage_key,
    station_endpoint_key,
    storage_key_for_procedure,
)
from macula.wire.records import (
    DEFAULT_TTL_MS,
    STATION_ENDPOINT_TTL_MS,
    Record,
    RecordType,
    default_ttl_ms,
    has_storage_rule,
    is_newer,
    new_record,
    record_version,
    validate_payload,
)
from support.vectorkit import load_vectors

VECTORS: dict[str, Any] = load_vectors("records")
PA = VECTORS["procedure_advertisement"]
SE = VECTORS["station_endpoint"]
SE_VERSION = bytes.fromhex("019b76daa80070438000000000000043")  # the envelope's "v"
NOW = PA["created_at"]
ALICE = Identity(bytes(range(1, 33)))
BOB = Identity(bytes(range(33, 65)))


def typed(value: dict[str, Any]) -> Any:
    """Typed vector notation -> Python value."""
    if "int" in value:
        return value["int"]
    if "bytes" in value:
        return bytes.fromhex(value["bytes"])
    if "text" in value:
        return value["text"]
    if "null" in value:
        return None
    if "array" in value:
        return [typed(item) for item in value["array"]]
    if "map" in value:
        return {typed(k): typed(v) for k, v in value["map"]}
    raise AssertionError(f"unknown typed value {value}")


def sha(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def build(vector: dict[str, Any], version: bytes) -> Record:
    envelope = typed(vector["unsigned_envelope"])
    identity = Identity(bytes.fromhex(vector["signer_seed_hex"]))
    return new_record(
        identity, vector["type"], envelope["p"], now_ms=envelope["c"], version=version
    )


@pytest.fixture
def advert() -> Record:
    return build(PA, bytes.fromhex(PA["version_uuidv7_hex"]))


@pytest.fixture
def endpoint() -> Record:
    return build(SE, SE_VERSION)


def reason_of(excinfo: pytest.ExceptionInfo[RecordInvalid]) -> str:
    return excinfo.value.reason


# --- vectors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("vector", "version"), [(PA, PA["version_uuidv7_hex"]), (SE, None)])
def test_vector_built_byte_exact(vector: dict[str, Any], version: str | None) -> None:
    record = build(vector, bytes.fromhex(version) if version else SE_VERSION)
    assert record.key.hex() == vector["signer_public_key_hex"]
    assert record.envelope() == typed(vector["unsigned_envelope"])
    assert record.signable_bytes().hex() == vector["signable_bytes_hex"]
    assert record.signable_bytes().startswith(DOMAIN_RECORD)
    assert record.signature is not None
    assert record.signature.hex() == vector["signature_hex"]
    assert record.storage_key().hex() == vector["storage_key_hex"]
    record.verify(record.created_at)


def test_procedure_advertisement_vector_forms(advert: Record) -> None:
    assert advert.expires_at == PA["expires_at"]
    assert advert.expires_at - advert.created_at == PA["ttl_ms"] == DEFAULT_TTL_MS
    assert advert.payload == typed(PA["payload"])
    assert advert.to_wire() == typed(PA["envelope_wire"])
    assert cbor.encode(advert.to_wire()).hex() == PA["envelope_wire_cbor_hex"]
    assert advert.to_rpc() == typed(PA["rpc_form"])
    assert cbor.encode(advert.to_rpc()) == cbor.encode(typed(PA["rpc_form"]))
    assert advert.storage_key() == storage_key_for_procedure(PA["procedure_uri"])


def test_procedure_advertisement_vector_parses_back(advert: Record) -> None:
    from_rpc = Record.from_rpc(typed(PA["rpc_form"]))
    from_wire = Record.from_wire(cbor.decode(bytes.fromhex(PA["envelope_wire_cbor_hex"])))
    assert from_rpc == from_wire == advert
    from_rpc.verify(PA["created_at"])
    from_wire.verify(PA["created_at"])


def test_station_endpoint_vector_forms(endpoint: Record) -> None:
    assert endpoint.expires_at - endpoint.created_at == STATION_ENDPOINT_TTL_MS
    assert endpoint.payload["host_advertised"] == [b"station.example.org"]
    assert endpoint.storage_key() == station_endpoint_key(endpoint.key)
    wire = cbor.decode(cbor.encode(endpoint.to_wire()))
    rpc = cbor.decode(cbor.encode(endpoint.to_rpc()))
    assert Record.from_wire(wire) == Record.from_rpc(rpc) == endpoint
    Record.from_wire(wire).verify(endpoint.created_at)


def test_put_record_call_frame_payload_is_rpc_form(advert: Record) -> None:
    frame = VECTORS["put_record_call_frame"]
    assert typed(frame["fields"])["payload"] == advert.to_rpc()
    wire = bytes.fromhex(frame["wire_hex"])
    decoded = cbor.decode(wire[4:])
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    assert decoded["payload"] == advert.to_rpc()
    Record.from_rpc(decoded["payload"]).verify(NOW)


def test_find_record_call_frame_asks_for_the_storage_key(advert: Record) -> None:
    fields = typed(VECTORS["find_record_call_frame"]["fields"])
    assert fields["payload"] == {"key": advert.storage_key()}


def test_record_version_layout_reproduces_vector() -> None:
    version = record_version(NOW, bytes.fromhex("00400000000000000040"))
    assert version.hex() == PA["version_uuidv7_hex"]
    v = record_version(NOW, b"\xff" * 10)
    assert v[:6] == NOW.to_bytes(6, "big")
    assert v[6] >> 4 == 7 and v[8] >> 6 == 0b10
    with pytest.raises(LocalProtocolError):
        record_version(NOW, b"\x00" * 9)
    with pytest.raises(LocalProtocolError):
        record_version(1 << 48, b"\x00" * 10)


# --- verification failures --------------------------------------------------------------------


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_expired(advert: Record) -> None:
    advert.verify(advert.expires_at - 1)
    assert not advert.is_expired(advert.expires_at - 1)
    assert advert.is_expired(advert.expires_at)
    with pytest.raises(RecordInvalid) as excinfo:
        advert.verify(advert.expires_at)
    assert reason_of(excinfo) == "expired"


def test_flipped_signature_bit(advert: Record) -> None:
    assert advert.signature is not None
    bad = dataclasses.replace(advert, signature=flip(advert.signature, 77))
    with pytest.raises(RecordInvalid) as excinfo:
        bad.verify(NOW)
    assert reason_of(excinfo) == "bad_signature"


def test_flipped_payload_bit(advert: Record) -> None:
    payload = dict(advert.payload)
    payload["advertiser_node"] = flip(payload["advertiser_node"], 3)
    with pytest.raises(RecordInvalid) as excinfo:
        dataclasses.replace(advert, payload=payload).verify(NOW)
    assert reason_of(excinfo) == "bad_signature"


def test_flipped_key_bit(advert: Record) -> None:
    rpc = advert.to_rpc()
    rpc["key"] = flip(rpc["key"], 200)
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc).verify(NOW)
    assert reason_of(excinfo) == "bad_signature"


@pytest.mark.parametrize("field", ["version", "created_at", "expires_at", "type"])
def test_changed_envelope_field_breaks_signature(advert: Record, field: str) -> None:
    value = getattr(advert, field)
    changed = flip(value, 0) if isinstance(value, bytes) else value + 1
    with pytest.raises(RecordInvalid) as excinfo:
        dataclasses.replace(advert, **{field: changed}).verify(NOW)  # type: ignore[arg-type]
    assert reason_of(excinfo) == "bad_signature"


def test_added_subject_id_breaks_signature(advert: Record) -> None:
    with pytest.raises(RecordInvalid) as excinfo:
        dataclasses.replace(advert, subject_id=b"x").verify(NOW)
    assert reason_of(excinfo) == "bad_signature"


@pytest.mark.parametrize(
    "signature", [None, b"", b"\x00" * 63, b"\x00" * 65, "ab" * 64, 0, [b"\x00" * 64]]
)
def test_malformed_signature(advert: Record, signature: object) -> None:
    rpc = advert.to_rpc()
    if signature is None:
        del rpc["signature"]
    else:
        rpc["signature"] = signature
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc)
    assert reason_of(excinfo) == "bad_signature"
    local = dataclasses.replace(advert, signature=signature)  # type: ignore[arg-type]
    with pytest.raises(RecordInvalid) as excinfo:
        local.verify(NOW)
    assert reason_of(excinfo) == "bad_signature"


@pytest.mark.parametrize("key", [None, b"\x00" * 31, "79b5", 7])
def test_missing_or_malformed_key_is_bad_signature(advert: Record, key: object) -> None:
    wire = advert.to_wire()
    if key is None:
        del wire["k"]
    else:
        wire["k"] = key
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_wire(wire)
    assert reason_of(excinfo) == "bad_signature"


def test_unsigned_record_cannot_be_sent_or_verified(advert: Record) -> None:
    unsigned = dataclasses.replace(advert, signature=None)
    with pytest.raises(LocalProtocolError):
        unsigned.to_rpc()
    with pytest.raises(LocalProtocolError):
        unsigned.to_wire()
    with pytest.raises(RecordInvalid) as excinfo:
        unsigned.verify(NOW)
    assert reason_of(excinfo) == "bad_signature"
    assert unsigned.signed(ALICE) == advert


def test_signing_with_someone_elses_identity_is_refused(advert: Record) -> None:
    with pytest.raises(LocalProtocolError):
        advert.signed(BOB)


# --- strict parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize("record_type", [0, 256, -1, "6", 6.0, True, None])
def test_bad_type(advert: Record, record_type: object) -> None:
    rpc = advert.to_rpc()
    rpc["type"] = record_type
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc)
    assert reason_of(excinfo) == "bad_record"
    assert "type" in excinfo.value.detail


@pytest.mark.parametrize("payload", [[], b"", "map", 1, None])
def test_payload_not_a_map(advert: Record, payload: object) -> None:
    rpc = advert.to_rpc()
    rpc["payload"] = payload
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc)
    assert reason_of(excinfo) == "bad_record"
    assert "payload" in excinfo.value.detail


@pytest.mark.parametrize("bad_key", [b"procedure_uri", 1, -1])
def test_payload_keys_must_be_text(advert: Record, bad_key: object) -> None:
    wire = advert.to_wire()
    wire["p"] = {**advert.payload, bad_key: "x"}
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_wire(wire)
    assert reason_of(excinfo) == "bad_record"


@pytest.mark.parametrize("bad_value", [{b"nested": 1}, {1.5}, float("nan")])
def test_payload_must_be_canonical_cbor(advert: Record, bad_value: object) -> None:
    rpc = advert.to_rpc()
    rpc["payload"] = {**advert.payload, "extra": bad_value}
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc)
    assert reason_of(excinfo) == "bad_record"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", b"\x00" * 15),
        ("version", "019b76daa80070408000000000000040"),
        ("created_at", -1),
        ("created_at", "1767225600000"),
        ("expires_at", 1 << 64),
        ("expires_at", 1.0),
        ("subject_id", "subject"),
        ("created_at", PA["expires_at"] + 1),
    ],
)
def test_bad_envelope_field(advert: Record, field: str, value: object) -> None:
    rpc = advert.to_rpc()
    rpc[field] = value
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(rpc)
    assert reason_of(excinfo) == "bad_record"
    assert field in excinfo.value.detail


def test_created_after_expires_is_refused_everywhere() -> None:
    with pytest.raises(LocalProtocolError):
        Record(6, ALICE.node_id, bytes(16), NOW + 1, NOW, {})


@pytest.mark.parametrize("field", ["t", "v", "c", "x", "p"])
def test_missing_field(advert: Record, field: str) -> None:
    wire = advert.to_wire()
    del wire[field]
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_wire(wire)
    assert reason_of(excinfo) == "missing_field"


@pytest.mark.parametrize("obj", [None, [], b"", "record", 6])
def test_record_not_a_map(obj: object) -> None:
    with pytest.raises(RecordInvalid) as excinfo:
        Record.from_rpc(obj)
    assert reason_of(excinfo) == "bad_record"


def test_extra_fields_ignored_and_null_subject_id_is_absent(advert: Record) -> None:
    rpc = {**advert.to_rpc(), "subject_id": None, "replicated_by": b"x"}
    assert Record.from_rpc(rpc) == advert
    wire = {**advert.to_wire(), "u": None, "s2": 1}
    assert Record.from_wire(wire) == advert


def test_wire_form_keys_are_not_rpc_keys(advert: Record) -> None:
    with pytest.raises(RecordInvalid):
        Record.from_wire(advert.to_rpc())
    with pytest.raises(RecordInvalid):
        Record.from_rpc(advert.to_wire())


# --- building ---------------------------------------------------------------------------------


def advert_payload(**extra: object) -> dict[str, Any]:
    return {
        "procedure_uri": "org.example.echo_v1",
        "advertiser_node": ALICE.node_id,
        "serving_station": BOB.node_id,
        **extra,
    }


@pytest.mark.parametrize(
    "extra",
    [
        {"detail": None},
        {"nested": {"inner": [1, None]}},
        {"session_token_hint": "undefined"},
        {"list": [{"deep": "undefined"}]},
    ],
)
def test_null_and_undefined_refused_at_build(extra: dict[str, Any]) -> None:
    with pytest.raises(LocalProtocolError) as excinfo:
        new_record(ALICE, 6, advert_payload(**extra), now_ms=NOW, version=bytes(16))
    assert excinfo.value.reason in {"null_in_record_payload", "undefined_text"}


def test_undefined_as_a_key_is_fine() -> None:
    record = new_record(ALICE, 6, advert_payload(undefined=1), now_ms=NOW, version=bytes(16))
    record.verify(NOW)


def test_build_refuses_bad_inputs() -> None:
    v = bytes(16)
    for record_type in (0, 2, 7, 0x0B, 0x13, 0x14, 0x17, 256):
        with pytest.raises(LocalProtocolError):
            new_record(ALICE, record_type, {}, now_ms=NOW, version=v)
    with pytest.raises(LocalProtocolError):
        new_record(ALICE, 6, advert_payload(), now_ms=NOW, version=v, subject_id=b"s")
    with pytest.raises(LocalProtocolError):
        new_record(ALICE, 0x20, {b"k": 1}, now_ms=NOW, version=v)  # type: ignore[dict-item]
    with pytest.raises(LocalProtocolError):
        new_record(ALICE, 0x20, {}, now_ms=NOW, version=v, ttl_ms=0)
    with pytest.raises(LocalProtocolError):
        new_record(ALICE, 0x20, {}, now_ms=NOW, version=bytes(15))
    with pytest.raises(LocalProtocolError) as excinfo:
        new_record(
            ALICE, 0x12, {"quic_port": 4433, "host_advertised": ["h"]}, now_ms=NOW, version=v
        )
    assert excinfo.value.reason == "bad_payload"


def test_ttl_rules() -> None:
    assert default_ttl_ms(RecordType.STATION_ENDPOINT) == 5 * 60 * 1000
    for record_type in (1, 5, 6, 0x11, 0x20):
        assert default_ttl_ms(record_type) == 48 * 3600 * 1000
    record = new_record(ALICE, 0x20, {}, now_ms=NOW, version=bytes(16), ttl_ms=1000)
    assert (record.created_at, record.expires_at) == (NOW, NOW + 1000)


def test_payload_is_copied_and_normalised() -> None:
    payload: dict[str, Any] = {"tags": ("a", "b"), "flag": True}
    record = new_record(ALICE, 0x20, payload, now_ms=NOW, version=bytes(16))
    payload["tags"] = ()
    assert record.payload == {"tags": ["a", "b"], "flag": 1}
    assert type(record.payload["flag"]) is int


def test_is_newer() -> None:
    def at(created_at: int, version: bytes) -> Record:
        return Record(0x20, ALICE.node_id, version, created_at, created_at + 1, {})

    old, new = at(NOW, bytes(16)), at(NOW + 1, bytes(16))
    assert is_newer(new, old) and not is_newer(old, new)
    low, high = at(NOW, b"\x01" * 16), at(NOW, b"\x02" * 16)
    assert is_newer(high, low) and not is_newer(low, high)
    assert not is_newer(low, low)
    assert is_newer(new, high)  # created_at first, version only breaks ties


# --- storage keys -----------------------------------------------------------------------------

REALM, NODE, MCID = b"\x11" * 32, b"\x22" * 32, b"\x01\x55" + b"\x33" * 32


def test_storage_key_functions_follow_the_table() -> None:
    k = ALICE.node_id
    assert signer_storage_key(k) == k
    assert storage_key_for_procedure("org.example.echo_v1").hex() == PA["storage_key_hex"]
    assert realm_stations_key(REALM) == sha(b"station_set", REALM)
    assert member_endorsement_key(REALM, NODE) == sha(b"member_endorsement", REALM, NODE)
    assert foundation_seed_list_key(k) == sha(b"foundation_seed_list", k)
    assert foundation_parameter_key(k, "quorum") == sha(b"foundation_parameter", k, b"quorum")
    assert foundation_parameter_key(k, b"quorum") == foundation_parameter_key(k, "quorum")
    assert foundation_realm_trust_list_key(k) == sha(b"foundation_realm_trust_list", k)
    assert foundation_t3_attestation_key(NODE) == sha(b"foundation_t3_attestation", NODE)
    assert content_announcement_key(MCID) == sha(MCID)
    assert station_endpoint_key(k) == sha(b"station_endpoint", k)
    assert org_directory_key(REALM, "acme") == sha(b"org_directory", REALM, b"acme")
    assert procedure_delegation_key(k, NODE) == sha(b"procedure_delegation", k, NODE)
    assert domain_record_key(0x20, k) == k
    assert domain_record_key(0x20, k, b"subj") == sha(b"\x20", k, b"subj")
    assert domain_record_key(0xFF, k, b"") == sha(b"\xff", k)


@pytest.mark.parametrize(
    "call",
    [
        lambda: realm_stations_key(b"\x00" * 31),
        lambda: member_endorsement_key(REALM, b""),
        lambda: content_announcement_key(b"\x00" * 32),
        lambda: station_endpoint_key("key"),  # type: ignore[arg-type]
        lambda: org_directory_key(REALM, 5),  # type: ignore[arg-type]
        lambda: domain_record_key(0x1F, NODE),
        lambda: domain_record_key(0x20, NODE, "subj"),  # type: ignore[arg-type]
        lambda: signer_storage_key(b""),
    ],
)
def test_storage_key_functions_check_their_inputs(call: Any) -> None:
    with pytest.raises(LocalProtocolError):
        call()


def test_record_storage_key_for_derivable_types() -> None:
    k = ALICE.node_id

    def rec(record_type: int, payload: dict[str, Any], subject: bytes | None = None) -> bytes:
        return Record(record_type, k, bytes(16), NOW, NOW + 1, payload, subject).storage_key()

    for record_type in (0x01, 0x03, 0x0C):
        assert rec(record_type, {}) == k
    assert rec(0x0D, {}) == foundation_seed_list_key(k)
    assert rec(0x0F, {}) == foundation_realm_trust_list_key(k)
    assert rec(0x11, {"mcid": MCID}) == sha(MCID)
    assert rec(0x12, {}) == station_endpoint_key(k)
    assert rec(0x20, {}) == k
    assert rec(0x42, {}, b"subject") == sha(b"\x42", k, b"subject")
    for record_type, payload in ((0x06, {}), (0x06, {"procedure_uri": b"x"}), (0x11, {})):
        with pytest.raises(RecordInvalid) as excinfo:
            rec(record_type, payload)
        assert reason_of(excinfo) == "bad_payload"


@pytest.mark.parametrize(
    "record_type", [0x04, 0x05, 0x0E, 0x10, 0x15, 0x16, 0x02, 0x07, 0x0B, 0x13, 0x14, 0x17, 0x1F]
)
def test_no_storage_rule(record_type: int) -> None:
    record = Record(record_type, ALICE.node_id, bytes(16), NOW, NOW + 1, {"realm": REALM})
    with pytest.raises(RecordInvalid) as excinfo:
        record.storage_key()
    assert reason_of(excinfo) == "no_storage_rule"
    if record_type in (0x04, 0x05, 0x0E, 0x10, 0x15, 0x16):
        assert "names no payload field" in excinfo.value.detail


def test_type_classification() -> None:
    assert int(RecordType.PROCEDURE_ADVERTISEMENT) == 0x06
    assert int(RecordType.PROCEDURE_DELEGATION) == 0x16
    assert len(RecordType) == 14
    assert [is_domain_type(t) for t in (0x1F, 0x20, 0xFF, 0x100)] == [False, True, True, False]
    assert not any(has_storage_rule(t) for t in (0, 2, 7, 8, 9, 10, 11, 0x13, 0x14, 0x17, 256))
    assert all(has_storage_rule(t) for t in (*RecordType, 0x20, 0x80, 0xFF))


# --- payload schemas --------------------------------------------------------------------------

NODE_PAYLOAD: dict[str, Any] = {
    "node_id": NODE,
    "station_id": REALM,
    "realms": [REALM],
    "capabilities": 0,
    "lat": "52.37",
    "lng": "4.89",
    "peers": [REALM, NODE],
    "display_name": "n",
}
TOMBSTONE_PAYLOAD: dict[str, Any] = {
    "superseded_key": NODE,
    "superseded_type": 6,
    "replaced_at": NOW,
    "reason": "rotated",
    "detail": None,
}
ANNOUNCEMENT: dict[str, Any] = {
    "announcer_node": NODE,
    "mcid": MCID,
    "endpoint": "quic://h:4433",
    "size": 10,
}


@pytest.mark.parametrize(
    ("record_type", "payload"),
    [
        (0x06, typed(PA["payload"])),
        (0x12, typed(SE["unsigned_envelope"])["p"]),
        (0x12, {"quic_port": 1}),
        (0x11, ANNOUNCEMENT),
        (0x01, NODE_PAYLOAD),
        (0x0C, TOMBSTONE_PAYLOAD),
        (0x0C, {k: v for k, v in TOMBSTONE_PAYLOAD.items() if k != "detail"}),
        (0x20, {"anything": [1, "two"]}),
        (0x04, {}),
    ],
)
def test_valid_payloads(record_type: int, payload: dict[str, Any]) -> None:
    validate_payload(record_type, payload)


@pytest.mark.parametrize(
    ("record_type", "payload", "named"),
    [
        (0x12, {"quic_port": 4433, "host_advertised": ["station.example.org"]}, "host_advertised"),
        (0x12, {"quic_port": "4433"}, "quic_port"),
        (0x12, {"quic_port": 70000}, "quic_port"),
        (0x12, {"alpn": "macula"}, "missing quic_port"),
        (0x01, {**NODE_PAYLOAD, "lat": 52.37}, "lat"),
        (0x01, {**NODE_PAYLOAD, "peers": [NODE, REALM]}, "peers"),
        (0x01, {**NODE_PAYLOAD, "realms": [b"short"]}, "realms"),
        (0x06, {"procedure_uri": b"org.example.echo_v1"}, "procedure_uri"),
        (0x11, {**ANNOUNCEMENT, "mcid": MCID[:32]}, "mcid"),
        (0x0C, {**TOMBSTONE_PAYLOAD, "detail": b"x"}, "detail"),
        (0x20, {b"k": 1}, "not text"),
    ],
)
def test_invalid_payloads(record_type: int, payload: dict[Any, Any], named: str) -> None:
    with pytest.raises(RecordInvalid) as excinfo:
        validate_payload(record_type, payload)
    assert reason_of(excinfo) == "bad_payload"
    assert named in excinfo.value.detail


def test_invalid_payload_lists_every_problem() -> None:
    with pytest.raises(RecordInvalid) as excinfo:
        validate_payload(0x06, {"advertiser_node": b"x"})
    detail = excinfo.value.detail
    assert "missing procedure_uri" in detail and "missing serving_station" in detail
    assert "advertiser_node must be bytes(32)" in detail
    with pytest.raises(RecordInvalid):
        validate_payload(0x06, [])


# --- properties -------------------------------------------------------------------------------

SCALARS = (
    st.integers(-(1 << 64), (1 << 64) - 1)
    | st.binary(max_size=40)
    | st.text(max_size=20).filter(lambda s: s != "undefined")
    | st.floats(allow_nan=False, allow_infinity=False)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
PAYLOADS = st.dictionaries(st.text(max_size=12), VALUES, max_size=6)
IDENTITIES = [ALICE, BOB, Identity(b"\x07" * 32)]


@settings(max_examples=150, deadline=None)
@given(
    payload=PAYLOADS,
    who=st.sampled_from(IDENTITIES),
    record_type=st.integers(0x20, 0xFF),
    subject=st.none() | st.binary(max_size=16),
    created=st.integers(0, (1 << 48) - 1),
    rand=st.binary(min_size=10, max_size=10),
    bit=st.integers(0, 511),
)
def test_round_trip_and_signature_bit_flips(
    payload: dict[str, Any],
    who: Identity,
    record_type: int,
    subject: bytes | None,
    created: int,
    rand: bytes,
    bit: int,
) -> None:
    version = record_version(created, rand)
    record = new_record(
        who, record_type, payload, now_ms=created, version=version, subject_id=subject
    )
    rpc = cbor.decode(cbor.encode(record.to_rpc()))
    via_rpc = Record.from_rpc(rpc)
    via_wire = Record.from_wire(cbor.decode(cbor.encode(via_rpc.to_wire())))
    assert via_rpc == via_wire == record
    assert cbor.encode(via_wire.to_rpc()) == cbor.encode(record.to_rpc())
    via_wire.verify(created)
    assert record.signature is not None
    forged = dataclasses.replace(via_wire, signature=flip(record.signature, bit))
    with pytest.raises(RecordInvalid) as excinfo:
        forged.verify(created)
    assert reason_of(excinfo) == "bad_signature"


FIELD_VALUES = st.none() | SCALARS | st.lists(SCALARS, max_size=2) | st.booleans()


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(
        ["type", "key", "version", "created_at", "expires_at", "payload", "subject_id", "signature"]
    ),
    value=FIELD_VALUES | st.dictionaries(st.text(max_size=4) | st.binary(max_size=2), SCALARS),
)
def test_mangled_rpc_form_only_raises_record_invalid(field: str, value: object) -> None:
    original = build(PA, bytes.fromhex(PA["version_uuidv7_hex"]))
    rpc = original.to_rpc()
    rpc[field] = value
    try:
        record = Record.from_rpc(rpc)
    except RecordInvalid:
        return
    if record == original:  # e.g. subject_id: null reads as absent
        return
    with pytest.raises(RecordInvalid):
        record.verify(NOW)
