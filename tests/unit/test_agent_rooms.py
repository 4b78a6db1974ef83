"""``Rooms`` without a station: waiting on the transcript the taps fill."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from macula.agent.envelope import build_envelope, new_message_id, new_room_topic
from macula.agent.rooms import Rooms
from macula.node import Node
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.wire.identity import Identity

NOW_MS = 1_700_000_000_000


def _rooms(transcript: TranscriptStore) -> Rooms:
    node = cast(Node, SimpleNamespace(identity=Identity.generate(os.urandom)))
    return Rooms(node, transcript, lambda: NOW_MS)


def test_a_message_recorded_between_the_check_and_the_wait_is_seen_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "transcript.sqlite3") as transcript:
            rooms = _rooms(transcript)
            topic = new_room_topic(os.urandom(16))
            other = Identity.generate(os.urandom).node_id
            envelope = build_envelope(
                message_id=new_message_id(os.urandom(16)),
                room_topic=topic,
                sender=other,
                kind="remark_made",
                text="arrived in the gap",
                sent_at=NOW_MS,
            )
            read = transcript.messages
            reads = 0

            async def read_then_arrive(*args: Any, **kwargs: Any) -> list[TranscriptMessage]:
                nonlocal reads
                found = await read(*args, **kwargs)
                reads += 1
                if reads == 1:  # the check saw nothing; the tap records before the wait begins
                    await rooms._record(envelope, other, True)
                return found

            monkeypatch.setattr(transcript, "messages", read_then_arrive)
            hit = await asyncio.wait_for(rooms.wait(topic, 3600), 2.0)
            assert hit is not None and hit.message_id == envelope["message_id"]
            assert reads == 2

    asyncio.run(scenario())
