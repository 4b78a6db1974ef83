"""The liveness probe of a node's session to its station.

Invariants:
- a station quiet for ``interval_s`` is pinged at the QUIC level (a PING frame, acknowledged by
  its QUIC stack: no signature, and never stuck behind a control stream the station has paused
  for backpressure); one that acknowledges none of ``attempts`` pings in a row, waited
  ``timeout_s``, then twice, four times as long (``timeout_s * (2**attempts - 1)`` in all), is
  gone (crash, network lost): the connection counts as lost, so the node moves on instead of
  after QUIC's idle timeout. A station merely behind (its receive queue seconds deep while
  hundreds of agents arrive) answers the first ping late, and that answer counts: one missed
  ping must not send every node on the station to reconnect at once, which would keep it behind;
- a connection the station keeps talking on is never pinged;
- a station that restarted (it lost our connection) answers the next packet, ping or not, with
  a stateless reset, which ends the connection at once (``macula.quic.transport``): no wait here;
- the probe ends with the session, and is cancelled when the session ends first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from macula.node.session import Session

log = logging.getLogger("macula.node.node")


async def until_ended(
    session: Session,
    interval_s: float,
    timeout_s: float,
    group: asyncio.TaskGroup | None,
    acknowledged: Callable[[], None],
    attempts: int = 1,
) -> None:
    """Wait for ``session`` to end, probing the station meanwhile (unless ``interval_s`` or
    ``timeout_s`` is 0, or there is no task group to run the probe in)."""
    if not (interval_s and timeout_s) or group is None:
        await session.ended.wait()
        return
    prober = group.create_task(probe(session, interval_s, timeout_s, acknowledged, attempts))
    try:
        await session.ended.wait()
    finally:
        prober.cancel()


async def probe(
    session: Session,
    interval_s: float,
    timeout_s: float,
    acknowledged: Callable[[], None],
    attempts: int = 1,
) -> None:
    """Ping ``session``'s station whenever it has been quiet for ``interval_s``; call
    ``acknowledged`` for each probe answered; end the connection on one that is not (none of
    its ``attempts`` pings acknowledged)."""
    probed_ms = session.heard_ms
    while session.alive:
        last_ms = max(session.heard_ms, probed_ms)
        quiet_s = (session.clock() - last_ms) / 1000
        if quiet_s < interval_s:
            await asyncio.sleep(interval_s - quiet_s)
            continue
        try:
            answered = await session.protocol.acknowledged(timeout_s, attempts)
        except ConnectionError:
            return  # the session ended meanwhile; the supervisor knows
        if not answered:
            patience = timeout_s * (2 ** max(1, attempts) - 1)
            why = f"station {session.address} acknowledged no ping in {patience:g} s"
            refused = session.protocol.refused
            if refused.done():  # ICMP: nothing listens there any more; no need to wait
                why = f"station {session.address}: {refused.result()}"
            log.warning("%s: moving on", why)
            session.connection_lost(why)
            return
        acknowledged()
        probed_ms = session.clock()
