"""The frames a station writes itself (PROTOCOL.md §4.5): stamped, signed, ready to send.

Pure: the station identity and a randomness source are given; time is an argument.
Invariants: every frame the station originates gets a fresh ``frame_id`` built from ``now_ms``
and is signed by the station identity; a frame the station only relays is re-encoded as
received (``relayed``), keeping its sender's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from macula.wire import cbor
from macula.wire.frames import (
    CAP_STATION,
    Connect,
    Error,
    Event,
    Frame,
    Goodbye,
    Hello,
    Pong,
    Publish,
    Result,
    StreamError,
    Subscribe,
    Unsubscribe,
    event_from_publish,
    new_frame_id,
)
from macula.wire.framing import frame_bytes
from macula.wire.identity import Identity
from relay.actions import Send

# ``delivered_via`` of an EVENT that came from another station. The wire's enumeration (§3.10)
# has no "relayed"; "plumtree" (delivery through the station mesh) is the closest value it has.
DELIVERED_VIA_RELAYED = "plumtree"


def dht_addresses(dht_port: int) -> list[dict[str, object]]:
    """The ``addresses`` a station puts in its CONNECT/HELLO to a peer station."""
    return [{"proto": "dht", "port": dht_port}] if 0 < dht_port <= 0xFFFF else []


def dht_port_of(addresses: object) -> int:
    """The DHT port a peer station announced in ``addresses``; 0 for any other shape."""
    if not isinstance(addresses, list):
        return 0
    for entry in addresses:
        if isinstance(entry, dict) and entry.get("proto") == "dht":
            port = entry.get("port")
            if type(port) is int and 0 < port <= 0xFFFF:
                return port
    return 0


class StationFrames:
    def __init__(self, identity: Identity, random_bytes: Callable[[int], bytes]) -> None:
        self.identity = identity
        self._random = random_bytes
        self.realms: list[bytes] = []  # the realms this station protects, told in CONNECT/HELLO

    def stamp(self, now_ms: int) -> dict[str, Any]:
        return {"frame_id": new_frame_id(now_ms, self._random(10)), "sent_at_ms": now_ms}

    def sign(self, frame: Frame) -> bytes:
        return frame.sign_and_encode(self.identity)

    @staticmethod
    def relayed(frame: Frame) -> bytes:
        """Relay a verified frame as received (its own signature kept, §4.5)."""
        return frame_bytes(cbor.encode(frame.to_map()))

    def connect(self, dht_port: int, now_ms: int) -> bytes:
        """The CONNECT this station sends on a link it dials (station bit set)."""
        connect = Connect(
            **self.stamp(now_ms),
            capabilities=CAP_STATION,
            node_id=self.identity.node_id,
            station_id=self.identity.node_id,
            puzzle_evidence=self.identity.puzzle_evidence,
            realms=self.realms,
            addresses=dht_addresses(dht_port),
        )
        return self.sign(connect)

    def hello(
        self, accepted: bool, refusal: int | None, now_ms: int, *, dht_port: int = 0
    ) -> bytes:
        hello = Hello(
            **self.stamp(now_ms),
            capabilities=CAP_STATION,
            node_id=self.identity.node_id,
            station_id=self.identity.node_id,
            accepted=accepted,
            negotiated_capabilities=CAP_STATION,
            refusal_code=refusal,
            realms=self.realms,
            addresses=dht_addresses(dht_port),
        )
        return self.sign(hello)

    def subscribe(self, realm: bytes, topic: str, now_ms: int) -> bytes:
        """SUBSCRIBE on behalf of this station's clients (subscriber = this station)."""
        frame = Subscribe(
            **self.stamp(now_ms), topic=topic, realm=realm, subscriber=self.identity.node_id
        )
        return self.sign(frame)

    def unsubscribe(self, realm: bytes, topic: str, now_ms: int) -> bytes:
        frame = Unsubscribe(
            **self.stamp(now_ms), topic=topic, realm=realm, subscriber=self.identity.node_id
        )
        return self.sign(frame)

    def relayed_event(self, event: Event, now_ms: int) -> bytes:
        """A fresh EVENT, signed by this station, for an EVENT a peer station sent
        (``publisher_sig`` copied: the publisher's end-to-end signature travels on)."""
        fresh = Event(
            **self.stamp(now_ms),
            topic=event.topic,
            realm=event.realm,
            publisher=event.publisher,
            seq=event.seq,
            payload=event.payload,
            delivered_via=DELIVERED_VIA_RELAYED,
            publisher_sig=event.publisher_sig,
        )
        return self.sign(fresh)

    def pong(self, nonce: bytes, now_ms: int) -> bytes:
        return self.sign(Pong(**self.stamp(now_ms), nonce=nonce))

    def result(self, call_id: bytes, payload: Any, now_ms: int) -> bytes:
        reply = Result(
            **self.stamp(now_ms),
            call_id=call_id,
            payload=payload,
            responded_by=self.identity.node_id,
        )
        return self.sign(reply)

    def event(self, publish: Publish, now_ms: int) -> bytes:
        return self.sign(event_from_publish(publish, **self.stamp(now_ms)))

    def error(
        self, conn: int, stream: int, call_id: bytes, code: int, detail: bytes | None, now_ms: int
    ) -> Send:
        error = Error(
            **self.stamp(now_ms),
            call_id=call_id,
            code=code,
            reported_by=self.identity.node_id,
            detail=detail,
        )
        return Send(conn, stream, self.sign(error))

    def goodbye(self, conn: int, stream: int, reason: str, detail: str, now_ms: int) -> Send:
        goodbye = Goodbye(**self.stamp(now_ms), reason=reason, detail=detail.encode())
        return Send(conn, stream, self.sign(goodbye))

    def stream_error(
        self,
        conn: int,
        stream: int,
        frame_map: dict[str, Any] | None,
        code: bytes,
        message: bytes,
        now_ms: int,
        stream_id: bytes | None = None,
    ) -> Send:
        """STREAM_ERROR for ``stream_id``, else the one ``frame_map`` names, else all zeros."""
        if stream_id is None:
            candidate = (frame_map or {}).get("stream_id")
            stream_id = (
                candidate if type(candidate) is bytes and len(candidate) == 16 else bytes(16)
            )
        error = StreamError(**self.stamp(now_ms), stream_id=stream_id, code=code, message=message)
        return Send(conn, stream, self.sign(error))
