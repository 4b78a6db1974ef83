"""Content across stations (docs/federation.md): a block or manifest missing here is asked of
a few linked stations, once.

A content get fans out at most one hop: the station asks with ``hops_remaining`` 0 in the
arguments, and a get carrying ``hops_remaining`` never fans out again. The router
(``RouterCore._call_refusal``) holds the key's two rules — a client may not set it, a station
peer must set it to 0 — so a peer station cannot make this one ask a third. ``peer_asker``
builds the ``ask_peers`` callable the built-ins get: it asks up to ``fanout`` linked stations at
once and returns the RESULT payloads that came back in time; the built-ins verify them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from relay.actions import StationReplied

HOPS_REMAINING: Final = "hops_remaining"
FANNED_OUT: Final = frozenset({"_content.get_block", "_content.get_manifest"})

# (procedure, arguments) -> the RESULT payloads of the linked stations asked
AskPeers = Callable[[str, Mapping[str, object]], Awaitable[list[object]]]
# (station node id, procedure, payload, timeout_s) -> how that CALL settled
CallStation = Callable[[bytes, str, object, float], Awaitable[StationReplied]]


def hops_refusal(procedure: str, payload: object, *, from_station: bool) -> str | None:
    """Why a content get's ``hops_remaining`` is not acceptable from this sender, or None."""
    if procedure not in FANNED_OUT or not isinstance(payload, Mapping):
        return None
    present = HOPS_REMAINING in payload
    if not from_station:
        return f"bad_request: '{HOPS_REMAINING}' is set only by stations" if present else None
    value = payload.get(HOPS_REMAINING)
    if not present or type(value) is not int or value != 0:
        return f"bad_request: a station's content get carries '{HOPS_REMAINING}' 0"
    return None


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
