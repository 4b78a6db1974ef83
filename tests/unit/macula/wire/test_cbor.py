"""Deterministic CBOR (PROTOCOL.md §2): vectors, strict decoding, bounds, round trips."""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.errors import LocalProtocolError, ProtocolError
from support.vectorkit import load_vectors, typed

CBOR = load_vectors("cbor")
BYTES_KEY_VECTORS = {"map/key_order_mixed_types"}  # §2.2 ordering shown with a bytes key


@pytest.mark.parametrize("vector", CBOR["vectors"], ids=lambda v: v["name"])
def test_vector_encodes_and_decodes_exactly(vector: dict[str, Any]) -> None:
    value = typed(vector["value"])
    bytes_keys = vector["name"] in BYTES_KEY_VECTORS
    assert cbor.encode(value, allow_bytes_keys=bytes_keys).hex() == vector["hex"]
    decoded = cbor.decode(bytes.fromhex(vector["hex"]), allow_bytes_keys=bytes_keys)
    assert decoded == value
    assert type(decoded) is type(value)
    if "bits" in vector["value"]:
        assert struct.pack(">d", decoded).hex() == vector["value"]["bits"]


def test_python_booleans_encode_as_integers() -> None:
    assert cbor.encode(True) == b"\x01"
    assert cbor.encode(False) == b"\x00"
    assert cbor.encode({"ok": True}) == cbor.encode({"ok": 1})


def test_bytes_map_keys_are_refused_by_default_both_ways() -> None:
    with pytest.raises(LocalProtocolError, match="bad_map_key"):
        cbor.encode({b"k": 1})
    with pytest.raises(ProtocolError, match="bad_map_key"):
        cbor.decode(bytes.fromhex("a1416b01"))


@pytest.mark.parametrize("case", CBOR["decoding"], ids=lambda c: c["input"])
def test_decoding_case_matches_reference_or_is_stricter(case: dict[str, Any]) -> None:
    data = bytes.fromhex(case["hex"])
    reference = case["reference_client"]
    if case["input"] == "map with a duplicated key":
        # Deliberately stricter than the reference client (which keeps the last value):
        # duplicate keys are ambiguous and never sent by an honest peer (§2.4).
        with pytest.raises(ProtocolError, match="duplicate_key"):
            cbor.decode(data)
        return
    if reference["accepted"]:
        decoded = cbor.decode(data)
        assert decoded == typed(reference["decoded"])
        # what we accept we re-encode canonically (so a signature over it would not verify)
        assert cbor.decode(cbor.encode(decoded)) == decoded
    else:
        with pytest.raises(ProtocolError):
            cbor.decode(data)


