"""Rooms over a real transcript and a stand-in node, for the unread, wait and inbox tests: a
fixed clock (``NOW_MS``), three fixed identities, and ``said`` to record a message as the tap
would."""

from __future__ import annotations

import itertools
import os
from types import SimpleNamespace
from typing import Any, cast

from macula.agent.envelope import build_envelope, new_message_id
from macula.agent.room.rooms import Rooms
from macula.node.node import Node
from macula.store.transcript import TranscriptStore
from macula.wire.identity import Identity

NOW_MS = 1_700_000_000_000
ME = Identity(bytes([7]) * 32)
BOB = Identity(bytes([8]) * 32)
CAROL = Identity(bytes([9]) * 32)
_seq = itertools.count(1_000)


def rooms_of(transcript: TranscriptStore) -> Rooms:
    """``ME``'s rooms over ``transcript``, at ``NOW_MS``."""
    node = cast(Node, SimpleNamespace(identity=ME))
    return Rooms(node, transcript, lambda: NOW_MS)


def envelope(topic: str, sender: Identity, text: str, **fields: Any) -> dict[str, Any]:
    return dict(
        build_envelope(
            message_id=new_message_id(os.urandom(16)),
            room_topic=topic,
            sender=sender.node_id,
            kind=fields.pop("kind", "remark_made"),
            text=text,
            sent_at=fields.pop("sent_at", NOW_MS),
            **fields,
        )
    )


async def said(rooms: Rooms, topic: str, sender: Identity, text: str, **kw: Any) -> str:
    """Record what ``sender`` said as the tap would; its message_id."""
    env = envelope(topic, sender, text, **kw)
    await rooms._record(env, sender.node_id, True, next(_seq))
    return str(env["message_id"])
