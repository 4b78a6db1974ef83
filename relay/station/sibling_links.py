"""A link to another worker of this station (``relay.workers.balancer``), kept alive by probing.

A worker that dies (killed, crashed) sends no CONNECTION_CLOSE, and the one started in its
place drops the old connection's datagrams without a word, so without a probe the link would
look up until QUIC's idle timeout (a minute), and clients of the new worker would miss the
others' events meanwhile. ``until_lost`` pings the link at the QUIC level whenever it has been
moving no bytes for ``interval_s``; ``misses`` pings in a row not acknowledged within
``timeout_s`` close it (a dead worker is left within about 15 s), and the link manager dials
again. Links to other stations are not probed here (their liveness is
QUIC's, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from macula.quic.transport import FrameProtocol

log = logging.getLogger("macula.relay")

PROBE_INTERVAL_S = 1.0  # of a link moving no bytes before a ping
PROBE_TIMEOUT_S = 4.0  # lenient: a loaded worker acknowledges late, and a closed link loses events
PROBE_MISSES = 3  # pings unanswered in a row before the link is closed (a flood stalled one 5 s)


async def until_lost(
    connection: FrameProtocol,
    lost: asyncio.Event,
    interval_s: float = PROBE_INTERVAL_S,
    timeout_s: float = PROBE_TIMEOUT_S,
    misses: int = PROBE_MISSES,
) -> None:
    """Return once ``lost`` is set; a link quiet for ``interval_s`` (no stream bytes received
    or sent: sending needs the other worker's flow-control credit, so a dead one stops it
    within a window) is pinged; once ``misses`` pings in a row go unanswered for ``timeout_s``
    each it is closed. A link that keeps moving bytes either way is never pinged."""
    heard = connection.stream_bytes()
    missed = 0
    while not lost.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lost.wait(), interval_s)
            return
        moved = connection.stream_bytes()
        if moved != heard:
            heard, missed = moved, 0
            continue
        try:
            answered = await connection.acknowledged(timeout_s)
        except ConnectionError:
            break  # ended meanwhile: ``lost`` follows
        missed = 0 if answered else missed + 1
        if missed >= misses:
            log.warning("link to another worker: %d pings unanswered, closing", missed)
            connection.close_connection("worker did not acknowledge a ping")
            break
    await lost.wait()