@pytest.mark.parametrize(
    ("hex_input", "reason"),
    [
        ("f5", "boolean"),
        ("f4", "boolean"),
        ("f7", "undefined"),
        ("f0", "simple_value"),
        ("f820", "simple_value"),
        ("c11a5f5e1000", "tag"),
        ("9f01ff", "indefinite_length"),
        ("7f6161ff", "indefinite_length"),
        ("bf6161ff", "indefinite_length"),
        ("ff", "indefinite_length"),
        ("1c", "reserved_additional_info"),
        ("fb7ff8000000000000", "non_finite_float"),
        ("fbfff0000000000000", "non_finite_float"),
        ("f97e00", "non_finite_float"),
        ("fa7f800000", "non_finite_float"),
        ("62c328", "invalid_utf8"),
        ("63eda080", "invalid_utf8"),  # an encoded surrogate is not UTF-8
        ("a1416b01", "bad_map_key"),
        ("a1f601", "bad_map_key"),
        ("a1fb3ff000000000000001", "bad_map_key"),
        ("a1800101", "bad_map_key"),
        ("a2616101616102", "duplicate_key"),
        ("0001", "trailing_bytes"),
        ("", "truncated"),
        ("5820aa", "truncated"),
        ("19", "truncated"),
        ("9b0000000100000000", "truncated"),  # a declared array of 2^32 items
        ("9bffffffffffffffff", "truncated"),
        ("bbffffffffffffffff", "truncated"),
        ("5bffffffffffffffff", "truncated"),
        ("7a00ffffff", "truncated"),
    ],
)
def test_bad_input_is_named(hex_input: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        cbor.decode(bytes.fromhex(hex_input))
    assert info.value.reason == reason


def test_nesting_ten_thousand_deep_is_refused_without_recursion_error() -> None:
    deep_arrays = b"\x81" * 10_000 + b"\x00"
    with pytest.raises(ProtocolError) as info:
        cbor.decode(deep_arrays)
    assert info.value.reason == "too_deep"
    deep_maps = b"\xa1\x61a" * 10_000 + b"\x00"
    with pytest.raises(ProtocolError, match="too_deep"):
        cbor.decode(deep_maps)


def test_depth_limit_is_exact() -> None:
    assert cbor.decode(b"\x81" * 5 + b"\x00", max_depth=5) == [[[[[0]]]]]
    with pytest.raises(ProtocolError, match="too_deep"):
        cbor.decode(b"\x81" * 6 + b"\x00", max_depth=5)


def test_item_budget_bounds_memory() -> None:
    many = b"\x9a\x00\x0f\x42\x3f" + b"\x80" * 999_999  # 999,999 empty arrays in one
    with pytest.raises(ProtocolError, match="too_many_items"):
        cbor.decode(many, max_items=100_000)
    assert len(cbor.decode(many)) == 999_999  # the default budget is a million items
    with pytest.raises(ProtocolError, match="too_many_items"):
        cbor.decode(b"\x9a\x00\x0f\x42\x40" + b"\x80" * 1_000_000)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (math.nan, "non_finite_float"),
        (math.inf, "non_finite_float"),
        (-math.inf, "non_finite_float"),
        ({1, 2}, "unencodable"),
        (object(), "unencodable"),
        (2**64, "int_out_of_range"),
        (-(2**64) - 1, "int_out_of_range"),
        ({b"k": 1}, "bad_map_key"),
        ({1.5: 1}, "bad_map_key"),
        ({None: 1}, "bad_map_key"),
        ("\ud800", "invalid_text"),
        ({True: 1}, "bad_map_key"),
    ],
)
def test_encoder_refuses_what_the_wire_cannot_carry(value: object, reason: str) -> None:
    with pytest.raises(LocalProtocolError) as info:
        cbor.encode(value)
    assert info.value.reason == reason


def test_encoder_depth_guard_handles_cycles() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(LocalProtocolError, match="too_deep"):
        cbor.encode(cyclic)


def test_integer_edges() -> None:
    for value in (0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, -1, -(2**64)):
        assert cbor.decode(cbor.encode(value)) == value
    assert cbor.encode(2**64 - 1) == b"\x1b" + b"\xff" * 8
    assert cbor.encode(-(2**64)) == b"\x3b" + b"\xff" * 8


def test_floats_are_always_binary64() -> None:
    assert cbor.encode(1.0) == bytes.fromhex("fb3ff0000000000000")
    assert cbor.encode(0.0) == bytes.fromhex("fb0000000000000000")
    assert cbor.encode(-0.0) == bytes.fromhex("fb8000000000000000")


def test_tuples_and_bytearrays_encode_like_lists_and_bytes() -> None:
    assert cbor.encode((1, 2)) == cbor.encode([1, 2])
    assert cbor.encode(bytearray(b"ab")) == cbor.encode(b"ab")
    assert cbor.encode(memoryview(b"ab")) == cbor.encode(b"ab")


wire_values = st.recursive(
    st.none()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=64)
    | st.text(max_size=32),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(
            st.text(max_size=8) | st.integers(min_value=-(2**64), max_value=2**64 - 1),
            children,
            max_size=6,
        )
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(wire_values)
def test_round_trip_is_identity_and_canonical(value: Any) -> None:
    encoded = cbor.encode(value)
    decoded = cbor.decode(encoded)
    assert decoded == value
    assert cbor.encode(decoded) == encoded


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        cbor.decode(data)


@settings(max_examples=300, deadline=None)
@given(wire_values, st.data())
def test_mutated_encodings_only_raise_protocol_error(value: Any, data: st.DataObject) -> None:
    encoded = bytearray(cbor.encode(value))
    position = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    encoded[position] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    with contextlib.suppress(ProtocolError):
        cbor.decode(bytes(encoded[:cut]))
