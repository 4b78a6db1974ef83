"""When this side acknowledges 1-RTT packets, and aioquic's connection timer without churn.

Invariants:
- an ACK for 1-RTT packets rides on the next packet this side sends anyway (a reply, a
  forwarded frame) when one leaves within ``ack_delay_s`` (at most ``MAX_ACK_DELAY_S``, under
  the 25 ms max_ack_delay aioquic advertises); it leaves at once, in the loop turn's transmit,
  when ``ack_every`` ack-eliciting datagrams are owed one or a packet number was skipped (a
  loss the sender must hear of quickly, RFC 9000 §13.2.1); Initial and Handshake packets are
  acknowledged at once, as aioquic does;
- the connection timer is moved only when its deadline comes earlier; one that fires early
  re-arms itself for the real deadline, so it is never late.
A subclass feeds datagrams through ``_feed`` and sets ``_payload_queued`` when it queues an
ack-eliciting frame for the next ``transmit``. Measurements: docs/performance.md §9.
"""

from __future__ import annotations

from typing import Any

from macula.quic.backend import (
    NetworkAddress,
    QuicConnection,
    QuicConnectionProtocol,
    application_space,
    set_ack_delay,
)

# How long an ACK-only datagram may wait for a packet to ride on. aioquic's own is 1 ms: in a
# request/response exchange (an RPC hop takes longer) each data packet then costs an ACK-only
# datagram each way, a packet build, AEAD, syscall and parse on both ends, where the ACK could
# ride on the reply or the next request. Bounded by MAX_ACK_DELAY_S, under the 25 ms
# max_ack_delay aioquic advertises (the peer's loss timers already allow for that much)
ACK_DELAY_S = 0.010
MAX_ACK_DELAY_S = 0.020
# ack-eliciting datagrams owed an ACK that make it leave in the loop turn's transmit at once (a
# bulk sender's congestion window keeps moving); RFC 9000 §13.2.2 suggests two
ACK_EVERY = 2


class AckRidingProtocol(QuicConnectionProtocol):
    """aioquic's protocol with the ACK and timer rules above."""

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.ack_delay_s = ACK_DELAY_S
        self.ack_every = ACK_EVERY
        set_ack_delay(quic, ACK_DELAY_S)
        self._space: Any | None = None  # aioquic's 1-RTT packet space, once there is one
        self._unacked = 0  # datagrams received while an ACK is owed, since the last ACK sent
        self._ack_at_once = False  # a packet number was skipped: the ACK leaves this turn
        self._payload_queued = False  # an ack-eliciting frame waits for the next transmit

    def configure_acks(self, delay_s: float, every: int) -> None:
        """How long an ACK may wait for a packet to ride on (0 to ``MAX_ACK_DELAY_S``
        seconds), and after how many ack-eliciting datagrams it leaves at once (at least 1)."""
        if not 0 <= delay_s <= MAX_ACK_DELAY_S:
            raise ValueError(f"ack delay must be 0 to {MAX_ACK_DELAY_S} s, not {delay_s}")
        if every < 1:
            raise ValueError(f"ack_every must be at least 1, not {every}")
        self.ack_delay_s = delay_s
        self.ack_every = every
        set_ack_delay(self._quic, delay_s)

    def _feed(self, data: bytes, addr: NetworkAddress) -> None:
        """Hand one datagram to aioquic, counting what it leaves owed an ACK."""
        space = self._space
        # until a 1-RTT packet arrived the space may still be replaced (a Retry: aioquic starts
        # over with new spaces), so it is looked up again
        if space is None or space.largest_received_packet < 0:
            self._quic.receive_datagram(data, addr, now=self._loop.time())
            self._space = application_space(self._quic)
            return
        before = space.largest_received_packet
        self._quic.receive_datagram(data, addr, now=self._loop.time())
        if space.ack_at is not None:
            self._unacked += 1
            if space.largest_received_packet > before + 1:  # packets between are missing
                self._ack_at_once = True

    def transmit(self) -> None:
        """aioquic's transmit; an ACK owed for 1-RTT packets is made due now when a packet
        leaves anyway (it rides on it) or when ``ack_every`` datagrams or a gap are owed one;
        otherwise aioquic's timer sends it ``ack_delay_s`` after the first packet it covers."""
        space = self._space
        if (
            space is not None
            and space.ack_at is not None
            and (self._payload_queued or self._ack_at_once or self._unacked >= self.ack_every)
        ):
            space.ack_at = self._loop.time()
        self._payload_queued = False
        self._ack_at_once = False
        # aioquic's transmit, but an armed timer is moved only when the deadline comes earlier:
        # aioquic cancels and re-arms it whenever the deadline changes, several times per
        # request/response (each packet sent or acknowledged moves the loss deadline later)
        self._transmit_task = None
        quic, transport = self._quic, self._transport
        assert transport is not None
        for data, addr in quic.datagrams_to_send(now=self._loop.time()):
            transport.sendto(data, addr)
        if space is not None and space.ack_at is None:
            self._unacked = 0
        due = quic.get_timer()
        timer, timer_at = self._timer, self._timer_at
        if timer is not None and (due is None or timer_at is None or due < timer_at):
            timer.cancel()
            timer = self._timer = None
        if timer is None and due is not None:
            self._timer = self._loop.call_at(due, self._handle_timer)
            self._timer_at = due

    def _handle_timer(self) -> None:
        # ``transmit`` keeps an armed timer that fires no later than the connection's deadline,
        # so it may fire before anything is due (a datagram since moved the deadline later):
        # then it is re-armed for the deadline (``get_timer`` also refreshes aioquic's cached
        # loss deadline); otherwise aioquic handles it as usual. A timer is never late.
        due = self._quic.get_timer()
        if due is not None and due > max(self._timer_at or 0.0, self._loop.time()):
            self._timer = self._loop.call_at(due, self._handle_timer)
            self._timer_at = due
            return
        super()._handle_timer()
