"""What nodes declare on their control stream (PROTOCOL.md §6.1, §7), sans-I/O: the procedures
they serve (ADVERTISE/UNADVERTISE), the topics they follow (SUBSCRIBE/UNSUBSCRIBE), and each
PUBLISH fanned out to the subscribers as a station-signed EVENT.

``RouterCore`` owns it and hands it only frames already verified (§4.3). Invariants: a
declaration names the connection's own identity, else it is a counted drop (foreign
ADVERTISE/UNADVERTISE §13 #5, SUBSCRIBE #6, PUBLISH #7), as is a PUBLISH whose
``publisher_sig`` does not verify; built-in, station-served and house procedure names are
never advertised; a procedure has one advertiser while that connection lives, and a released
one stays tombstoned for ``tombstone_ms`` to everyone but its former owner; gossip from a
station is first-write-wins; per-connection advertisement and per-node subscription quotas
hold; an EVENT goes only to CONNECTED subscribers, on their control stream.
"""

from __future__ import annotations

from collections.abc import Callable

from macula.house import HOUSE_PROCEDURES
from macula.wire.frames import (
    Advertise,
    Publish,
    Subscribe,
    Unadvertise,
    Unsubscribe,
    publisher_sig_valid,
)
from relay.actions import Action, Send
from relay.adverts import AdvertTable, ProcedureKey
from relay.peers import Peer, PeerState
from relay.policy import Quotas
from relay.station_frames import StationFrames
from relay.subscriptions import SubscriptionTable

Declaration = Advertise | Unadvertise | Subscribe | Unsubscribe | Publish
DECLARATIONS = (Advertise, Unadvertise, Subscribe, Unsubscribe, Publish)  # what ``handle`` takes


class InterestRouter:
    def __init__(
        self,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        adverts: AdvertTable,
        subscriptions: SubscriptionTable,
        frames: StationFrames,
        *,
        quotas: Quotas,
        tombstone_ms: int,
        station_serves: Callable[[ProcedureKey], bool],
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
    ) -> None:
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
        self.published: Callable[[Publish, int], None] | None = None  # every PUBLISH accepted

    def handle(self, peer: Peer, frame: Declaration, now_ms: int) -> list[Action]:
        """Apply one verified declaration from ``peer``; the EVENTs a PUBLISH sends."""
        if isinstance(frame, Publish):
            return self._publish(peer, frame, now_ms)
        if isinstance(frame, Subscribe):
            self._subscribe(peer, frame)
        elif isinstance(frame, Unsubscribe):
            self._unsubscribe(peer, frame)
        elif isinstance(frame, Advertise):
            self._advertise(peer, frame, now_ms)
        else:
            self._unadvertise(peer, frame, now_ms)
        return []

    def release_adverts(self, conn: int, now_ms: int) -> None:
        """``conn`` is going: its advertisements end, each leaving a tombstone (§6.1)."""
        until_ms = now_ms + self._tombstone_ms
        for key in self._adverts.keys_for(conn):
            self._adverts.remove(key, until_ms)

    # --- advertisements (§6.1) --------------------------------------------------------------

    def _advertise(self, peer: Peer, frame: Advertise, now_ms: int) -> None:
        key = (frame.realm, frame.procedure)
        if frame.advertiser != peer.node_id:
            return self._drop(peer, "foreign_advertise", "advertiser is not this connection")
        if self._station_serves(key):
            return self._drop(peer, "builtin_advertise", f"{frame.procedure} is the station's")
        if frame.procedure in HOUSE_PROCEDURES:  # reserved in every realm, issue 11
            return self._drop(peer, "reserved_advertise", f"{frame.procedure} is a house service")
        current = self._adverts.get(key)
        if current is not None and current.node_id != peer.node_id and current.conn in self._peers:
            return self._drop(
                peer, "advertise_taken", f"{frame.procedure} is served by another node"
            )
        released_by = self._adverts.released_by(key, now_ms)
        if released_by is not None and released_by != peer.node_id:
            return self._drop(peer, "advertise_tombstoned", f"{frame.procedure} was just released")
        if peer.is_station and current is not None:
            return None  # gossip is first-write-wins (§6.1)
        if (
            not self._adverts.held_by(peer.conn, key)
            and self._adverts.count_for(peer.conn) >= self._quotas.max_advertisements
        ):
            return self._drop(peer, "advertise_quota", "advertisement quota reached")
        self._adverts.put(key, peer.node_id, peer.conn)
        self._count("advertisements")
        return None

    def _unadvertise(self, peer: Peer, frame: Unadvertise, now_ms: int) -> None:
        key = (frame.realm, frame.procedure)
        current = self._adverts.get(key)
        if frame.advertiser != peer.node_id or current is None or current.node_id != peer.node_id:
            return self._drop(peer, "foreign_unadvertise", "only the owner may unadvertise")
        self._adverts.remove(key, now_ms + self._tombstone_ms)
        return None

    # --- pub/sub (§7) -------------------------------------------------------------------------

    def _subscribe(self, peer: Peer, frame: Subscribe) -> None:
        if frame.subscriber != peer.node_id:
            return self._drop(peer, "foreign_subscribe", "subscriber is not this connection")
        key = (frame.realm, frame.topic.encode())
        if (
            not self._subscriptions.has(peer.node_id, key)
            and self._subscriptions.count_for(peer.node_id) >= self._quotas.max_subscriptions
        ):
            return self._drop(peer, "subscription_quota", "subscription quota reached")
        self._subscriptions.add(peer.node_id, key)
        return None

    def _unsubscribe(self, peer: Peer, frame: Unsubscribe) -> None:
        if frame.subscriber != peer.node_id:
            return self._drop(peer, "foreign_unsubscribe", "subscriber is not this connection")
        self._subscriptions.remove(peer.node_id, (frame.realm, frame.topic.encode()))
        return None

    def _publish(self, peer: Peer, frame: Publish, now_ms: int) -> list[Action]:
        if frame.publisher != peer.node_id:
            self._drop(peer, "foreign_publish", "publisher is not this connection")
            return []
        if frame.publisher_sig is not None and not publisher_sig_valid(frame):
            self._drop(peer, "bad_publisher_sig", "publisher_sig does not verify")
            return []
        if not peer.publish_bucket.take(now_ms):
            self._drop(peer, "publish_rate_limited", "publish rate above quota")
            return []
        self._count("publishes")
        if self.published is not None:
            self.published(frame, now_ms)  # the room history (relay.house.history)
        subscribers = self._subscriptions.subscribers((frame.realm, frame.topic.encode()))
        if not subscribers:
            return []
        data = self._frames.event(frame, now_ms)
        out: list[Action] = []
        for node_id in subscribers:
            conn = self._node_conn.get(node_id)
            target = self._peers.get(conn) if conn is not None else None
            if (
                target is not None
                and target.state is PeerState.CONNECTED
                and target.control is not None
            ):
                out.append(Send(target.conn, target.control, data))
                self._count("events_delivered")
        return out
