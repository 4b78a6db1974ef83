"""CALL routing (PROTOCOL.md §6), a part of ``RouterCore``: checks, built-ins, house services,
forwarding, this station's own CALLs on its links, and vouching for members (issue 26).

Sans-I/O, as the core, which builds one ``CallHandling`` over its own tables; each method
returns its actions (the core's one convention). It owns ``builtins_running`` (built-in and
house calls in flight, per connection) and ``services``. Rules:
- a CALL is checked before anything runs (``call_refusal``): ``caller`` must be the connection
  (§13 #2; over a link, whoever signed it), a content get's ``hops_remaining`` as
  ``relay.federation.content_hops`` says, the connection's call rate, the deadline not passed
  (§13 #9), at most ``max_pending_calls`` in flight (``max_station_pending_calls`` for a link),
  and in a protected realm: members only (a link: callers it vouched for); a refusal is an
  ERROR on the CALL's stream;
- ``_realm.vouch`` from a link is answered here; ``_mesh.stations`` from a link, signed by the
  linked station itself, is the shell's to answer (``RunBuiltin``, ``relay.station.links``);
  from anyone else it is an ordinary procedure (no provider: "no route"); a built-in
  (``BUILTINS``) or a house service of this station becomes ``RunBuiltin`` and counts as in
  flight until ``builtin_done``; a content stream carries built-ins only; anything else is
  forwarded to its provider (``CallForwarder``) or answered "no route";
- ``call_station`` signs a CALL of this station's own on a link; it settles as one
  ``StationReplied``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from macula.realm.records import Endorsement
from macula.wire.codes import ErrorCode
from macula.wire.frames import Call
from relay.builtins.outcome import Outcome
from relay.core.actions import Action, EndStream, RunBuiltin, Send, StationReplied
from relay.core.adverts import ProcedureKey
from relay.core.call_forwarding import CallForwarder
from relay.core.frames import StationFrames
from relay.core.peers import Peer, PeerState
from relay.core.pending import ORIGIN, PendingCalls
from relay.core.policy import StationPolicy
from relay.federation.content_hops import hops_refusal
from relay.federation.gossip import AdvertGossip
from relay.federation.mesh_roster import MESH_PROCEDURE
from relay.realms.gate import RealmGate
from relay.realms.links import (
    VOUCH_DEADLINE_MS,
    VOUCH_PROCEDURE,
    RealmCalls,
    provider_allowed,
    unvouched,
    vouch_actions,
)

__all__ = ["BUILTINS", "CallHandling"]

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


class CallHandling:
    def __init__(
        self,
        station_id: bytes,
        peers: dict[int, Peer],
        node_conn: dict[bytes, int],
        pending: PendingCalls,
        frames: StationFrames,
        *,
        policy: StationPolicy,
        services: frozenset[tuple[bytes, str]],
        realms: RealmGate,
        gossip: AdvertGossip,
        calls: CallForwarder,
        realm_calls: RealmCalls,
        stats: Counter[str],
        random_bytes: Callable[[int], bytes],
        refusals_of: Callable[[int], tuple[tuple[str, int], ...]],
    ) -> None:
        self.policy = policy  # replaced by ``RouterCore.reconfigure``
        self.services = services  # (realm, procedure) the station serves itself (house)
        self.builtins_running: Counter[int] = Counter()  # conn -> built-in/house calls
        self._station_id = station_id
        self._peers = peers
        self._node_conn = node_conn
        self._pending = pending
        self._frames = frames
        self._realms = realms
        self._gossip = gossip
        self._calls = calls
        self._realm_calls = realm_calls
        self._stats = stats
        self._random_bytes = random_bytes
        self._refusals_of = refusals_of

    def serves_itself(self, key: ProcedureKey) -> bool:
        """A built-in procedure, or a house service this station runs: never advertised."""
        return key[1] in BUILTINS or key in self.services

    def call(
        self,
        peer: Peer,
        stream: int,
        frame: Call,
        now_ms: int,
        *,
        builtins_only: bool,
        body: bytes | None = None,
    ) -> list[Action]:
        """A verified CALL from ``peer`` on ``stream`` (its control stream, or a content stream:
        ``builtins_only``); ``body``: the received bytes when canonical (what a relay sends
        on)."""
        refusal = self.call_refusal(peer, frame, now_ms)
        if refusal is not None:
            code, detail = refusal
            return [self._error(peer, stream, frame.call_id, code, detail.encode(), now_ms)]
        stats, running = self._stats, self.builtins_running
        if frame.procedure == VOUCH_PROCEDURE and peer.is_station and peer.linked:
            payload = frame.payload if isinstance(frame.payload, dict) else {}
            answer = self._realms.take_vouches(peer.conn, payload.get("endorsements"), now_ms)
            stats["realm_members_vouched"] += answer["kept"]
            return [Send(peer.conn, stream, self._frames.result(frame.call_id, answer, now_ms))]
        if frame.procedure == MESH_PROCEDURE and _from_link_itself(peer, frame, builtins_only):
            running[peer.conn] += 1  # answered by the shell, then builtin_done
            return [RunBuiltin(peer.conn, stream, frame)]
        if frame.procedure in BUILTINS:
            stats["builtin_calls"] += 1
            if stream in peer.content_streams:
                peer.content_streams[stream] += 1
            running[peer.conn] += 1  # counts as pending until builtin_done
            refusals = self._refusals_of(peer.conn) if frame.procedure == "_relay.ping" else ()
            return [RunBuiltin(peer.conn, stream, frame, refusals)]
        if not builtins_only and (frame.realm, frame.procedure) in self.services:
            stats["service_calls"] += 1
            running[peer.conn] += 1
            return [RunBuiltin(peer.conn, stream, frame)]  # a house service: same path
        realms, gossip = self._realms, self._gossip
        if builtins_only or not provider_allowed(gossip, realms, peer, frame, now_ms):
            return self._calls.no_route(peer, stream, frame, now_ms)
        out = self._calls.forward(peer, stream, frame, now_ms, body)
        self._realm_calls.forwarded(gossip, realms, peer, frame, now_ms)
        return out

    def call_refusal(self, peer: Peer, frame: Call, now_ms: int) -> tuple[int, str] | None:
        """Why this CALL is refused (a §9 code and a detail), or None."""
        quotas = self.policy.quotas
        # over a link the caller is whoever signed the CALL (admission verified it)
        if frame.caller != peer.node_id and not peer.is_station:
            return ErrorCode.SIGNATURE_INVALID, "caller is not this connection's identity"
        hops = hops_refusal(frame.procedure, frame.payload, from_station=peer.is_station)
        if hops is not None:
            self._stats["hops_refused"] += 1
            return ErrorCode.UNKNOWN_ERROR, hops
        if not peer.call_bucket.take(now_ms):
            self._stats["calls_rate_limited"] += 1
            return ErrorCode.UPSTREAM_CONGESTION, f"call rate above {quotas.call_rate:g}/s"
        if frame.deadline_ms <= now_ms:
            return ErrorCode.EXPIRY_TOO_SOON, "deadline_ms has already passed"
        in_flight = self._pending.in_flight_for(peer.conn) + self.builtins_running[peer.conn]
        limit = quotas.max_station_pending_calls if peer.is_station else quotas.max_pending_calls
        if in_flight >= limit:
            return ErrorCode.UPSTREAM_CONGESTION, (
                f"more than {limit} calls in flight on this connection"
            )
        if frame.procedure not in BUILTINS and not self._realms.allows(
            peer.conn, peer.is_station, frame.realm, now_ms
        ):
            self._stats["realm_calls_refused"] += 1
            return ErrorCode.TARGET_REALM_REFUSED, "not a member of this protected realm"
        relayed = peer.is_station and frame.procedure not in BUILTINS
        if relayed and unvouched(self._realms, peer, frame.realm, frame.caller, now_ms):
            self._stats["realm_calls_refused"] += 1
            return ErrorCode.TARGET_REALM_REFUSED, "caller not vouched for on this link"
        return None

    def builtin_done(
        self, conn: int, stream: int, frame: Call, outcome: Outcome, now_ms: int
    ) -> list[Action]:
        """Reply to a built-in CALL (or a house service's) with its ``Outcome``."""
        running = self.builtins_running
        running[conn] -= 1
        if running[conn] <= 0:
            del running[conn]
        peer = self._peers.get(conn)
        if peer is None or peer.state is PeerState.CLOSED:
            return []
        out: list[Action] = []
        if self._realms.to_vouch:  # a member accepted: its links hear before it does
            out += self.vouch(self._realms.drain_vouches(), now_ms)
        if outcome.code is not None:
            code, detail = outcome.code, outcome.detail
            out.append(self._error(peer, stream, frame.call_id, code, detail, now_ms))
        else:
            result = self._frames.result(frame.call_id, outcome.payload, now_ms)
            out.append(Send(conn, stream, result))
        running_here = peer.content_streams.get(stream)
        if running_here is not None:
            peer.content_streams[stream] = running_here - 1
            if running_here == 1 and stream in peer.finished_content:
                del peer.content_streams[stream]
                peer.finished_content.discard(stream)
                out.append(EndStream(conn, stream))
        return out

    def call_station(
        self,
        node_id: bytes,
        procedure: str,
        payload: Any,
        deadline_ms: int,
        now_ms: int,
        realm: bytes = bytes(32),
    ) -> tuple[bytes, list[Action]]:
        """A CALL signed by this station on the link to station ``node_id``: its call_id, and
        the Send (``RouterCore.call_station`` says how it settles)."""
        call_id = self._random_bytes(16)
        conn = self._node_conn.get(node_id)
        link = self._peers.get(conn) if conn is not None else None
        if link is None or not link.is_station or link.state is not PeerState.CONNECTED:
            code = ErrorCode.UNKNOWN_NEXT_PEER
            return call_id, [StationReplied(call_id, False, "no link to that station", code)]
        limit = self.policy.max_station_calls
        if self._pending.in_flight_for(ORIGIN) >= limit:
            detail = f"more than {limit} station calls in flight"
            congested = ErrorCode.UPSTREAM_CONGESTION
            return call_id, [StationReplied(call_id, False, detail, congested)]
        frame = Call(
            **self._frames.stamp(now_ms),
            call_id=call_id,
            procedure=procedure,
            realm=realm,
            payload=payload,
            deadline_ms=deadline_ms,
            caller=self._station_id,
        )
        return call_id, self._calls.originate(link, frame, now_ms)

    def vouch(
        self, endorsements: list[Endorsement], now_ms: int, links: list[Peer] | None = None
    ) -> list[Action]:
        """Tell ``links`` (None: every link) these members' endorsements (relay.realms.links)."""
        if not endorsements:
            return []
        if links is None:
            links = [p for p in self._peers.values() if p.is_station and p.linked]

        def ask(node_id: bytes, payload: dict[str, Any]) -> list[Action]:
            deadline = now_ms + VOUCH_DEADLINE_MS
            return self.call_station(node_id, VOUCH_PROCEDURE, payload, deadline, now_ms)[1]

        return vouch_actions(self._realms, links, endorsements, now_ms, ask)

    def _error(
        self, peer: Peer, stream: int, call_id: bytes, code: int, detail: bytes | None, now_ms: int
    ) -> Send:
        return self._frames.error(peer.conn, stream, call_id, code, detail, now_ms)


def _from_link_itself(peer: Peer, frame: Call, builtins_only: bool) -> bool:
    """A CALL on a link's control stream that the linked station signed itself."""
    return peer.is_station and peer.linked and not builtins_only and frame.caller == peer.node_id
