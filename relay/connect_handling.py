"""CONNECT, HELLO and a link coming up (PROTOCOL.md §5, docs/federation.md), for ``RouterCore``.

Sans-I/O, as the core: each function takes the core, the peer and the current time and returns
the actions (the core's one convention). Rules:
- the first stream a peer sends on is its control stream; data on another before CONNECT closes
  the connection; a frame before CONNECT is a counted drop; a malformed CONNECT closes it;
- a verified CONNECT is refused in-band (HELLO ``"false"`` + §9 code, then closed) by admission
  (signature, replay, clock), a ``bound_to`` naming another station (issue 27: a client's
  CONNECT bound to this station binds its connection, ``Peer.bound``), who may connect at all
  (``--admission``, ``ConnectRule``), a station shutting down (retryable, so a reconnecting
  client never believes it is in) or a second inbound link of one station;
- a station peer gets HELLO with this station's DHT port (and endorsements) and its link comes
  up (``LinkHandshake.link_up``); a client's CONNECT endorsements are vouched to the links
  before its HELLO, and the newest connection of a node id wins: the older gets GOODBYE
  ``replaced_by_newer_handshake`` (§5.4);
- a connection this station dialled takes only the HELLO of the station it expected
  (``LinkHandshake.hello``), its endorsements presented first (issue 26);
- ``station_linked`` is the one place that runs when a link comes up, on either side.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from macula.wire.codes import ErrorCode
from macula.wire.errors import ProtocolError
from macula.wire.frames import CAP_STATION, Connect, parse_frame
from relay.actions import Action, Close, Send
from relay.logbook import clip
from relay.peers import Peer, PeerState
from relay.realm_links import linked_realms
from relay.station_frames import dht_port_of

if TYPE_CHECKING:
    from relay.router_state import RouterState

log = logging.getLogger("macula.relay")


def handshake(
    core: RouterState, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
) -> list[Action]:
    """A frame from a connection whose handshake is not done (either side)."""
    if peer.dialled:
        if frame_map.get("frame_type") == "hello":  # before the link is up (issue 26)
            presented = frame_map.get("endorsements")
            core.realms.present_station(peer.conn, peer.expected_node_id, presented, now_ms)
        return core.linking.hello(peer, stream, frame_map, now_ms)
    if peer.control is None:
        peer.control = stream  # the first stream a peer sends on is its control stream
    elif stream != peer.control:
        core.stats["streams_before_connect"] += 1
        peer.state = PeerState.DRAINING
        return [Close(peer.conn, "data on a second stream before CONNECT")]
    if frame_map.get("frame_type") != "connect":
        core.stats["dropped_before_connect"] += 1
        peer.refusals.count("dropped_before_connect", "frame before CONNECT")
        return []
    try:
        connect = parse_frame(frame_map)
    except ProtocolError as exc:
        log.info("conn %d: malformed CONNECT: %s", peer.conn, clip(exc))
        core.remove(peer.conn, now_ms)
        return [Close(peer.conn, f"malformed CONNECT: {exc.detail}")]
    assert isinstance(connect, Connect)
    refusal = _refusal(core, peer, connect, now_ms)
    if refusal is not None:
        return _refused(core, peer, stream, connect, refusal, now_ms)
    peer.node_id = connect.node_id
    peer.capabilities = connect.capabilities
    peer.bound = connect.bound_to is not None and not peer.is_station  # a link: never
    peer.state = PeerState.CONNECTED
    core.stats["handshakes"] += 1
    if peer.is_station:
        return _station_accepted(core, peer, stream, connect, now_ms)
    return _client_accepted(core, peer, stream, now_ms)


def _refusal(
    core: RouterState, peer: Peer, connect: Connect, now_ms: int
) -> tuple[int, str] | None:
    """Why this CONNECT is refused (a §9 code and a reason), or None."""
    refusal = core.admission.connect_refusal(connect, now_ms)
    if refusal is None and connect.bound_to not in (None, core.identity.node_id):
        # meant for another station: a replay of what that station captured (issue 27)
        core.stats["connects_bound_elsewhere"] += 1
        refusal = (ErrorCode.SIGNATURE_INVALID, "CONNECT is bound to another station")
    if refusal is None:  # who may connect at all (relay.realm_admission)
        refusal = _connect_rule_refusal(core, peer, connect, now_ms)
    if refusal is None and core.stopping:
        # a client that reconnects while the station drains must not believe it is in
        refusal = (ErrorCode.TEMPORARY_RELAY_FAILURE, "station is shutting down")
    if refusal is None and connect.capabilities & CAP_STATION:
        refusal = core.admission.inbound_link_refusal(connect.node_id, core.peers.values())
        core.stats["inbound_links_refused"] += refusal is not None
    return refusal


def _connect_rule_refusal(
    core: RouterState, peer: Peer, connect: Connect, now_ms: int
) -> tuple[int, str] | None:
    """Who may connect at all (``--admission``); a client's CONNECT ``endorsements``
    make it a member of the realms they endorse (relay.realms)."""
    members = 0
    if not connect.capabilities & CAP_STATION:
        members = core.realms.connect_members(peer.conn, connect, now_ms)
    return core.connect_rule.refusal(connect, members)


def _refused(
    core: RouterState,
    peer: Peer,
    stream: int,
    connect: Connect,
    refusal: tuple[int, str],
    now_ms: int,
) -> list[Action]:
    code, why = refusal
    log.info("conn %d: refused %s: %s", peer.conn, connect.node_id.hex()[:16], clip(why))
    core.stats["handshakes_refused"] += 1
    peer.state = PeerState.DRAINING
    core.realms.forget(peer.conn)
    return [
        Send(peer.conn, stream, core.frames.hello(False, code, now_ms)),
        Close(peer.conn, f"handshake refused: {why}", after_ms=200),
    ]


def _station_accepted(
    core: RouterState, peer: Peer, stream: int, connect: Connect, now_ms: int
) -> list[Action]:
    """A station's CONNECT: what it may carry (its station endorsements), HELLO, the link."""
    core.realms.present_station(peer.conn, peer.node_id, connect.endorsements, now_ms)
    peer.dht_port = dht_port_of(connect.addresses)
    hello = core.frames.hello(True, None, now_ms, dht_port=core.dht_port, to_station=True)
    return [Send(peer.conn, stream, hello), *core.linking.link_up(peer, now_ms)]


