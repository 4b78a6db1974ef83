"""The station's routing core (PROTOCOL.md §5-§8), sans-I/O.

``RouterCore`` is fed decoded frame maps with the connection and stream they arrived on and the
current time, and answers with actions (``relay.actions``: send these bytes, end that stream,
close that connection, run that built-in). The QUIC shell (``relay.station``) only moves bytes.
State lives in small tables (``SubscriptionTable``, ``AdvertTable``, ``PendingCalls``,
``RouteTable``); helpers it owns apply one part of the protocol each (``CallForwarder``,
``StreamRelay``, ``InterestRouter``: ADVERTISE, SUBSCRIBE, PUBLISH). Rules:
- handshake (§5): the first CONNECT, verified against its ``node_id``, makes its stream the
  control stream; HELLO ``"true"`` or an in-band refusal (HELLO ``"false"`` + §9 code); the
  newest connection of a node id wins, the older gets GOODBYE ``replaced_by_newer_handshake``;
- every frame after that is parsed and verified per §4.3 before it touches any state, and the
  §13 weaknesses an honest client cannot notice are closed: replayed frame ids and skewed clocks
  (#1), CALL/STREAM_OPEN ``caller`` must be the connection (#2), replies only from the
  connection a CALL was forwarded to (#3), foreign declarations refused (#5-#7, a bad
  ``publisher_sig`` too: ``relay.interest``), EVENT only from stations (#8), expired deadlines
  answered 0x07 (#9), unverifiable CALLs answered 0x0E and framing errors closing the
  connection (#10), gossip never sent to clients (#16), subscriptions purged with the node's
  last connection (#17), per-connection quotas (#19);
- bounds (issue 11): at most ``max_connections`` connections, ``max_connections_per_address``
  per source address (over either: closed at once, before any handshake work); before its
  CONNECT a connection may send on one stream only (its control stream; another closes it);
  topic and procedure names at most ``max_name_bytes`` (admission);
- a refusal never raises: it is an ERROR/STREAM_ERROR where the protocol has a reply, else a
  counted drop, also counted on its connection (``Peer.refusals``), which that client reads in
  its ``_relay.ping`` reply; a drop is never a log line of its own, only part of the
  connection's summary (``relay.logbook.Refusals``: at most one line per ``log_summary_ms``,
  driven by ``tick``);
- backpressure, not loss (``relay.pacing``): a PUBLISH over its connection's rate pauses that
  control stream (``PauseReading``) instead of being dropped, and ``resume`` catches up (an
  EVENT over its link's ``station_event_rate`` pauses that link the same way); a
  connection with more than ``quotas.max_outbound_bytes`` unsent on its control stream
  (``outbound_full``) is a slow consumer: GOODBYE ``slow_consumer``, closed at once;
- station links (docs/federation.md): a connection this station ``dial``s sends CONNECT with
  the station bit and waits for a HELLO verified against the node id it dialled (anything
  else closes it, counted); an accepted CONNECT with the station bit makes a station peer;
  either way ``LinkHandshake.link_up`` (relay.federation.handshake) emits ``LinkUp`` once and
  ``_forget_peer`` the matching ``LinkDown``; one link per station (the duplicate rule is
  there); ``_station_linked`` runs on every link that comes up; an EVENT is taken from
  a station peer only, and goes to local clients only (``relay.federation.interest``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from macula.rate import TokenBucket
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError, ProtocolError
from macula.wire.frames import (
    CAP_STATION,
    Advertise,
    Call,
    Connect,
    Error,
    Event,
    Frame,
    Goodbye,
    Ping,
    Publish,
    Result,
    StreamOpen,
    Subscribe,
    parse_frame,
)
from macula.wire.identity import Identity
from relay.actions import (
    Action,
    Close,
    EndStream,
    LinkDown,
    PauseReading,
    ResumeReading,
    RunBuiltin,
    Send,
    StationReplied,
)
from relay.admission import Admitted, FrameAdmission, Rejected
from relay.adverts import AdvertTable, ProcedureKey
from relay.call_forwarding import CallForwarder
from relay.connection_caps import ConnectionCaps
from relay.federation.content import hops_refusal
from relay.federation.dedup import RelayedEventDedup
from relay.federation.gossip import AdvertGossip
from relay.federation.handshake import LinkHandshake, dialled_peer
from relay.federation.interest import StationInterest
from relay.interest import DECLARATIONS, InterestRouter
from relay.logbook import Refusals, clip
from relay.outcome import Outcome
from relay.pacing import PublishPacer
from relay.peers import Peer, PeerState
from relay.pending import ORIGIN, PendingCalls
from relay.policy import StationPolicy
from relay.realm_admission import ConnectRule
from relay.realms import RealmGate
from relay.routes import RouteTable
from relay.station_frames import StationFrames, dht_port_of
from relay.stream_relay import StreamRelay
from relay.subscriptions import SubscriptionTable

log = logging.getLogger("macula.relay")

BUILTINS = frozenset(
    {
        "_dht.put_record",
        "_dht.find_record",
        "_dht.find_records",
        "_dht.find_records_by_type",
        "_content.put_block",
        "_content.get_block",
        "_content.put_manifest",
        "_content.get_manifest",
        "_relay.ping",
        "_realm.present",
    }
)

_GONE = (PeerState.DRAINING, PeerState.CLOSED)


class RouterCore:
    def __init__(
        self,
        identity: Identity,
        policy: StationPolicy,
        *,
        open_stream: Callable[[int], int],
        random_bytes: Callable[[int], bytes],
        services: frozenset[tuple[bytes, str]] = frozenset(),
        realms: RealmGate | None = None,
        connect_rule: ConnectRule | None = None,
    ) -> None:
        self.identity = identity
        self.services = services  # (realm, procedure) served by the station itself
        self.policy = policy
        self.frames = StationFrames(identity, random_bytes)
        self._random = random_bytes
        self.peers: dict[int, Peer] = {}
        self.node_conn: dict[bytes, int] = {}
        self.subscriptions = SubscriptionTable()
        self.adverts = AdvertTable()
        self.pending = PendingCalls()
        self.routes = RouteTable()
        self.admission = FrameAdmission(policy)
        self.realms = RealmGate() if realms is None else realms  # protected realms (issue 13)
        self.connect_rule = ConnectRule() if connect_rule is None else connect_rule
        self.frames.realms = self.realms.tags  # peer stations learn what this one protects
        self.stats: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # what ``_drop`` counted (relay.monitor_figures)
        self.builtins_running: Counter[int] = Counter()  # conn -> built-in/house calls in flight
        self.pacer = PublishPacer()
        self.caps = ConnectionCaps(policy.max_connections, policy.max_connections_per_address)
        self.stopping = False  # after ``shutdown``: new handshakes are refused, retryably
        self.dht_port = 0  # this station's DHT UDP port, told to peer stations (0: none)
        self._open_stream = open_stream
        self.gossip = AdvertGossip(
            self.peers,
            self.adverts,
            self.frames,
            max_station_advertisements=policy.quotas.max_station_advertisements,
        )
        self.streams = StreamRelay(
            self.peers,
            self.gossip,
            self.routes,
            self.frames,
            route_ttl_ms=policy.stream_route_ttl_ms,
            open_stream=open_stream,
            drop=self._drop,
            count=self._count,
        )
        self.calls = CallForwarder(
            self.peers,
            self.gossip,
            self.pending,
            self.frames,
            forward_slot_ms=policy.forward_slot_ms,
            drop=self._drop,
            count=self._count,
        )
        self.interest = InterestRouter(
            self.peers,
            self.node_conn,
            self.adverts,
            self.subscriptions,
            self.frames,
            quotas=policy.quotas,
            tombstone_ms=policy.advertise_tombstone_ms,
            station_serves=self._serves_itself,
            drop=self._drop,
            count=self._count,
            gossip=self.gossip,
            federation=StationInterest(
                self.peers,
                self.node_conn,
                self.subscriptions,
                self.frames,
                dedup=RelayedEventDedup(
                    policy.relayed_event_dedup_ms, policy.max_relayed_event_ids
                ),
                drop=self._drop,
                count=self._count,
                event_rate=policy.quotas.station_event_rate,
                event_burst=policy.quotas.station_event_burst,
            ),
        )
        self.linking = LinkHandshake(
            identity.node_id,
            self.peers,
            self.node_conn,
            self.frames,
            self.admission,
            drop=self._drop,
            count=self._count,
            forget=self._forget_peer,
            linked=self._station_linked,
        )

    # --- entry points ---------------------------------------------------------------------

    def connection_made(self, conn: int, now_ms: int, address: str = "") -> list[Action]:
        """A new connection from ``address``; closed at once if it is over a connection cap."""
        refusal = self.caps.refusal(len(self.peers), address)
        if refusal is not None:
            counter, why = refusal
            self.stats[counter] += 1
            return [Close(conn, why)]
        quotas = self.policy.quotas
        self.peers[conn] = Peer(
            conn=conn,
            opened_ms=now_ms,
            publish_bucket=TokenBucket(quotas.publish_rate, quotas.publish_burst, now_ms),
            call_bucket=TokenBucket(quotas.call_rate, quotas.call_burst, now_ms),
            refusals=Refusals(now_ms),
            address=address,
        )
        return []

    def dial(self, conn: int, expected_node_id: bytes, now_ms: int, host: str = "") -> list[Action]:
        """A connection this station opened to station ``expected_node_id`` (at ``host``):
        CONNECT with the station bit on a new control stream; the link is up at its HELLO."""
        if self.stopping:
            return [Close(conn, "station is shutting down")]
        control = self._open_stream(conn)
        quotas = self.policy.quotas
        self.peers[conn] = dialled_peer(conn, control, expected_node_id, host, quotas, now_ms)
        self.stats["links_dialled"] += 1
        return [Send(conn, control, self.frames.connect(self.dht_port, now_ms))]

    def is_connected(self, conn: int) -> bool:
        """True once the connection's CONNECT was accepted (and until it drains)."""
        peer = self.peers.get(conn)
        return peer is not None and peer.state is PeerState.CONNECTED

    def frames_received(
        self, conn: int, stream: int, frames: list[dict[str, Any]], now_ms: int
    ) -> list[Action]:
        out: list[Action] = []
        for frame_map in frames:
            peer = self.peers.get(conn)
            if peer is None or peer.state in _GONE:
                break
            if peer.state is PeerState.HANDSHAKING and peer.dialled:
                self.linking.hello(peer, stream, frame_map, now_ms, out)
                if peer.linked:  # its verified HELLO names the realms it protects
                    self.realms.declare_station(conn, frame_map.get("realms"))
            elif peer.state is PeerState.HANDSHAKING:
                self._handshake(peer, stream, frame_map, now_ms, out)
            elif stream == peer.control:
                if self.pacer.paused(conn):
                    self.pacer.hold(conn, frame_map)  # order is kept
                elif self.pacer.over_rate(peer.publish_bucket, frame_map, now_ms):
                    self.pacer.hold(conn, frame_map)
                    self.stats["publishers_paused"] += 1
                    peer.refusals.count("publish_slowed", "over the publish rate: paused")
                    until_ms = self.pacer.refilled_at(peer.publish_bucket, now_ms)
                    out.append(PauseReading(conn, stream, until_ms))
                elif link := self.interest.federation.events_over_rate(peer, frame_map, now_ms):
                    self.pacer.hold(conn, frame_map)  # a link's EVENTs: paused, not dropped
                    self.stats["links_paused"] += 1
                    peer.refusals.count("events_slowed", "over the link's EVENT rate: paused")
                    out.append(PauseReading(conn, stream, self.pacer.refilled_at(link, now_ms)))
                else:
                    self._control(peer, frame_map, now_ms, out)
            else:
                self._dedicated(peer, stream, frame_map, now_ms, out)
        return out

    def framing_failed(
        self, conn: int, stream: int, error: FramingError, now_ms: int
    ) -> list[Action]:
        """§13 #10: a broken stream closes its connection (with a GOODBYE saying why)."""
        peer = self.peers.get(conn)
        self.stats["framing_errors"] += 1
        if peer is None:
            return []
        log.info("conn %d: framing error on stream %d: %s", conn, stream, clip(error))
        out: list[Action] = []
        if peer.control is not None and peer.state is PeerState.CONNECTED:
            detail = f"framing error on stream {stream}: {error.detail}"
            out.append(self._goodbye(peer, "protocol_error", detail, now_ms))
        out.append(Close(conn, f"protocol_error: {error.reason}", after_ms=50))
        peer.state = PeerState.DRAINING  # nothing more from this connection is heard
        out += self._forget_peer(peer, now_ms)
        return out

    def resume(self, conn: int, now_ms: int) -> list[Action]:
        """``until_ms`` of a pause came: catch up, then resume reading (or pause again)."""
        frames = self.pacer.take(conn)
        peer = self.peers.get(conn)
        if frames is None or peer is None or peer.control is None:
            return []
        out = self.frames_received(conn, peer.control, frames, now_ms)
        if self.pacer.paused(conn):
            return out
        if self.pacer.take_end(conn):
            return out + self.stream_ended(conn, peer.control, now_ms)
        if peer.state is PeerState.CONNECTED:
            out.append(ResumeReading(conn, peer.control))
        return out

    def outbound_full(self, conn: int, stream: int, queued: int, now_ms: int) -> list[Action]:
        """``queued`` bytes unsent on ``stream``: over the bound on a control stream, the peer is
        a slow consumer, closed at once (its GOODBYE waits behind the backlog; NATS does so)."""
        peer = self.peers.get(conn)
        limit = self.policy.quotas.max_outbound_bytes
        if peer is None or peer.state is not PeerState.CONNECTED or stream != peer.control:
            return []
        if queued <= limit:
            return []
        self.stats["slow_consumers"] += 1
        log.info("conn %d: slow consumer, %d bytes queued", conn, queued)
        detail = f"more than {limit} bytes waiting to be sent to this connection"
        out: list[Action] = [self._goodbye(peer, "slow_consumer", detail, now_ms)]
        out.append(Close(conn, "slow_consumer"))
        peer.state = PeerState.DRAINING
        return out + self._forget_peer(peer, now_ms)

    def stream_ended(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        peer = self.peers.get(conn)
        if peer is None:
            return []
        if stream == peer.control and self.pacer.paused(conn):
            self.pacer.ended.add(conn)  # the end comes after the frames held
            return []
        peer.ignored_streams.discard(stream)
        if stream == peer.control:
            # The client closed its control stream: the session is over.
            peer.state = PeerState.DRAINING
            return [Close(conn, "control stream ended"), *self._forget_peer(peer, now_ms)]
        if stream in peer.content_streams:
            peer.finished_content.add(stream)
            if peer.content_streams[stream] == 0:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                return [EndStream(conn, stream)]
            return []
        return self.streams.leg_lost(
            conn, stream, "peer closed the stream before a terminal frame", now_ms
        )

    def stream_reset(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        peer = self.peers.get(conn)
        if peer is not None:
            if stream == peer.control and peer.state is not PeerState.DRAINING:
                return self.stream_ended(conn, stream, now_ms)  # the session is over
            peer.content_streams.pop(stream, None)
            peer.finished_content.discard(stream)
            peer.ignored_streams.discard(stream)
        return self.streams.leg_lost(conn, stream, "peer reset the stream", now_ms)

    def connection_lost(self, conn: int, now_ms: int) -> list[Action]:
        peer = self._remove(conn, now_ms)
        if peer is None:
            return []
        peer.state = PeerState.CLOSED
        return self._forget_peer(peer, now_ms)

    def _remove(self, conn: int, now_ms: int) -> Peer | None:
        """Take ``conn`` out of the peer table (its address slot and a last summary line)."""
        peer = self.peers.pop(conn, None)
        if peer is None:
            return None
        self.caps.release(peer.address)
        self._summarise(peer, now_ms, final=True)
        return peer

    def builtin_done(
        self, conn: int, stream: int, call: Call, outcome: Outcome, now_ms: int
    ) -> list[Action]:
        """Reply to a built-in CALL (or a house service's) with its ``Outcome``."""
        self.builtins_running[conn] -= 1
        if self.builtins_running[conn] <= 0:
            del self.builtins_running[conn]
        peer = self.peers.get(conn)
        if peer is None or peer.state is PeerState.CLOSED:
            return []
        out: list[Action] = []
        if outcome.code is not None:
            out.append(
                self._error(peer, stream, call.call_id, outcome.code, outcome.detail, now_ms)
            )
        else:
            out.append(
                Send(conn, stream, self.frames.result(call.call_id, outcome.payload, now_ms))
            )
        running = peer.content_streams.get(stream)
        if running is not None:
            peer.content_streams[stream] = running - 1
            if running == 1 and stream in peer.finished_content:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                out.append(EndStream(conn, stream))
        return out

    def tick(self, now_ms: int) -> list[Action]:
        """Timers: handshake timeouts, forwarded-call deadlines, route TTLs, replay cache,
        and the log's per-connection summaries of refused frames."""
        out: list[Action] = []
        for peer in list(self.peers.values()):
            if (
                peer.state is PeerState.HANDSHAKING
                and now_ms - peer.opened_ms > self.policy.handshake_timeout_ms
            ):
                out.append(Close(peer.conn, "handshake timeout"))
                self._remove(peer.conn, now_ms)
            else:
                self._summarise(peer, now_ms)
        line = self.caps.refused.summary(now_ms, self.policy.log_summary_ms)
        if line is not None:
            log.warning("connections %s", line)
        out += self.calls.expire(now_ms)
        out += self.streams.expire(now_ms)
        self.admission.prune(now_ms, self.node_conn)
        self.adverts.expire(now_ms)
        if self.realms.sweep_due(now_ms):
            out += self.sweep_realms(now_ms)
        return out

    # --- protected realms (relay.realms, issue 13) ------------------------------------------

    def _realm_refused(self, peer: Peer, frame: Frame, now_ms: int) -> bool:
        """SUBSCRIBE, PUBLISH, ADVERTISE (and a relayed EVENT) in a protected realm from a
        connection that may not act there: a counted drop."""
        if not isinstance(frame, (Subscribe, Publish, Advertise, Event)):
            return False
        if self.realms.allows(peer.conn, peer.is_station, frame.realm, now_ms):
            return False
        self._drop(peer, "realm_refused", f"{frame.FRAME_TYPE} in a protected realm")
        return True

    def _members_only(self, realm: bytes, actions: list[Action], now_ms: int) -> list[Action]:
        """What a declaration or an EVENT makes the station send in a protected realm goes
        only to connections allowed there (members, stations protecting it too)."""
        if not self.realms.protects(realm):
            return actions
        kept: list[Action] = []
        for action in actions:
            target = self.peers.get(action.conn) if isinstance(action, Send) else None
            if target is not None and not self.realms.allows(
                target.conn, target.is_station, realm, now_ms
            ):
                self.stats["realm_sends_withheld"] += 1
                continue
            kept.append(action)
        return kept

    def sweep_realms(self, now_ms: int) -> list[Action]:
        """End expired and revoked memberships; their advertisements in that realm go."""
        out: list[Action] = []
        for conn, realm in self.realms.sweep(now_ms):
            self.stats["realm_memberships_ended"] += 1
            for key in self.adverts.keys_for(conn):
                if key[0] == realm:
                    self.adverts.remove(key, now_ms + self.policy.advertise_tombstone_ms)
                    out += self.gossip.local_removed(key, now_ms)
        return out

    def shutdown(self, now_ms: int) -> list[Action]:
        self.stopping = True
        out: list[Action] = []
        for peer in list(self.peers.values()):
            if peer.state is PeerState.CONNECTED:
                out.append(self._goodbye(peer, "operator_stop", "station is shutting down", now_ms))
            out.append(Close(peer.conn, "station shutting down", after_ms=100))
            peer.state = PeerState.DRAINING
        return out

    # --- handshake (§5) -------------------------------------------------------------------

    def _handshake(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        if peer.control is None:
            peer.control = stream  # the first stream a peer sends on is its control stream
        elif stream != peer.control:
            self.stats["streams_before_connect"] += 1
            out.append(Close(peer.conn, "data on a second stream before CONNECT"))
            peer.state = PeerState.DRAINING
            return
        if frame_map.get("frame_type") != "connect":
            self.stats["dropped_before_connect"] += 1
            peer.refusals.count("dropped_before_connect", "frame before CONNECT")
            return
        try:
            connect = parse_frame(frame_map)
        except ProtocolError as exc:
            log.info("conn %d: malformed CONNECT: %s", peer.conn, clip(exc))
            out.append(Close(peer.conn, f"malformed CONNECT: {exc.detail}"))
            self._remove(peer.conn, now_ms)
            return
        assert isinstance(connect, Connect)
        refusal = self.admission.connect_refusal(connect, now_ms)
        if refusal is None:  # who may connect at all (relay.realm_admission)
            refusal = self._connect_refusal(peer, connect, now_ms)
        if refusal is None and self.stopping:
            # a client that reconnects while the station drains must not believe it is in
            refusal = (ErrorCode.TEMPORARY_RELAY_FAILURE, "station is shutting down")
        if refusal is None and connect.capabilities & CAP_STATION:
            refusal = self.admission.inbound_link_refusal(connect.node_id, self.peers.values())
            self.stats["inbound_links_refused"] += refusal is not None
        if refusal is not None:
            code, why = refusal
            log.info("conn %d: refused %s: %s", peer.conn, connect.node_id.hex()[:16], clip(why))
            self.stats["handshakes_refused"] += 1
            out.append(Send(peer.conn, stream, self.frames.hello(False, code, now_ms)))
            out.append(Close(peer.conn, f"handshake refused: {why}", after_ms=200))
            peer.state = PeerState.DRAINING
            self.realms.forget(peer.conn)
            return
        peer.node_id = connect.node_id
        peer.capabilities = connect.capabilities
        peer.state = PeerState.CONNECTED
        self.stats["handshakes"] += 1
        if peer.is_station:
            self.realms.declare_station(peer.conn, connect.realms)
            peer.dht_port = dht_port_of(connect.addresses)
            hello = self.frames.hello(True, None, now_ms, dht_port=self.dht_port)
            out.append(Send(peer.conn, stream, hello))
            self.linking.link_up(peer, now_ms, out)
            return
        out.append(Send(peer.conn, stream, self.frames.hello(True, None, now_ms)))
        older = self.node_conn.get(peer.node_id)
        self.node_conn[peer.node_id] = peer.conn
        if older is not None and older in self.peers:
            out += self._replace(self.peers[older], now_ms)

    def _connect_refusal(self, peer: Peer, connect: Connect, now_ms: int) -> tuple[int, str] | None:
        """Who may connect at all (``--admission``); a client's CONNECT ``endorsements``
        make it a member of the realms they endorse (relay.realms)."""
        members = 0
        if not connect.capabilities & CAP_STATION:
            members = self.realms.connect_members(peer.conn, connect, now_ms)
        return self.connect_rule.refusal(connect, members)

    def _station_linked(self, peer: Peer, now_ms: int, out: list[Action]) -> None:
        """The one place that runs when a link comes up, on either side: the peer station
        learns this station's clients' interest and adverts."""
        out += self.interest.station_linked(peer, now_ms)
        out += self._gossip_linked(peer, now_ms)

    def _replace(self, older: Peer, now_ms: int) -> list[Action]:
        """Same identity, newer handshake: the older connection is told and closed (§5.4)."""
        out: list[Action] = [
            self._goodbye(
                older, "replaced_by_newer_handshake", "a newer connection took over", now_ms
            ),
            Close(older.conn, "replaced by newer handshake", after_ms=self.policy.drain_ms),
        ]
        older.state = PeerState.DRAINING
        out += self._forget_peer(older, now_ms)
        return out

    # --- control stream -------------------------------------------------------------------

    def _control(
        self, peer: Peer, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        admitted = self._accept_received(peer, peer.control or 0, frame_map, now_ms, out)
        if admitted is None:
            return
        frame, body = admitted
        if isinstance(frame, Call):
            self._call(peer, peer.control or 0, frame, now_ms, out, builtins_only=False, body=body)
        elif isinstance(frame, (Result, Error)):
            out += self.calls.reply(peer, frame, body)
        elif isinstance(frame, DECLARATIONS):
            if self._realm_refused(peer, frame, now_ms):
                return
            out += self._members_only(
                frame.realm, self.interest.handle(peer, frame, now_ms), now_ms
            )
        elif isinstance(frame, Ping):
            out.append(Send(peer.conn, peer.control or 0, self.frames.pong(frame.nonce, now_ms)))
        elif isinstance(frame, Event):
            if peer.is_station and peer.linked:
                if self._realm_refused(peer, frame, now_ms):
                    return
                relayed = self.interest.relayed_event(peer, frame, now_ms)
                out += self._members_only(frame.realm, relayed, now_ms)
            else:
                self._drop(peer, "event_from_client", "EVENT from a peer without the station bit")
        elif isinstance(frame, Goodbye):
            self.stats["goodbyes_received"] += 1
        else:
            self._drop(peer, "misplaced_frame", f"{frame.FRAME_TYPE} on the control stream")

    def _accept(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> Frame | None:
        """The frame if admitted (§4.3, §13 #1, #10); else count it and answer a CALL."""
        admitted = self._accept_received(peer, stream, frame_map, now_ms, out)
        return None if admitted is None else admitted.frame

    def _accept_received(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> Admitted | None:
        """``_accept``, with the received body when canonical (what a relay sends on)."""
        admission = self.admission
        verdict = admission.admit_received(frame_map, peer.node_id, now_ms, station=peer.is_station)
        if not isinstance(verdict, Rejected):
            return verdict
        self._drop(peer, verdict.counter, verdict.why or verdict.counter)
        if verdict.call_id is not None:
            code, detail = verdict.code, verdict.detail
            out.append(self._error(peer, stream, verdict.call_id, code, detail, now_ms))
        return None

    # --- RPC (§6) ---------------------------------------------------------------------------

    def _call(
        self,
        peer: Peer,
        stream: int,
        call: Call,
        now_ms: int,
        out: list[Action],
        *,
        builtins_only: bool,
        body: bytes | None = None,
    ) -> None:
        refusal = self._call_refusal(peer, call, now_ms)
        if refusal is not None:
            code, detail = refusal
            out.append(self._error(peer, stream, call.call_id, code, detail.encode(), now_ms))
            return
        if call.procedure in BUILTINS:
            self.stats["builtin_calls"] += 1
            if stream in peer.content_streams:
                peer.content_streams[stream] += 1
            self.builtins_running[peer.conn] += 1  # counts as pending until builtin_done
            ping = call.procedure == "_relay.ping"
            out.append(
                RunBuiltin(peer.conn, stream, call, self.refusals_of(peer.conn) if ping else ())
            )
            return
        if not builtins_only and (call.realm, call.procedure) in self.services:
            self.stats["service_calls"] += 1
            self.builtins_running[peer.conn] += 1
            out.append(RunBuiltin(peer.conn, stream, call))  # a house service: same path
            return
        if builtins_only:
            out += self.calls.no_route(peer, stream, call, now_ms)
        else:
            out += self.calls.forward(peer, stream, call, now_ms, body)

    def _call_refusal(self, peer: Peer, call: Call, now_ms: int) -> tuple[int, str] | None:
        quotas = self.policy.quotas
        # over a link the caller is whoever signed the CALL (admission verified it)
        if call.caller != peer.node_id and not peer.is_station:
            return ErrorCode.SIGNATURE_INVALID, "caller is not this connection's identity"
        hops = hops_refusal(call.procedure, call.payload, from_station=peer.is_station)
        if hops is not None:
            self.stats["hops_refused"] += 1
            return ErrorCode.UNKNOWN_ERROR, hops
        if not peer.call_bucket.take(now_ms):
            self.stats["calls_rate_limited"] += 1
            return ErrorCode.UPSTREAM_CONGESTION, f"call rate above {quotas.call_rate:g}/s"
        if call.deadline_ms <= now_ms:
            return ErrorCode.EXPIRY_TOO_SOON, "deadline_ms has already passed"
        in_flight = self.pending.in_flight_for(peer.conn) + self.builtins_running[peer.conn]
        limit = quotas.max_station_pending_calls if peer.is_station else quotas.max_pending_calls
        if in_flight >= limit:
            return ErrorCode.UPSTREAM_CONGESTION, (
                f"more than {limit} calls in flight on this connection"
            )
        if call.procedure not in BUILTINS and not self.realms.allows(
            peer.conn, peer.is_station, call.realm, now_ms
        ):
            self.stats["realm_calls_refused"] += 1
            return ErrorCode.TARGET_REALM_REFUSED, "not a member of this protected realm"
        return None

    # --- federation: this station's own CALLs and its adverts on a new link ------------------

    def call_station(
        self,
        node_id: bytes,
        procedure: str,
        payload: Any,
        deadline_ms: int,
        now_ms: int,
        *,
        realm: bytes = bytes(32),
    ) -> tuple[bytes, list[Action]]:
        """A CALL signed by this station on the link to station ``node_id``: its call_id, and
        the Send. It settles as one ``StationReplied`` (``ok`` False for an unknown link, the
        link's loss, the deadline passing, or over ``max_station_calls`` in flight)."""
        call_id = self._random(16)
        conn = self.node_conn.get(node_id)
        link = self.peers.get(conn) if conn is not None else None
        if link is None or not link.is_station or link.state is not PeerState.CONNECTED:
            code = ErrorCode.UNKNOWN_NEXT_PEER
            return call_id, [StationReplied(call_id, False, "no link to that station", code)]
        limit = self.policy.max_station_calls
        if self.pending.in_flight_for(ORIGIN) >= limit:
            detail = f"more than {limit} station calls in flight"
            return call_id, [StationReplied(call_id, False, detail, ErrorCode.UPSTREAM_CONGESTION)]
        call = Call(
            **self.frames.stamp(now_ms),
            call_id=call_id,
            procedure=procedure,
            realm=realm,
            payload=payload,
            deadline_ms=deadline_ms,
            caller=self.identity.node_id,
        )
        return call_id, self.calls.originate(link, call, now_ms)

    def linked_stations(self) -> list[bytes]:
        """The node ids of the stations linked now (CONNECTED station peers)."""
        return [
            p.node_id
            for p in self.peers.values()
            if p.is_station and p.state is PeerState.CONNECTED
        ]

    def _gossip_linked(self, peer: Peer, now_ms: int) -> list[Action]:
        """A station peer's link came up: it is told the procedures our clients serve."""
        return self.gossip.station_linked(peer, now_ms)

    # --- dedicated streams (§6.3, §8) ---------------------------------------------------------

    def _dedicated(
        self, peer: Peer, stream: int, frame_map: dict[str, Any], now_ms: int, out: list[Action]
    ) -> None:
        if stream in peer.ignored_streams:
            return
        route = self.routes.by_leg(peer.conn, stream)
        if route is not None:
            relayed = self._accept(peer, stream, frame_map, now_ms, out)
            if relayed is not None:
                out += self.streams.relay(peer, stream, route, relayed, now_ms)
            return
        if stream not in peer.content_streams:
            quotas = self.policy.quotas
            limit = quotas.max_station_streams if peer.is_station else quotas.max_streams
            if len(peer.content_streams) + self.routes.count_for(peer.conn) >= limit:
                self._drop(peer, "stream_quota", "dedicated stream quota reached")
                msg = b"too many streams on this connection"
                out += self.streams.refuse(peer, stream, frame_map, b"quota_exceeded", msg, now_ms)
                return
            kind = frame_map.get("frame_type")
            if kind == "stream_open":
                opened = self._accept(peer, stream, frame_map, now_ms, out)
                if isinstance(opened, StreamOpen) and not self.realms.allows(
                    peer.conn, peer.is_station, opened.realm, now_ms
                ):  # stream RPC in a protected realm: members only, as CALL
                    self._drop(peer, "realm_refused", "stream_open in a protected realm")
                    msg = b"not a member of this protected realm"
                    code = b"target_realm_refused"
                    out += self.streams.refuse(peer, stream, frame_map, code, msg, now_ms)
                    return
                out += self.streams.open_route(peer, stream, opened, frame_map, now_ms)
                return
            if kind != "call":
                peer.ignored_streams.add(stream)  # §1.3: no route for such a stream
                self.stats["streams_ignored"] += 1
                return
            peer.content_streams[stream] = 0
        frame = self._accept(peer, stream, frame_map, now_ms, out)
        if isinstance(frame, Call):
            self._call(peer, stream, frame, now_ms, out, builtins_only=True)
        elif frame is not None:
            self._drop(peer, "misplaced_frame", f"{frame.FRAME_TYPE} on a content stream")

    # --- cleanup -----------------------------------------------------------------------------

    def _forget_peer(self, peer: Peer, now_ms: int) -> list[Action]:
        """Purge what a closing (or replaced) connection owned (§6.1, §7.5, §8.4)."""
        out: list[Action] = []
        out += self.interest.release_adverts(peer.conn, now_ms)
        out += self.calls.forget_conn(peer.conn, now_ms)
        out += self.streams.forget_conn(peer.conn, now_ms)
        self.pacer.forget(peer.conn)
        self.realms.forget(peer.conn)
        if peer.node_id and self.node_conn.get(peer.node_id) == peer.conn:
            del self.node_conn[peer.node_id]
            out += self.interest.purge_subscriptions(peer, now_ms)
        if peer.linked:
            peer.linked = False
            self.stats["links_down"] += 1
            out.append(LinkDown(peer.conn, peer.node_id))
        return out

    # --- replies and drops -------------------------------------------------------------------

    def _error(
        self, peer: Peer, stream: int, call_id: bytes, code: int, detail: bytes | None, now_ms: int
    ) -> Send:
        return self.frames.error(peer.conn, stream, call_id, code, detail, now_ms)

    def _goodbye(self, peer: Peer, reason: str, detail: str, now_ms: int) -> Send:
        return self.frames.goodbye(peer.conn, peer.control or 0, reason, detail, now_ms)

    def _serves_itself(self, key: ProcedureKey) -> bool:
        """A built-in procedure, or a house service this station runs: never advertised."""
        return key[1] in BUILTINS or key in self.services

    def _count(self, counter: str, n: int = 1, /) -> None:
        self.stats[counter] += n

    def _drop(self, peer: Peer, counter: str, why: str) -> None:
        """Count a refused frame, station-wide and on its connection; no log line of its own."""
        self.stats[counter] += 1
        self.refused[counter] += 1
        peer.refusals.count(counter, why)

    def refusals_of(self, conn: int) -> tuple[tuple[str, int], ...]:
        """What this connection had refused without an in-band answer, sorted by name."""
        peer = self.peers.get(conn)
        return () if peer is None else tuple(sorted(peer.refusals.counts.items()))

    def _summarise(self, peer: Peer, now_ms: int, *, final: bool = False) -> None:
        line = peer.refusals.summary(now_ms, self.policy.log_summary_ms, final=final)
        if line is not None:
            who = peer.node_id.hex()[:16] or peer.address or "?"
            log.info("conn %d (%s): %s", peer.conn, who, line)
