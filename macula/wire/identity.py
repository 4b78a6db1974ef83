"""Identity of Macula wire v2 (PROTOCOL.md §12, §4.1): Ed25519 keys, node ids, puzzle, realms.

- node_id = the raw 32-byte Ed25519 public key; the secret is the 32-byte seed.
- Every signed message is ``domain || canonical CBOR`` (§4.1); the domains live here.
- Puzzle (§12.2): evidence = SHA-256(node_id); valid at difficulty d when its first d bits are 0.
  Grinding takes a seed source as a parameter: no hidden randomness.
- Key file (§12.1): ``b"macula-v2-key\\0" || public (32) || seed (32)`` = 78 bytes. Only the
  byte format lives here; writing the file (0600, atomic, 0700 directory) is ``macula.keyfile``.
- Realm tag: SHA-256(UTF-8 name); the zero realm is reserved for protocol-internal traffic.
No I/O, no clock, no hidden randomness.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final

import nacl.bindings
import nacl.exceptions
import nacl.signing

from macula.wire.errors import LocalProtocolError, ProtocolError

DOMAIN_FRAME: Final = b"macula-v2-frame\x00"
DOMAIN_EVENT_PUB: Final = b"macula-v2-event-pub\x00"
DOMAIN_RECORD: Final = b"macula-v2-record\x00"
DOMAIN_SWIM_UPDATE: Final = b"macula-v2-swim-update\x00"

KEY_FILE_MAGIC: Final = b"macula-v2-key\x00"
KEY_FILE_SIZE: Final = len(KEY_FILE_MAGIC) + 64
DEFAULT_PUZZLE_DIFFICULTY: Final = 8
ZERO_REALM: Final = bytes(32)


class Identity:
    """One Ed25519 key pair. ``repr`` never shows the seed."""

    __slots__ = ("_secret", "_signing_key", "node_id")

    def __init__(self, seed: bytes) -> None:
        if type(seed) is not bytes or len(seed) != 32:
            raise LocalProtocolError("bad_seed", "an Ed25519 seed is exactly 32 bytes")
        self._signing_key = nacl.signing.SigningKey(seed)
        self.node_id: bytes = bytes(self._signing_key.verify_key)
        # libsodium's 64-byte secret key (seed || public): ``sign`` calls the binding directly,
        # without building a ``SignedMessage`` per signature
        self._secret: bytes = nacl.bindings.crypto_sign_seed_keypair(seed)[1]

    @property
    def seed(self) -> bytes:
        return bytes(self._signing_key)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (64 bytes) of ``message`` (callers prepend the domain)."""
        return nacl.bindings.crypto_sign(message, self._secret)[:64]

    @property
    def puzzle_evidence(self) -> bytes:
        return puzzle_evidence(self.node_id)

    def has_valid_puzzle(self, difficulty: int = DEFAULT_PUZZLE_DIFFICULTY) -> bool:
        return puzzle_valid(self.node_id, difficulty)

    def to_key_file(self) -> bytes:
        return KEY_FILE_MAGIC + self.node_id + self.seed

    @classmethod
    def from_key_file(cls, data: bytes) -> Identity:
        """Parse the 78-byte key file; the stored public key must match the seed."""
        if len(data) != KEY_FILE_SIZE or not data.startswith(KEY_FILE_MAGIC):
            raise ProtocolError(
                "bad_key_file",
                f"a key file is {KEY_FILE_SIZE} bytes starting with 'macula-v2-key\\0'",
            )
        public = data[len(KEY_FILE_MAGIC) : len(KEY_FILE_MAGIC) + 32]
        identity = cls(bytes(data[len(KEY_FILE_MAGIC) + 32 :]))
        if identity.node_id != public:
            raise ProtocolError("bad_key_file", "the public key does not match the seed")
        return identity

    @classmethod
    def generate(
        cls,
        random_bytes: Callable[[int], bytes],
        *,
        difficulty: int = DEFAULT_PUZZLE_DIFFICULTY,
        max_attempts: int = 1_000_000,
    ) -> Identity:
        """Grind seeds from ``random_bytes`` until the puzzle holds at ``difficulty``."""
        if not 0 <= difficulty <= 256:
            raise LocalProtocolError("bad_difficulty", "difficulty is 0..256 bits")
        for _ in range(max_attempts):
            identity = cls(random_bytes(32))
            if puzzle_valid(identity.node_id, difficulty):
                return identity
        raise LocalProtocolError(
            "puzzle_not_found", f"no seed met difficulty {difficulty} in {max_attempts} attempts"
        )

    def __repr__(self) -> str:
        return f"Identity(node_id={self.node_id.hex()})"


def uuid7(now_ms: int, random10: bytes) -> bytes:
    """UUIDv7 (§12.3), the layout of ``frame_id`` and record ``version``: 48-bit Unix ms,
    version 0111, 12 random bits, variant 10, 62 random bits (from ``random10``)."""
    if type(now_ms) is not int or not 0 <= now_ms < 1 << 48:
        raise LocalProtocolError("bad_argument", "now_ms must be an int in 0..2^48-1")
    if type(random10) is not bytes or len(random10) != 10:
        raise LocalProtocolError("bad_argument", "a UUIDv7 needs exactly 10 random bytes")
    r = random10
    return (
        now_ms.to_bytes(6, "big")
        + bytes((0x70 | (r[0] & 0x0F), r[1], 0x80 | (r[2] & 0x3F)))
        + r[3:]
    )


def verify(public_key: bytes, message: bytes, signature: object) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Never raises for malformed input: a wrong-length key or signature is simply not valid.
    """
    if type(signature) is not bytes or len(signature) != 64:
        return False
    if type(public_key) is not bytes or len(public_key) != 32:
        return False
    try:  # what ``VerifyKey(public_key).verify`` does, without building the key object
        nacl.bindings.crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.CryptoError, ValueError):
        return False
    return True


def puzzle_evidence(node_id: bytes) -> bytes:
    return hashlib.sha256(node_id).digest()


def leading_zero_bits(data: bytes) -> int:
    value = int.from_bytes(data, "big")
    return len(data) * 8 - value.bit_length()


def puzzle_valid(node_id: bytes, difficulty: int = DEFAULT_PUZZLE_DIFFICULTY) -> bool:
    """S/Kademlia puzzle of §12.2, computed from the node id itself (never from a claim)."""
    return leading_zero_bits(puzzle_evidence(node_id)) >= difficulty


def realm_tag(name: str) -> bytes:
    """Realm tag from a name: SHA-256 of its UTF-8 bytes (the Erlang SDK's rule)."""
    return hashlib.sha256(name.encode("utf-8")).digest()
