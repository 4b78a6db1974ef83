"""What a wait in a room returns: every unread message at once, and which one answers.

Invariants:
- a wait returns all it can take (``UnreadBatch``: oldest first, at most ``MAX_BATCH``
  messages and ``MAX_BATCH_CHARS`` of envelopes, ``left`` counting the rest), so a reply
  recorded after a notice (someone joined, left) is in the same result as the notice;
- a notice (a lifecycle kind: joined, left, opened, closed, keys) never answers a message:
  the answer to ``message_id`` is the first message replying to it (``in_reply_to``), else
  the first talk message from someone else after it (``answer_index``); pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from macula.agent.envelope import TALK_KINDS
from macula.store.transcript import TranscriptMessage

MAX_BATCH: Final = 20
MAX_BATCH_CHARS: Final = 16_384


@dataclass(frozen=True, slots=True)
class UnreadBatch:
    """Messages taken by one wait (marked read), oldest first, and how many are left."""

    messages: list[TranscriptMessage]
    left: int = 0


def answer_index(messages: Sequence[TranscriptMessage], message_id: str) -> int | None:
    """Where in ``messages`` the answer to ``message_id`` is, or None (see the invariants)."""
    for i, message in enumerate(messages):
        if message.in_reply_to == message_id and message.kind in TALK_KINDS:
            return i
    for i, message in enumerate(messages):
        if message.kind in TALK_KINDS:
            return i
    return None
