"""Backpressure for publishers: pure, no I/O.

``PublishPacer`` is the "slowed, not dropped" rule: a PUBLISH that finds its connection's token
bucket empty is not refused; the router stops reading that control stream until enough tokens
are back (``refilled_at``) and parks, in order, the frames it was already handed (``hold``).
Invariants: a paused connection's control frames are processed only by ``take`` (in arrival
order, before any newer one); what is parked is at most one delivery of the shell (the shell
keeps the rest unread, so QUIC flow control pushes back on the sender); ``forget`` drops it all.

What the station refused without an in-band answer is counted per connection in
``Peer.refusals`` (``relay.core.logbook``); the client reads it in its ``_relay.ping`` reply.
"""

from __future__ import annotations

import math
from typing import Any

from macula.rate import TokenBucket

RESUME_AFTER_S = 0.05  # a paused publisher resumes once this many seconds of tokens are back


class PublishPacer:
    def __init__(self) -> None:
        self.backlog: dict[int, list[dict[str, Any]]] = {}  # paused conn -> unread frames
        self.ended: set[int] = set()  # paused conns whose control stream ended meanwhile

    def paused(self, conn: int) -> bool:
        return conn in self.backlog

    @staticmethod
    def over_rate(bucket: TokenBucket, frame_map: dict[str, Any], now_ms: int) -> bool:
        """A PUBLISH that finds no token must wait."""
        if frame_map.get("frame_type") != "publish" or bucket.rate <= 0:
            return False
        return bucket.tokens(now_ms) < 1.0

    @staticmethod
    def refilled_at(bucket: TokenBucket, now_ms: int) -> int:
        """When the bucket holds enough tokens (``RESUME_AFTER_S`` worth) to resume for."""
        wanted = max(1.0, min(bucket.burst, bucket.rate * RESUME_AFTER_S))
        missing = wanted - bucket.tokens(now_ms)
        return now_ms + max(1, math.ceil(missing * 1000 / bucket.rate))

    def hold(self, conn: int, frame_map: dict[str, Any]) -> None:
        self.backlog.setdefault(conn, []).append(frame_map)

    def take(self, conn: int) -> list[dict[str, Any]] | None:
        """The parked frames (the connection is no longer paused), or None if it was not."""
        return self.backlog.pop(conn, None)

    def take_end(self, conn: int) -> bool:
        """Whether the control stream ended while paused (reported once)."""
        if conn in self.ended:
            self.ended.discard(conn)
            return True
        return False

    def forget(self, conn: int) -> None:
        self.backlog.pop(conn, None)
        self.ended.discard(conn)
