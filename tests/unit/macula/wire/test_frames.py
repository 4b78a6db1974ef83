"""Typed frames (PROTOCOL.md §3, §4): every vector byte for byte, both ways, and bad fields."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor, frames
from macula.wire.errors import LocalProtocolError, ProtocolError, SignatureInvalid
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity
from support.vectorkit import load_vectors, typed

FRAMES = load_vectors("frames")
ALL = FRAMES["frames"] + FRAMES["erlang_golden"]
CLIENT = Identity(bytes.fromhex(FRAMES["fixtures"]["client_seed_hex"]))
STATION = Identity(bytes.fromhex(FRAMES["fixtures"]["station_seed_hex"]))
SIGNERS = {CLIENT.node_id: CLIENT, STATION.node_id: STATION}


def vector(name: str) -> dict[str, Any]:
    return next(v for v in ALL if v["name"] == name)


def parsed(name: str) -> frames.Frame:
    return frames.parse_frame(typed(vector(name)["fields"]))


@pytest.mark.parametrize("vec", ALL, ids=lambda v: v["name"])
def test_vector_decodes_parses_and_verifies(vec: dict[str, Any]) -> None:
    wire = bytes.fromhex(vec["wire_hex"])
    [frame_map] = FrameDecoder().feed(wire)
    assert frame_map == typed(vec["fields"])
    frame = frames.parse_frame(frame_map)
    assert type(frame) is frames.FRAME_TYPES[frame_map["frame_type"]]
    assert frame.to_map() == frame_map
    assert frame.encode() == wire
    key = bytes.fromhex(vec["verify_against_hex"])
    assert frame.verifies(key)
    frame.require_signed_by(key)
    if "signable_bytes_hex" in vec:
        assert frame.signable_bytes().hex() == vec["signable_bytes_hex"]
        assert frame.signature is not None and frame.signature.hex() == vec["signature_hex"]


@pytest.mark.parametrize("vec", FRAMES["frames"], ids=lambda v: v["name"])
def test_vector_is_rebuilt_from_typed_fields_and_signed_identically(vec: dict[str, Any]) -> None:
    """Build direction: construct the typed frame from its fields, sign, compare the bytes."""
    frame = parsed(vec["name"])
    fields = {
        f.name: getattr(frame, f.name)
        for f in dataclasses.fields(frame)
        if f.name not in ("signature", "extras")
    }
    rebuilt = type(frame)(**fields)
    if isinstance(rebuilt, frames.Publish) and frame.publisher_sig is not None:  # type: ignore[attr-defined]
        rebuilt = dataclasses.replace(rebuilt, publisher_sig=None).with_publisher_sig(CLIENT)
    signer = SIGNERS[bytes.fromhex(vec["signer_public_key_hex"])]
    assert rebuilt.signed_by(signer).encode().hex() == vec["wire_hex"]


def test_expected_signer_follows_section_4_3() -> None:
    client, station = CLIENT.node_id, STATION.node_id
    assert parsed("connect").expected_signer() == client
    assert parsed("hello").expected_signer() == station
    assert parsed("call").expected_signer() == client
    assert parsed("result").expected_signer() == client
    assert parsed("error_station_unknown_next_peer").expected_signer() == station
    assert parsed("stream_data").expected_signer() == client
    assert parsed("stream_open").expected_signer() == client
    assert parsed("stream_reply").expected_signer() == client
    # frames verified against the connection (or the station's HELLO key)
    for name in ("advertise", "publish", "subscribe", "event", "ping", "goodbye"):
        assert parsed(name).expected_signer() is None
    assert parsed("stream_error_station_no_route").expected_signer() is None
    parsed("stream_error_station_no_route").require_signed_by(station)


def test_publisher_sig_verifies_on_publish_and_on_the_event_built_from_it() -> None:
    publish = parsed("publish_with_publisher_sig")
    assert isinstance(publish, frames.Publish)
    vec = vector("publish_with_publisher_sig")
    assert (
        frames.publication_signable(
            publish.topic, publish.realm, publish.publisher, publish.seq, publish.payload
        ).hex()
        == vec["publisher_sig_signable_hex"]
    )
    assert frames.publisher_sig_valid(publish)
    event = parsed("event")
    assert isinstance(event, frames.Event)
    assert event.publisher_sig_valid()
    unsigned_event = parsed("event_without_publisher_sig")
    assert isinstance(unsigned_event, frames.Event)
    assert not unsigned_event.publisher_sig_valid()  # absence is never "valid"
    forged = dataclasses.replace(event, payload={"count": 4, "headline": "hi"})
    assert not forged.publisher_sig_valid()


def test_event_from_publish_reproduces_the_station_event_vector() -> None:
    publish = parsed("publish_with_publisher_sig")
    expected = parsed("event")
    assert isinstance(publish, frames.Publish)
    event = frames.event_from_publish(
        publish, frame_id=expected.frame_id, sent_at_ms=expected.sent_at_ms
    ).signed_by(STATION)
    assert event.encode().hex() == vector("event")["wire_hex"]
    short_sig = dataclasses.replace(publish, publisher_sig=b"\x01" * 10)
    assert (
        frames.event_from_publish(short_sig, frame_id=b"\0" * 16, sent_at_ms=0).publisher_sig
        is None
    )


def test_hello_accepted_is_text_on_the_wire() -> None:
    hello = parsed("hello")
    assert isinstance(hello, frames.Hello)
    assert hello.accepted is True
    assert hello.to_map()["accepted"] == "true"
    refused = dataclasses.replace(hello, accepted=False, refusal_code=0x0A)
    assert refused.to_map()["accepted"] == "false"
    assert frames.parse_frame(refused.to_map()) == refused


def test_error_name_is_derived_from_code() -> None:
    error = frames.Error(
        frame_id=b"\0" * 16, sent_at_ms=1, call_id=b"\1" * 16, code=7, reported_by=b"\2" * 32
    )
    assert error.name == "expiry_too_soon"
    assert (
        frames.Error(
            frame_id=b"\0" * 16, sent_at_ms=1, call_id=b"\1" * 16, code=200, reported_by=b"\2" * 32
        ).name
        == "unknown_code_200"
    )
    provider_error = parsed("error_provider_unknown_error")
    assert isinstance(provider_error, frames.Error)
    assert provider_error.detail_text == "boom"


def test_unknown_fields_are_kept_and_covered_by_the_signature() -> None:
    ping_map = typed(vector("ping")["fields"])
    ping_map["x_future"] = {"a": 1}
    ping = frames.parse_frame(ping_map)
    assert ping.extras == {"x_future": {"a": 1}}
    assert ping.to_map() == ping_map
    assert not ping.verifies(CLIENT.node_id)  # the original signature did not cover x_future
    resigned = ping.signed_by(CLIENT)
    assert resigned.verifies(CLIENT.node_id)
    assert frames.parse_frame(resigned.to_map()).verifies(CLIENT.node_id)


def test_nested_signature_keys_are_signed_like_any_data() -> None:
    call = parsed("call")
    assert isinstance(call, frames.Call)
    nested = dataclasses.replace(call, payload={"signature": b"x" * 64}).signed_by(CLIENT)
    assert b"signature" in nested.signable_bytes()
    assert nested.verifies(CLIENT.node_id)


@pytest.mark.parametrize(
    ("name", "key", "bad", "reason"),
    [
        ("call", "procedure", "org.example.echo_v1", "bad_field"),  # text, must be bytes
        ("call", "procedure", b"\xff\xfe", "bad_field"),  # bytes, not UTF-8
        ("call", "call_id", b"\0" * 15, "bad_field"),
        ("call", "caller", None, "bad_field"),
        ("call", "deadline_ms", 1.5, "bad_field"),
        ("publish", "seq", -1, "bad_field"),
        ("publish", "topic", None, "bad_field"),
        ("hello", "accepted", 1, "bad_field"),
        ("hello", "accepted", "yes", "bad_field"),
        ("event", "delivered_via", "relay", "bad_field"),
        ("stream_open", "mode", "duplex", "bad_field"),
        ("stream_data", "body", {"not": "bytes"}, "bad_field"),  # raw encoding needs bytes
        ("stream_end_send", "role", "half", "bad_field"),
        ("error_station_unknown_next_peer", "code", 256, "bad_field"),
        ("result", "realm", b"\0" * 32, "bad_field"),  # unused envelope slot must be null
        ("connect", "realms", [b"short"], "bad_field"),
        ("ping", "nonce", b"", "bad_field"),
        ("ping", "frame_id", "not-bytes", "bad_field"),
        ("ping", "signature", "text", "bad_field"),
        ("ping", "version", 3, "unsupported_version"),
        ("ping", "frame_type", 7, "bad_frame_type"),
    ],
)
def test_bad_field_is_named(name: str, key: str, bad: object, reason: str) -> None:
    frame_map = typed(vector(name)["fields"])
    frame_map[key] = bad
    with pytest.raises(ProtocolError) as info:
        frames.parse_frame(frame_map)
    assert info.value.reason == reason
    assert key in info.value.detail or reason in ("unsupported_version", "bad_frame_type")


@pytest.mark.parametrize("name", [v["name"] for v in FRAMES["frames"]])
def test_every_required_key_is_required(name: str) -> None:
    frame_map = typed(vector(name)["fields"])
    optional = {"signature", "publisher_sig", "signer"}
    for key in frame_map:
        if key in optional or key == "frame_type":
            continue
        broken = {k: v for k, v in frame_map.items() if k != key}
        with pytest.raises(ProtocolError):
            frames.parse_frame(broken)


def test_unknown_frame_type_is_its_own_error() -> None:
    frame_map = typed(vector("ping")["fields"])
    frame_map["frame_type"] = "swim_ping"
    with pytest.raises(frames.UnknownFrameType):
        frames.parse_frame(frame_map)
    with pytest.raises(ProtocolError, match="not_a_map"):
        frames.parse_frame([1, 2])


def test_wrong_length_or_missing_signature_never_verifies() -> None:
    call = parsed("call")
    for signature in (None, b"", b"\0" * 63, b"\0" * 65, call.signature + b"\0"):  # type: ignore[operator]
        broken = dataclasses.replace(call, signature=signature)
        assert not broken.verifies(CLIENT.node_id)
        with pytest.raises(SignatureInvalid):
            broken.require_signed_by(CLIENT.node_id)
    assert not call.verifies(b"\0" * 31)
    assert not call.verifies(STATION.node_id)


def test_builders_refuse_invalid_fields() -> None:
    with pytest.raises(LocalProtocolError, match=r"ping\.nonce"):
        frames.Ping(frame_id=b"\0" * 16, sent_at_ms=1, nonce=b"short")
    with pytest.raises(LocalProtocolError):
        frames.Publish(
            frame_id=b"\0" * 16, sent_at_ms=1, topic="t", realm=b"\0" * 32,
            publisher=b"\0" * 32, seq=-5, payload=None, published_at_ms=1,
        )  # fmt: skip


def test_new_frame_id_is_uuidv7_with_injected_time_and_randomness() -> None:
    now_ms = FRAMES["fixtures"]["sent_at_ms"]
    frame_id = frames.new_frame_id(now_ms, b"\xff" * 10)
    assert len(frame_id) == 16
    assert int.from_bytes(frame_id[:6], "big") == now_ms  # 48-bit Unix ms first
    assert frame_id[6] >> 4 == 0x7
    assert frame_id[8] >> 6 == 0b10
    assert frames.new_frame_id(now_ms, b"\0" * 10) == bytes.fromhex(
        "019b76daa80070008000000000000000"
    )
    assert frames.new_frame_id(now_ms, b"\1" * 10) != frames.new_frame_id(now_ms, b"\2" * 10)
    example = bytes.fromhex(load_vectors("identity")["uuidv7_frame_id_example"]["hex"])
    assert example[6] >> 4 == 0x7 and example[8] >> 6 == 0b10
    with pytest.raises(LocalProtocolError):
        frames.new_frame_id(now_ms, b"\0" * 9)


SIGNED_VECTORS = [v for v in ALL if "verify_against_hex" in v]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SIGNED_VECTORS), st.data())
def test_any_one_bit_change_breaks_the_signature(vec: dict[str, Any], data: st.DataObject) -> None:
    frame = frames.parse_frame(typed(vec["fields"]))
    key = bytes.fromhex(vec["verify_against_hex"])
    body = bytearray(cbor.encode(frame.to_map(signed=False)))
    bit = data.draw(st.integers(min_value=0, max_value=len(body) * 8 - 1))
    body[bit // 8] ^= 1 << (bit % 8)
    try:
        mutated_map = cbor.decode(bytes(body))
        mutated_map["signature"] = frame.signature
        if frame.to_map().get("publisher_sig") is not None:
            mutated_map["publisher_sig"] = frame.to_map()["publisher_sig"]
        mutated = frames.parse_frame(mutated_map)
    except ProtocolError:
        return  # the flip made it malformed: rejected before verification
    signer = mutated.expected_signer() or key
    assert not mutated.verifies(signer)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SIGNED_VECTORS), st.integers(min_value=0, max_value=511))
def test_any_one_bit_change_of_the_signature_fails(vec: dict[str, Any], bit: int) -> None:
    frame = frames.parse_frame(typed(vec["fields"]))
    assert frame.signature is not None
    sig = bytearray(frame.signature)
    sig[bit // 8] ^= 1 << (bit % 8)
    assert not dataclasses.replace(frame, signature=bytes(sig)).verifies(
        bytes.fromhex(vec["verify_against_hex"])
    )


@pytest.mark.parametrize("vec", FRAMES["frames"], ids=lambda v: v["name"])
def test_sign_and_encode_equals_sign_then_encode(vec: dict[str, Any]) -> None:
    frame = parsed(vec["name"])
    signer = SIGNERS[bytes.fromhex(vec["signer_public_key_hex"])]
    unsigned = dataclasses.replace(frame, signature=None)
    assert unsigned.sign_and_encode(signer).hex() == vec["wire_hex"]
    assert unsigned.sign_and_encode(signer) == unsigned.signed_by(signer).encode()
