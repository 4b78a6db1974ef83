"""Private rooms' cryptography: room topics bound to their opener, sealed room keys, sealed bodies.

- A private room's topic is ``agents.room.<hex(BLAKE2b-128(domain || opener || salt))>``: whoever
  shows the 16-byte ``salt`` proves which node opened it, so a key envelope for that topic from
  anyone but its opener is refused without any prior knowledge of the room.
- A room key is 32 random bytes, numbered by ``epoch`` (1, 2, ...) and named by ``key_id``
  (BLAKE2b-64 of the key, so a sealed key that opens to another key is caught). It is sealed to
  each participant, opener included, with a NaCl sealed box to the X25519 key derived from the
  participant's Ed25519 node id (``crypto_sign_ed25519_pk_to_curve25519``).
- A ``key_distributed`` envelope carries ``room_key = {epoch, key_id, salt, sealed, signature}``;
  the signature is the opener's Ed25519 over ``DOMAIN_ROOM_KEY || canonical JSON`` of the whole
  envelope without the signature, so it verifies on any path (topic, RPC, the station's history).
- A sealed envelope keeps ``message_id, room_topic, sent_at, from, kind`` in the clear, ``text``
  empty, and ``cipher = {epoch, key_id, box}``; ``box`` is base64 of nonce (24) || secretbox of
  canonical JSON of the sealable fields plus the clear ones and the epoch, which ``open_body``
  checks against the outside (a body cannot be moved to another envelope or epoch).
  Messages are not signed here: their event's ``publisher_sig`` covers the sealed form.
- Nothing raises on bad input from outside: checks return problems, openers return None or raise
  ``RoomCryptoError`` with a short reason. Keys never appear in a repr or a message.
No I/O and no clock; randomness comes in as bytes, except the sealed boxes' ephemeral keys
(libsodium draws them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import nacl.exceptions
import nacl.public
import nacl.secret
import nacl.signing
from nacl.bindings import crypto_sign_ed25519_pk_to_curve25519

from macula.agent.envelope import (
    KEY_KIND,
    ROOM_TOPIC_PREFIX,
    SEALABLE,
    build_envelope,
    is_node_hex,
    validate,
)
from macula.errors import MaculaError
from macula.wire.identity import Identity, verify

DOMAIN_ROOM_TOPIC: Final = b"macula-private-room\x00"
DOMAIN_ROOM_KEY: Final = b"macula-room-key\x00"
DOMAIN_KEY_ID: Final = b"macula-room-key-id\x00"
KEY_BYTES: Final = 32
SALT_BYTES: Final = 16
NONCE_BYTES: Final = nacl.secret.SecretBox.NONCE_SIZE
CLEAR: Final = ("message_id", "room_topic", "sent_at", "from", "kind")


class RoomCryptoError(MaculaError, ValueError):
    """A sealed body or key that cannot be used; the message is a short reason, never a key."""


@dataclass(frozen=True, slots=True)
class RoomKey:
    """One epoch's key of one room; ``recipients`` are the 64-hex node ids it was sealed to."""

    room_topic: str
    epoch: int
    key_id: str
    recipients: tuple[str, ...]
    key: bytes = field(repr=False)


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def private_room_topic(opener: bytes, salt: bytes) -> str:
    if len(opener) != 32 or len(salt) != SALT_BYTES:
        raise ValueError("a private room topic needs a 32-byte node id and a 16-byte salt")
    digest = hashlib.blake2b(DOMAIN_ROOM_TOPIC + opener + salt, digest_size=16).hexdigest()
    return ROOM_TOPIC_PREFIX + digest


def key_id_of(key: bytes) -> str:
    return hashlib.blake2b(DOMAIN_KEY_ID + key, digest_size=8).hexdigest()


def x25519_public(node_id: bytes) -> nacl.public.PublicKey:
    """The X25519 key of an Ed25519 node id; ``RoomCryptoError`` when it is not a valid point."""
    try:
        return nacl.public.PublicKey(crypto_sign_ed25519_pk_to_curve25519(node_id))
    except (nacl.exceptions.CryptoError, nacl.exceptions.RuntimeError, TypeError) as exc:
        raise RoomCryptoError("that node id is not an Ed25519 public key") from exc


def x25519_private(identity: Identity) -> nacl.public.PrivateKey:
    return nacl.signing.SigningKey(identity.seed).to_curve25519_private_key()


def seal_key(key: bytes, recipient: bytes) -> str:
    return base64.b64encode(nacl.public.SealedBox(x25519_public(recipient)).encrypt(key)).decode()


def open_sealed_key(sealed: str, identity: Identity) -> bytes | None:
    """The key sealed to ``identity``, or None when it does not open."""
    raw = _b64(sealed)
    if raw is None:
        return None
    try:
        key = nacl.public.SealedBox(x25519_private(identity)).decrypt(raw)
    except nacl.exceptions.CryptoError:
        return None
    return key if len(key) == KEY_BYTES else None


# -- key envelopes ------------------------------------------------------------------------------


