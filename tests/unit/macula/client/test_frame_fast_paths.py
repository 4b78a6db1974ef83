"""The frame fast paths of the client's hot path (docs/performance.md §10) give exactly what
the general paths give: ``parse_frame`` filling a frame's slots directly equals the frame the
dataclass constructor builds from the same values; ``Frame.encoded_pairs`` (fields encoded in
the class's precomputed key order) equals ``cbor.encode_pairs`` of ``to_map()``; the signature
and publisher_sig of every vector come out byte-identical."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from macula.client.publishing import signed_publish
from macula.wire import cbor, frames
from macula.wire.errors import LocalProtocolError, ProtocolError
from macula.wire.framing import FrameDecoder
from macula.wire.identity import DOMAIN_EVENT_PUB, DOMAIN_FRAME, Identity, verify
from support.vectorkit import load_vectors, typed

FRAMES = load_vectors("frames")
ALL = FRAMES["frames"] + FRAMES["erlang_golden"]
ME = Identity(bytes(range(32)))


def _constructed(frame: frames.Frame) -> frames.Frame:
    """The same frame through the dataclass constructor (every check of ``__post_init__``)."""
    values = {f.name: getattr(frame, f.name) for f in dataclasses.fields(frame)}
    return type(frame)(**values)


def _unsigned_pairs(frame: frames.Frame) -> list[tuple[bytes, bytes]]:
    unsigned = frame.to_map()
    unsigned.pop("signature", None)
    return cbor.encode_pairs(unsigned)


@pytest.mark.parametrize("vec", ALL, ids=lambda v: v["name"])
def test_parsed_vector_equals_the_constructed_frame(vec: dict[str, Any]) -> None:
    [frame_map] = FrameDecoder().feed(bytes.fromhex(vec["wire_hex"]))
    frame = frames.parse_frame(frame_map)
    again = _constructed(frame)
    assert frame == again
    for f in dataclasses.fields(frame):
        assert getattr(frame, f.name) == getattr(again, f.name)
        assert type(getattr(frame, f.name)) is type(getattr(again, f.name))
    assert frame.to_map() == frame_map


@pytest.mark.parametrize("vec", ALL, ids=lambda v: v["name"])
def test_encoded_pairs_equal_the_general_encoding(vec: dict[str, Any]) -> None:
    frame = frames.parse_frame(typed(vec["fields"]))
    assert frame.encoded_pairs() == _unsigned_pairs(frame)
    assert frame.signable_bytes() == DOMAIN_FRAME + cbor.join_pairs(
        [pair for pair in frame.encoded_pairs() if pair[0] != cbor.encode_key("publisher_sig")]
    )


@pytest.mark.parametrize("vec", FRAMES["frames"], ids=lambda v: v["name"])
def test_sign_and_encode_reproduces_every_vector(vec: dict[str, Any]) -> None:
    frame = frames.parse_frame(typed(vec["fields"]))
    signer = Identity(bytes.fromhex(vec["signer_seed_hex"]))
    unsigned = dataclasses.replace(frame, signature=None)
    assert unsigned.sign_and_encode(signer).hex() == vec["wire_hex"]
    assert unsigned.sign_and_encode(signer) == unsigned.signed_by(signer).encode()


def _event(**changes: Any) -> dict[str, Any]:
    event = frames.Event(
        frame_id=frames.new_frame_id(1_700_000_000_000, bytes(10)),
        sent_at_ms=1_700_000_000_000,
        topic="t.fast",
        realm=bytes(32),
        publisher=ME.node_id,
        seq=7,
        payload={"k": [1, 2.5, "x", None]},
    )
    return {**event.signed_by(ME).to_map(), **changes}


def test_an_unknown_key_is_kept_when_an_optional_field_is_absent() -> None:
    """No ``publisher_sig`` (omitted) and one unknown key: the same number of keys as a frame
    with both known, and still an extra."""
    frame_map = _event(zz_future=b"kept")
    assert "publisher_sig" not in frame_map
    frame = frames.parse_frame(frame_map)
    assert dict(frame.extras) == {"zz_future": b"kept"}
    assert frame.to_map() == frame_map
    assert frame.encoded_pairs() == _unsigned_pairs(frame)  # the general path, with extras
    assert frame == _constructed(frame)


def test_a_frame_without_extras_shares_the_empty_extras() -> None:
    frame = frames.parse_frame(_event())
    assert dict(frame.extras) == {} and frame == _constructed(frame)


@pytest.mark.parametrize(
    ("key", "bad"),
    [("seq", -1), ("publisher", b"short"), ("topic", b"\xff"), ("delivered_via", "mail")],
)
def test_a_bad_field_is_still_refused_on_the_fast_path(key: str, bad: object) -> None:
    with pytest.raises(ProtocolError) as refused:
        frames.parse_frame(_event(**{key: bad}))
    assert refused.value.reason == "bad_field" and key in refused.value.detail


def test_the_classes_with_cross_field_rules_keep_their_constructor() -> None:
    assert frames.Error not in frames._CHECKED_ONLY
    assert frames.StreamData not in frames._CHECKED_ONLY
    with pytest.raises(ProtocolError):  # STREAM_DATA raw body must be bytes (cross-field)
        data = frames.StreamData(
            frame_id=frames.new_frame_id(1, bytes(10)),
            sent_at_ms=1,
            stream_id=bytes(16),
            seq=0,
            encoding="msgpack",
            body="text",
        )
        frames.parse_frame({**data.to_map(), "encoding": "raw"})


def test_signed_publish_signatures_verify_and_match_the_reference_path() -> None:
    for payload in (b"", os.urandom(128), {"nested": [1, {"a": None}]}, "text", 2**40):
        publish = frames.Publish(
            frame_id=frames.new_frame_id(1_700_000_000_000, os.urandom(10)),
            sent_at_ms=1_700_000_000_000,
            topic="t.pub",
            realm=bytes(32),
            publisher=ME.node_id,
            seq=3,
            payload=payload,
            published_at_ms=1_700_000_000_000,
        )
        data = signed_publish(publish, ME)
        assert data == publish.with_publisher_sig(ME).sign_and_encode(ME)
        parsed = frames.parse_frame(FrameDecoder().feed(data)[0])
        assert isinstance(parsed, frames.Publish) and parsed.verifies(ME.node_id)
        assert frames.publisher_sig_valid(parsed)


def test_identity_sign_and_verify_agree_with_pynacl() -> None:
    import nacl.signing

    key = nacl.signing.SigningKey(bytes(range(32)))
    for message in (b"", b"m", os.urandom(1000)):
        signature = ME.sign(message)
        assert signature == key.sign(message).signature
        assert verify(ME.node_id, message, signature)
        assert not verify(ME.node_id, message + b"x", signature)
        assert not verify(ME.node_id, message, signature[:63] + bytes([signature[63] ^ 1]))
        assert not verify(ME.node_id[:31], message, signature)
        assert not verify(bytes(32), message, signature)


@pytest.mark.parametrize(
    "payload",
    [None, b"", os.urandom(128), os.urandom(300), "text", "ünï", 0, 23, 24, 2**40, -5, 1.5,
     [1, [2, {"b": 1, "a": 2}]], {"z": None, "a": [b"x"]}],
)  # fmt: skip
def test_publication_signable_equals_the_encoded_map(payload: Any) -> None:
    for seq in (0, 23, 1_790_000_000_000_000):
        expected = DOMAIN_EVENT_PUB + cbor.encode(
            {"topic": "t.ü".encode(), "realm": bytes(32), "publisher": ME.node_id,
             "seq": seq, "payload": payload}
        )  # fmt: skip
        assert frames.publication_signable("t.ü", bytes(32), ME.node_id, seq, payload) == expected


def test_publication_signable_refuses_what_the_encoder_refuses() -> None:
    with pytest.raises(LocalProtocolError):
        frames.publication_signable("t", bytes(32), ME.node_id, 1, {b"bytes key": 1})
    with pytest.raises(LocalProtocolError):
        frames.publication_signable("t", bytes(32), ME.node_id, 1, object())


def test_publication_signable_keeps_the_depth_limit_of_the_encoded_map() -> None:
    deepest: Any = 1
    for _ in range(cbor.DEFAULT_MAX_DEPTH - 1):
        deepest = [deepest]
    frames.publication_signable("t", bytes(32), ME.node_id, 1, deepest)  # fits in the map
    with pytest.raises(LocalProtocolError):
        frames.publication_signable("t", bytes(32), ME.node_id, 1, [deepest])
    with pytest.raises(LocalProtocolError):
        cbor.encode({"payload": [deepest]})  # the same limit as the map's encoding
