"""Waiting in a room (``Rooms`` inherits ``TranscriptWaits``): every unread message at once,
and which one answers.

Invariants:
- a wait returns all it can take (``UnreadBatch``: oldest first, at most ``MAX_BATCH``
  messages and ``MAX_BATCH_CHARS`` of envelopes, ``left`` counting the rest), so a reply
  recorded after a notice (someone joined, left) is in the same result as the notice;
- a notice (a lifecycle kind: joined, left, opened, closed, keys) never answers a message:
  the answer to ``message_id`` is the first message replying to it (``in_reply_to``), else
  the first talk message from someone else after it (``answer_index``); pure, no I/O;
- waiting never polls the station: it waits on the local transcript, which the taps fill;
  every new message bumps ``_generation`` under ``_changed``, and a waiter re-reads whenever
  the generation moved since its last read, so nothing recorded between a read and the wait
  is missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from macula.agent.envelope import TALK_KINDS
from macula.errors import MaculaError
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.store.unread import Fit

MAX_BATCH: Final = 20
MAX_BATCH_CHARS: Final = 16_384
_Found = TypeVar("_Found")


class RoomError(MaculaError):
    """A room operation that cannot be done; the message says why and what to do."""


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


class TranscriptWaits:
    """The waits of ``Rooms`` on its transcript (the attributes are ``Rooms``')."""

    transcript: TranscriptStore
    clock: Callable[[], int]
    me: str  # our node id, 64 hex
    _changed: asyncio.Condition
    _generation: int

    async def wait(
        self,
        topic: str,
        wait_seconds: float,
        *,
        after_ms: int | None = None,
        kinds: set[str] | None = None,
        sender: str | None = None,
    ) -> TranscriptMessage | None:
        """The first attested message in ``topic`` from someone else received after now."""
        since = self.clock() if after_ms is None else after_ms

        async def found() -> TranscriptMessage | None:
            for message in await self.transcript.messages(topic, since_ms=since, limit=200):
                if (
                    message.attested
                    and message.from_hex != self.me
                    and (kinds is None or message.kind in kinds)
                    and (sender is None or message.from_hex == sender)
                ):
                    return message
            return None

        return await self._wait_until(found, wait_seconds)

    async def wait_unread(
        self, topic: str, wait_seconds: float, *, after_message_id: str | None = None
    ) -> TranscriptMessage | None:
        """``wait_unread_all`` for one message: the oldest it would give, or None."""
        batch = await self.wait_unread_all(
            topic, wait_seconds, after_message_id=after_message_id, limit=1
        )
        return batch.messages[0] if batch.messages else None

    async def wait_unread_all(
        self,
        topic: str,
        wait_seconds: float,
        *,
        after_message_id: str | None = None,
        until: Callable[[UnreadBatch], bool] | None = None,
        limit: int = MAX_BATCH,
        fit: Fit | None = None,
    ) -> UnreadBatch:
        """Every unread attested message in ``topic`` from someone else (oldest first, up to
        ``limit``), at once if there are any, else as soon as one is recorded within
        ``wait_seconds``; marked read. With ``after_message_id``: those that arrived after that
        envelope, read or not (``RoomError`` if it is not recorded in ``topic``), and, with
        ``until``, only once ``until`` holds for them (else an empty batch at the deadline).
        ``fit`` (a caller's byte budget) may cut the batch further: only what it admits is
        taken and marked read, the rest is counted in ``left``."""
        after_seq = None
        if after_message_id is not None:
            anchor = await self.transcript.message(topic, after_message_id)
            if anchor is None:
                raise RoomError(
                    f"after_message_id {after_message_id!r} is not a message recorded in "
                    f"{topic}: pass a message_id from mesh_read_inbox or mesh_say"
                )
            after_seq = anchor.seq

        async def found() -> UnreadBatch | None:
            taken, left = await self.transcript.take_unread(
                topic, self.me, self.clock(), after_seq=after_seq, limit=limit,
                max_chars=MAX_BATCH_CHARS, fit=fit, accept=accept,
            )  # fmt: skip
            return UnreadBatch(taken, left) if taken else None

        def accept(taken: list[TranscriptMessage], left: int) -> bool:
            """``until`` decides before anything is marked: a batch it refuses stays unread."""
            return until is None or until(UnreadBatch(taken, left))

        return await self._wait_until(found, wait_seconds) or UnreadBatch([])

    async def _wait_until(
        self, found: Callable[[], Awaitable[_Found | None]], wait_seconds: float
    ) -> _Found | None:
        """``found()`` now, and again whenever a message is recorded, for ``wait_seconds``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_seconds)
        while True:
            generation = self._generation  # read before looking: a later record moves it
            hit = await found()
            if hit is not None:
                return hit
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    moved = functools.partial(self._moved_since, generation)
                    await asyncio.wait_for(self._changed.wait_for(moved), remaining)

    def _moved_since(self, generation: int) -> bool:
        return self._generation != generation
