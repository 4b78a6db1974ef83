"""CONNECT, HELLO and a link coming up (PROTOCOL.md §5, docs/federation.md), a part of
``RouterCore``.

Sans-I/O, as the core, which builds one ``ConnectHandling`` over its own tables; each method
takes the peer and the current time and returns the actions (the core's one convention). It
owns ``stopping`` (after the core's ``shutdown``) and ``dht_port`` (this station's, told to
peer stations). Rules:
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
- a connection this station dials (``dial``) sends CONNECT with the station bit and takes only
  the HELLO of the station it expected (``LinkHandshake.hello``), its endorsements presented
  first (issue 26);
- ``station_linked`` is the one place that runs when a link comes up, on either side (its
  ``LinkHandshake``, ``linking``, calls it).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from macula.realm.records import Endorsement
from macula.services.refusals import DROPPED_BEFORE_CONNECT
from macula.wire.codes import ErrorCode
from macula.wire.errors import ProtocolError
from macula.wire.frames import CAP_STATION, Connect, parse_frame
from relay.core.actions import Action, Close, Send
from relay.core.admission import FrameAdmission
from relay.core.frames import StationFrames, dht_port_of
from relay.core.interest import InterestRouter
from relay.core.logbook import clip
from relay.core.peers import Peer, PeerState
from relay.core.policy import StationPolicy
from relay.federation.gossip import AdvertGossip
from relay.federation.handshake import LinkHandshake, dialled_peer
from relay.realms.admission import ConnectRule
from relay.realms.gate import RealmGate
from relay.realms.links import linked_realms

__all__ = ["ConnectHandling"]

log = logging.getLogger("macula.relay")

# tells links of members' endorsements (``CallHandling.vouch``; None: every link)
Vouch = Callable[[list[Endorsement], int, list[Peer] | None], list[Action]]


class ConnectHandling:
    def __init__(
        self,
        station_id: bytes,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        frames: StationFrames,
        admission: FrameAdmission,
        *,
        policy: StationPolicy,
        connect_rule: ConnectRule,
        realms: RealmGate,
        interest: InterestRouter,
        gossip: AdvertGossip,
        stats: Counter[str],
        open_stream: Callable[[int], int],
        remove: Callable[[int, int], Peer | None],
        forget: Callable[[Peer, int], list[Action]],
        vouch: Vouch,
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
    ) -> None:
        self.policy = policy  # replaced by ``RouterCore.reconfigure``
        self.stopping = False  # new handshakes are refused, retryably; nothing is dialled
        self.dht_port = 0  # this station's DHT UDP port, told to peer stations (0: none)
        self._station_id = station_id
        self._peers = peers
        self._node_conn = node_conn
        self._frames = frames
        self._admission = admission
        self._connect_rule = connect_rule
        self._realms = realms
        # a link's own handshake, either side (relay.federation.handshake)
        self.linking = LinkHandshake(
            station_id,
            peers,
            node_conn,
            frames,
            admission,
            drop=drop,
            count=count,
            forget=forget,
            linked=self.station_linked,
        )
        self._interest = interest
        self._gossip = gossip
        self._stats = stats
        self._open_stream = open_stream
        self._remove = remove
        self._forget = forget
        self._vouch = vouch

    def dial(self, conn: int, expected_node_id: bytes, now_ms: int, host: str) -> list[Action]:
        """A connection this station opened to station ``expected_node_id`` (at ``host``):
        CONNECT with the station bit on a new control stream; the link is up at its HELLO."""
        if self.stopping:
            return [Close(conn, "station is shutting down")]
        control = self._open_stream(conn)
        quotas = self.policy.quotas
        self._peers[conn] = dialled_peer(conn, control, expected_node_id, host, quotas, now_ms)
        self._stats["links_dialled"] += 1
        return [Send(conn, control, self._frames.connect(self.dht_port, now_ms))]

    def handshake(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int
    ) -> list[Action]:
        """A frame from a connection whose handshake is not done (either side)."""
        if peer.dialled:
            if frame_map.get("frame_type") == "hello":  # before the link is up (issue 26)
                presented = frame_map.get("endorsements")
                self._realms.present_station(peer.conn, peer.expected_node_id, presented, now_ms)
            return self.linking.hello(peer, stream, frame_map, now_ms)
        if peer.control is None:
            peer.control = stream  # the first stream a peer sends on is its control stream
        elif stream != peer.control:
            self._stats["streams_before_connect"] += 1
            peer.state = PeerState.DRAINING
            return [Close(peer.conn, "data on a second stream before CONNECT")]
        if frame_map.get("frame_type") != "connect":
            self._stats[DROPPED_BEFORE_CONNECT] += 1
            peer.refusals.count(DROPPED_BEFORE_CONNECT, "frame before CONNECT")
            return []
        try:
            connect = parse_frame(frame_map)
        except ProtocolError as exc:
            log.info("conn %d: malformed CONNECT: %s", peer.conn, clip(exc))
            self._remove(peer.conn, now_ms)
            return [Close(peer.conn, f"malformed CONNECT: {exc.detail}")]
        assert isinstance(connect, Connect)
        refusal = self._refusal(peer, connect, now_ms)
        if refusal is not None:
            return self._refused(peer, stream, connect, refusal, now_ms)
        peer.node_id = connect.node_id
        peer.capabilities = connect.capabilities
        peer.bound = connect.bound_to is not None and not peer.is_station  # a link: never
        peer.state = PeerState.CONNECTED
        self._stats["handshakes"] += 1
        if peer.is_station:
            return self._station_accepted(peer, stream, connect, now_ms)
        return self._client_accepted(peer, stream, now_ms)

    def station_linked(self, peer: Peer, now_ms: int) -> list[Action]:
        """A link came up (either side): the peer station learns this station's clients'
        interest and adverts, and (in the protected realms it may carry) this station's
        members."""
        realms = self._realms
        carries = linked_realms(realms, peer, now_ms)  # protected realms: endorsed only
        out = self._interest.station_linked(peer, now_ms, carries)
        out += self._gossip.station_linked(peer, now_ms, carries)
        ours = [e for realm in realms.tags for e in realms.local_members(realm)]
        out += self._vouch(ours, now_ms, [peer])
        return out

    def _refusal(self, peer: Peer, connect: Connect, now_ms: int) -> tuple[int, str] | None:
        """Why this CONNECT is refused (a §9 code and a reason), or None."""
        refusal = self._admission.connect_refusal(connect, now_ms)
        if refusal is None and connect.bound_to not in (None, self._station_id):
            # meant for another station: a replay of what that station captured (issue 27)
            self._stats["connects_bound_elsewhere"] += 1
            refusal = (ErrorCode.SIGNATURE_INVALID, "CONNECT is bound to another station")
        if refusal is None:  # who may connect at all (relay.realms.admission)
            refusal = self._connect_rule_refusal(peer, connect, now_ms)
        if refusal is None and self.stopping:
            # a client that reconnects while the station drains must not believe it is in
            refusal = (ErrorCode.TEMPORARY_RELAY_FAILURE, "station is shutting down")
        if refusal is None and connect.capabilities & CAP_STATION:
            peers = self._peers.values()
            refusal = self._admission.inbound_link_refusal(connect.node_id, peers)
            self._stats["inbound_links_refused"] += refusal is not None
        return refusal

    def _connect_rule_refusal(
        self, peer: Peer, connect: Connect, now_ms: int
    ) -> tuple[int, str] | None:
        """Who may connect at all (``--admission``); a client's CONNECT ``endorsements``
        make it a member of the realms they endorse (relay.realms.gate)."""
        members = 0
        if not connect.capabilities & CAP_STATION:
            members = self._realms.connect_members(peer.conn, connect, now_ms)
        return self._connect_rule.refusal(connect, members)

    def _refused(
        self, peer: Peer, stream: int, connect: Connect, refusal: tuple[int, str], now_ms: int
    ) -> list[Action]:
        code, why = refusal
        log.info("conn %d: refused %s: %s", peer.conn, connect.node_id.hex()[:16], clip(why))
        self._stats["handshakes_refused"] += 1
        peer.state = PeerState.DRAINING
        self._realms.forget(peer.conn)
        return [
            Send(peer.conn, stream, self._frames.hello(False, code, now_ms)),
            Close(peer.conn, f"handshake refused: {why}", after_ms=200),
        ]

    def _station_accepted(
        self, peer: Peer, stream: int, connect: Connect, now_ms: int
    ) -> list[Action]:
        """A station's CONNECT: what it may carry (its station endorsements), HELLO, the
        link."""
        self._realms.present_station(peer.conn, peer.node_id, connect.endorsements, now_ms)
        peer.dht_port = dht_port_of(connect.addresses)
        hello = self._frames.hello(True, None, now_ms, dht_port=self.dht_port, to_station=True)
        return [Send(peer.conn, stream, hello), *self.linking.link_up(peer, now_ms)]

    def _client_accepted(self, peer: Peer, stream: int, now_ms: int) -> list[Action]:
        out: list[Action] = []
        if self._realms.to_vouch:  # its CONNECT endorsements: the links hear first
            out += self._vouch(self._realms.drain_vouches(), now_ms, None)
        bound = peer.node_id if peer.bound else None
        hello = self._frames.hello(True, None, now_ms, bound_client=bound)
        out.append(Send(peer.conn, stream, hello))
        older = self._node_conn.get(peer.node_id)
        self._node_conn[peer.node_id] = peer.conn
        if older is not None and older in self._peers:
            out += self._replace(self._peers[older], now_ms)
        return out

    def _replace(self, older: Peer, now_ms: int) -> list[Action]:
        """Same identity, newer handshake: the older connection is told and closed (§5.4)."""
        detail = "a newer connection took over"
        goodbye = self._frames.goodbye(
            older.conn, older.control or 0, "replaced_by_newer_handshake", detail, now_ms
        )
        out: list[Action] = [
            goodbye,
            Close(older.conn, "replaced by newer handshake", after_ms=self.policy.drain_ms),
        ]
        older.state = PeerState.DRAINING
        out += self._forget(older, now_ms)
        return out
