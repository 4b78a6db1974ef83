"""A person at the console: how a room message says "a person wrote this, not the model".

A home has one *person identity* (an Ed25519 key of its own, never an agent's and never reachable
through a tool). A message a person writes from the console travels as an ordinary envelope of
the agent whose room it is (published on that agent's connection, sealed in a private room),
with one extra entry in ``refs``::

    "macula-person:" + base64url(person_node_id(32) || person_sig(64) || endorsement(64))

- ``endorsement``: the *agent* (the envelope's ``from``) signs
  ``ENDORSEMENT_TAG || person_node_id``: "this key is the person behind me";
- ``person_sig``: the *person* signs ``MESSAGE_TAG || message_id 0 room_topic 0 from 0 kind 0
  sha256(text)``, binding this very message (a copied ref does not verify on another one).

Invariants:
- ``from_person`` is 1 only for an attested envelope (its publisher is its ``from``) carrying
  exactly one such ref whose two signatures verify; otherwise 0. It never raises.
- The tags are distinct from every other signed string in macula (domain separation), so no
  other signature an agent or person makes can be replayed as one of these.
- No tool signs arbitrary bytes with an agent's key, and the person key lives only under
  ``MACULA_HOME`` (read by the daemon's console): a model acting through its mesh tools can
  produce neither signature. The envelope schema is unchanged (a ref is an ordinary string), so
  readers that do not know the mark see an ordinary message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from typing import Final

from macula.wire.identity import Identity, verify

REF_PREFIX: Final = "macula-person:"
ENDORSEMENT_TAG: Final = b"macula-person-endorsement-v1\x00"
MESSAGE_TAG: Final = b"macula-person-message-v1\x00"
_RAW_LEN: Final = 32 + 64 + 64


def endorse(agent: Identity, person_node_id: bytes) -> bytes:
    """The agent's signature saying ``person_node_id`` is the person behind it."""
    return agent.sign(ENDORSEMENT_TAG + person_node_id)


def _message_bytes(
    message_id: str, room_topic: str, sender_hex: str, kind: str, text: str
) -> bytes:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    head = "\x00".join((message_id, room_topic, sender_hex, kind)).encode("utf-8")
    return MESSAGE_TAG + head + b"\x00" + digest


def person_ref(
    person: Identity,
    endorsement: bytes,
    *,
    message_id: str,
    room_topic: str,
    sender_hex: str,
    kind: str,
    text: str,
) -> str:
    """The ref that marks this one message as written by ``person`` (endorsed by the sender)."""
    signature = person.sign(_message_bytes(message_id, room_topic, sender_hex, kind, text))
    raw = person.node_id + signature + endorsement
    return REF_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode(ref: str) -> tuple[bytes, bytes, bytes] | None:
    body = ref[len(REF_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != _RAW_LEN:
        return None
    return raw[:32], raw[32:96], raw[96:]


def person_of(
    *,
    attested: int,
    sender_hex: object,
    message_id: object,
    room_topic: object,
    kind: object,
    text: object,
    refs: Sequence[object] | None,
) -> bytes | None:
    """The person's node id when this message verifiably came from the sender's person."""
    if not attested or not refs:
        return None
    fields = (sender_hex, message_id, room_topic, kind, text)
    if not all(isinstance(value, str) for value in fields):
        return None
    marks = [r for r in refs if isinstance(r, str) and r.startswith(REF_PREFIX)]
    if len(marks) != 1:
        return None
    decoded = _decode(marks[0])
    if decoded is None:
        return None
    person, signature, endorsement = decoded
    try:
        agent = bytes.fromhex(str(sender_hex))
    except ValueError:
        return None
    if not verify(agent, ENDORSEMENT_TAG + person, endorsement):
        return None
    signed = _message_bytes(str(message_id), str(room_topic), str(sender_hex), str(kind), str(text))
    return person if verify(person, signed, signature) else None


def from_person(
    *,
    attested: int,
    sender_hex: object,
    message_id: object,
    room_topic: object,
    kind: object,
    text: object,
    refs: Sequence[object] | None,
) -> int:
    """1 when the message verifiably came from a person at the sender's console, else 0."""
    found = person_of(
        attested=attested,
        sender_hex=sender_hex,
        message_id=message_id,
        room_topic=room_topic,
        kind=kind,
        text=text,
        refs=refs,
    )
    return int(found is not None)
