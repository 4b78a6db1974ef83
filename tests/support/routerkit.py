"""A station's router core (``RouterCore``) driven by hand: ``Station`` holds one, ``Client``
builds the frames of one connection and reads the actions back; fixed identities and clock."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from macula.wire.frames import (
    Advertise,
    Call,
    Connect,
    Error,
    Frame,
    Hello,
    Publish,
    Result,
    StreamData,
    StreamEnd,
    StreamError,
    StreamOpen,
    StreamReply,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    new_frame_id,
    parse_frame,
)
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, puzzle_evidence, realm_tag
from relay.core.actions import Action, Close, EndStream, Send
from relay.core.policy import StationPolicy
from relay.core.router import RouterCore

from .identities import hardened

F = TypeVar("F", bound=Frame)

NOW = 1_767_225_600_000
SKEW = StationPolicy().max_clock_skew_ms
REALM = realm_tag("test.router-core")
OTHER_REALM = realm_tag("test.router-core.other")
ZERO_REALM = bytes(32)


STATION = Identity(bytes(range(100, 132)))
ALICE = hardened(1)
BOB = hardened(2)
CAROL = hardened(3)
PROVIDER = hardened(4)
MALLORY = hardened(5)
UNHARDENED = Identity(b"\x01" * 32)

_frame_counter = itertools.count(1)


def envelope(now: int) -> dict[str, Any]:
    """A fresh ``frame_id`` and ``sent_at_ms`` for a frame built at ``now``."""
    return {
        "frame_id": new_frame_id(now, next(_frame_counter).to_bytes(10, "big")),
        "sent_at_ms": now,
    }


def fresh_id(n: int = 16) -> bytes:
    return next(_frame_counter).to_bytes(n, "big")


# --- the fake link -------------------------------------------------------------------------


class StreamAllocator:
    """``open_stream`` of the shell: server-initiated bidi ids 1, 5, 9, ... per connection."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def __call__(self, conn: int) -> int:
        stream = self._next.get(conn, 1)
        self._next[conn] = stream + 4
        return stream


@dataclass
class Client:
    """One connection to the core, speaking as ``identity``; builders return unsigned frames."""

    core: RouterCore
    conn: int
    identity: Identity
    control: int = 0
    _next_stream: int = 4

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    def new_stream(self) -> int:
        """The next client-initiated bidi stream id (0 is the control stream)."""
        stream = self._next_stream
        self._next_stream += 4
        return stream

    # moving frames

    def send(
        self,
        frame: Frame,
        *,
        now: int = NOW,
        stream: int | None = None,
        signer: Identity | None = None,
    ) -> list[Action]:
        """Sign ``frame`` (as this client unless ``signer``) and feed it to the core."""
        signed = frame.signed_by(signer or self.identity)
        return self.send_map(signed.to_map(), now=now, stream=stream)

    def send_map(
        self, frame_map: dict[str, Any], *, now: int = NOW, stream: int | None = None
    ) -> list[Action]:
        target = self.control if stream is None else stream
        return self.core.frames_received(self.conn, target, [frame_map], now)

    def handshake(self, *, now: int = NOW) -> list[Action]:
        return self.send(self.connect(now=now), now=now)

    # builders

    def connect(self, *, now: int = NOW) -> Connect:
        return Connect(
            **envelope(now),
            node_id=self.node_id,
            station_id=self.node_id,
            puzzle_evidence=puzzle_evidence(self.node_id),
        )

    def call(
        self,
        procedure: str,
        *,
        now: int = NOW,
        realm: bytes = REALM,
        payload: Any = None,
        call_id: bytes | None = None,
        deadline_ms: int | None = None,
        caller: bytes | None = None,
    ) -> Call:
        return Call(
            **envelope(now),
            call_id=call_id or fresh_id(),
            procedure=procedure,
            realm=realm,
            payload={} if payload is None else payload,
            deadline_ms=now + 30_000 if deadline_ms is None else deadline_ms,
            caller=caller or self.node_id,
        )

    def result(self, call_id: bytes, payload: Any, *, now: int = NOW) -> Result:
        return Result(**envelope(now), call_id=call_id, payload=payload, responded_by=self.node_id)

    def advertise(
        self,
        procedure: str,
        *,
        now: int = NOW,
        realm: bytes = REALM,
        advertiser: bytes | None = None,
    ) -> Advertise:
        return Advertise(
            **envelope(now),
            realm=realm,
            procedure=procedure,
            advertiser=advertiser or self.node_id,
        )

    def unadvertise(
        self,
        procedure: str,
        *,
        now: int = NOW,
        realm: bytes = REALM,
        advertiser: bytes | None = None,
    ) -> Unadvertise:
        return Unadvertise(
            **envelope(now),
            realm=realm,
            procedure=procedure,
            advertiser=advertiser or self.node_id,
        )

    def subscribe(
        self,
        topic: str,
        *,
        now: int = NOW,
        realm: bytes = REALM,
        subscriber: bytes | None = None,
    ) -> Subscribe:
        return Subscribe(
            **envelope(now), topic=topic, realm=realm, subscriber=subscriber or self.node_id
        )

    def unsubscribe(self, topic: str, *, now: int = NOW, realm: bytes = REALM) -> Unsubscribe:
        return Unsubscribe(**envelope(now), topic=topic, realm=realm, subscriber=self.node_id)

    def publish(
        self,
        topic: str,
        payload: Any = b"news",
        *,
        now: int = NOW,
        realm: bytes = REALM,
        seq: int = 0,
        publisher: bytes | None = None,
    ) -> Publish:
        return Publish(
            **envelope(now),
            topic=topic,
            realm=realm,
            publisher=publisher or self.node_id,
            seq=seq,
            payload=payload,
            published_at_ms=now,
        )

    def stream_open(
        self, procedure: str, mode: str, stream_id: bytes, *, now: int = NOW
    ) -> StreamOpen:
        return StreamOpen(
            **envelope(now),
            stream_id=stream_id,
            procedure=procedure,
            realm=REALM,
            mode=mode,
            args={"n": 3},
            deadline_ms=now + 30_000,
            caller=self.node_id,
        )

    def data(self, stream_id: bytes, seq: int, body: bytes, *, now: int = NOW) -> StreamData:
        return StreamData(
            **envelope(now), stream_id=stream_id, seq=seq, body=body, signer=self.node_id
        )

    def end(self, stream_id: bytes, role: str, *, now: int = NOW) -> StreamEnd:
        return StreamEnd(**envelope(now), stream_id=stream_id, role=role, signer=self.node_id)

    def stream_error(self, stream_id: bytes, *, now: int = NOW) -> StreamError:
        return StreamError(
            **envelope(now),
            stream_id=stream_id,
            code=b"handler_error",
            message=b"boom",
            signer=self.node_id,
        )

    def stream_reply(self, stream_id: bytes, payload: Any, *, now: int = NOW) -> StreamReply:
        return StreamReply(
            **envelope(now), stream_id=stream_id, payload=payload, responded_by=self.node_id
        )


