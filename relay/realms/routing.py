"""Protected realms in the router (issue 13, issue 26), a part of ``RouterCore``: who may
declare, who is sent what, EVENTs from links, memberships ending.

Sans-I/O, as the core, which builds one ``RealmRouting`` over its own tables; the gate
(``relay.realms.gate.RealmGate``) decides, this applies it:
- SUBSCRIBE, PUBLISH, ADVERTISE and a relayed EVENT in a protected realm from a connection that
  may not act there are counted drops (``realm_refused``);
- what a declaration or an EVENT makes the station send in a protected realm goes only to
  connections allowed there, members and stations protecting it too (``members_only``);
- an EVENT is taken from a linked station only: in a protected realm it must carry a
  ``publisher_sig`` and its publisher must have been vouched for on that link
  (``relay.realms.links``), and it goes to local clients only (``relayed_event``);
- expired and revoked memberships end at each sweep; their advertisements in that realm go
  (``sweep``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from macula.services.refusals import (
    EVENT_FROM_CLIENT,
    REALM_EVENT_UNSIGNED,
    REALM_PUBLISHER_UNVOUCHED,
    REALM_REFUSED,
)
from macula.wire.frames import Advertise, Event, Frame, Publish, Subscribe
from relay.core.actions import Action, Send
from relay.core.adverts import AdvertTable
from relay.core.interest import InterestRouter
from relay.core.peers import Peer
from relay.federation.gossip import AdvertGossip
from relay.realms.gate import RealmGate
from relay.realms.links import forget_link_adverts, unsigned_in_protected_realm, unvouched

__all__ = ["RealmRouting"]


class RealmRouting:
    def __init__(
        self,
        peers: dict[int, Peer],
        adverts: AdvertTable,
        realms: RealmGate,
        *,
        gossip: AdvertGossip,
        interest: InterestRouter,
        tombstone_ms: int,
        stats: Counter[str],
        drop: Callable[[Peer, str, str], None],
    ) -> None:
        self._peers = peers
        self._adverts = adverts
        self._realms = realms
        self._gossip = gossip
        self._interest = interest
        self._tombstone_ms = tombstone_ms
        self._stats = stats
        self._drop = drop

    def realm_refused(self, peer: Peer, frame: Frame, now_ms: int) -> bool:
        """SUBSCRIBE, PUBLISH, ADVERTISE (and a relayed EVENT) in a protected realm from a
        connection that may not act there: a counted drop."""
        if not isinstance(frame, (Subscribe, Publish, Advertise, Event)):
            return False
        if self._realms.allows(peer.conn, peer.is_station, frame.realm, now_ms):
            return False
        self._drop(peer, REALM_REFUSED, f"{frame.FRAME_TYPE} in a protected realm")
        return True

    def members_only(self, realm: bytes, actions: list[Action], now_ms: int) -> list[Action]:
        """``actions`` less the Sends to connections not allowed in ``realm`` (if
        protected)."""
        realms = self._realms
        if not realms.protects(realm):
            return actions
        kept: list[Action] = []
        for action in actions:
            target = self._peers.get(action.conn) if isinstance(action, Send) else None
            if target is not None and not realms.allows(
                target.conn, target.is_station, realm, now_ms
            ):
                self._stats["realm_sends_withheld"] += 1
                continue
            kept.append(action)
        return kept

    def relayed_event(self, peer: Peer, frame: Event, now_ms: int) -> list[Action]:
        """An EVENT on ``peer``'s control stream: from a linked station only."""
        if not (peer.is_station and peer.linked):
            self._drop(peer, EVENT_FROM_CLIENT, "EVENT from a peer without the station bit")
            return []
        if self.realm_refused(peer, frame, now_ms):
            return []
        if unsigned_in_protected_realm(self._realms, frame):
            self._drop(peer, REALM_EVENT_UNSIGNED, "protected realm EVENT without sig")
            return []
        if unvouched(self._realms, peer, frame.realm, frame.publisher, now_ms):
            self._drop(peer, REALM_PUBLISHER_UNVOUCHED, "publisher not vouched for")
            return []
        relayed = self._interest.relayed_event(peer, frame, now_ms)
        return self.members_only(frame.realm, relayed, now_ms)

    def sweep(self, now_ms: int) -> list[Action]:
        """End expired and revoked memberships; their advertisements in that realm go."""
        out: list[Action] = []
        for conn, realm in self._realms.sweep(now_ms):
            self._stats["realm_memberships_ended"] += 1
            for key in self._adverts.keys_for(conn):
                if key[0] == realm:
                    self._adverts.remove(key, now_ms + self._tombstone_ms)
                    removed = self._gossip.local_removed(key, now_ms)
                    out += self.members_only(realm, removed, now_ms)
            ended = forget_link_adverts(self._gossip, conn, realm)
            self._stats["realm_link_adverts_ended"] += ended
        return out
