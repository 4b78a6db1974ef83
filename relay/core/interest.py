"""What nodes declare on their control stream (PROTOCOL.md §6.1, §7), sans-I/O: the procedures
they serve (ADVERTISE/UNADVERTISE), the topics they follow (SUBSCRIBE/UNSUBSCRIBE), and each
PUBLISH fanned out to the subscribers as a station-signed EVENT.

``RouterCore`` owns it and hands it only frames already verified (§4.3). Invariants: a declaration
names the connection's own identity, else it is a counted drop (foreign ADVERTISE/UNADVERTISE §13
#5, SUBSCRIBE #6, PUBLISH #7), as is a PUBLISH whose ``publisher_sig`` is not 64 bytes, or does not
verify when the station checks it: only when the EVENT goes on to a peer station (subscribers check
it end to end, §4.3: the station verifies a PUBLISH against its connection); an EVENT is signed and
encoded once per PUBLISH; built-in, station-served and house procedure names are never advertised;
a procedure has one advertiser while that connection lives, and a released one stays tombstoned for
``tombstone_ms`` to everyone but its former owner; a station peer's ADVERTISE is kept apart
(``relay.federation.gossip``: a local client wins, then the first station) and a local client's
advert appearing or going is told to the links; per-connection advertisement and per-node
subscription quotas hold (a peer station's under ``max_station_subscriptions``); an EVENT goes only
to CONNECTED subscribers, on their control stream, and to a peer station never for a PUBLISH that
came from a peer station (an event crosses at most one link); without a ``publisher_sig`` it goes
to peer stations as this station's attestation (``relay.federation.interest``), except in a
protected realm.
Interest across station links (what is told to peer stations, EVENTs from them) is
``relay.federation.interest``'s; this router tells it each change of a client's subscriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from macula.services.house import HOUSE_PROCEDURES
from macula.services.refusals import (
    ADVERTISE_QUOTA,
    ADVERTISE_TAKEN,
    ADVERTISE_TOMBSTONED,
    BAD_PUBLISHER_SIG,
    BUILTIN_ADVERTISE,
    FOREIGN_ADVERTISE,
    FOREIGN_PUBLISH,
    FOREIGN_SUBSCRIBE,
    FOREIGN_UNADVERTISE,
    FOREIGN_UNSUBSCRIBE,
    NO_GOSSIP,
    PUBLISH_RATE_LIMITED,
    RESERVED_ADVERTISE,
    SUBSCRIPTION_QUOTA,
    UNKNOWN_UNADVERTISE,
)
from macula.wire.frames import (
    CAP_STATION,
    Advertise,
    Event,
    Publish,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    publisher_sig_valid,
)
from relay.core.actions import Action, Send
from relay.core.adverts import AdvertTable, ProcedureKey
from relay.core.frames import StationFrames
from relay.core.peers import Peer, PeerState
from relay.core.policy import Quotas
from relay.core.subscriptions import StationSubscriptions
from relay.federation.gossip import AdvertGossip
from relay.federation.interest import StationInterest

Declaration = Advertise | Unadvertise | Subscribe | Unsubscribe | Publish
SIGNATURE_BYTES = 64  # Ed25519 (§4.1)
DECLARATIONS = (Advertise, Unadvertise, Subscribe, Unsubscribe, Publish)  # what ``handle`` takes
# told every PUBLISH accepted, its time, and whether its publisher_sig was verified here
PublishHook = Callable[[Publish, int, bool], None]


class Counting(Protocol):
    """Adds ``n`` to a station counter (``RouterCore.count``)."""

    def __call__(self, counter: str, n: int = 1, /) -> None: ...


class InterestRouter:
    def __init__(
        self,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        adverts: AdvertTable,
        subscriptions: StationSubscriptions,
        frames: StationFrames,
        *,
        quotas: Quotas,
        tombstone_ms: int,
        station_serves: Callable[[ProcedureKey], bool],
        drop: Callable[[Peer, str, str], None],
        count: Counting,
        federation: StationInterest,
        gossip: AdvertGossip | None = None,
        published: PublishHook | None = None,
    ) -> None:
        self.gossip = gossip  # tells linked stations of local adverts; keeps theirs
        self._peers = peers
        self._node_conn = node_conn
        self._adverts = adverts
        self._subscriptions = subscriptions
        self._frames = frames
        self._quotas = quotas
        self._tombstone_ms = tombstone_ms
        self._station_serves = station_serves  # a built-in or a house service of this station
        self._drop = drop
        self._count = count
        self.federation = federation
        # every PUBLISH accepted, and whether its present publisher_sig was verified here
        self._published = published

    def set_quotas(self, quotas: Quotas) -> None:
        """Per-connection quotas from now on (``RouterCore.reconfigure``); what is held stays."""
        self._quotas = quotas

    def handle(self, peer: Peer, frame: Declaration, now_ms: int) -> list[Action]:
        """Apply one verified declaration from ``peer``; the EVENTs a PUBLISH sends."""
        if isinstance(frame, Publish):
            return self._publish(peer, frame, now_ms)
        if isinstance(frame, Subscribe):
            return self._subscribe(peer, frame, now_ms)
        if isinstance(frame, Unsubscribe):
            return self._unsubscribe(peer, frame, now_ms)
        if isinstance(frame, Advertise):
            return self._advertise(peer, frame, now_ms)
        return self._unadvertise(peer, frame, now_ms)

    def release_adverts(self, conn: int, now_ms: int) -> list[Action]:
        """``conn`` is going: its advertisements end, each leaving a tombstone (§6.1), and
        linked stations are told; a link's gossiped advertisements go with it."""
        until_ms = now_ms + self._tombstone_ms
        out: list[Action] = []
        for key in self._adverts.keys_for(conn):
            self._adverts.remove(key, until_ms)
            if self.gossip is not None:
                out += self.gossip.local_removed(key, now_ms)
        if self.gossip is not None:
            self.gossip.link_lost(conn)
        return out

    # --- advertisements (§6.1) --------------------------------------------------------------

    def _advertise(self, peer: Peer, frame: Advertise, now_ms: int) -> list[Action]:
        key = (frame.realm, frame.procedure)
        if frame.advertiser != peer.node_id:
            self._drop(peer, FOREIGN_ADVERTISE, "advertiser is not this connection")
            return []
        if self._station_serves(key):
            self._drop(peer, BUILTIN_ADVERTISE, f"{frame.procedure} is the station's")
            return []
        if frame.procedure in HOUSE_PROCEDURES:  # reserved in every realm, issue 11
            self._drop(peer, RESERVED_ADVERTISE, f"{frame.procedure} is a house service")
            return []
        if peer.is_station:  # gossip: kept apart, a local client wins (relay.federation.gossip)
            refused = self.gossip.station_advertised(peer, key) if self.gossip else NO_GOSSIP
            if refused is not None:
                self._drop(peer, refused, "station advertisement quota reached")
            return []
        current = self._adverts.get(key)
        if current is not None and current.node_id != peer.node_id and current.conn in self._peers:
            self._drop(peer, ADVERTISE_TAKEN, f"{frame.procedure} is served by another node")
            return []
        released_by = self._adverts.released_by(key, now_ms)
        if released_by is not None and released_by != peer.node_id:
            self._drop(peer, ADVERTISE_TOMBSTONED, f"{frame.procedure} was just released")
            return []
        if self._adverts.held_by(peer.conn, key):
            return []  # already so: nothing changes, nothing to tell the links
        if self._adverts.count_for(peer.conn) >= self._quotas.max_advertisements:
            self._drop(peer, ADVERTISE_QUOTA, "advertisement quota reached")
            return []
        self._adverts.put(key, peer.node_id, peer.conn)
        self._count("advertisements")
        return self.gossip.local_added(key, now_ms) if self.gossip is not None else []

    def _unadvertise(self, peer: Peer, frame: Unadvertise, now_ms: int) -> list[Action]:
        key = (frame.realm, frame.procedure)
        if peer.is_station:
            if frame.advertiser != peer.node_id or self.gossip is None:
                self._drop(peer, FOREIGN_UNADVERTISE, "only the owner may unadvertise")
            elif not self.gossip.station_unadvertised(peer, key):
                self._drop(peer, UNKNOWN_UNADVERTISE, "this station did not advertise it")
            return []
        current = self._adverts.get(key)
        if frame.advertiser != peer.node_id or current is None or current.node_id != peer.node_id:
            self._drop(peer, FOREIGN_UNADVERTISE, "only the owner may unadvertise")
            return []
        self._adverts.remove(key, now_ms + self._tombstone_ms)
        return self.gossip.local_removed(key, now_ms) if self.gossip is not None else []

    # --- pub/sub (§7) -------------------------------------------------------------------------

    def _subscribe(self, peer: Peer, frame: Subscribe, now_ms: int) -> list[Action]:
        if frame.subscriber != peer.node_id:
            self._drop(peer, FOREIGN_SUBSCRIBE, "subscriber is not this connection")
            return []
        key = (frame.realm, frame.topic.encode())
        if self._subscriptions.has(peer.node_id, key):
            return []
        quotas = self._quotas
        limit = quotas.max_station_subscriptions if peer.is_station else quotas.max_subscriptions
        if self._subscriptions.count_for(peer.node_id) >= limit:
            self._drop(peer, SUBSCRIPTION_QUOTA, "subscription quota reached")
            return []
        self._subscriptions.add(peer.node_id, key)
        if peer.is_station:
            return []
        return self.federation.client_subscribed(key, now_ms)

    def _unsubscribe(self, peer: Peer, frame: Unsubscribe, now_ms: int) -> list[Action]:
        if frame.subscriber != peer.node_id:
            self._drop(peer, FOREIGN_UNSUBSCRIBE, "subscriber is not this connection")
            return []
        key = (frame.realm, frame.topic.encode())
        if not self._subscriptions.has(peer.node_id, key):
            return []
        self._subscriptions.remove(peer.node_id, key)
        if peer.is_station:
            return []
        return self.federation.client_unsubscribed(key, now_ms)

    def purge_subscriptions(self, peer: Peer, now_ms: int) -> list[Action]:
        """The node's last connection went (§7.5): its subscriptions end, and the interest
        peer stations were told for the keys no other client here holds is withdrawn."""
        keys = self._subscriptions.keys_for(peer.node_id)
        self._subscriptions.purge(peer.node_id)
        return [] if peer.is_station else self.federation.clients_gone(keys, now_ms)

    def station_linked(
        self, peer: Peer, now_ms: int, realm_ok: Callable[[bytes], bool] | None = None
    ) -> list[Action]:
        """A link came up: the peer station learns every key this station's clients hold
        (only in the realms ``realm_ok`` lets this link carry: protected realms, issue 26)."""
        return self.federation.replay(peer, now_ms, realm_ok)

    def relayed_event(self, peer: Peer, frame: Event, now_ms: int) -> list[Action]:
        """An EVENT from a linked station: to local client subscribers, once."""
        return self.federation.relayed_event(peer, frame, now_ms)

    def _publish(self, peer: Peer, frame: Publish, now_ms: int) -> list[Action]:
        if frame.publisher != peer.node_id:
            self._drop(peer, FOREIGN_PUBLISH, "publisher is not this connection")
            return []
        sig = frame.publisher_sig
        if sig is not None and len(sig) != SIGNATURE_BYTES:  # can never verify: no crypto
            self._drop(peer, BAD_PUBLISHER_SIG, "publisher_sig is not 64 bytes")
            return []
        if not peer.publish_bucket.take(now_ms):
            self._drop(peer, PUBLISH_RATE_LIMITED, "publish rate above quota")
            return []
        subscribers = self._subscriptions.subscribers((frame.realm, frame.topic.encode()))
        data = self._frames.event(frame, now_ms) if subscribers else b""  # once, for all
        out: list[Action] = []
        echo: Send | None = None  # the publisher's own copy: sent last, the others wait less
        to_stations = 0
        from_station = peer.is_station
        node_conn, peers, connected = self._node_conn, self._peers, PeerState.CONNECTED
        for node_id in subscribers:  # the per-subscriber loop of a fan-out: kept lean
            conn = node_conn.get(node_id)
            target = peers.get(conn) if conn is not None else None
            if target is None or target.state is not connected or target.control is None:
                continue
            if target.capabilities & CAP_STATION:
                if from_station:  # a peer station's frames never go on to a third one
                    continue
                if sig is None and not self.federation.crosses_unsigned(frame.realm):
                    self._count("unsigned_events_not_relayed")  # a protected realm's
                    continue
                to_stations += 1
            elif target is peer:  # a client's own copy (a station's never comes back: above)
                echo = Send(target.conn, target.control, data)
                continue
            out.append(Send(target.conn, target.control, data))
        if echo is not None:  # each connection's packets leave in the order of its first Send
            out.append(echo)
        # publisher_sig is end to end: local clients verify it themselves (a bad one is
        # dropped by the client, never delivered), so the station checks it only where it
        # vouches for it further: before relaying it to a peer station (docs/performance.md §2)
        sig_checked = to_stations > 0 and sig is not None
        if sig_checked and not publisher_sig_valid(frame):
            self._drop(peer, BAD_PUBLISHER_SIG, "publisher_sig does not verify")
            return []
        self._count("publishes")
        if self._published is not None:
            self._published(frame, now_ms, sig_checked)  # the room history (relay.house.history)
        if to_stations:
            self._count("events_to_stations", to_stations)
        if len(out) > to_stations:
            self._count("events_delivered", len(out) - to_stations)
        return out
