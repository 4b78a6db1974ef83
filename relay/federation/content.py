"""Content across stations (docs/federation.md): a block or manifest missing here is asked of
a few linked stations, once.

A content get fans out at most one hop: the station asks with ``hops_remaining`` 0 in the
arguments, and a get carrying ``hops_remaining`` never fans out again (the router's pure rule:
``relay.federation.content_hops``). ``peer_asker``
builds the ``ask_peers`` callable the built-ins get: it asks up to ``fanout`` linked stations at
once and returns the RESULT payloads that came back in time; the built-ins verify them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from relay.core.actions import StationReplied
from relay.federation.content_hops import HOPS_REMAINING

# (procedure, arguments) -> the RESULT payloads of the linked stations asked
AskPeers = Callable[[str, Mapping[str, object]], Awaitable[list[object]]]
# (station node id, procedure, payload, timeout_s) -> how that CALL settled
CallStation = Callable[[bytes, str, object, float], Awaitable[StationReplied]]


def peer_asker(
    linked: Callable[[], list[bytes]],
    call_station: CallStation,
    *,
    fanout: int,
    timeout_s: float,
) -> AskPeers:
    """``ask_peers`` over ``call_station``: up to ``fanout`` of the ``linked`` stations."""

    async def ask(procedure: str, args: Mapping[str, object]) -> list[object]:
        stations = linked()[: max(0, fanout)]
        if not stations:
            return []
        payload = {**args, HOPS_REMAINING: 0}
        replies = await asyncio.gather(
            *(call_station(node_id, procedure, payload, timeout_s) for node_id in stations)
        )
        return [reply.payload for reply in replies if reply.ok]

    return ask
