"""Protected realms in the router (issue 13, issue 26), for ``RouterCore``: who may declare,
who is sent what, EVENTs from links, memberships ending.

Sans-I/O, as the core; the gate (``relay.realms.RealmGate``) decides, this applies it:
- SUBSCRIBE, PUBLISH, ADVERTISE and a relayed EVENT in a protected realm from a connection that
  may not act there are counted drops (``realm_refused``);
- what a declaration or an EVENT makes the station send in a protected realm goes only to
  connections allowed there, members and stations protecting it too (``members_only``);
- an EVENT is taken from a linked station only: in a protected realm it must carry a
  ``publisher_sig`` and its publisher must have been vouched for on that link
  (``relay.realm_links``), and it goes to local clients only (``relayed_event``);
- expired and revoked memberships end at each sweep; their advertisements in that realm go
  (``sweep``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from macula.wire.frames import Advertise, Event, Frame, Publish, Subscribe
from relay.actions import Action, Send
from relay.peers import Peer
from relay.realm_links import forget_link_adverts, unsigned_in_protected_realm, unvouched

if TYPE_CHECKING:
    from relay.router_state import RouterState


def realm_refused(core: RouterState, peer: Peer, frame: Frame, now_ms: int) -> bool:
    """SUBSCRIBE, PUBLISH, ADVERTISE (and a relayed EVENT) in a protected realm from a
    connection that may not act there: a counted drop."""
    if not isinstance(frame, (Subscribe, Publish, Advertise, Event)):
        return False
    if core.realms.allows(peer.conn, peer.is_station, frame.realm, now_ms):
        return False
    core.drop(peer, "realm_refused", f"{frame.FRAME_TYPE} in a protected realm")
    return True


def members_only(
    core: RouterState, realm: bytes, actions: list[Action], now_ms: int
) -> list[Action]:
    """``actions`` less the Sends to connections not allowed in ``realm`` (if protected)."""
    realms = core.realms
    if not realms.protects(realm):
        return actions
    kept: list[Action] = []
    for action in actions:
        target = core.peers.get(action.conn) if isinstance(action, Send) else None
        if target is not None and not realms.allows(target.conn, target.is_station, realm, now_ms):
            core.stats["realm_sends_withheld"] += 1
            continue
        kept.append(action)
    return kept


def relayed_event(core: RouterState, peer: Peer, frame: Event, now_ms: int) -> list[Action]:
    """An EVENT on ``peer``'s control stream: from a linked station only."""
    if not (peer.is_station and peer.linked):
        core.drop(peer, "event_from_client", "EVENT from a peer without the station bit")
        return []
    if realm_refused(core, peer, frame, now_ms):
        return []
    if unsigned_in_protected_realm(core.realms, frame):
        core.drop(peer, "realm_event_unsigned", "protected realm EVENT without sig")
        return []
    if unvouched(core.realms, peer, frame.realm, frame.publisher, now_ms):
        core.drop(peer, "realm_publisher_unvouched", "publisher not vouched for")
        return []
    relayed = core.interest.relayed_event(peer, frame, now_ms)
    return members_only(core, frame.realm, relayed, now_ms)


def sweep(core: RouterState, now_ms: int) -> list[Action]:
    """End expired and revoked memberships; their advertisements in that realm go."""
    out: list[Action] = []
    tombstone_ms = core.policy.advertise_tombstone_ms
    for conn, realm in core.realms.sweep(now_ms):
        core.stats["realm_memberships_ended"] += 1
        for key in core.adverts.keys_for(conn):
            if key[0] == realm:
                core.adverts.remove(key, now_ms + tombstone_ms)
                removed = core.gossip.local_removed(key, now_ms)
                out += members_only(core, realm, removed, now_ms)
        core.stats["realm_link_adverts_ended"] += forget_link_adverts(core.gossip, conn, realm)
    return out
