"""Pub/sub across station links (FEDERATION.md "Pub/sub"), sans-I/O.

A station tells its linked peer stations only the interest of its **own clients**: SUBSCRIBE
(subscriber = this station) when a (realm, topic) gets its first local client subscriber,
UNSUBSCRIBE when the last one leaves, and every such key again when a link comes up. An EVENT
from a peer station is delivered, as a fresh EVENT signed by this station, to local *client*
subscribers only, never to another station, so an event crosses at most one link.
Invariants: ``local[key]`` is the number of client (non-station) nodes subscribed to ``key``
here, and holds no zero counts; an EVENT from a station reaches a client only if its
``publisher_sig`` verifies (end to end) or, without one and outside a protected realm, as
*attested* by the linked station that sent it: the frame verified against that link's key,
the fresh EVENT names it in ``attested_by``. An EVENT whose ``attested_by`` names any other
station is refused (``forged_attestation``): a station vouches only for itself. Each is
delivered once per dedup window: signed ones by (realm, publisher, seq), attested ones by
(realm, attesting station, publisher, seq) in a table of their own, so no station's unsigned
events can shadow a signed event or another station's. Every refusal is a counted drop on the
link it came from. A link's EVENTs take
tokens from its own bucket (``station_event_rate``, station-sized): ``events_over_rate`` tells
the core to pause that link's control stream (backpressure, ``relay.core.pacing``) when it is empty,
so a flooding peer is slowed and its frames wait in QUIC's window, not in this station; the
buckets are only those of current connections.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from macula.rate import TokenBucket
from macula.services.refusals import (
    BAD_RELAYED_PUBLISHER_SIG,
    DUPLICATE_RELAYED_EVENT,
    FORGED_ATTESTATION,
    UNSIGNED_RELAYED_EVENT,
    UNWANTED_RELAYED_EVENT,
)
from macula.wire.frames import Event, publisher_sig_valid
from relay.core.actions import Action, Send
from relay.core.frames import StationFrames
from relay.core.peers import Peer, PeerState
from relay.core.subscriptions import StationSubscriptions, TopicKey
from relay.federation.dedup import RelayedEventDedup

BATCH = 256  # SUBSCRIBE frames per Send when a link comes up


class StationInterest:
    def __init__(
        self,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        subscriptions: StationSubscriptions,
        frames: StationFrames,
        *,
        dedup: RelayedEventDedup,
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
        event_rate: float = 20_000.0,
        event_burst: float = 40_000.0,
        protects: Callable[[bytes], bool] = lambda realm: False,
    ) -> None:
        self._peers = peers
        self._node_conn = node_conn
        self._subscriptions = subscriptions
        self._frames = frames
        self.dedup = dedup
        self.attested_dedup = RelayedEventDedup(dedup.window_ms, dedup.capacity)
        self._protects = protects  # a protected realm's events cross links signed only
        self._drop = drop
        self._count = count
        self.local: Counter[TopicKey] = Counter()
        self.event_rate = event_rate
        self.event_burst = event_burst
        self._event_buckets: dict[int, TokenBucket] = {}  # link conn -> its EVENT bucket

    def links(self) -> list[Peer]:
        """The peer stations this station is linked with (CONNECTED, LinkUp emitted)."""
        return [
            p
            for p in self._peers.values()
            if p.linked and p.state is PeerState.CONNECTED and p.control is not None
        ]

    # --- interest of local clients ---------------------------------------------------------

    def client_subscribed(self, key: TopicKey, now_ms: int) -> list[Action]:
        """A client node subscribed to ``key`` (it was not before)."""
        self.local[key] += 1
        if self.local[key] != 1:
            return []
        self._count("interest_announced")
        return self._tell_links(self._frames.subscribe(key[0], key[1].decode(), now_ms))

    def client_unsubscribed(self, key: TopicKey, now_ms: int) -> list[Action]:
        """A client node's subscription to ``key`` ended (it had one)."""
        left = self.local[key] - 1
        if left > 0:
            self.local[key] = left
            return []
        del self.local[key]
        self._count("interest_withdrawn")
        return self._tell_links(self._frames.unsubscribe(key[0], key[1].decode(), now_ms))

    def clients_gone(self, keys: Iterable[TopicKey], now_ms: int) -> list[Action]:
        out: list[Action] = []
        for key in keys:
            out += self.client_unsubscribed(key, now_ms)
        return out

    def replay(
        self, peer: Peer, now_ms: int, realm_ok: Callable[[bytes], bool] | None = None
    ) -> list[Action]:
        """Every key local clients hold (in the realms ``realm_ok`` allows), as SUBSCRIBEs to
        a link that just came up."""
        if peer.control is None:
            return []
        out: list[Action] = []
        batch: list[bytes] = []
        for realm, topic in self.local:
            if realm_ok is not None and not realm_ok(realm):
                continue
            batch.append(self._frames.subscribe(realm, topic.decode(), now_ms))
            if len(batch) >= BATCH:
                out.append(Send(peer.conn, peer.control, b"".join(batch)))
                batch = []
        if batch:
            out.append(Send(peer.conn, peer.control, b"".join(batch)))
        return out

    def _tell_links(self, data: bytes) -> list[Action]:
        return [Send(p.conn, p.control, data) for p in self.links() if p.control is not None]

    # --- EVENTs from peer stations -----------------------------------------------------------

    def event_bucket(self, peer: Peer, now_ms: int) -> TokenBucket:
        bucket = self._event_buckets.get(peer.conn)
        if bucket is None:
            if len(self._event_buckets) >= len(self._peers):  # forget closed connections'
                for conn in [c for c in self._event_buckets if c not in self._peers]:
                    del self._event_buckets[conn]
            bucket = TokenBucket(self.event_rate, self.event_burst, now_ms)
            self._event_buckets[peer.conn] = bucket
        return bucket

    def events_over_rate(
        self, peer: Peer, frame_map: dict[str, Any], now_ms: int
    ) -> TokenBucket | None:
        """The link's EVENT bucket if ``frame_map`` is an EVENT from a linked station that
        finds it empty (the link must wait for it to refill), else None."""
        if not peer.linked or frame_map.get("frame_type") != "event" or self.event_rate <= 0:
            return None
        bucket = self.event_bucket(peer, now_ms)
        return bucket if bucket.tokens(now_ms) < 1.0 else None

    def crosses_unsigned(self, realm: bytes) -> bool:
        """May an EVENT without ``publisher_sig`` in ``realm`` go to a peer station?"""
        return not self._protects(realm)

    def relayed_event(self, peer: Peer, event: Event, now_ms: int) -> list[Action]:
        """An EVENT a linked station sent (the frame already verified against it)."""
        self.event_bucket(peer, now_ms).take(now_ms)
        refusal = self._refusal(peer, event)
        if refusal is not None:
            self._drop(peer, *refusal)
            return []
        key = (event.realm, event.topic.encode())
        targets = list(self._client_subscribers(key))
        if not targets:  # before the verify: an unwanted EVENT costs no Ed25519
            self._drop(peer, UNWANTED_RELAYED_EVENT, "EVENT for a topic no client here follows")
            return []
        signed = event.publisher_sig is not None
        if signed and not publisher_sig_valid(event):  # before dedup: only verified keys kept
            self._drop(peer, BAD_RELAYED_PUBLISHER_SIG, "relayed publisher_sig does not verify")
            return []
        if signed:
            first = self.dedup.first_sighting((event.realm, event.publisher, event.seq), now_ms)
        else:
            vouched = (event.realm, peer.node_id + event.publisher, event.seq)
            first = self.attested_dedup.first_sighting(vouched, now_ms)
        if not first:
            self._drop(peer, DUPLICATE_RELAYED_EVENT, "EVENT already delivered (dedup)")
            return []
        data = self._frames.relayed_event(event, now_ms, None if signed else peer.node_id)
        self._count("relayed_events_received")
        if not signed:
            self._count("relayed_attested_events_received")
        out: list[Action] = []
        for target in targets:
            assert target.control is not None
            out.append(Send(target.conn, target.control, data))
            self._count("events_delivered")
        return out

    def _refusal(self, peer: Peer, event: Event) -> tuple[str, str] | None:
        """Why an EVENT from linked station ``peer`` is refused before any other work."""
        if event.attested_by is not None and event.attested_by != peer.node_id:
            return FORGED_ATTESTATION, "EVENT claims another station's attestation"
        if event.publisher_sig is None and not self.crosses_unsigned(event.realm):
            return UNSIGNED_RELAYED_EVENT, "EVENT of a protected realm without publisher_sig"
        return None

    def _client_subscribers(self, key: TopicKey) -> Iterable[Peer]:
        for node_id in self._subscriptions.subscribers(key):
            conn = self._node_conn.get(node_id)
            target = self._peers.get(conn) if conn is not None else None
            if (
                target is not None
                and not target.is_station
                and target.state is PeerState.CONNECTED
                and target.control is not None
            ):
                yield target
