"""CALLs forwarded to the node that advertised the procedure (PROTOCOL.md §6.2), sans-I/O.

``RouterCore`` owns it and hands it only CALLs and RESULT/ERROR frames admitted (verified, or on
a bound connection, whose node id they claim: issue 27). Invariants: one from a bound connection
is verified before it goes onto a link (``relay.core.bound_claims``); a CALL is forwarded verbatim,
only to a CONNECTED advertiser (a local client first, else a linked station that gossiped it:
``AdvertGossip.serving``), and only while no CALL with the same ``call_id`` is pending; a CALL
that came from a station peer goes only to a local client (one hop across the mesh, else 0x01);
a reply is accepted only from the connection the CALL went to and only signed by that node (§13
#3) — over a link, by whichever node answered behind it (the frame is verified against its own
signer); every pending call ends exactly once — replied, expired (0x07 at the caller's deadline,
0x0F at the end of the forwarding slot), failed with 0x01 when its provider (or link) goes, or
dropped when its caller goes. The station's own CALLs (caller ``ORIGIN``) end the same ways,
each as one ``StationReplied``.
"""

from __future__ import annotations

from collections.abc import Callable

from macula.services.refusals import UNEXPECTED_REPLY, UNVERIFIED_FRAME
from macula.wire.codes import ErrorCode
from macula.wire.frames import Call, Error, Result
from relay.core.actions import Action, Send, StationReplied
from relay.core.bound_claims import crossing_verified
from relay.core.frames import StationFrames
from relay.core.peers import Peer, PeerState
from relay.core.pending import ORIGIN, Pending, PendingCalls
from relay.federation.gossip import AdvertGossip


class CallForwarder:
    def __init__(
        self,
        peers: dict[int, Peer],
        gossip: AdvertGossip,
        pending: PendingCalls,
        frames: StationFrames,
        *,
        forward_slot_ms: int,
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
    ) -> None:
        self._peers = peers
        self._gossip = gossip
        self.pending = pending
        self._frames = frames
        self._forward_slot_ms = forward_slot_ms
        self._drop = drop
        self._count = count

    def forward(
        self, peer: Peer, stream: int, call: Call, now_ms: int, body: bytes | None = None
    ) -> list[Action]:
        """Send ``call`` to its advertiser, or answer the caller why not (``body``: the CALL
        as received, when canonical: ``StationFrames.relayed``)."""
        key = (call.realm, call.procedure)
        provider = self._gossip.serving(key, local_only=peer.is_station)
        if provider is None:
            if peer.is_station and self._gossip.serving(key, local_only=False) is not None:
                self._count("calls_second_hop_refused")
            return self.no_route(peer, stream, call, now_ms)
        if call.call_id in self.pending:
            detail = b"bad_request: this call_id is already in flight"
            code = ErrorCode.UNKNOWN_ERROR
            return [self._frames.error(peer.conn, stream, call.call_id, code, detail, now_ms)]
        if provider.is_station and not crossing_verified(peer, call, body):
            self._drop(peer, UNVERIFIED_FRAME, "call: signature does not verify")
            code, detail = ErrorCode.SIGNATURE_INVALID, b"signature does not verify"
            return [self._frames.error(peer.conn, stream, call.call_id, code, detail, now_ms)]
        slot_end = now_ms + self._forward_slot_ms
        self.pending.add(
            Pending(
                call.call_id,
                peer.conn,
                stream,
                provider.conn,
                provider.node_id,
                min(call.deadline_ms, slot_end),
                slot_only=slot_end < call.deadline_ms,
                via_link=provider.is_station,
            )
        )
        self._count("calls_forwarded_to_station" if provider.is_station else "calls_forwarded")
        return [Send(provider.conn, provider.control or 0, self._frames.relayed(call, body))]

    def originate(self, link: Peer, call: Call, now_ms: int) -> list[Action]:
        """Sign the station's own ``call`` and send it on ``link``; its reply, or its failure,
        comes back as one ``StationReplied``."""
        slot_end = now_ms + self._forward_slot_ms
        self.pending.add(
            Pending(
                call.call_id,
                ORIGIN,
                0,
                link.conn,
                link.node_id,
                min(call.deadline_ms, slot_end),
                slot_only=slot_end < call.deadline_ms,
                via_link=True,
            )
        )
        self._count("station_calls")
        return [Send(link.conn, link.control or 0, self._frames.sign(call))]

    def no_route(self, peer: Peer, stream: int, call: Call, now_ms: int) -> list[Action]:
        self._count("calls_no_route")
        code = ErrorCode.UNKNOWN_NEXT_PEER
        return [self._frames.error(peer.conn, stream, call.call_id, code, None, now_ms)]

    def reply(self, peer: Peer, reply: Result | Error, body: bytes | None = None) -> list[Action]:
        """Route a provider's RESULT/ERROR back to the caller (§13 #3); ``body`` as in
        ``forward``."""
        pending = self.pending.get(reply.call_id)
        responder = reply.responded_by if isinstance(reply, Result) else reply.reported_by
        if (
            pending is None
            or pending.provider_conn != peer.conn
            or (responder != pending.provider_node and not pending.via_link)
        ):
            self._drop(peer, UNEXPECTED_REPLY, "reply to a call not forwarded to this connection")
            return []
        caller = self._peers.get(pending.caller_conn)
        if caller is not None and caller.is_station and not crossing_verified(peer, reply, body):
            self._drop(peer, UNVERIFIED_FRAME, f"{reply.FRAME_TYPE}: signature does not verify")
            return []  # the call stays pending: a good reply, or its deadline, ends it
        self.pending.pop(reply.call_id)
        if pending.caller_conn == ORIGIN:
            if isinstance(reply, Result):
                return [StationReplied(reply.call_id, True, reply.payload)]
            return [StationReplied(reply.call_id, False, reply.detail_text, reply.code)]
        if caller is None:
            return []
        return [Send(caller.conn, pending.caller_stream, self._frames.relayed(reply, body))]

    def expire(self, now_ms: int) -> list[Action]:
        """Answer the calls whose time is up (§6.2, §13 #9)."""
        out: list[Action] = []
        for pending in self.pending.due(now_ms):
            if pending.slot_only:
                code, why = ErrorCode.TEMPORARY_RELAY_FAILURE, "provider did not reply in time"
            else:
                code, why = (
                    ErrorCode.EXPIRY_TOO_SOON,
                    "deadline passed before the provider replied",
                )
            out += self._fail(pending.call_id, code, why, now_ms)
        return out

    def forget_conn(self, conn: int, now_ms: int) -> list[Action]:
        """``conn`` is going: fail the calls it was serving, forget the ones it made."""
        out: list[Action] = []
        for pending in self.pending.involving(conn):
            if pending.provider_conn == conn:
                why = "provider disconnected before replying"
                if pending.via_link:
                    why = "the link to the station serving it was lost before a reply"
                out += self._fail(pending.call_id, ErrorCode.UNKNOWN_NEXT_PEER, why, now_ms)
            else:
                self.pending.pop(pending.call_id)
        return out

    def _fail(self, call_id: bytes, code: int, detail: str, now_ms: int) -> list[Action]:
        pending = self.pending.pop(call_id)
        if pending is None:
            return []
        if pending.caller_conn == ORIGIN:
            return [StationReplied(call_id, False, detail, code)]
        caller = self._peers.get(pending.caller_conn)
        if caller is None or caller.state is not PeerState.CONNECTED:
            return []
        stream = pending.caller_stream
        return [self._frames.error(caller.conn, stream, call_id, code, detail.encode(), now_ms)]
