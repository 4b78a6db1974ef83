"""A stop's drain (PROTOCOL.md §5.5): GOODBYE to every connected peer, then a wait until each
acknowledged a QUIC PING sent behind its GOODBYE, its connection ended, or the deadline
passed; then every connection is closed.

The wait is on conditions (the PING's acknowledgement, the connection's end), bounded by the
deadline the station passes in; never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from macula.clock import now_ms
from macula.quic.transport import FrameProtocol
from relay.core.actions import Action
from relay.core.router import RouterCore

__all__ = ["acknowledged", "drain"]


async def drain(
    connections: Mapping[int, FrameProtocol],
    core: RouterCore,
    run: Callable[[list[Action]], None],
    deadline_s: float,
) -> None:
    """GOODBYE to every peer the core counts as connected; once each acknowledged it (or
    left, or ``deadline_s`` passed), close every connection."""
    told = [c for n, c in connections.items() if core.is_connected(n)]
    run(core.shutdown(now_ms()))
    await asyncio.gather(*(acknowledged(c, deadline_s) for c in told))
    for connection in list(connections.values()):
        connection.close_connection("station stopped")


async def acknowledged(connection: FrameProtocol, timeout_s: float) -> None:
    """Until the peer acknowledged a QUIC PING sent now (behind what was queued), its
    connection ended, or ``timeout_s`` passed."""
    if connection.lost:
        return
    with contextlib.suppress(ConnectionError):
        await connection.acknowledged(timeout_s)
