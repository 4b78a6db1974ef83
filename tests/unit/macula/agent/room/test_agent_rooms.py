"""``Rooms`` without a station: waiting on the transcript the taps fill."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from macula.agent.envelope import build_envelope, new_message_id, new_room_topic
from macula.agent.room.rooms import Rooms
from macula.node.node import Node
from macula.node.subscriptions import Delivery
from macula.store.transcript import TranscriptMessage, TranscriptStore
from macula.wire.identity import ZERO_REALM, Identity

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


def test_an_event_without_publisher_sig_is_never_attested(tmp_path: Path) -> None:
    """Issue 11: ``from`` equal to the publisher is not enough; nobody vouches for an event
    that carried no ``publisher_sig``."""

    async def scenario() -> None:
        async with await TranscriptStore.open(tmp_path / "transcript.sqlite3") as transcript:
            rooms = _rooms(transcript)
            topic = new_room_topic(os.urandom(16))
            sender = Identity.generate(os.urandom).node_id

            def heard(authenticated: bool) -> Delivery:
                envelope = build_envelope(
                    message_id=new_message_id(os.urandom(16)),
                    room_topic=topic,
                    sender=sender,
                    kind="remark_made",
                    text="signed" if authenticated else "unsigned",
                    sent_at=NOW_MS,
                )
                return Delivery(ZERO_REALM, topic, sender, 1, dict(envelope), authenticated)

            await rooms._heard(topic, heard(False))
            await rooms._heard(topic, heard(True))
            messages = await transcript.messages(topic)
            assert {m.text: m.attested for m in messages} == {"unsigned": 0, "signed": 1}
            assert rooms.stats["unauthenticated"] == 1 and rooms.stats["unattested"] == 1

    asyncio.run(scenario())
