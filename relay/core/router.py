"""The station's routing core (PROTOCOL.md §5-§8), sans-I/O.

``RouterCore`` is fed decoded frame maps with the connection and stream they arrived on and the
current time, and answers with actions (``relay.core.actions``: send these bytes, end that stream,
close that connection, run that built-in). The QUIC shell (``relay.station.station``) only moves
bytes.
State lives in small tables (``StationSubscriptions``, ``AdvertTable``, ``PendingCalls``,
``RouteTable``); helpers it owns apply one part of the protocol each (``CallForwarder``,
``StreamRelay``, ``InterestRouter``: ADVERTISE, SUBSCRIBE, PUBLISH). Rules:
- handshake (§5, ``ConnectHandling``): the first CONNECT, verified against its ``node_id``,
  makes its stream the control stream; the newest connection of a node id wins;
- every frame after that is parsed and verified per §4.3 before it touches any state (on a
  connection bound to this station, issue 27: its claimed signer compared with the connection's
  node id instead, ``relay.core.admission``; verified before it crosses a link), and the
  §13 weaknesses an honest client cannot notice are closed: replayed frame ids and skewed clocks
  (#1), CALL/STREAM_OPEN ``caller`` must be the connection (#2), replies only from the
  connection a CALL was forwarded to (#3), foreign declarations refused (#5-#7, a bad
  ``publisher_sig`` too: ``relay.core.interest``), EVENT only from stations (#8), expired deadlines
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
  connection's summary (``relay.core.logbook.Refusals``: at most one line per ``log_summary_ms``,
  driven by ``tick``);
- backpressure, not loss (``relay.core.pacing``): a PUBLISH over its connection's rate pauses that
  control stream (``PauseReading``) instead of being dropped, and ``resume`` catches up (an
  EVENT over its link's ``station_event_rate`` pauses that link the same way); a
  connection with more than ``quotas.max_outbound_bytes`` unsent on its control stream
  (``outbound_full``) is a slow consumer: GOODBYE ``slow_consumer``, closed at once;
- station links (docs/federation.md): dialled (``dial``) or accepted, a link comes up in
  ``LinkHandshake.link_up`` (``LinkUp`` once; ``forget_peer`` the matching ``LinkDown``); an
  EVENT is taken from a station peer only, and goes to local clients only.
Its parts are built here over exactly the tables and hooks each needs (none holds the core):
``ConnectHandling`` (CONNECT, HELLO, dialling, links coming up), ``CallHandling`` (CALLs,
built-ins, this station's own CALLs), ``StreamHandling`` (dedicated streams), ``RealmRouting``
(protected realms). A part returns its actions; only ``frames_received`` gathers them, one
method call per frame. Hooks and data from the shell are constructor parameters, never
assigned afterwards (tests/unit/test_relay_shape.py); a reload goes through ``reconfigure``.
Nothing here or below does I/O (pyproject.toml's import contract).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from macula.services.refusals import (
    EVENTS_SLOWED,
    MISPLACED_FRAME,
    PUBLISH_SLOWED,
    REALM_RESULT_UNVOUCHED,
)
from macula.wire.errors import FramingError
from macula.wire.frames import Call, Error, Event, Goodbye, Ping, Result
from macula.wire.identity import Identity
from relay.builtins.outcome import Outcome
from relay.core.actions import Action, Close, LinkDown, PauseReading, ResumeReading, Send
from relay.core.admission import Admitted, FrameAdmission, Rejected
from relay.core.adverts import AdvertTable
from relay.core.call_forwarding import CallForwarder
from relay.core.calls import BUILTINS, CallHandling
from relay.core.connection_caps import ConnectionCaps
from relay.core.connects import ConnectHandling
from relay.core.frames import StationFrames
from relay.core.interest import DECLARATIONS, InterestRouter, PublishHook
from relay.core.logbook import clip
from relay.core.pacing import PublishPacer
from relay.core.peers import Peer, PeerState, accepted_peer
from relay.core.pending import PendingCalls
from relay.core.policy import StationPolicy, restart_only_changes
from relay.core.routes import RouteTable
from relay.core.stream_relay import StreamRelay
from relay.core.streams import StreamHandling
from relay.core.subscriptions import StationSubscriptions
from relay.federation.dedup import RelayedEventDedup
from relay.federation.gossip import AdvertGossip
from relay.federation.interest import StationInterest
from relay.realms.admission import ConnectRule
from relay.realms.gate import RealmGate
from relay.realms.links import RealmCalls
from relay.realms.routing import RealmRouting

__all__ = ["BUILTINS", "RouterCore"]

log = logging.getLogger("macula.relay")

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
        station_endorsements: Iterable[dict[str, Any]] = (),
        published: PublishHook | None = None,
    ) -> None:
        """``services``: (realm, procedure) served by the station itself (house services);
        ``realms``: the protected realms (issue 13); ``connect_rule``: who may connect at all;
        ``station_endorsements``: the RPC forms this station presents on its links
        (relay.realms.links); ``published``: told every PUBLISH accepted (the room history)."""
        self.identity = identity
        self.policy = policy
        self.realms = RealmGate() if realms is None else realms
        # peer stations learn what this one protects, and its endorsements
        self.frames = StationFrames(
            identity, random_bytes, realms=self.realms.tags, endorsements=station_endorsements
        )
        self.random_bytes = random_bytes
        self.peers: dict[int, Peer] = {}
        self.node_conn: dict[bytes, int] = {}
        self.subscriptions = StationSubscriptions()
        self.adverts = AdvertTable()
        self.pending = PendingCalls()
        self.routes = RouteTable()
        self.admission = FrameAdmission(policy)
        self.connect_rule = ConnectRule() if connect_rule is None else connect_rule
        self.realm_calls = RealmCalls()  # protected realms' CALLs out on links (relay.realms.links)
        self.stats: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()  # what ``drop`` counted (relay.monitor.figures)
        self.pacer = PublishPacer()
        self.caps = ConnectionCaps(policy.max_connections, policy.max_connections_per_address)
        self.gossip = AdvertGossip(
            self.peers,
            self.adverts,
            self.frames,
            max_station_advertisements=policy.quotas.max_station_advertisements,
        )
        self._call_parts(open_stream, random_bytes, services)
        self.interest = self._interest_router(published)
        self._handling_parts(open_stream)

    def _call_parts(
        self,
        open_stream: Callable[[int], int],
        random_bytes: Callable[[int], bytes],
        services: frozenset[tuple[bytes, str]],
    ) -> None:
        """The parts that route CALLs and relay stream RPC."""
        policy = self.policy
        self.streams = StreamRelay(
            self.peers,
            self.gossip,
            self.routes,
            self.frames,
            route_ttl_ms=policy.stream_route_ttl_ms,
            open_stream=open_stream,
            drop=self.drop,
            count=self.count,
        )
        self.calls = CallForwarder(
            self.peers,
            self.gossip,
            self.pending,
            self.frames,
            forward_slot_ms=policy.forward_slot_ms,
            drop=self.drop,
            count=self.count,
        )
        self.call_handling = CallHandling(
            self.identity.node_id,
            self.peers,
            self.node_conn,
            self.pending,
            self.frames,
            policy=policy,
            services=services,
            realms=self.realms,
            gossip=self.gossip,
            calls=self.calls,
            realm_calls=self.realm_calls,
            stats=self.stats,
            random_bytes=random_bytes,
            refusals_of=self.refusals_of,
        )

    def _interest_router(self, published: PublishHook | None) -> InterestRouter:
        """ADVERTISE, SUBSCRIBE, PUBLISH (relay.core.interest), and EVENTs across links."""
        policy = self.policy
        federation = StationInterest(
            self.peers,
            self.node_conn,
            self.subscriptions,
            self.frames,
            dedup=RelayedEventDedup(policy.relayed_event_dedup_ms, policy.max_relayed_event_ids),
            drop=self.drop,
            count=self.count,
            event_rate=policy.quotas.station_event_rate,
            event_burst=policy.quotas.station_event_burst,
            protects=self.realms.protects,
        )
        return InterestRouter(
            self.peers,
            self.node_conn,
            self.adverts,
            self.subscriptions,
            self.frames,
            quotas=policy.quotas,
            tombstone_ms=policy.advertise_tombstone_ms,
            station_serves=self.call_handling.serves_itself,
            drop=self.drop,
            count=self.count,
            gossip=self.gossip,
            published=published,
            federation=federation,
        )

    def _handling_parts(self, open_stream: Callable[[int], int]) -> None:
        """The parts that handle CONNECT/HELLO, dedicated streams and protected realms."""
        policy = self.policy
        self.connect_handling = ConnectHandling(
            self.identity.node_id,
            self.peers,
            self.node_conn,
            self.frames,
            self.admission,
            policy=policy,
            connect_rule=self.connect_rule,
            realms=self.realms,
            interest=self.interest,
            gossip=self.gossip,
            stats=self.stats,
            open_stream=open_stream,
            remove=self.remove,
            forget=self.forget_peer,
            vouch=self.call_handling.vouch,
            drop=self.drop,
            count=self.count,
        )
        self.stream_handling = StreamHandling(
            self.peers,
            self.routes,
            self.streams,
            self.call_handling,
            policy=policy,
            realms=self.realms,
            pacer=self.pacer,
            stats=self.stats,
            admit=self.admit,
            refused=self.refused,
            drop=self.drop,
            forget=self.forget_peer,
        )
        self.realm_routing = RealmRouting(
            self.peers,
            self.adverts,
            self.realms,
            gossip=self.gossip,
            interest=self.interest,
            tombstone_ms=policy.advertise_tombstone_ms,
            stats=self.stats,
            drop=self.drop,
        )

    # --- what the parts own, as the shell and the tests read it ----------------------------

    @property
    def stopping(self) -> bool:
        """After ``shutdown``: new handshakes are refused, retryably; nothing is dialled."""
        return self.connect_handling.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.connect_handling.stopping = value

    @property
    def services(self) -> frozenset[tuple[bytes, str]]:
        """(realm, procedure) served by the station itself (house services)."""
        return self.call_handling.services

    @services.setter
    def services(self, value: frozenset[tuple[bytes, str]]) -> None:
        self.call_handling.services = value

    @property
    def builtins_running(self) -> Counter[int]:
        """conn -> built-in and house calls in flight (``CallHandling``'s)."""
        return self.call_handling.builtins_running

    def reconfigure(self, policy: StationPolicy) -> None:
        """Run under ``policy`` from now on (a reload, relay.ops.reload): the per-connection quotas
        (every open connection's token buckets take the new rates and keep their tokens, so
        no client is dropped), the realms' sweep interval, and what admission reads per frame.
        ``ValueError`` (nothing changed) if it changes what the parts were built with."""
        fixed = restart_only_changes(self.policy, policy)
        if fixed:
            raise ValueError(f"needs a restart, not a reconfigure: {', '.join(fixed)}")
        quotas = policy.quotas
        self.policy = self.admission.policy = policy
        self.connect_handling.policy = self.call_handling.policy = policy
        self.stream_handling.policy = policy
        self.interest.set_quotas(quotas)
        self.realms.sweep_ms = policy.realm_sweep_ms
        for peer in self.peers.values():  # open connections keep their tokens: none dropped
            peer.retune(quotas)

    # --- entry points ---------------------------------------------------------------------

    def connection_made(self, conn: int, now_ms: int, address: str = "") -> list[Action]:
        """A new connection from ``address``; closed at once if it is over a connection cap."""
        refusal = self.caps.refusal(len(self.peers), address)
        if refusal is not None:
            counter, why = refusal
            self.stats[counter] += 1
            return [Close(conn, why)]
        self.peers[conn] = accepted_peer(conn, address, self.policy.quotas, now_ms)
        return []

    def dial(self, conn: int, expected_node_id: bytes, now_ms: int, host: str = "") -> list[Action]:
        """A connection this station opened to station ``expected_node_id`` (at ``host``):
        CONNECT with the station bit on a new control stream; the link is up at its HELLO."""
        return self.connect_handling.dial(conn, expected_node_id, now_ms, host)

    def dht_started(self, port: int) -> None:
        """This station's DHT listens on UDP ``port``: told to peer stations from now on."""
        self.connect_handling.dht_port = port

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
            if peer.state is PeerState.HANDSHAKING:
                out += self.connect_handling.handshake(peer, stream, frame_map, now_ms)
            elif stream != peer.control:
                out += self.stream_handling.dedicated(peer, stream, frame_map, now_ms)
            elif self.pacer.paused(conn):
                self.pacer.hold(conn, frame_map)  # order is kept
            elif self.pacer.over_rate(peer.publish_bucket, frame_map, now_ms):
                self.pacer.hold(conn, frame_map)
                self.stats["publishers_paused"] += 1
                peer.refusals.count(PUBLISH_SLOWED, "over the publish rate: paused")
                until_ms = self.pacer.refilled_at(peer.publish_bucket, now_ms)
                out.append(PauseReading(conn, stream, until_ms))
            elif link := self.interest.federation.events_over_rate(peer, frame_map, now_ms):
                self.pacer.hold(conn, frame_map)  # a link's EVENTs: paused, not dropped
                self.stats["links_paused"] += 1
                peer.refusals.count(EVENTS_SLOWED, "over the link's EVENT rate: paused")
                out.append(PauseReading(conn, stream, self.pacer.refilled_at(link, now_ms)))
            else:
                out += self._control(peer, frame_map, now_ms)
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
            out.append(self.goodbye(peer, "protocol_error", detail, now_ms))
        out.append(Close(conn, f"protocol_error: {error.reason}", after_ms=50))
        peer.state = PeerState.DRAINING  # nothing more from this connection is heard
        out += self.forget_peer(peer, now_ms)
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
        out: list[Action] = [self.goodbye(peer, "slow_consumer", detail, now_ms)]
        out.append(Close(conn, "slow_consumer"))
        peer.state = PeerState.DRAINING
        return out + self.forget_peer(peer, now_ms)

    def stream_ended(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        return self.stream_handling.stream_ended(conn, stream, now_ms)

    def stream_reset(self, conn: int, stream: int, now_ms: int) -> list[Action]:
        return self.stream_handling.stream_reset(conn, stream, now_ms)

    def connection_lost(self, conn: int, now_ms: int) -> list[Action]:
        peer = self.remove(conn, now_ms)
        if peer is None:
            return []
        peer.state = PeerState.CLOSED
        return self.forget_peer(peer, now_ms)

    def remove(self, conn: int, now_ms: int) -> Peer | None:
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
        return self.call_handling.builtin_done(conn, stream, call, outcome, now_ms)

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
                self.remove(peer.conn, now_ms)
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

    def sweep_realms(self, now_ms: int) -> list[Action]:
        """End expired and revoked memberships; their advertisements in that realm go."""
        return self.realm_routing.sweep(now_ms)

    def shutdown(self, now_ms: int) -> list[Action]:
        self.stopping = True
        out: list[Action] = []
        for peer in list(self.peers.values()):
            if peer.state is PeerState.CONNECTED:
                out.append(self.goodbye(peer, "operator_stop", "station is shutting down", now_ms))
            out.append(Close(peer.conn, "station shutting down", after_ms=100))
            peer.state = PeerState.DRAINING
        return out

    # --- control stream -------------------------------------------------------------------

    def _control(self, peer: Peer, frame_map: dict[str, Any], now_ms: int) -> list[Action]:
        verdict = self.admit(peer, frame_map, now_ms)
        if isinstance(verdict, Rejected):
            return self.refused(peer, peer.control or 0, verdict, now_ms)
        frame, body = verdict
        if isinstance(frame, Call):
            control = peer.control or 0
            calls = self.call_handling
            return calls.call(peer, control, frame, now_ms, builtins_only=False, body=body)
        if isinstance(frame, (Result, Error)):
            if isinstance(frame, Result) and self.realm_calls.refused(
                self.realms, peer, frame, now_ms
            ):  # a protected realm's CALL answered over a link by a non-member
                self.drop(peer, REALM_RESULT_UNVOUCHED, "answered by a non-member")
                return []
            return self.calls.reply(peer, frame, body)
        if isinstance(frame, DECLARATIONS):
            if self.realm_routing.realm_refused(peer, frame, now_ms):
                return []
            sent = self.interest.handle(peer, frame, now_ms)
            return self.realm_routing.members_only(frame.realm, sent, now_ms)
        if isinstance(frame, Ping):
            return [Send(peer.conn, peer.control or 0, self.frames.pong(frame.nonce, now_ms))]
        if isinstance(frame, Event):
            return self.realm_routing.relayed_event(peer, frame, now_ms)
        if isinstance(frame, Goodbye):
            self.stats["goodbyes_received"] += 1
        else:
            self.drop(peer, MISPLACED_FRAME, f"{frame.FRAME_TYPE} on the control stream")
        return []

    def admit(self, peer: Peer, frame_map: dict[str, Any], now_ms: int) -> Admitted | Rejected:
        """Parse and verify a frame from ``peer`` before it touches any state (§4.3, §13 #1,
        #10); a ``Rejected`` one goes to ``refused``."""
        station, bound = peer.is_station, peer.bound
        return self.admission.admit_received(
            frame_map, peer.node_id, now_ms, station=station, bound=bound
        )

    def refused(self, peer: Peer, stream: int, verdict: Rejected, now_ms: int) -> list[Action]:
        """A frame ``admit`` rejected: counted; a CALL is answered on ``stream``."""
        self.drop(peer, verdict.counter, verdict.why or verdict.counter)
        if verdict.call_id is None:
            return []
        code, detail = verdict.code, verdict.detail
        return [self.frames.error(peer.conn, stream, verdict.call_id, code, detail, now_ms)]

    # --- federation: this station's own CALLs, links -----------------------------------------

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
        calls = self.call_handling
        return calls.call_station(node_id, procedure, payload, deadline_ms, now_ms, realm)

    def linked_stations(self) -> list[bytes]:
        """The node ids of the stations linked now (CONNECTED station peers)."""
        return [
            p.node_id
            for p in self.peers.values()
            if p.is_station and p.state is PeerState.CONNECTED
        ]

    # --- cleanup -----------------------------------------------------------------------------

    def forget_peer(self, peer: Peer, now_ms: int) -> list[Action]:
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

    # --- replies and drops (for the handler modules too) ---------------------------------------

    def goodbye(self, peer: Peer, reason: str, detail: str, now_ms: int) -> Send:
        return self.frames.goodbye(peer.conn, peer.control or 0, reason, detail, now_ms)

    def count(self, counter: str, n: int = 1, /) -> None:
        self.stats[counter] += n

    def drop(self, peer: Peer, counter: str, why: str) -> None:
        """Count a refused frame, station-wide and on its connection; no log line of its own."""
        self.stats[counter] += 1
        self.refusals[counter] += 1
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
