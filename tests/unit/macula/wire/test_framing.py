"""Stream framing (PROTOCOL.md §2.1, §2.5): incremental decoding and hostile streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.errors import FramingError, LocalProtocolError, ProtocolError
from macula.wire.framing import MAX_FRAME_SIZE, FrameDecoder, frame_bytes
from support.vectorkit import load_vectors

WIRES = [bytes.fromhex(v["wire_hex"]) for v in load_vectors("frames")["frames"]]
STREAM = b"".join(WIRES)


def test_every_split_of_a_stream_yields_the_same_frames() -> None:
    expected = FrameDecoder().feed(STREAM)
    assert len(expected) == len(WIRES)
    for cut in range(0, len(WIRES[0]) + len(WIRES[1]) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(STREAM[:cut]) + decoder.feed(STREAM[cut:])
        assert got == expected
        assert decoder.at_frame_boundary()


def test_byte_at_a_time() -> None:
    decoder = FrameDecoder()
    got = []
    for i in range(len(WIRES[2])):
        got += decoder.feed(WIRES[2][i : i + 1])
        if i < len(WIRES[2]) - 1:
            assert got == [] and not decoder.at_frame_boundary()
    assert len(got) == 1 and decoder.buffered == 0


def test_incomplete_frame_waits() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(WIRES[0][:-1]) == []
    assert decoder.buffered == len(WIRES[0]) - 1
    assert not decoder.at_frame_boundary()


def test_length_above_limit_is_refused_before_the_body_arrives() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FramingError) as info:
        decoder.feed((MAX_FRAME_SIZE + 1).to_bytes(4, "big"))
    assert info.value.reason == "frame_too_large"
    with pytest.raises(FramingError, match="frame_too_large"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")
    small = FrameDecoder(max_frame_size=100)
    with pytest.raises(FramingError, match="frame_too_large"):
        small.feed(WIRES[0][:4])


def test_max_size_frame_is_accepted() -> None:
    payload = b"x" * (MAX_FRAME_SIZE - 16)
    body = cbor.encode({"p": payload})
    assert len(body) <= MAX_FRAME_SIZE
    [frame] = FrameDecoder().feed(frame_bytes(body))
    assert frame["p"] == payload
    with pytest.raises(LocalProtocolError):
        frame_bytes(b"\0" * (MAX_FRAME_SIZE + 1))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x01", "not_a_map"),  # top level not a map
        (b"\x80", "not_a_map"),
        (bytes.fromhex("a0") + b"\x00", "trailing_bytes"),  # trailing bytes inside the length
        (bytes.fromhex("a1616101") + b"\xff", "trailing_bytes"),
        (bytes.fromhex("a16161f5"), "boolean"),
        (bytes.fromhex("a16161c100"), "tag"),
        (bytes.fromhex("bf6161f6ff"), "indefinite_length"),
        (bytes.fromhex("a16161f7"), "undefined"),
        (bytes.fromhex("a16161fb7ff8000000000000"), "non_finite_float"),
        (bytes.fromhex("a1616162c328"), "invalid_utf8"),
        (bytes.fromhex("a1416101"), "bad_map_key"),
        (bytes.fromhex("a161619b0000000100000000"), "truncated"),  # array of 2^32 items
        (b"", "truncated"),
        (b"\xa1" + b"\x61a\xa1" * 5_000 + b"\x61a\x00", "too_deep"),
    ],
)
def test_malformed_body_raises_framing_error(body: bytes, reason: str) -> None:
    with pytest.raises(FramingError) as info:
        FrameDecoder().feed(frame_bytes(body))
    assert info.value.reason == reason


def test_truncated_frame_then_fin_is_detectable() -> None:
    decoder = FrameDecoder()
    decoder.feed(WIRES[0] + WIRES[1][:10])
    assert not decoder.at_frame_boundary()


def test_decoder_is_poisoned_after_an_error_and_keeps_earlier_frames() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FramingError) as info:
        decoder.feed(WIRES[0] + frame_bytes(b"\x01") + WIRES[1])
    assert len(info.value.frames_before) == 1
    assert info.value.frames_before[0]["frame_type"] == "connect"
    with pytest.raises(FramingError, match="not_a_map"):
        decoder.feed(WIRES[2])  # never resynchronises
    assert decoder.buffered == 0


def test_framed_map_round_trips() -> None:
    frame = {"frame_type": "ping", "version": 2}
    assert FrameDecoder().feed(frame_bytes(cbor.encode(frame)) * 3) == [frame] * 3


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512), st.integers(min_value=1, max_value=64))
def test_arbitrary_bytes_only_raise_framing_error(data: bytes, step: int) -> None:
    decoder = FrameDecoder(max_frame_size=4096)
    try:
        for i in range(0, len(data), step):
            decoder.feed(data[i : i + step])
    except FramingError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_mutated_frames_only_raise_framing_error(data: st.DataObject) -> None:
    stream = bytearray(data.draw(st.sampled_from(WIRES)) + data.draw(st.sampled_from(WIRES)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(stream) - 1))
        stream[position] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(stream)))
    decoder = FrameDecoder()
    try:
        frames = decoder.feed(bytes(stream[:cut])) + decoder.feed(bytes(stream[cut:]))
    except ProtocolError as exc:
        assert isinstance(exc, FramingError)
    else:
        assert all(isinstance(f, dict) for f in frames)