def _client_accepted(core: RouterState, peer: Peer, stream: int, now_ms: int) -> list[Action]:
    out: list[Action] = []
    if core.realms.to_vouch:  # its CONNECT endorsements: the links hear first
        out += core.vouch(core.realms.drain_vouches(), now_ms)
    bound = peer.node_id if peer.bound else None
    out.append(Send(peer.conn, stream, core.frames.hello(True, None, now_ms, bound_client=bound)))
    older = core.node_conn.get(peer.node_id)
    core.node_conn[peer.node_id] = peer.conn
    if older is not None and older in core.peers:
        out += _replace(core, core.peers[older], now_ms)
    return out


def _replace(core: RouterState, older: Peer, now_ms: int) -> list[Action]:
    """Same identity, newer handshake: the older connection is told and closed (§5.4)."""
    detail = "a newer connection took over"
    out: list[Action] = [
        core.goodbye(older, "replaced_by_newer_handshake", detail, now_ms),
        Close(older.conn, "replaced by newer handshake", after_ms=core.policy.drain_ms),
    ]
    older.state = PeerState.DRAINING
    out += core.forget_peer(older, now_ms)
    return out


def station_linked(core: RouterState, peer: Peer, now_ms: int) -> list[Action]:
    """A link came up (either side): the peer station learns this station's clients' interest
    and adverts, and (in the protected realms it may carry) this station's members."""
    carries = linked_realms(core.realms, peer, now_ms)  # protected realms: endorsed only
    out = core.interest.station_linked(peer, now_ms, carries)
    out += core.gossip.station_linked(peer, now_ms, carries)
    ours = [e for realm in core.realms.tags for e in core.realms.local_members(realm)]
    out += core.vouch(ours, now_ms, [peer])
    return out
