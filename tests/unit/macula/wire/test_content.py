"""Content addressing (PROTOCOL.md §11): vectors/content.json, bad cases, properties."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.wire import cbor
from macula.wire.content import (
    CHUNK_SIZE,
    CODEC_MANIFEST,
    CODEC_RAW,
    MCID_SIZE,
    ChunkInfo,
    Manifest,
    Mcid,
    assemble,
    chunk,
    chunk_mcid,
    digest,
    merkle_levels,
    merkle_root,
    plan_put,
    raw_mcid,
    verify_block,
)
from macula.wire.errors import ContentInvalid, LocalProtocolError, ProtocolError
from support.vectorkit import load_vectors

VECTORS = load_vectors("content")
CREATED = 1767225600  # the vectors' fixed `created`

# Inputs the vectors describe in words instead of hex.
_DESCRIBED = {
    "bytes(1000) of 0x00": bytes(1000),
    "1000 zero bytes": bytes(1000),
    "exactly 262144 bytes of 0x61": b"a" * 262144,
    "b'macula-content-chunk-test-data-' * 21875": b"macula-content-chunk-test-data-" * 21875,
    "ascii 'abcdefghijklmnopq'": b"abcdefghijklmnopq",
    "262145 bytes of 0x62": b"b" * 262145,
    "empty": b"",
}


def _input(entry: dict[str, Any]) -> bytes:
    if entry.get("input_hex") is not None:
        return bytes.fromhex(entry["input_hex"])
    description = entry["input_description"]
    matches = [data for prefix, data in _DESCRIBED.items() if description.startswith(prefix)]
    assert len(matches) == 1, f"no unique input for {description!r}"
    return matches[0]


def _value(typed: dict[str, Any]) -> Any:
    """The typed value notation of the vector files, as Python values."""
    (kind, payload), *_ = typed.items()
    if kind == "int":
        return payload
    if kind == "bytes":
        return bytes.fromhex(payload)
    if kind == "text":
        return payload
    if kind == "null":
        return None
    if kind == "array":
        return [_value(item) for item in payload]
    assert kind == "map", kind
    return {_value(k): _value(v) for k, v in payload}


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["input_description"][:40] for e in entries]


GOLDEN = VECTORS["blake3_golden"]
BLOCKS = VECTORS["blocks"]
MANIFESTS = VECTORS["manifests"]


def _manifest(vector: dict[str, Any]) -> Manifest:
    return Manifest.create(
        _input(vector),
        vector["name"],
        created=CREATED,
        chunk_size=vector["chunk_size"],
        algorithm=vector["hash_algorithm"],
    )


@pytest.fixture(scope="module")
def letters() -> Manifest:
    return Manifest.create(b"abcdefghijklmnopq", "letters.txt", created=CREATED, chunk_size=4)


# --- vectors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", GOLDEN, ids=_ids(GOLDEN))
def test_blake3_golden(vector: dict[str, Any]) -> None:
    assert digest(_input(vector)).hex() == vector["blake3_hex"]


@pytest.mark.parametrize("vector", BLOCKS, ids=_ids(BLOCKS))
def test_block_mcid(vector: dict[str, Any]) -> None:
    data = _input(vector)
    assert len(data) == vector["length"]
    assert digest(data).hex() == vector["blake3_hex"]
    mcid = raw_mcid(data)
    assert mcid.hex() == vector["mcid_hex"]
    assert mcid.to_bytes() == bytes.fromhex(vector["mcid_hex"])
    assert Mcid.from_bytes(mcid.to_bytes()) == mcid
    assert not mcid.is_manifest
    verify_block(mcid, data)


@pytest.mark.parametrize("vector", BLOCKS, ids=_ids(BLOCKS))
def test_block_vectors_plan_as_one_raw_block(vector: dict[str, Any]) -> None:
    data = _input(vector)
    plan = plan_put(data, created=CREATED)
    assert plan.manifest is None
    assert plan.mcid.hex() == vector["mcid_hex"]
    assert len(plan.blocks) == 1
    assert plan.blocks[0][0] == plan.mcid
    assert bytes(plan.blocks[0][1]) == data


@pytest.mark.parametrize("vector", MANIFESTS, ids=_ids(MANIFESTS))
def test_manifest_vector(vector: dict[str, Any]) -> None:
    data = _input(vector)
    assert len(data) == vector["length"]
    algorithm = vector["hash_algorithm"]
    m = _manifest(vector)

    chunks = chunk(data, vector["chunk_size"], algorithm)
    assert [c.mcid.hex() for c in chunks] == vector["chunk_mcids_hex"]
    assert [chunk_mcid(c.hash).hex() for c in m.chunks] == vector["chunk_mcids_hex"]
    assert list(m.chunks) == chunks

    leaves = [c.hash for c in chunks]
    levels = merkle_levels(leaves, algorithm)
    assert [[h.hex() for h in level] for level in levels] == vector["merkle_levels_hex"]
    assert merkle_root(leaves, algorithm).hex() == vector["root_hash_hex"]
    assert m.root_hash.hex() == vector["root_hash_hex"]

    assert m.canonical_map() == _value(vector["mcid_canonical_map"])
    assert cbor.encode(m.canonical_map()).hex() == vector["mcid_canonical_cbor_hex"]
    assert m.mcid.hex() == vector["manifest_mcid_hex"]
    assert m.compute_mcid() == m.mcid
    assert m.mcid.is_manifest
    m.verify(Mcid.from_bytes(bytes.fromhex(vector["manifest_mcid_hex"])))

    wire = m.to_wire()
    assert wire == _value(vector["manifest_wire"])
    assert type(wire["name"]) is str
    payload = cbor.encode({"manifest": wire})
    assert payload.hex() == vector["put_manifest_call_payload_cbor_hex"]

    decoded = cbor.decode(payload)["manifest"]
    assert Manifest.from_wire(decoded) == m
    assert Manifest.from_wire(_value(vector["manifest_wire"])) == m


@pytest.mark.parametrize("vector", MANIFESTS, ids=_ids(MANIFESTS))
def test_manifest_vector_assembles(vector: dict[str, Any]) -> None:
    data = _input(vector)
    m = _manifest(vector)
    blocks = [data[c.offset : c.offset + c.size] for c in m.chunks]
    for c, block in zip(m.chunks, blocks, strict=True):
        verify_block(c.mcid, block, m.hash_algorithm)
    assert assemble(m, blocks) == data


@pytest.mark.parametrize("vector", MANIFESTS, ids=_ids(MANIFESTS))
def test_manifest_vector_plan_put(vector: dict[str, Any]) -> None:
    data = _input(vector)
    plan = plan_put(
        data,
        vector["name"],
        created=CREATED,
        chunk_size=vector["chunk_size"],
        algorithm=vector["hash_algorithm"],
    )
    if len(data) <= vector["chunk_size"]:  # the empty vector: put() sends one raw block
        assert plan.manifest is None
        assert plan.mcid == raw_mcid(data, vector["hash_algorithm"])
        return
    assert plan.manifest is not None
    assert plan.mcid.hex() == vector["manifest_mcid_hex"]
    assert [mcid.hex() for mcid, _ in plan.blocks] == vector["chunk_mcids_hex"]
    assert b"".join(plan.blocks[i][1] for i in range(len(plan.blocks))) == data


def test_threshold_is_262144_bytes() -> None:
    assert plan_put(b"a" * CHUNK_SIZE, created=CREATED).manifest is None
    plan = plan_put(b"a" * (CHUNK_SIZE + 1), created=CREATED)
    assert plan.manifest is not None
    assert [len(block) for _, block in plan.blocks] == [CHUNK_SIZE, 1]


def test_large_input_blocks_are_views_not_copies() -> None:
    data = bytes(range(256)) * (16 * 4096)  # 16 MiB
    plan = plan_put(data, "big", created=CREATED)
    assert plan.manifest is not None and plan.manifest.chunk_count == 64
    assert all(isinstance(block, memoryview) and block.obj is data for _, block in plan.blocks)
    assert assemble(plan.manifest, [block for _, block in plan.blocks]) == data


# --- MCID bad cases ---------------------------------------------------------------------------

_GOOD_MCID = bytes.fromhex(BLOCKS[1]["mcid_hex"])


@pytest.mark.parametrize("length", [0, 1, 33, 35, 64])
def test_mcid_wrong_length(length: int) -> None:
    with pytest.raises(ProtocolError) as info:
        Mcid.from_bytes((_GOOD_MCID * 2)[:length])
    assert info.value.reason == "bad_mcid_length"


@pytest.mark.parametrize("version", [0x00, 0x02, 0xFF])
def test_mcid_wrong_version(version: int) -> None:
    with pytest.raises(ProtocolError) as info:
        Mcid.from_bytes(bytes([version]) + _GOOD_MCID[1:])
    assert info.value.reason == "bad_mcid_version"


@pytest.mark.parametrize("codec", [0x00, 0x54, 0x57, 0x70])
def test_mcid_wrong_codec(codec: int) -> None:
    with pytest.raises(ProtocolError) as info:
        Mcid.from_bytes(bytes([0x01, codec]) + _GOOD_MCID[2:])
    assert info.value.reason == "bad_mcid_codec"


@pytest.mark.parametrize("value", ["01" * 34, 42, None, [1, 2]])
def test_mcid_not_bytes(value: object) -> None:
    with pytest.raises(ProtocolError) as info:
        Mcid.from_bytes(value)
    assert info.value.reason == "bad_mcid_type"


def test_mcid_construction_is_checked() -> None:
    with pytest.raises(LocalProtocolError):
        Mcid(2, CODEC_RAW, bytes(32))
    with pytest.raises(LocalProtocolError):
        Mcid(1, 0x70, bytes(32))
    with pytest.raises(LocalProtocolError):
        Mcid(1, CODEC_RAW, bytes(31))
    assert len(Mcid(1, CODEC_MANIFEST, bytes(32)).to_bytes()) == MCID_SIZE


def test_unknown_algorithm_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        digest(b"x", "md5")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        chunk(b"x", 0)


def test_sha256_digest() -> None:
    assert digest(b"", "sha256").hex().startswith("e3b0c442")


# --- blocks and assembly ----------------------------------------------------------------------


def test_verify_block_tampered() -> None:
    mcid = raw_mcid(b"macula")
    with pytest.raises(ContentInvalid) as info:
        verify_block(mcid, b"macuIa")
    assert info.value.reason == "block_hash_mismatch"
    with pytest.raises(ContentInvalid):
        verify_block(mcid, b"macula", "sha256")


def test_verify_block_refuses_manifest_mcid(letters: Manifest) -> None:
    with pytest.raises(ContentInvalid) as info:
        verify_block(letters.mcid, b"abcd")
    assert info.value.reason == "not_a_block_mcid"


def test_assemble_wrong_block(letters: Manifest) -> None:
    blocks = [b"abcd", b"efgh", b"ijkl", b"mnop", b"q"]
    assert assemble(letters, blocks) == b"abcdefghijklmnopq"
    for bad, reason in [
        ([b"abcd", b"efgh", b"ijkX", b"mnop", b"q"], "chunk_hash_mismatch"),
        ([b"abcd", b"efgh", b"ijkl", b"mnop", b"qq"], "chunk_size_mismatch"),
        ([b"abcd", b"efgh", b"ijkl", b"mnop"], "chunk_count_mismatch"),
        ([b"efgh", b"abcd", b"ijkl", b"mnop", b"q"], "chunk_hash_mismatch"),
    ]:
        with pytest.raises(ContentInvalid) as info:
            assemble(letters, bad)
        assert info.value.reason == reason


def test_assemble_detects_forged_root(letters: Manifest) -> None:
    forged = dataclasses.replace(letters, root_hash=bytes(32))
    with pytest.raises(ContentInvalid) as info:
        assemble(forged, [b"abcd", b"efgh", b"ijkl", b"mnop", b"q"])
    assert info.value.reason == "merkle_root_mismatch"
    with pytest.raises(ContentInvalid):
        forged.verify()


# --- manifest bad cases -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "letters.TXT"), ("chunk_size", 5), ("hash_algorithm", "sha256")],
)
def test_verify_mcid_detects_tampered_field(letters: Manifest, field: str, value: object) -> None:
    wire = letters.to_wire()
    wire[field] = value
    if field == "chunk_size":  # keep the chunk list consistent so only the MCID is wrong
        wire["chunks"] = [c.to_wire() for c in chunk(b"abcdefghijklmnopq", 5)]
        wire["chunk_count"] = 4
    tampered = Manifest.from_wire(wire)
    with pytest.raises(ContentInvalid) as info:
        tampered.verify_mcid()
    assert info.value.reason == "manifest_mcid_mismatch"


def test_verify_mcid_detects_size_and_root_tamper(letters: Manifest) -> None:
    # size + chunks extended consistently: only the MCID can notice.
    bigger = Manifest.create(b"abcdefghijklmnopqr", "letters.txt", created=CREATED, chunk_size=4)
    wire = bigger.to_wire()
    wire["mcid"] = letters.mcid.to_bytes()
    with pytest.raises(ContentInvalid):
        Manifest.from_wire(wire).verify_mcid()


def test_verify_mcid_against_expected(letters: Manifest) -> None:
    letters.verify_mcid(letters.mcid)
    other = raw_mcid(b"x")
    with pytest.raises(ContentInvalid):
        letters.verify_mcid(Mcid(1, CODEC_MANIFEST, other.digest))


def test_created_and_version_not_covered(letters: Manifest) -> None:
    later = dataclasses.replace(letters, created=CREATED + 1)
    later.verify()
    assert later.compute_mcid() == letters.mcid


def test_name_as_bytes_accepted(letters: Manifest) -> None:
    wire = letters.to_wire()
    wire["name"] = b"letters.txt"
    parsed = Manifest.from_wire(wire)
    assert parsed.name == "letters.txt"
    assert parsed == letters
    parsed.verify()
    assert parsed.to_wire()["name"] == "letters.txt"


def test_name_bytes_not_utf8(letters: Manifest) -> None:
    wire = letters.to_wire()
    wire["name"] = b"\xff\xfe"
    with pytest.raises(ProtocolError) as info:
        Manifest.from_wire(wire)
    assert info.value.reason == "manifest_name_not_utf8"


def test_unknown_hash_algorithm_read_as_blake3(letters: Manifest) -> None:
    wire = letters.to_wire()
    wire["hash_algorithm"] = "blake2b"
    parsed = Manifest.from_wire(wire)
    assert parsed.hash_algorithm == "blake3"
    parsed.verify()  # the canonical map then names blake3, so this MCID still matches


def test_unknown_keys_ignored(letters: Manifest) -> None:
    wire = letters.to_wire()
    wire["extra"] = [1, 2, 3]
    assert Manifest.from_wire(wire) == letters


def _reason(wire: dict[str, Any]) -> str:
    with pytest.raises(ProtocolError) as info:
        Manifest.from_wire(wire)
    return info.value.reason


def test_chunk_count_mismatch(letters: Manifest) -> None:
    wire = letters.to_wire()
    wire["chunk_count"] = 4
    with pytest.raises(ContentInvalid) as info:
        Manifest.from_wire(wire)
    assert info.value.reason == "chunk_count_mismatch"


def test_non_contiguous_offsets_rejected(letters: Manifest) -> None:
    wire = letters.to_wire()
    chunks: list[dict[str, Any]] = wire["chunks"]  # type: ignore[assignment]
    chunks[2]["offset"] = 9
    with pytest.raises(ContentInvalid) as info:
        Manifest.from_wire(wire)
    assert info.value.reason == "chunk_offsets_not_contiguous"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda w: w["chunks"].reverse(), "chunk_index_out_of_order"),
        (lambda w: w["chunks"][1].update(index=2), "chunk_index_out_of_order"),
        (lambda w: w.update(size=18), "chunk_sizes_mismatch"),
        (lambda w: w["chunks"][4].update(size=2), "chunk_sizes_mismatch"),
        (lambda w: w["chunks"][4].update(size=5), "bad_chunk_length"),
        (lambda w: w["chunks"][3].update(size=3), "bad_chunk_length"),
        (lambda w: w.update(chunk_size=0), "bad_chunk_size"),
        (lambda w: w.update(version=2), "unsupported_manifest_version"),
        (lambda w: w.update(mcid=_GOOD_MCID), "mcid_not_manifest"),
    ],
)
def test_inconsistent_manifest_rejected(letters: Manifest, change: Any, reason: str) -> None:
    wire = json_copy(letters.to_wire())
    change(wire)
    with pytest.raises(ContentInvalid) as info:
        Manifest.from_wire(wire)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("mcid", _GOOD_MCID[:20], "bad_mcid_length"),
        ("mcid", "not bytes", "bad_mcid_type"),
        ("size", -1, "manifest_field_type"),
        ("size", "17", "manifest_field_type"),
        ("created", 1.5, "manifest_field_type"),
        ("chunk_count", None, "manifest_field_type"),
        ("name", 7, "manifest_field_type"),
        ("hash_algorithm", b"blake3", "manifest_field_type"),
        ("root_hash", bytes(31), "manifest_field_type"),
        ("root_hash", "00" * 32, "manifest_field_type"),
        ("chunks", {}, "manifest_field_type"),
        ("chunks", ["x"], "manifest_field_type"),
    ],
)
def test_bad_field_type(letters: Manifest, field: str, value: object, reason: str) -> None:
    wire = letters.to_wire()
    wire[field] = value
    assert _reason(wire) == reason


@pytest.mark.parametrize("field", list(Manifest.__dataclass_fields__))
def test_missing_field(letters: Manifest, field: str) -> None:
    wire = letters.to_wire()
    del wire[field]
    assert _reason(wire) == "manifest_field_missing"


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("hash", bytes(33), "bad_chunk_hash"),
        ("hash", None, "bad_chunk_hash"),
        ("index", -1, "manifest_field_type"),
        ("offset", "0", "manifest_field_type"),
    ],
)
def test_bad_chunk_info(letters: Manifest, key: str, value: object, reason: str) -> None:
    wire = json_copy(letters.to_wire())
    wire["chunks"][0][key] = value
    assert _reason(wire) == reason
    del wire["chunks"][0][key]
    assert _reason(wire) == "manifest_field_missing"


def test_manifest_not_a_map() -> None:
    values: list[object] = [None, [], b"", "manifest"]
    for value in values:
        with pytest.raises(ProtocolError) as info:
            Manifest.from_wire(value)
        assert info.value.reason == "manifest_not_map"


def test_direct_construction_is_checked(letters: Manifest) -> None:
    with pytest.raises(LocalProtocolError):
        dataclasses.replace(letters, chunk_count=3)
    with pytest.raises(LocalProtocolError):
        ChunkInfo(0, 0, 4, bytes(31))
    with pytest.raises(LocalProtocolError):
        Manifest.create(b"x", created=-1)


def test_merkle_small_cases() -> None:
    a, b, c = digest(b"a"), digest(b"b"), digest(b"c")
    assert merkle_root([]) == digest(b"")
    assert merkle_levels([]) == [[]]
    assert merkle_root([a]) == a
    assert merkle_root([a, b]) == digest(a + b)
    assert merkle_root([a, b, c]) == digest(digest(a + b) + digest(c + c))


def json_copy(wire: dict[str, object]) -> dict[str, Any]:
    """Deep copy of a wire map through CBOR (so tests can mutate nested chunk maps)."""
    copied: dict[str, Any] = cbor.decode(cbor.encode(wire))
    return copied


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=2048),
    chunk_size=st.integers(min_value=1, max_value=64),
    algorithm=st.sampled_from(["blake3", "sha256"]),
    name=st.text(max_size=20),
    created=st.integers(min_value=0, max_value=2**40),
)
def test_plan_assemble_round_trip(
    data: bytes, chunk_size: int, algorithm: Any, name: str, created: int
) -> None:
    plan = plan_put(data, name, created=created, chunk_size=chunk_size, algorithm=algorithm)
    for mcid, block in plan.blocks:
        verify_block(mcid, block, algorithm)
    if plan.manifest is None:
        assert len(data) <= chunk_size
        assert plan.mcid == raw_mcid(data, algorithm)
        assert bytes(plan.blocks[0][1]) == data
        return
    m = plan.manifest
    assert plan.mcid == m.mcid
    assert m.chunk_count == len(plan.blocks) == -(-len(data) // chunk_size)
    m.verify_mcid(plan.mcid)
    m.verify()
    received = Manifest.from_wire(cbor.decode(cbor.encode(m.to_wire())))
    assert received == m
    received.verify(plan.mcid)
    assert assemble(received, [bytes(block) for _, block in plan.blocks]) == data


_cbor_scalars = (
    st.none()
    | st.integers(min_value=-(2**64), max_value=2**64 - 1)
    | st.binary(max_size=40)
    | st.text(max_size=10)
)
_cbor_values = st.recursive(
    _cbor_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(
    base=st.sampled_from([0, 1]),
    edits=st.dictionaries(
        st.sampled_from(
            [
                "mcid",
                "version",
                "name",
                "size",
                "created",
                "chunk_size",
                "chunk_count",
                "hash_algorithm",
                "root_hash",
                "chunks",
            ]
        ),
        _cbor_values,
        max_size=3,
    ),
)
def test_from_wire_only_raises_protocol_error(base: int, edits: dict[str, Any]) -> None:
    vector = MANIFESTS[1 + base]  # the two small manifests
    wire = _value(vector["manifest_wire"])
    wire.update(edits)
    with contextlib.suppress(ProtocolError):
        Manifest.from_wire(wire)
