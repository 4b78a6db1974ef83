"""A station's honest pair (a node serving and one calling, checked before and after a hostile
test) and raw frame builders, for the hostile-input tests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.subscriptions import Subscription
from macula.wire.frames import Call, Publish
from macula.wire.identity import ZERO_REALM

from .meshkit import REALM
from .rawclient import RawClient, Received, stamp

ECHO = "org.example.honest_echo_v1"
NEWS = "honest.news"
MINUTE_MS = 60_000


# --- the honest pair ----------------------------------------------------------------------------


@dataclass
class HonestPair:
    """Alice serves ``ECHO`` and publishes ``NEWS``; Bob subscribes and calls."""

    alice: Node
    bob: Node
    news: Subscription | None = None
    served: int = 0
    rounds: int = 0

    def echo(self, call: IncomingCall) -> object:
        self.served += 1
        return {"echo": call.payload, "caller": call.caller}

    async def check(self) -> None:
        """One event Alice → Bob and one call Bob → Alice, both must arrive intact."""
        assert self.news is not None
        self.rounds += 1
        marker = {"round": self.rounds, "nonce": os.urandom(4)}
        seq = await self.alice.publish(REALM, NEWS, marker)
        while True:
            got = await self.news.next(5)
            if got.publisher == self.alice.identity.node_id and got.seq == seq:
                break
        assert got.payload == marker and got.authenticated
        answer = await self.bob.call(REALM, ECHO, marker, timeout=5)
        assert answer == {"echo": marker, "caller": self.bob.identity.node_id}


@contextlib.asynccontextmanager
async def honest_pair(make_node: Callable[..., Node]) -> AsyncIterator[HonestPair]:
    """The pair works before the test body and must still work after it."""
    async with make_node() as alice, make_node() as bob:
        pair = HonestPair(alice, bob)
        await alice.advertise(REALM, ECHO, pair.echo)
        pair.news = await bob.subscribe(REALM, NEWS)
        await alice.flush()
        await bob.flush()
        await pair.check()
        yield pair
        await pair.check()


# --- frame builders -----------------------------------------------------------------------------


def call_frame(
    caller: bytes, procedure: str = "_relay.ping", realm: bytes = ZERO_REALM, **kw: Any
) -> Call:
    fields: dict[str, Any] = {**stamp(), "deadline_ms": stamp()["sent_at_ms"] + MINUTE_MS}
    fields.update(kw)
    return Call(
        call_id=fields.pop("call_id", os.urandom(16)),
        procedure=procedure,
        realm=realm,
        payload=fields.pop("payload", {}),
        caller=caller,
        **fields,
    )


def publish_frame(publisher: bytes, topic: str, payload: object, seq: int, **kw: Any) -> Publish:
    fields: dict[str, Any] = {**stamp(), **kw}
    return Publish(
        topic=topic,
        realm=REALM,
        publisher=publisher,
        seq=seq,
        payload=payload,
        published_at_ms=fields["sent_at_ms"],
        **fields,
    )


def is_reply(call_id: bytes) -> Callable[[Received], bool]:
    return lambda r: r.frame_type in ("result", "error") and r.frame.get("call_id") == call_id


def is_event(topic: str) -> Callable[[Received], bool]:
    return lambda r: r.frame_type == "event" and r.frame.get("topic") == topic.encode()


async def ping_works(raw: RawClient) -> None:
    """The raw connection is still served: a built-in CALL gets its RESULT."""
    call = call_frame(raw.node_id)
    raw.send(call)
    reply = await raw.reply_to(call.call_id)
    assert reply["frame_type"] == "result" and set(reply["payload"]) == {"ts", "refused"}
