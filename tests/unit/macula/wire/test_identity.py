"""Identity (PROTOCOL.md §12, §4.1): vectors, puzzle, key files on disk, realm tags, codes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from macula.keyfile import KeyFileError, load_identity, load_or_create_identity, save_identity
from macula.wire import codes
from macula.wire.errors import LocalProtocolError, ProtocolError
from macula.wire.identity import (
    DOMAIN_EVENT_PUB,
    DOMAIN_FRAME,
    DOMAIN_RECORD,
    DOMAIN_SWIM_UPDATE,
    ZERO_REALM,
    Identity,
    leading_zero_bits,
    puzzle_valid,
    realm_tag,
    verify,
)
from support.vectorkit import load_vectors

IDENTITY = load_vectors("identity")


@pytest.mark.parametrize("vec", IDENTITY["identities"], ids=lambda v: v["name"])
def test_identity_vector(vec: dict[str, Any]) -> None:
    identity = Identity(bytes.fromhex(vec["seed_hex"]))
    assert identity.node_id.hex() == vec["public_key_hex"] == vec["node_id_hex"]
    assert identity.puzzle_evidence.hex() == vec["puzzle_evidence_hex"]
    assert leading_zero_bits(identity.puzzle_evidence) == vec["leading_zero_bits"]
    assert identity.has_valid_puzzle() is vec["puzzle_valid_difficulty_8"]
    if "ed25519_signature_over_ascii_macula_hex" in vec:
        signature = identity.sign(b"macula")
        assert signature.hex() == vec["ed25519_signature_over_ascii_macula_hex"]
        assert verify(identity.node_id, b"macula", signature)
        assert not verify(identity.node_id, b"macul4", signature)


def test_key_file_vector_both_ways() -> None:
    key_file = IDENTITY["key_file"]
    identity = Identity(bytes.fromhex(key_file["seed_hex"]))
    assert identity.to_key_file().hex() == key_file["file_hex"]
    assert Identity.from_key_file(bytes.fromhex(key_file["file_hex"])).seed == identity.seed


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:-1],
        lambda b: b + b"\0",
        lambda b: b"macula-v1-key\0" + b[14:],
        lambda b: b[:14] + bytes([b[14] ^ 1]) + b[15:],  # public key does not match the seed
    ],
)
def test_malformed_key_file_is_refused(mutate: Any) -> None:
    good = bytes.fromhex(IDENTITY["key_file"]["file_hex"])
    with pytest.raises(ProtocolError, match="bad_key_file"):
        Identity.from_key_file(mutate(good))


@pytest.mark.parametrize("vec", IDENTITY["realm_tags"], ids=lambda v: v["realm_name"] or "empty")
def test_realm_tag_vector(vec: dict[str, Any]) -> None:
    assert realm_tag(vec["realm_name"]).hex() == vec["realm_tag_hex"]


def test_zero_realm_and_domains() -> None:
    assert ZERO_REALM.hex() == IDENTITY["special_realms"]["zero_realm_hex"]
    assert DOMAIN_FRAME.hex() == "6d6163756c612d76322d6672616d6500"
    assert DOMAIN_EVENT_PUB.hex() == "6d6163756c612d76322d6576656e742d70756200"
    assert DOMAIN_RECORD.hex() == "6d6163756c612d76322d7265636f726400"
    assert DOMAIN_SWIM_UPDATE.hex().endswith("7377696d2d75706461746500")


def test_grinding_reaches_difficulty_eight_and_uses_the_given_randomness() -> None:
    identity = Identity.generate(os.urandom)
    assert identity.has_valid_puzzle(8)
    assert identity.puzzle_evidence[0] == 0
    seeds = iter([i.to_bytes(32, "big") for i in range(1, 5000)])
    first = Identity.generate(lambda n: next(seeds), difficulty=8)
    seeds = iter([i.to_bytes(32, "big") for i in range(1, 5000)])
    assert Identity.generate(lambda n: next(seeds), difficulty=8).seed == first.seed
    with pytest.raises(LocalProtocolError, match="puzzle_not_found"):
        Identity.generate(lambda n: b"\1" * 32, difficulty=64, max_attempts=5)


def test_puzzle_is_computed_from_the_node_id() -> None:
    hardened = next(v for v in IDENTITY["identities"] if v["puzzle_valid_difficulty_8"])
    assert puzzle_valid(bytes.fromhex(hardened["node_id_hex"]), 8)
    assert puzzle_valid(bytes.fromhex(hardened["node_id_hex"]), hardened["leading_zero_bits"])
    assert not puzzle_valid(bytes.fromhex(hardened["node_id_hex"]), 11)


def test_bad_seed_and_bad_signatures() -> None:
    with pytest.raises(LocalProtocolError):
        Identity(b"\0" * 31)
    identity = Identity(b"\7" * 32)
    signature = identity.sign(b"m")
    assert not verify(identity.node_id, b"m", signature[:63])
    assert not verify(identity.node_id, b"m", "text")
    assert not verify(identity.node_id[:31], b"m", signature)
    assert "seed" not in repr(identity) and identity.seed.hex() not in repr(identity)


def test_key_file_on_disk_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    path = tmp_path / "home" / "keys" / "agent.key"
    identity = Identity.generate(os.urandom)
    save_identity(path, identity)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_identity(path).node_id == identity.node_id
    assert [p.name for p in path.parent.iterdir()] == ["agent.key"]  # no temporary left


def test_load_or_create_keeps_one_identity(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    first = load_or_create_identity(path)
    assert first.has_valid_puzzle()
    assert load_or_create_identity(path).node_id == first.node_id
    with pytest.raises(FileExistsError):
        save_identity(path, Identity(b"\1" * 32), exclusive=True)
    assert load_identity(path).node_id == first.node_id


def test_loose_permissions_and_garbage_are_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "agent.key"
    identity = Identity(b"\3" * 32)
    save_identity(path, identity)
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_identity(path)
    os.chmod(path, 0o600)
    path.write_bytes(b"not a key")
    with pytest.raises(KeyFileError, match="not a Macula v2 key file") as info:
        load_or_create_identity(path)  # never silently replaced
    assert identity.seed.hex() not in str(info.value)
    with pytest.raises(KeyFileError, match="does not exist"):
        load_identity(tmp_path / "missing.key")


@pytest.mark.parametrize(
    ("code", "name", "retryable"),
    [
        (0x00, "ok", False),
        (0x01, "unknown_next_peer", True),
        (0x02, "temporary_relay_failure", True),
        (0x03, "relay_disabled", True),
        (0x04, "node_not_found_at_target_relay", True),
        (0x05, "target_realm_refused", False),
        (0x06, "loop_detected", True),
        (0x07, "expiry_too_soon", True),
        (0x08, "upstream_congestion", True),
        (0x09, "invalid_path_header", True),
        (0x0A, "crypto_puzzle_invalid", False),
        (0x0B, "realm_not_authoritative_here", True),
        (0x0C, "tombstoned", False),
        (0x0D, "payload_too_large", False),
        (0x0E, "signature_invalid", False),
        (0x0F, "unknown_error", True),
        (0x10, "unauthorized", False),
    ],
)
def test_error_codes_of_section_9(code: int, name: str, retryable: bool) -> None:
    assert codes.code_name(code) == name
    assert codes.ErrorCode(code).wire_name == name
    assert codes.is_retryable(code) is retryable


def test_unassigned_codes_still_have_a_name() -> None:
    assert codes.code_name(0x42) == "unknown_code_66"
    assert codes.code_advice(0x42) is codes.RetryAdvice.RETRY_WITH_CAUTION