@dataclass
class Station:
    """A ``RouterCore`` with the fake stream allocator and connection numbering."""

    policy: StationPolicy = field(default_factory=StationPolicy)
    streams: StreamAllocator = field(default_factory=StreamAllocator)
    core: RouterCore = field(init=False)
    _conns: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.core = RouterCore(
            STATION, self.policy, open_stream=self.streams, random_bytes=os.urandom
        )

    def dial(self, identity: Identity, *, now: int = NOW) -> Client:
        """A new connection, not yet handshaken."""
        conn = next(self._conns)
        self.core.connection_made(conn, now)
        return Client(self.core, conn, identity)

    def join(self, identity: Identity, *, now: int = NOW) -> Client:
        """A new connection with an accepted handshake."""
        client = self.dial(identity, now=now)
        hello = only(sent(client.handshake(now=now), client.conn, 0), Hello)
        assert hello.accepted
        return client


# --- reading the core's actions -------------------------------------------------------------


def decode(data: bytes) -> list[Frame]:
    return [parse_frame(frame_map) for frame_map in FrameDecoder().feed(data)]


def sent(actions: list[Action], conn: int, stream: int | None = None) -> list[Frame]:
    """Every frame the actions send to ``conn`` (on ``stream`` if given), in order."""
    return [
        frame
        for action in actions
        if isinstance(action, Send)
        and action.conn == conn
        and (stream is None or action.stream == stream)
        for frame in decode(action.data)
    ]


def sent_to(actions: list[Action], client: Client, stream: int | None = None) -> list[Frame]:
    return sent(actions, client.conn, client.control if stream is None else stream)


def only(frames: list[Frame], kind: type[F]) -> F:
    assert len(frames) == 1, f"expected one {kind.__name__}, got {frames}"
    [frame] = frames
    assert isinstance(frame, kind), f"expected {kind.__name__}, got {frame}"
    return frame


def ended(actions: list[Action]) -> set[tuple[int, int]]:
    return {(a.conn, a.stream) for a in actions if isinstance(a, EndStream)}


def closed(actions: list[Action]) -> dict[int, Close]:
    return {a.conn: a for a in actions if isinstance(a, Close)}


def station_error(actions: list[Action], client: Client, stream: int | None = None) -> Error:
    """The one ERROR the station sent ``client``; it must be station-signed and -reported."""
    error = only(sent_to(actions, client, stream), Error)
    assert error.reported_by == STATION.node_id
    assert error.verifies(STATION.node_id)
    return error


def forwarded_call(actions: list[Action], provider: Client) -> Call:
    return only(sent_to(actions, provider), Call)
