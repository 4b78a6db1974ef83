"""The liveness ping of one QUIC connection: a QUIC PING, acknowledged by the peer's QUIC stack.

Invariants: ``refused`` is set once the (connected) socket hears ICMP "port unreachable": nothing
listens at the peer's address any more (a pending handshake fails at once on it; an established
connection is dead, as a restarted peer would not know it), and a ping then counts as
unanswered at once. Every ping sent has a waiter in aioquic's ``_ping_waiters`` (aioquic
resolves it on the acknowledgement and fails it with ``ConnectionError`` when the connection
ends) until the ``acknowledged`` call that sent it returns; then it is removed, and cancelled
if still open, so no waiter outlives its caller and no failed one goes unretrieved. A ping
costs no signature and no stream: a control stream paused for backpressure cannot hold it up.
Once ``abandon``ed (nothing listens there) the connection sends nothing more and arms no timer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from macula.quic.acks import AckRidingProtocol
from macula.quic.backend import WRITE_REFUSED, QuicConnection


class PingingProtocol(AckRidingProtocol):
    """``AckRidingProtocol`` with ``acknowledged``: a ping that says whether the peer lives."""

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.refused: asyncio.Future[str] = self._loop.create_future()
        self._abandoned = False

    def abandon(self) -> None:
        """End without a word: nothing listens at the peer's address (``refused``), so a
        CONNECTION_CLOSE or a retransmission would only meet ICMP again. No timer is left."""
        self._abandoned = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def transmit(self) -> None:
        if not self._abandoned:
            super().transmit()

    def error_received(self, exc: Exception) -> None:
        """ICMP errors on the UDP socket: a refused port fails a pending handshake, and a
        ping, at once."""
        if isinstance(exc, ConnectionRefusedError) and not self.refused.done():
            self.refused.set_result(f"nothing listens there ({exc})")

    async def acknowledged(self, timeout_s: float, attempts: int = 1) -> bool:
        """Send a QUIC PING: True once the peer's QUIC stack acknowledged it, False if it did
        not within ``timeout_s``; ``ConnectionError`` if the connection ended meanwhile. With
        ``attempts`` > 1 a ping unanswered in its time is followed by another, waited twice as
        long (as QUIC's own probe timeout doubles), and the acknowledgement of any ping sent so
        far counts: False only after ``timeout_s * (2**attempts - 1)`` with none (a peer that is
        behind by more than one timeout answers the first ping late, not never), or at once
        when nothing listens at the peer's address any more (``refused``). Unlike
        aioquic's ``ping()``, pings that timed out leave no waiter behind (whose later
        ``ConnectionError`` nobody would retrieve). Uses aioquic's ping bookkeeping
        (``_ping_waiters``), as ``ping()`` does."""
        waiters: list[asyncio.Future[None]] = []
        try:
            wait_s = timeout_s
            for _ in range(max(1, attempts)):
                waiters.append(self._send_ping())
                race: list[asyncio.Future[Any]] = [*waiters, self.refused]
                await asyncio.wait(race, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                answered = [waiter for waiter in waiters if waiter.done()]
                for waiter in answered:
                    waiter.result()  # ConnectionError: the connection ended meanwhile
                if answered or self.refused.done():
                    return bool(answered)
                wait_s *= 2
            return False
        finally:
            for waiter in waiters:
                self._ping_waiters.pop(id(waiter), None)
                if not waiter.done():
                    waiter.cancel()
                elif not waiter.cancelled():
                    waiter.exception()  # seen: a second failed ping is not "never retrieved"

    def _send_ping(self) -> asyncio.Future[None]:
        """One QUIC PING on its way; its waiter is resolved when the peer acknowledges it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._quic.send_ping(id(waiter))
        except WRITE_REFUSED as exc:  # the library's connection is closed already
            raise ConnectionError(f"connection closed: {exc}") from exc
        self._ping_waiters[id(waiter)] = waiter
        self._payload_queued = True
        self.transmit()
        return waiter
