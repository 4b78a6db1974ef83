"""What the house-service unit tests share: reading an ``Outcome``; for the room history, signed
publications of one room and a fetch of it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

from macula.services.house import HISTORY_FETCH
from macula.wire.codes import ErrorCode
from macula.wire.frames import Publish, new_frame_id
from macula.wire.identity import ZERO_REALM, Identity
from relay.builtins.outcome import Outcome
from relay.house.history import HistoryService

T = TypeVar("T")
BAD = ErrorCode.UNKNOWN_ERROR


def ok(outcome: Outcome) -> Any:
    assert not outcome.is_error, outcome.detail
    return outcome.payload


def refused(outcome: Outcome, reason: str) -> str:
    """The refusal's text after ``<reason>: ``; the code must be 0x0F."""
    assert outcome.code == BAD, outcome
    assert outcome.detail is not None
    detail = outcome.detail.decode()
    assert detail.startswith(f"{reason}: "), detail
    return detail


def walk(value: object) -> Iterator[object]:
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


def assert_no_booleans(value: object) -> None:
    assert not [item for item in walk(value) if type(item) is bool]


# --- the room history ---

NOW = 1_767_225_600_000
ROOM = "agents.room." + "ab" * 16
ALICE = Identity(bytes([1]) * 32)
BOB = Identity(bytes([2]) * 32)
_ids = itertools.count(1)


def publish(
    who: Identity, seq: int, topic: str = ROOM, text: str = "hi", *, sign: bool = True
) -> Publish:
    frame = Publish(
        frame_id=new_frame_id(NOW, next(_ids).to_bytes(10, "big")),
        sent_at_ms=NOW,
        topic=topic,
        realm=ZERO_REALM,
        publisher=who.node_id,
        seq=seq,
        payload={"message_id": f"m{seq}", "text": text, "n": [1, 2, {"x": b"\x00"}]},
        published_at_ms=NOW,
    )
    return frame.with_publisher_sig(who) if sign else frame


async def fetch(history: HistoryService, caller: bytes = BOB.node_id, **args: Any) -> Any:
    return await history.handle(HISTORY_FETCH, {"topic": ROOM, **args}, caller, NOW)
