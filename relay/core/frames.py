"""The frames a station writes itself (PROTOCOL.md §4.5): stamped, signed, ready to send.

Pure: the station identity and a randomness source are given; time is an argument.
Invariants: every frame the station originates gets a fresh ``frame_id`` built from ``now_ms``
and is signed by the station identity; a frame the station only relays is re-encoded as
received (``relayed``), keeping its sender's signature: sent as the very bytes received when
those are canonical (the same bytes the re-encoding gives), without encoding anything.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

from macula.wire import cbor
from macula.wire.frames import (
    CAP_STATION,
    PROTOCOL_VERSION,
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
    new_frame_id,
)
from macula.wire.framing import frame_bytes
from macula.wire.identity import DOMAIN_FRAME, Identity
from relay.core.actions import Send

# ``delivered_via`` of an EVENT that came from another station. The wire's enumeration (§3.10)
# has no "relayed"; "plumtree" (delivery through the station mesh) is the closest value it has.
DELIVERED_VIA_RELAYED = "plumtree"


SIGNATURE_BYTES = 64  # Ed25519 (§4.1)
# the EVENT keys whose values never change (§3.12: the envelope, and "direct" delivery)
_EVENT_CONSTANT_PAIRS = cbor.encode_pairs(
    {
        "version": PROTOCOL_VERSION,
        "frame_type": Event.FRAME_TYPE,
        "capabilities": 0,
        "call_id": None,
        "source_route": None,
        "delivered_via": "direct",
    }
)
_SIGNATURE_KEY = cbor.encode_key("signature")
_PUBLISHER_SIG_KEY = cbor.encode_key("publisher_sig")


def _encoded_key(pair: tuple[bytes, bytes]) -> bytes:
    return pair[0]


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
    def __init__(
        self,
        identity: Identity,
        random_bytes: Callable[[int], bytes],
        *,
        realms: Iterable[bytes] = (),
        endorsements: Iterable[dict[str, Any]] = (),
    ) -> None:
        self.identity = identity
        self._random = random_bytes
        self.realms = list(realms)  # the realms this station protects, told in CONNECT/HELLO
        # its station endorsements (RPC forms), presented on each link (relay.realms.links)
        self.endorsements = list(endorsements)

    def stamp(self, now_ms: int) -> dict[str, Any]:
        return {"frame_id": new_frame_id(now_ms, self._random(10)), "sent_at_ms": now_ms}

    def sign(self, frame: Frame) -> bytes:
        return frame.sign_and_encode(self.identity)

    @staticmethod
    def relayed(frame: Frame, body: bytes | None = None) -> bytes:
        """Relay a verified frame as received (its own signature kept, §4.5): ``body``, the
        received bytes when they were canonical (``relay.core.admission.Admitted``: decoding and
        canonically re-encoding them gives them back byte for byte), else re-encoded."""
        if body is not None:
            return frame_bytes(body)
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
            endorsements=self.endorsements,
        )
        return self.sign(connect)

    def hello(
        self,
        accepted: bool,
        refusal: int | None,
        now_ms: int,
        *,
        dht_port: int = 0,
        to_station: bool = False,
        bound_client: bytes | None = None,
    ) -> bytes:
        extras: dict[str, object] = {}
        if to_station and accepted and self.endorsements:
            extras["endorsements"] = self.endorsements
        if bound_client is not None and accepted:
            # this connection's frames are checked by id (issue 27): the client may leave out
            # the signature nobody would verify (a PUBLISH's; SECURITY.md)
            extras["bound_to"] = bound_client
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
            # keys HELLO does not define (kept and signed like any extra, §2.5)
            extras=extras,
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

    def relayed_event(self, event: Event, now_ms: int, attested_by: bytes | None = None) -> bytes:
        """A fresh EVENT, signed by this station, for an EVENT a peer station sent
        (``publisher_sig`` copied: the publisher's end-to-end signature travels on; without
        one, ``attested_by`` names the station that vouched for the publisher)."""
        fresh = Event(
            **self.stamp(now_ms),
            topic=event.topic,
            realm=event.realm,
            publisher=event.publisher,
            seq=event.seq,
            payload=event.payload,
            delivered_via=DELIVERED_VIA_RELAYED,
            publisher_sig=event.publisher_sig,
            attested_by=attested_by,
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
        """The EVENT of §7.2 for a verified ``publish``, signed: byte for byte
        ``event_from_publish(publish, **stamp).sign_and_encode(identity)`` (a test holds it),
        encoded straight from the PUBLISH's fields (already validated) without building an
        ``Event``: this runs once per PUBLISH."""
        fields = {
            "frame_id": new_frame_id(now_ms, self._random(10)),
            "sent_at_ms": now_ms,
            "topic": publish.topic.encode("utf-8"),
            "realm": publish.realm,
            "publisher": publish.publisher,
            "seq": publish.seq,
            "payload": publish.payload,
        }
        pairs = cbor.encode_pairs(fields) + _EVENT_CONSTANT_PAIRS
        pairs.sort(key=_encoded_key)  # canonical order (§2.2): keys are distinct
        signature = self.identity.sign(DOMAIN_FRAME + cbor.join_pairs(pairs))
        sig = publish.publisher_sig
        if sig is not None and len(sig) == SIGNATURE_BYTES:  # as ``event_from_publish``
            bisect.insort(pairs, (_PUBLISHER_SIG_KEY, cbor.encode(sig)))
        bisect.insort(pairs, (_SIGNATURE_KEY, cbor.encode(signature)))
        return frame_bytes(cbor.join_pairs(pairs))

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
