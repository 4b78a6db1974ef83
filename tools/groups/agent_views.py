"""How the agent layer's typed results look to a model: shared by the agent tool groups.

Invariants (the wire rule for what agents see):
- no booleans: flags are the ints 0/1; ``from_person`` 1 marks what a person wrote at the
  console (verified, never a claim); node ids are 64 lowercase hex; every node id shown to a
  model comes with its petname (a label, never a proof) under a ``*_petname`` key;
- the keys and values are the tools' contract with the model: change them only on purpose.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from macula.agent.envelope import is_node_hex
from macula.agent.person import from_person
from macula.agent.petnames import petname
from macula.store.rings import Ring
from macula.store.transcript import TranscriptMessage


def label(node_hex: object) -> str | None:
    """The petname of a 64-hex node id, or None if it is not one."""
    if not isinstance(node_hex, str) or not is_node_hex(node_hex):
        return None
    return petname(bytes.fromhex(node_hex))


def person_mark(message: dict[str, Any]) -> int:
    """``from_person`` of a message dict (envelope keys plus ``attested``): 1 only when a person
    at the sender's console verifiably wrote it (``macula.agent.person``)."""
    refs = message.get("refs")
    return from_person(
        attested=int(message.get("attested") or 0),
        sender_hex=message.get("from"),
        message_id=message.get("message_id"),
        room_topic=message.get("room_topic"),
        kind=message.get("kind"),
        text=message.get("text"),
        refs=refs if isinstance(refs, list) else None,
    )


def with_petname(message: dict[str, Any]) -> dict[str, Any]:
    """A message dict with ``from_petname`` and ``from_person`` added."""
    return message | {
        "from_petname": label(message.get("from")),
        "from_person": person_mark(message),
    }


def message_view(message: TranscriptMessage) -> dict[str, Any]:
    """A recorded message as a room wait, a reply or a help broadcast shows it."""
    return {
        "room_topic": message.room_topic,
        "message_id": message.message_id,
        "from": message.from_hex,
        "kind": message.kind,
        "text": message.text,
        "in_reply_to": message.in_reply_to,
        "refs": list(message.refs) if message.refs else None,
        "sent_at": message.sent_at,
        "attested": message.attested,
        "from_petname": label(message.from_hex),
        "from_person": from_person(
            attested=message.attested,
            sender_hex=message.from_hex,
            message_id=message.message_id,
            room_topic=message.room_topic,
            kind=message.kind,
            text=message.text,
            refs=list(message.refs) if message.refs else None,
        ),
    }


def optional_message_view(message: TranscriptMessage | None) -> dict[str, Any] | None:
    return None if message is None else message_view(message)


def ring_view(ring: Ring) -> dict[str, Any]:
    """A stored ring (pending or recent), ``peer`` as hex."""
    view = dataclasses.asdict(ring)
    view["peer"] = ring.peer.hex()
    return view