def build_key_envelope(
    identity: Identity,
    *,
    message_id: str,
    salt: bytes,
    epoch: int,
    key: bytes,
    recipients: Sequence[bytes],
    sent_at: int,
) -> dict[str, Any]:
    """The signed ``key_distributed`` envelope of ``key`` (epoch ``epoch``) for ``recipients``
    (the opener, ``identity``, is always among them)."""
    if len(key) != KEY_BYTES:
        raise ValueError("a room key is 32 bytes")
    everyone = dict.fromkeys([identity.node_id, *recipients])
    envelope: dict[str, Any] = dict(
        build_envelope(
            message_id=message_id,
            room_topic=private_room_topic(identity.node_id, salt),
            sender=identity.node_id,
            kind="room_opened",  # replaced below; build_envelope checks the common fields
            text="",
            sent_at=sent_at,
        )
    )
    envelope["kind"] = KEY_KIND
    envelope["room_key"] = {
        "epoch": epoch,
        "key_id": key_id_of(key),
        "salt": salt.hex(),
        "sealed": {node.hex(): seal_key(key, node) for node in everyone},
        "signature": "0" * 128,
    }
    envelope["room_key"]["signature"] = identity.sign(_key_signed_bytes(envelope)).hex()
    problems = validate(envelope)
    if problems:
        raise RoomCryptoError("; ".join(problems))
    return envelope


def _key_signed_bytes(envelope: Mapping[str, Any]) -> bytes:
    unsigned = dict(envelope)
    unsigned["room_key"] = {k: v for k, v in envelope["room_key"].items() if k != "signature"}
    return DOMAIN_ROOM_KEY + canonical(unsigned)


def key_envelope_problems(envelope: object, attested_sender: bytes | None) -> list[str]:
    """Every reason to refuse a key envelope: shape, a sender other than the attested one, a
    topic not opened by its ``from``, a bad signature. Empty means: signed by the room's opener."""
    problems = validate(envelope)
    if problems:
        return problems
    assert isinstance(envelope, dict)
    if envelope["kind"] != KEY_KIND:
        return [f"kind: expected {KEY_KIND}"]
    sender = bytes.fromhex(envelope["from"])
    if attested_sender is not None and attested_sender != sender:
        return ["from: not the attested sender of this key envelope"]
    room_key = envelope["room_key"]
    topic = private_room_topic(sender, bytes.fromhex(room_key["salt"]))
    if topic != envelope["room_topic"]:
        return ["room_key: the sender did not open this room (topic and salt disagree)"]
    if not verify(sender, _key_signed_bytes(envelope), bytes.fromhex(room_key["signature"])):
        return ["room_key.signature: does not verify"]
    return []


def open_key_envelope(envelope: Mapping[str, Any], identity: Identity) -> RoomKey | None:
    """Our key from a key envelope already checked by ``key_envelope_problems``; None when it is
    not sealed to us. ``RoomCryptoError`` when our sealed key opens to a key of another id."""
    room_key = envelope["room_key"]
    sealed = room_key["sealed"].get(identity.node_id.hex())
    if sealed is None:
        return None
    key = open_sealed_key(sealed, identity)
    if key is None:
        raise RoomCryptoError("the key sealed to us does not open")
    if key_id_of(key) != room_key["key_id"]:
        raise RoomCryptoError("the key sealed to us is not the key named by key_id")
    recipients = tuple(sorted(room_key["sealed"]))
    return RoomKey(envelope["room_topic"], room_key["epoch"], room_key["key_id"], recipients, key)


def recipients_of(envelope: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(node for node in envelope["room_key"]["sealed"] if is_node_hex(node)))


# -- sealed bodies ------------------------------------------------------------------------------


def seal_body(envelope: Mapping[str, Any], key: RoomKey, nonce: bytes) -> dict[str, Any]:
    """The sealed form of a valid plaintext envelope of ``key``'s room."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a secretbox nonce is {NONCE_BYTES} bytes")
    if envelope.get("room_topic") != key.room_topic or validate(envelope):
        raise RoomCryptoError("only a valid envelope of this very room can be sealed")
    inner = {k: envelope[k] for k in (*CLEAR, *SEALABLE) if k in envelope} | {"epoch": key.epoch}
    box = nacl.secret.SecretBox(key.key).encrypt(canonical(inner), nonce)
    sealed = {k: envelope[k] for k in CLEAR} | {"text": ""}
    sealed["cipher"] = {
        "epoch": key.epoch,
        "key_id": key.key_id,
        "box": base64.b64encode(bytes(box)).decode(),
    }
    return sealed


def open_body(envelope: Mapping[str, Any], key: RoomKey) -> dict[str, Any]:
    """The plaintext envelope of a valid sealed one, or ``RoomCryptoError``: ``wrong key``
    (another epoch or key id), ``tampered`` (the box does not open), ``mismatch`` (the body
    belongs to another envelope), ``invalid`` (what it holds is not a valid envelope)."""
    cipher = envelope["cipher"]
    if cipher["epoch"] != key.epoch or cipher["key_id"] != key.key_id:
        raise RoomCryptoError("wrong key")
    raw = _b64(cipher["box"])
    if raw is None or len(raw) <= NONCE_BYTES:
        raise RoomCryptoError("tampered")
    try:
        plain = nacl.secret.SecretBox(key.key).decrypt(raw[NONCE_BYTES:], raw[:NONCE_BYTES])
        inner = json.loads(plain)
    except (nacl.exceptions.CryptoError, ValueError) as exc:
        raise RoomCryptoError("tampered") from exc
    if not isinstance(inner, dict) or inner.get("epoch") != key.epoch:
        raise RoomCryptoError("mismatch")
    if any(inner.get(k) != envelope[k] for k in CLEAR):
        raise RoomCryptoError("mismatch")
    opened = {k: envelope[k] for k in CLEAR} | {
        k: inner[k] for k in SEALABLE if k in inner and k != "epoch"
    }
    if validate(opened) or set(inner) - {*CLEAR, *SEALABLE, "epoch"}:
        raise RoomCryptoError("invalid")
    return opened


def _b64(text: object) -> bytes | None:
    if type(text) is not str:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
