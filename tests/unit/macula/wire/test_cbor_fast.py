"""The fast CBOR paths agree with the codec they replace: differential tests on random input.

``cbor_reference`` holds the previous encoder verbatim and the full strict decoder alone.
Decoding must give the same value with the same types, or the same ``ProtocolError`` reason,
for valid, mutated, random and hand-made hostile inputs; encoding must give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.cbor_fast import Fallback, decode_fast
from macula.wire.errors import LocalProtocolError, ProtocolError
from support import cbor_reference as reference
from support.vectorkit import load_vectors


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b) or (a != a and b != b)


def outcome(decode: Any, data: bytes, **options: Any) -> tuple[str, Any]:
    try:
        return "ok", decode(data, **options)
    except ProtocolError as exc:
        return "error", exc.reason


def assert_agree(data: bytes, **options: Any) -> None:
    ours, theirs = outcome(cbor.decode, data, **options), outcome(reference.decode, data, **options)
    assert ours[0] == theirs[0], (data.hex(), ours, theirs)
    assert same(ours[1], theirs[1]), (data.hex(), ours, theirs)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.integers(min_value=-30, max_value=30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.binary(max_size=40)
    | st.binary(min_size=250, max_size=300)
    | st.text(max_size=30)
    | st.text(alphabet="abcé\u20ac\U0001f600", max_size=30)
)
keys = st.text(max_size=26) | st.integers(min_value=-(2**64), max_value=2**64 - 1)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(keys, children, max_size=6)
        | st.dictionaries(keys, children, max_size=4).map(MappingProxyType)
    ),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(values)
def test_encoding_is_byte_identical_to_the_reference(value: Any) -> None:
    encoded = cbor.encode(value)
    assert encoded == reference.encode(value)
    assert_agree(encoded)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(keys, values, max_size=12))
def test_encoded_pairs_are_identical_to_the_reference(value: dict[Any, Any]) -> None:
    pairs = cbor.encode_pairs(value)
    assert pairs == reference.encode_pairs(value)
    assert cbor.join_pairs(pairs) == cbor.encode(value)


@settings(max_examples=500, deadline=None)
@given(values, st.data())
def test_mutated_encodings_decode_alike(value: Any, data: st.DataObject) -> None:
    encoded = bytearray(cbor.encode(value))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        position = data.draw(st.integers(min_value=0, max_value=len(encoded)))
        action = data.draw(st.sampled_from(["replace", "insert", "delete", "cut"]))
        byte = data.draw(st.integers(min_value=0, max_value=255))
        if action == "replace" and position < len(encoded):
            encoded[position] = byte
        elif action == "insert":
            encoded.insert(position, byte)
        elif action == "delete" and position < len(encoded):
            del encoded[position]
        elif action == "cut":
            del encoded[position:]
    assert_agree(bytes(encoded))
    assert_agree(bytes(encoded), max_depth=2)
    assert_agree(bytes(encoded), allow_bytes_keys=True)


# Items made from raw heads: every major type and additional-info value, tags and simple
# values included, so the rare and the hostile heads are drawn often.
head_bytes = st.builds(
    lambda major, ai, tail: bytes(((major << 5) | ai,)) + tail,
    st.integers(min_value=0, max_value=7),
    st.integers(min_value=0, max_value=31),
    st.just(b"") | st.binary(min_size=1, max_size=2) | st.binary(min_size=1, max_size=9),
)


@settings(max_examples=1000, deadline=None)
@given(st.lists(head_bytes, max_size=12), st.sampled_from([b"", b"\xa1\x61k", b"\xa2\x61a\x01"]))
def test_random_heads_decode_alike(items: list[bytes], prefix: bytes) -> None:
    assert_agree(prefix + b"".join(items))
    assert_agree(prefix + b"".join(items), allow_bytes_keys=True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_alike(data: bytes) -> None:
    assert_agree(data)


CBOR = load_vectors("cbor")
HOSTILE = [
    "f5", "f4", "f7", "f0", "f820", "c11a5f5e1000", "c24101", "d9d9f700", "9f01ff", "7f6161ff",
    "bf6161ff", "ff", "1c", "5c", "7d", "fb7ff8000000000000", "fbfff0000000000000", "f97e00",
    "f97c00", "fa7f800000", "62c328", "63eda080", "416b", "f6", "80", "a0", "0001", "", "5820aa",
    "19", "1b00000000000000", "9b0000000100000000", "9bffffffffffffffff", "bbffffffffffffffff",
    "5bffffffffffffffff", "7a00ffffff", "5818", "7818", "f93c00", "fa3fc00000", "1817",
    "fb3ff0000000000000", "3bffffffffffffffff", "1bffffffffffffffff", "58", "78",
    "a1416b01", "a1f601", "a1800101", "a1a00101", "a1fb3ff000000000000001", "a1f501",
]  # fmt: skip


@pytest.mark.parametrize("item", HOSTILE)
def test_hostile_items_decode_alike_in_every_position(item: str) -> None:
    raw = bytes.fromhex(item)
    for data in (
        raw,
        b"\x81" + raw,
        b"\x82\x01" + raw,
        b"\xa1\x61k" + raw,  # a map value: the inline value heads of the fast path
        b"\xa2\x61k" + raw + b"\x61j\x01",
        b"\xa1" + raw + b"\x01",  # a map key
        b"\xa2\x61k\x01" + raw + b"\x01",
        b"\xa2\x61k" + raw + b"\x61k\x01",  # duplicate after a hostile value
    ):
        assert_agree(data)
        assert_agree(data, allow_bytes_keys=True)


TAILS = [b"", b"\x00", b"\x01\x02", b"\x7f\xf0\x00\x00", b"\x00" * 8, b"\x3f\xf0" + b"\x00" * 6]


@pytest.mark.parametrize("initial", range(256), ids=lambda i: f"{i:02x}")
def test_every_initial_byte_decodes_alike_in_every_position(initial: int) -> None:
    for tail in TAILS:
        item = bytes((initial,)) + tail
        for data in (
            item,
            b"\x81" + item,
            b"\xa1\x61k" + item,
            b"\xa2\x61k" + item + b"\x61j\x01",
            b"\xa1" + item + b"\x01",
            b"\xa2\x61k\x01" + item + b"\x01",
        ):
            assert_agree(data)
            assert_agree(data, allow_bytes_keys=True)
            assert_agree(data, max_depth=1)


def test_every_vector_and_decoding_case_decodes_alike() -> None:
    for vector in CBOR["vectors"]:
        assert_agree(bytes.fromhex(vector["hex"]), allow_bytes_keys=True)
    for case in CBOR["decoding"]:
        assert_agree(bytes.fromhex(case["hex"]))
    for frame in load_vectors("frames")["frames"]:
        body = bytes.fromhex(frame["cbor_hex"])
        assert same(decode_fast(body, cbor.DEFAULT_MAX_DEPTH, False), reference.decode(body))


@pytest.mark.parametrize(
    "hex_input",
    ["f93c00", "fa3fc00000", "c24101", "f5", "9f01ff", "a2616101616102", "0001", "", "62c328"],
)
def test_fast_path_leaves_uncommon_and_bad_input_to_the_full_decoder(hex_input: str) -> None:
    with pytest.raises(Fallback):
        decode_fast(bytes.fromhex(hex_input), cbor.DEFAULT_MAX_DEPTH, False)


def test_item_budget_is_exact_on_both_sides_of_the_fast_path_threshold() -> None:
    three = b"\x83\x01\x02\x03"  # four items in four bytes
    assert cbor.decode(three, max_items=4) == [1, 2, 3]  # len <= max_items: fast path
    with pytest.raises(ProtocolError, match="too_many_items"):
        cbor.decode(three, max_items=3)  # len > max_items: the counting decoder
    assert cbor.decode(b"\x43abc", max_items=1) == b"abc"  # one item in four bytes


def test_depth_limit_is_exact_through_maps_and_arrays() -> None:
    nested = b"\xa1\x61k\x81\xa1\x61k\x00"  # map > array > map
    assert cbor.decode(nested, max_depth=3) == {"k": [{"k": 0}]}
    with pytest.raises(ProtocolError, match="too_deep"):
        cbor.decode(nested, max_depth=2)
    assert cbor.decode(b"\x00", max_depth=0) == 0


class _Odd(Mapping[Any, Any]):
    """A Mapping that is not a dict: encoded like one."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = data

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"a": [1, {"b": float("nan")}]}, "non_finite_float"),
        ({"a": {True: 1}}, "bad_map_key"),
        ([{"a": ("\ud800",)}], "invalid_text"),
        ({"a": [2**64]}, "int_out_of_range"),
        ({"a": {1, 2}}, "unencodable"),
        (_Odd({"z": 1, b"k": 2}), "bad_map_key"),
    ],
)
def test_encoder_refusals_are_unchanged_when_nested(value: object, reason: str) -> None:
    for encode in (cbor.encode, reference.encode):
        with pytest.raises(LocalProtocolError) as info:
            encode(value)
        assert info.value.reason == reason


def test_mapping_subclasses_and_byte_views_encode_like_the_reference() -> None:
    value = _Odd({"z": [bytearray(b"x"), memoryview(b"yz"), (1, "é")], "a": True, 3: -0.0})
    assert cbor.encode(value) == reference.encode(value)
    assert cbor.encode([True, False, None, "x" * 23, "x" * 24, 23, 24, -1]) == reference.encode(
        [True, False, None, "x" * 23, "x" * 24, 23, 24, -1]
    )
