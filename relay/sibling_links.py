"""A link to another worker of this station (``relay.workers``), kept alive by probing.

A worker that dies (killed, crashed) sends no CONNECTION_CLOSE, and the one started in its
place drops the old connection's datagrams without a word, so without a probe the link would
look up until QUIC's idle timeout (a minute), and clients of the new worker would miss the
others' events meanwhile. ``until_lost`` pings the link at the QUIC level whenever it has been
quiet for ``interval_s``; one ping not acknowledged within ``timeout_s`` closes it, and the
link manager dials again. Links to other stations are not probed here (their liveness is
QUIC's, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from macula.transport import FrameProtocol

log = logging.getLogger("macula.relay")

PROBE_INTERVAL_S = 1.0  # of a link moving no bytes before a ping
PROBE_TIMEOUT_S = 4.0  # lenient: a loaded worker acknowledges late, and a closed link loses events


async def until_lost(
    connection: FrameProtocol,
    lost: asyncio.Event,
    interval_s: float = PROBE_INTERVAL_S,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> None:
    """Return once ``lost`` is set; a link quiet for ``interval_s`` (no stream bytes received
    or sent: sending needs the other worker's flow-control credit, so a dead one stops it
    within a window) is pinged, and closed first if the ping goes unanswered for
    ``timeout_s``. A link that keeps moving bytes either way is never pinged."""
    heard = connection.stream_bytes()
    while not lost.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lost.wait(), interval_s)
            return
        moved = connection.stream_bytes()
        if moved != heard:
            heard = moved
            continue
        try:
            answered = await connection.acknowledged(timeout_s)
        except ConnectionError:
            break  # ended meanwhile: ``lost`` follows
        if not answered:
            log.warning("link to another worker: no ping answered in %g s, closing", timeout_s)
            connection.close_connection("worker did not acknowledge a ping")
            break
    await lost.wait()
