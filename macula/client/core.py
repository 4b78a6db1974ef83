"""The client's protocol core (PROTOCOL.md §4-§8), sans-I/O: the mirror of ``relay.core.router``.

A ``ClientCore`` is one connection of one identity to one station, seen without sockets: it is
fed decoded frame maps (with the stream they came on) and the time, and answers with outputs —
``Transmit`` (framed bytes for a stream) and small event dataclasses the adapter
(``macula.node.session``) turns into futures and queue items. Time (``now_ms`` arguments, deadlines)
and randomness (``random_bytes``) are injected; nothing here imports asyncio or a socket.
Invariants:
- handshake (§5): CONNECT first; only a HELLO that verifies against the pinned station key (or
  its own ``node_id`` when nothing is pinned) counts; ``accepted`` false is a ``HandshakeFailed``
  carrying the refusal code. Control frames before an accepted HELLO are ignored.
- every frame that names a signer is verified before it touches any state (§4.3); a station-signed
  frame (HELLO, EVENT, PONG, a built-in's RESULT/ERROR) needs no check when TLS already proved
  the station key (``tls_pinned``). EVENTs carrying a ``publisher_sig`` must verify end to end.
  Failures are counted in ``dropped``, never raised. The CONNECT names the pinned station
  (``bound_to``, issue 27), so that station checks our frames' claims by id, not by signature;
  when its HELLO names us back in ``bound_to`` (``station_binds``), a PUBLISH goes without its
  frame signature (``publisher_sig``, end to end, is always made).
- a CALL gets a ``call_id`` from ``random_bytes`` and a deadline; exactly one ``CallSettled``
  per call: its RESULT/ERROR (only on the stream it was sent on), ``tick`` past the deadline
  (``CallTimeout``), or the end of the connection (``BrokenError``/``ClosedError``).
- the intent (subscriptions, advertisements) outlives a connection: it lives in an ``Intent``
  owned by the node, and is replayed, in full, right after the HELLO, before ``Established``.
- duplicate EVENTs (same realm, publisher, seq) are suppressed across reconnects by the node's
  ``EventDedup`` window.
- once ``Ended`` has been emitted (GOODBYE, framing error, connection lost, closed) nothing is
  transmitted again; sending raises ``ClosedError`` (we closed) or ``BrokenError`` (it broke).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from macula.client.channels import ChannelState, deliver, lose
from macula.client.events import (
    CallArrived,
    CallSettled,
    ChannelOpened,
    Ended,
    Established,
    EventArrived,
    HandshakeFailed,
    Output,
    Transmit,
)
from macula.client.intent import EventDedup, Intent, Key, Wanted
from macula.client.publishing import signed_publish
from macula.client.send_limits import (
    MAX_CONTROL_FRAME,
    MAX_CONTROL_ITEMS,
    check_control_frame,
    encoded,
)
from macula.errors import (
    BrokenError,
    CallTimeout,
    ClosedError,
    HandshakeError,
    MaculaError,
    MeshError,
)
from macula.wire.codes import ErrorCode, code_name
from macula.wire.errors import FramingError, ProtocolError
from macula.wire.frames import (
    Advertise,
    Call,
    Connect,
    Error,
    Event,
    Frame,
    Goodbye,
    Hello,
    Publish,
    Result,
    StreamData,
    StreamEnd,
    StreamError,
    StreamOpen,
    StreamReply,
    Subscribe,
    Unadvertise,
    UnknownFrameType,
    Unsubscribe,
    new_frame_id,
    parse_frame,
    publisher_sig_valid,
)
from macula.wire.identity import Identity
from macula.wire.verified import publications

RandomBytes = Callable[[int], bytes]
# what a station accepts on a control stream by default (macula.client.send_limits, from
# relay.core.policy);
# content and stream-RPC streams take the protocol's full frame size
REPLACED = "replaced_by_newer_handshake"


class CoreState(enum.Enum):
    CONNECTING = "connecting"
    ESTABLISHED = "established"
    ENDED = "ended"


@dataclass(slots=True)
class _PendingCall:
    stream: int
    procedure: str
    deadline_ms: int  # when ``tick`` gives up on it
    own_deadline: bool  # the CALL carries that same deadline (not an earlier one)


@dataclass(slots=True)
class ClientCore:
    identity: Identity
    random_bytes: RandomBytes
    intent: Wanted = field(default_factory=Intent)
    dedup: EventDedup = field(default_factory=EventDedup)
    control: int = 0
    pinned: bytes | None = None  # the station key we expect, if the address names one
    tls_pinned: bool = False  # TLS proved ``pinned`` (certificate key checked)
    # the station's HELLO said it checks this connection's frames by id (``bound_to`` = us):
    # a PUBLISH goes without its frame signature, which nobody would verify (issue 27)
    station_binds: bool = False
    max_control_frame: int = MAX_CONTROL_FRAME
    max_control_items: int = MAX_CONTROL_ITEMS
    state: CoreState = CoreState.CONNECTING
    station_key: bytes = b""
    goodbye: Goodbye | None = None
    ended: Ended | None = None
    dropped: Counter[str] = field(default_factory=Counter)
    told_subscriptions: set[Key] = field(default_factory=set)  # what this station knows
    told_advertisements: set[Key] = field(default_factory=set)
    _calls: dict[bytes, _PendingCall] = field(default_factory=dict)
    _content: set[int] = field(default_factory=set)
    _channels: dict[int, ChannelState] = field(default_factory=dict)

    # --- handshake ------------------------------------------------------------------------

    def connect(self, now_ms: int) -> list[Output]:
        """The CONNECT that opens the control stream (§5.1)."""
        frame = Connect(
            **self._stamp(now_ms),
            node_id=self.identity.node_id,
            station_id=self.identity.node_id,
            puzzle_evidence=self.identity.puzzle_evidence,
            bound_to=self.pinned,  # the station we dial, when we know it (issue 27)
        )
        return [Transmit(self.control, frame.sign_and_encode(self.identity))]

    @property
    def alive(self) -> bool:
        return self.state is not CoreState.ENDED

    # --- sending ----------------------------------------------------------------------------

    def send_frame(self, stream: int, frame: Frame) -> Transmit:
        """Sign and encode ``frame`` for ``stream``; raises once the connection has ended, and
        refuses (``MeshError``, ``macula.client.send_limits``) a value CBOR cannot carry and a
        control-stream frame over the stations' size, item or depth limits rather than have
        the station close the connection for it."""
        self._open()
        return self._transmit(stream, frame, encoded(frame.sign_and_encode, self.identity))

    def _open(self) -> None:
        if self.ended is not None:
            if self.ended.closed:
                raise ClosedError("session closed")
            raise BrokenError(self.ended.reason)

    def _transmit(self, stream: int, frame: Frame, data: bytes) -> Transmit:
        if stream == self.control:
            check_control_frame(
                frame.FRAME_TYPE,
                data,
                max_bytes=self.max_control_frame,
                max_items=self.max_control_items,
            )
        return Transmit(stream, data)

    def sync_intent(self, now_ms: int) -> list[Output]:
        """SUBSCRIBE/ADVERTISE what the intent holds and this station was not told yet;
        UNSUBSCRIBE/UNADVERTISE what it was told and the intent no longer holds. Idempotent;
        nothing before the HELLO (the replay after it carries everything)."""
        if self.state is not CoreState.ESTABLISHED:
            return []
        out: list[Output] = []
        wanted_subs, wanted_ads = list(self.intent.subscriptions), list(self.intent.advertisements)
        for realm, topic in self.told_subscriptions - set(wanted_subs):
            out += self.unsubscribe(realm, topic, now_ms)
        for realm, procedure in self.told_advertisements - set(wanted_ads):
            out += self.unadvertise(realm, procedure, now_ms)
        for realm, topic in wanted_subs:
            if (realm, topic) not in self.told_subscriptions:
                out += self.subscribe(realm, topic, now_ms)
        for realm, procedure in wanted_ads:
            if (realm, procedure) not in self.told_advertisements:
                out += self.advertise(realm, procedure, now_ms)
        return out

    def subscribe(self, realm: bytes, topic: str, now_ms: int) -> list[Output]:
        frame = Subscribe(
            **self._stamp(now_ms), topic=topic, realm=realm, subscriber=self.identity.node_id
        )
        out = self.send_frame(self.control, frame)
        self.told_subscriptions.add((realm, topic))
        return [out]

    def unsubscribe(self, realm: bytes, topic: str, now_ms: int) -> list[Output]:
        frame = Unsubscribe(
            **self._stamp(now_ms), topic=topic, realm=realm, subscriber=self.identity.node_id
        )
        out = self.send_frame(self.control, frame)
        self.told_subscriptions.discard((realm, topic))
        return [out]

    def advertise(self, realm: bytes, procedure: str, now_ms: int) -> list[Output]:
        frame = Advertise(
            **self._stamp(now_ms),
            realm=realm,
            procedure=procedure,
            advertiser=self.identity.node_id,
        )
        out = self.send_frame(self.control, frame)
        self.told_advertisements.add((realm, procedure))
        return [out]

    def unadvertise(self, realm: bytes, procedure: str, now_ms: int) -> list[Output]:
        frame = Unadvertise(
            **self._stamp(now_ms),
            realm=realm,
            procedure=procedure,
            advertiser=self.identity.node_id,
        )
        out = self.send_frame(self.control, frame)
        self.told_advertisements.discard((realm, procedure))
        return [out]

    def publish(
        self, realm: bytes, topic: str, payload: Any, seq: int, now_ms: int
    ) -> list[Output]:
        frame = Publish(
            **self._stamp(now_ms),
            topic=topic,
            realm=realm,
            publisher=self.identity.node_id,
            seq=seq,
            payload=payload,
            published_at_ms=now_ms,
        )
        self._open()  # both signatures from one encoding of the fields (macula.client.publishing)
        data = encoded(
            partial(signed_publish, frame, frame_signature=not self.station_binds),
            self.identity,
        )
        return [self._transmit(self.control, frame, data)]

    def call(
        self,
        realm: bytes,
        procedure: str,
        payload: Any,
        deadline_ms: int,
        now_ms: int,
        *,
        stream: int | None = None,
        expires_ms: int | None = None,
    ) -> tuple[bytes, list[Output]]:
        """A CALL on the control stream (or a content stream); its ``call_id`` and the bytes.
        ``expires_ms`` is when ``tick`` gives up on it (default: ``deadline_ms``)."""
        call_id = self.random_bytes(16)
        call = Call(
            **self._stamp(now_ms),
            call_id=call_id,
            procedure=procedure,
            realm=realm,
            payload=payload,
            deadline_ms=deadline_ms,
            caller=self.identity.node_id,
        )
        on = self.control if stream is None else stream
        out = self.send_frame(on, call)
        expires = deadline_ms if expires_ms is None else expires_ms
        self._calls[call_id] = _PendingCall(on, procedure, expires, deadline_ms >= expires)
        return call_id, [out]

    def forget_call(self, call_id: bytes) -> None:
        """The caller gave up (cancelled): a late answer is ignored."""
        self._calls.pop(call_id, None)

    def reply(self, stream: int, call: Call, payload: Any, now_ms: int) -> list[Output]:
        result = Result(
            **self._stamp(now_ms),
            call_id=call.call_id,
            payload=payload,
            responded_by=self.identity.node_id,
        )
        return [self.send_frame(stream, result)]

    def reply_error(
        self, stream: int, call: Call, code: int, detail: str | None, now_ms: int
    ) -> list[Output]:
        raw = None if detail is None else detail.encode("utf-8")[:256]
        error = Error(
            **self._stamp(now_ms),
            call_id=call.call_id,
            code=code,
            reported_by=self.identity.node_id,
            detail=raw,
        )
        return [self.send_frame(stream, error)]

    def open_content(self, stream: int) -> None:
        """``stream`` carries a sequence of built-in CALLs (§6.3) answered by ``call_id``."""
        self._content.add(stream)

    def close_content(self, stream: int) -> None:
        self._content.discard(stream)

    # --- streaming RPC (§8) ---------------------------------------------------------------

    def channel(self, stream: int) -> ChannelState | None:
        """The channel on ``stream`` while it is open (forgotten once it ended both ways)."""
        return self._channels.get(stream)

    def open_channel(
        self,
        stream: int,
        realm: bytes,
        procedure: str,
        mode: str,
        args: Any,
        deadline_ms: int,
        now_ms: int,
    ) -> tuple[ChannelState, list[Output]]:
        channel = ChannelState(stream, self.random_bytes(16))
        opening = StreamOpen(
            **self._stamp(now_ms),
            stream_id=channel.stream_id,
            procedure=procedure,
            realm=realm,
            mode=mode,
            args=args,
            deadline_ms=deadline_ms,
            caller=self.identity.node_id,
        )
        out = self.send_frame(stream, opening)
        self._channels[stream] = channel
        return channel, [out]

    def channel_send(
        self, channel: ChannelState, body: Any, encoding: str, now_ms: int
    ) -> list[Output]:
        frame = StreamData(
            **self._stamp(now_ms),
            stream_id=channel.stream_id,
            seq=channel.seq,
            encoding=encoding,
            body=body,
            signer=self.identity.node_id,
        )
        out = self.send_frame(channel.stream, frame)
        channel.seq += 1
        return [out]

    def channel_end(self, channel: ChannelState, role: str, now_ms: int) -> list[Output]:
        """STREAM_END: ``send`` finishes our direction, ``both`` ends the session."""
        frame = StreamEnd(
            **self._stamp(now_ms),
            stream_id=channel.stream_id,
            role=role,
            signer=self.identity.node_id,
        )
        out = self.send_frame(channel.stream, frame)
        channel.finished = True
        if role == "both" or channel.peer_finished:
            channel.closed = True
        return [out]

    def channel_fail(
        self, channel: ChannelState, code: str, message: str, now_ms: int
    ) -> list[Output]:
        frame = StreamError(
            **self._stamp(now_ms),
            stream_id=channel.stream_id,
            code=code.encode(),
            message=message.encode(),
            signer=self.identity.node_id,
        )
        out = self.send_frame(channel.stream, frame)
        channel.closed = True
        return [out]

    def channel_reply(self, channel: ChannelState, payload: Any, now_ms: int) -> list[Output]:
        frame = StreamReply(
            **self._stamp(now_ms),
            stream_id=channel.stream_id,
            payload=payload,
            responded_by=self.identity.node_id,
        )
        out = self.send_frame(channel.stream, frame)
        channel.closed = True
        return [out]

    # --- receiving --------------------------------------------------------------------------

    def frames_received(
        self, stream: int, frames: list[dict[str, Any]], now_ms: int
    ) -> list[Output]:
        out: list[Output] = []
        for frame_map in frames:
            if self.ended is not None:
                break
            try:
                frame = parse_frame(frame_map)
            except UnknownFrameType:
                continue  # §4.2: unknown frame types are ignored
            except ProtocolError:
                self.dropped["malformed"] += 1
                continue
            if stream == self.control:
                self._control_frame(frame, now_ms, out)
            elif stream in self._content:
                self._reply(stream, frame, out)
            else:
                self._stream_frame(stream, frame, out)
        return out

    def framing_failed(self, stream: int, error: FramingError) -> list[Output]:
        return self._end(f"station sent a malformed stream: {error}", terminal=False)

    def stream_ended(self, stream: int) -> list[Output]:
        channel = self._channels.pop(stream, None)
        if channel is None or channel.closed:
            return []
        return lose(channel, "stream closed before a terminal frame")

    def stream_reset(self, stream: int) -> list[Output]:
        return self.stream_ended(stream)

    def connection_lost(self, reason: str) -> list[Output]:
        return self._end(reason, terminal=False)

    def close(self) -> list[Output]:
        """We end the session: pending calls fail with ``ClosedError``."""
        return self._end("session closed", terminal=False, closed=True)

    # --- timers -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest pending-call deadline (ms), for the adapter's one timer."""
        return min((p.deadline_ms for p in self._calls.values()), default=None)

    def tick(self, now_ms: int) -> list[Output]:
        """Fail every call whose deadline has passed with ``CallTimeout``."""
        out: list[Output] = []
        for call_id, pending in list(self._calls.items()):
            if now_ms >= pending.deadline_ms:
                del self._calls[call_id]
                error = CallTimeout(f"{pending.procedure}: no answer before its deadline")
                out.append(CallSettled(call_id, error=error))
        return out

    # --- inside -----------------------------------------------------------------------------

    def _control_frame(self, frame: Frame, now_ms: int, out: list[Output]) -> None:
        if isinstance(frame, Hello):
            self._hello(frame, now_ms, out)
            return
        if self.state is not CoreState.ESTABLISHED or not self._verified(frame):
            return
        if isinstance(frame, Event):
            # verified once per process (macula.wire.verified): other nodes here may get it too
            signed = frame.publisher_sig is not None
            if signed and not publisher_sig_valid(frame, publications.verify):
                self.dropped["bad_publisher_sig"] += 1
                return
            if self.dedup.first_time(frame):
                out.append(EventArrived(frame, frame.publisher_sig is not None))
        elif isinstance(frame, (Result, Error)):
            self._settle(self.control, frame, out)
        elif isinstance(frame, Call):
            out.append(CallArrived(self.control, frame))
        elif isinstance(frame, Goodbye):
            self.goodbye = frame
            reason = f"station said goodbye: {frame.reason}"
            out += self._end(reason, terminal=frame.reason == REPLACED)

    def _hello(self, hello: Hello, now_ms: int, out: list[Output]) -> None:
        if self.state is not CoreState.CONNECTING:
            self.dropped["unexpected_hello"] += 1
            return
        expected = self.pinned or hello.node_id
        # TLS already proved the pinned key: only the id is compared (issue 27)
        proven = self.tls_pinned and self.pinned is not None
        if hello.node_id != expected or not (proven or hello.verifies(expected)):
            error = HandshakeError(f"HELLO does not verify against {expected.hex()}")
            out += self._end("station could not prove its key", terminal=False, failure=error)
            return
        if not hello.accepted:
            code = hello.refusal_code
            why = f" ({code_name(code)})" if code is not None else ""
            refusal = HandshakeError(f"the station refused the connection{why}", refusal_code=code)
            out += self._end(f"refused{why}", terminal=False, failure=refusal)
            return
        self.station_key = hello.node_id
        # only a station TLS proved, that we bound ourselves, and that names us back
        self.station_binds = proven and hello.extras.get("bound_to") == self.identity.node_id
        self.state = CoreState.ESTABLISHED
        out += self.sync_intent(now_ms)  # the replay: before anyone hears we are up
        out.append(Established(hello.node_id))

    def _verified(self, frame: Frame) -> bool:
        """§4.3. A frame the station itself signs needs no check when TLS already proved the
        station's key: nothing but the station can have sent it on this connection. Relayed
        frames name their signer and are always verified end to end."""
        signer = frame.expected_signer()
        if self.tls_pinned and signer in (None, self.station_key):  # a built-in's RESULT too
            return True
        key = signer or self.station_key
        if key and frame.verifies(key):
            return True
        self.dropped["unverified"] += 1
        return False

    def _reply(self, stream: int, frame: Frame, out: list[Output]) -> None:
        """An answer on a content stream: verified here, then settled."""
        if isinstance(frame, (Result, Error)) and self._verified(frame):
            self._settle(stream, frame, out)

    def _settle(self, stream: int, frame: Result | Error, out: list[Output]) -> None:
        """A verified RESULT/ERROR settles the call it names, sent on this stream."""
        pending = self._calls.get(frame.call_id)
        if pending is None or pending.stream != stream:
            self.dropped["unmatched_reply"] += 1
            return
        del self._calls[frame.call_id]
        if isinstance(frame, Result):
            out.append(CallSettled(frame.call_id, payload=frame.payload))
        elif frame.code == ErrorCode.EXPIRY_TOO_SOON and pending.own_deadline:
            # our deadline, seen passing by the station first: a timeout, as ``tick`` gives
            why = f"{pending.procedure}: no answer before its deadline ({frame.detail_text})"
            out.append(CallSettled(frame.call_id, error=CallTimeout(why)))
        else:
            error = MeshError(frame.code, frame.detail_text, frame.name)
            out.append(CallSettled(frame.call_id, error=error))

    def _stream_frame(self, stream: int, frame: Frame, out: list[Output]) -> None:
        if not self._verified(frame):
            return
        channel = self._channels.get(stream)
        if channel is not None:
            deliver(channel, frame, out)
            if (channel.closed and channel.peer_finished) or channel.replied or channel.error:
                self._channels.pop(stream, None)
            return
        if isinstance(frame, StreamOpen):
            self._channels[stream] = ChannelState(stream, frame.stream_id)
            out.append(ChannelOpened(stream, frame))
        elif isinstance(frame, Call):
            out.append(CallArrived(stream, frame))

    def _end(
        self,
        reason: str,
        *,
        terminal: bool,
        closed: bool = False,
        failure: MaculaError | None = None,
    ) -> list[Output]:
        if self.ended is not None:
            return []
        failing = self.state is CoreState.CONNECTING
        self.state = CoreState.ENDED
        self.ended = Ended(reason, terminal, closed)
        out: list[Output] = []
        if failing:
            out.append(
                HandshakeFailed(failure or (ClosedError(reason) if closed else BrokenError(reason)))
            )
        error: MaculaError = (
            ClosedError("session closed") if closed else BrokenError(f"connection lost: {reason}")
        )
        for call_id in list(self._calls):
            out.append(CallSettled(call_id, error=error))
        self._calls.clear()
        for channel in list(self._channels.values()):
            out += lose(channel, str(error))
        out.append(self.ended)
        return out

    def _stamp(self, now_ms: int) -> dict[str, Any]:
        return {"frame_id": new_frame_id(now_ms, self.random_bytes(10)), "sent_at_ms": now_ms}
