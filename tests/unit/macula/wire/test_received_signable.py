"""Verifying over the received bytes (PROTOCOL.md §4.2) gives exactly the re-encoding's verdict.

``unsigned_body`` cuts the signed bytes out of a received canonical body; for any body that is
not canonical it says None and the verifier re-encodes the decoded map as before. The safety
property: whenever it answers, its answer is byte for byte the canonical re-encoding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor, frames
from macula.wire.errors import ProtocolError
from macula.wire.framing import FrameDecoder, ReceivedMap, frame_bytes, unsigned_body
from macula.wire.identity import DOMAIN_FRAME, Identity, realm_tag
from support.vectorkit import load_vectors

FRAMES = load_vectors("frames")
ALL = FRAMES["frames"] + FRAMES["erlang_golden"]
SIGNER = Identity(bytes(range(1, 33)))
REALM = realm_tag("test.received-signable")
SIGNATURE_KEYS = ("signature", "publisher_sig")


def received(wire: bytes) -> ReceivedMap:
    (frame_map,) = FrameDecoder().feed(wire)
    assert isinstance(frame_map, ReceivedMap)
    return frame_map


def canonical_unsigned(frame_map: dict[Any, Any]) -> bytes:
    return cbor.encode({k: v for k, v in frame_map.items() if k not in SIGNATURE_KEYS})


def call(payload: Any) -> frames.Call:
    return frames.Call(
        frame_id=frames.new_frame_id(1_767_225_600_000, os.urandom(10)),
        sent_at_ms=1_767_225_600_000,
        call_id=os.urandom(16),
        procedure="org.example.echo_v1",
        realm=REALM,
        payload=payload,
        deadline_ms=1_767_225_605_000,
        caller=SIGNER.node_id,
    )


# --- the vectors --------------------------------------------------------------------------


@pytest.mark.parametrize("vec", ALL, ids=lambda v: v["name"])
def test_every_vector_is_verified_over_its_received_bytes(vec: dict[str, Any]) -> None:
    frame_map = received(bytes.fromhex(vec["wire_hex"]))
    frame = frames.parse_frame(frame_map)
    assert unsigned_body(frame_map.body) is not None  # every vector is canonical
    assert frames.received_signable(frame, frame_map) == frame.signable_bytes()
    if "signable_bytes_hex" in vec:
        assert frames.received_signable(frame, frame_map).hex() == vec["signable_bytes_hex"]
    if "verify_against_hex" in vec:
        key = bytes.fromhex(vec["verify_against_hex"])
        assert frames.verifies_received(frame, frame_map, frame.expected_signer() or key)


def test_the_received_path_does_not_re_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    vec = next(v for v in FRAMES["frames"] if v["name"].startswith("publish"))
    frame_map = received(bytes.fromhex(vec["wire_hex"]))
    frame = frames.parse_frame(frame_map)

    def refuse(self: frames.Frame) -> bytes:
        raise AssertionError("re-encoded a canonical body")

    monkeypatch.setattr(frames.Frame, "signable_bytes", refuse)
    key = bytes.fromhex(vec["verify_against_hex"])
    assert frames.verifies_received(frame, frame_map, key)
    # a plain map (not from a FrameDecoder) has no body: the re-encoding is the only way
    with pytest.raises(AssertionError, match="re-encoded"):
        frames.verifies_received(frame, dict(frame_map), key)


def test_the_body_is_the_decoders_own_bytes_object() -> None:
    wire = call({"n": 1}).sign_and_encode(SIGNER)
    frame_map = received(wire)
    assert frame_map.body == wire[4:]
    assert unsigned_body(frame_map.body) == canonical_unsigned(frame_map)


# --- canonical bodies, generated ----------------------------------------------------------

values = st.recursive(
    st.none()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=40)
    | st.text(max_size=24),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(max_size=12) | st.integers(min_value=-(2**64), max_value=2**64 - 1),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=120, deadline=None)
@given(values, st.dictionaries(st.text(min_size=1, max_size=14), values, max_size=4))
def test_a_generated_frame_verifies_over_its_received_bytes(
    payload: Any, extras: dict[str, Any]
) -> None:
    unsigned = call(payload).to_map()
    unsigned.update({k: v for k, v in extras.items() if k not in unsigned})
    frame = frames.parse_frame(unsigned)
    signed = frame.signed_by(SIGNER)
    body = cbor.encode(signed.to_map())
    frame_map = received(frame_bytes(body))
    assert unsigned_body(frame_map.body) == canonical_unsigned(frame_map)
    assert frames.verifies_received(frames.parse_frame(frame_map), frame_map, SIGNER.node_id)


@settings(max_examples=250, deadline=None)
@given(st.dictionaries(st.text(max_size=14), values, max_size=8), st.data())
def test_an_answer_is_always_the_canonical_re_encoding(
    value: dict[str, Any], data: st.DataObject
) -> None:
    """Flip bits or bytes of a canonical map: whatever the decoder still accepts,
    ``unsigned_body`` either refuses or gives exactly the canonical re-encoding."""
    value["signature"] = b"\x01" * 64
    body = bytearray(cbor.encode(value))
    for _ in range(data.draw(st.integers(min_value=0, max_value=3))):
        at = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        body[at] = data.draw(st.integers(min_value=0, max_value=255))
    decoded: Any = None
    with contextlib.suppress(ProtocolError):
        decoded = cbor.decode(bytes(body))
    if not isinstance(decoded, dict):
        return
    answer = unsigned_body(bytes(body))
    if answer is not None:
        assert answer == canonical_unsigned(decoded)


# --- non-canonical bodies: the re-encoding decides, as before -----------------------------

PAYLOAD_KEY = cbor.encode_key("payload")
SIGNATURE_KEY = cbor.encode_key("signature")
# variant -> (payload, the payload's non-canonical encoding or None to keep it)
VARIANTS: dict[str, tuple[Any, bytes | None]] = {
    "unsorted": ({"n": 1}, None),
    "long_map_head": ({"n": 1}, None),
    "non_minimal_int": (5, b"\x18\x05"),  # 5 in two bytes
    "half_float": (1.5, b"\xf9\x3e\x00"),  # binary16
    "single_float": (1.5, b"\xfa\x3f\xc0\x00\x00"),  # binary32
    "nested_unsorted": ({"a": 2, "b": 1}, b"\xa2\x61b\x01\x61a\x02"),
}


def variant_body(pairs: list[tuple[bytes, bytes]], variant: str) -> bytes:
    """The map of sorted ``pairs``, made non-canonical in the one way ``variant`` names."""
    payload = VARIANTS[variant][1]
    if payload is not None:
        pairs = [(k, payload if k == PAYLOAD_KEY else v) for k, v in pairs]
    if variant == "unsorted":
        return cbor.join_pairs(pairs[::-1])
    if variant == "long_map_head":
        return bytes((0xB8, len(pairs))) + cbor.join_pairs(pairs)[1:]
    return cbor.join_pairs(pairs)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_non_canonical_body_is_verified_by_re_encoding(variant: str) -> None:
    frame = call(VARIANTS[variant][0])
    unsigned_pairs = cbor.encode_pairs(frame.to_map(signed=False))

    def sent_with(signature: bytes) -> ReceivedMap:
        pairs = sorted([*unsigned_pairs, (SIGNATURE_KEY, cbor.encode(signature))])
        return received(frame_bytes(variant_body(pairs, variant)))

    # signed over the canonical bytes: accepted, exactly as the re-encoding path does (§2.5 MAY)
    honest = sent_with(SIGNER.sign(frame.signable_bytes()))
    assert unsigned_body(honest.body) is None
    parsed = frames.parse_frame(honest)
    assert dataclasses.replace(parsed, signature=None) == frame
    assert frames.verifies_received(parsed, honest, SIGNER.node_id)
    # signed over its own non-canonical bytes: refused, as before (§4.2), though cutting the
    # signature out of the received body would have given exactly those bytes
    own = DOMAIN_FRAME + variant_body(unsigned_pairs, variant)
    forged = sent_with(SIGNER.sign(own))
    parsed = frames.parse_frame(forged)
    assert not parsed.verifies(SIGNER.node_id)
    assert not frames.verifies_received(parsed, forged, SIGNER.node_id)


def test_a_missing_or_short_signature_is_refused() -> None:
    frame = call({"n": 1}).signed_by(SIGNER)
    assert frame.signature is not None
    for signature in (None, frame.signature[:63]):
        changed = dataclasses.replace(frame, signature=signature)
        frame_map = received(changed.encode())
        parsed = frames.parse_frame(frame_map)
        assert not frames.verifies_received(parsed, frame_map, SIGNER.node_id)
