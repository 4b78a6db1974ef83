"""CALLs forwarded to the node that advertised the procedure (PROTOCOL.md §6.2), sans-I/O.

``RouterCore`` owns it and hands it only verified CALLs that passed its checks, and verified
RESULT/ERROR frames. Invariants: a CALL is forwarded verbatim, only to a CONNECTED advertiser,
and only while no CALL with the same ``call_id`` is pending; a reply is accepted only from the
connection the CALL went to and only signed by that node (§13 #3); every pending call ends
exactly once — replied, expired (0x07 at the caller's deadline, 0x0F at the end of the
forwarding slot), failed with 0x04 when its provider goes, or dropped when its caller goes.
"""

from __future__ import annotations

from collections.abc import Callable

from macula.wire.codes import ErrorCode
from macula.wire.frames import Call, Error, Result
from relay.actions import Action, Send
from relay.adverts import AdvertTable
from relay.peers import Peer, PeerState
from relay.pending import Pending, PendingCalls
from relay.station_frames import StationFrames


class CallForwarder:
    def __init__(
        self,
        peers: dict[int, Peer],
        adverts: AdvertTable,
        pending: PendingCalls,
        frames: StationFrames,
        *,
        forward_slot_ms: int,
        drop: Callable[[Peer, str, str], None],
        count: Callable[[str], None],
    ) -> None:
        self._peers = peers
        self._adverts = adverts
        self.pending = pending
        self._frames = frames
        self._forward_slot_ms = forward_slot_ms
        self._drop = drop
        self._count = count

    def forward(self, peer: Peer, stream: int, call: Call, now_ms: int) -> list[Action]:
        """Send ``call`` to its advertiser, or answer the caller why not."""
        ad = self._adverts.get((call.realm, call.procedure))
        provider = self._peers.get(ad.conn) if ad is not None else None
        if provider is None or provider.state is not PeerState.CONNECTED:
            return self.no_route(peer, stream, call, now_ms)
        if call.call_id in self.pending:
            detail = b"bad_request: this call_id is already in flight"
            code = ErrorCode.UNKNOWN_ERROR
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
            )
        )
        self._count("calls_forwarded")
        return [Send(provider.conn, provider.control or 0, self._frames.relayed(call))]

    def no_route(self, peer: Peer, stream: int, call: Call, now_ms: int) -> list[Action]:
        self._count("calls_no_route")
        code = ErrorCode.UNKNOWN_NEXT_PEER
        return [self._frames.error(peer.conn, stream, call.call_id, code, None, now_ms)]

    def reply(self, peer: Peer, reply: Result | Error) -> list[Action]:
        """Route a provider's RESULT/ERROR back to the caller (§13 #3)."""
        pending = self.pending.get(reply.call_id)
        responder = reply.responded_by if isinstance(reply, Result) else reply.reported_by
        if (
            pending is None
            or pending.provider_conn != peer.conn
            or responder != pending.provider_node
        ):
            self._drop(peer, "unexpected_reply", "reply to a call not forwarded to this connection")
            return []
        self.pending.pop(reply.call_id)
        caller = self._peers.get(pending.caller_conn)
        if caller is None:
            return []
        return [Send(caller.conn, pending.caller_stream, self._frames.relayed(reply))]

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
                out += self._fail(pending.call_id, ErrorCode.UNKNOWN_NEXT_PEER, why, now_ms)
            else:
                self.pending.pop(pending.call_id)
        return out

    def _fail(self, call_id: bytes, code: int, detail: str, now_ms: int) -> list[Action]:
        pending = self.pending.pop(call_id)
        if pending is None:
            return []
        caller = self._peers.get(pending.caller_conn)
        if caller is None or caller.state is not PeerState.CONNECTED:
            return []
        stream = pending.caller_stream
        return [self._frames.error(caller.conn, stream, call_id, code, detail.encode(), now_ms)]
