"""The one-hop rule of content across stations (docs/federation.md), pure.

A content get fans out at most one hop: the station asks its links with ``hops_remaining`` 0 in
the arguments, and a get carrying ``hops_remaining`` never fans out again. The router
(``relay.core.calls.CallHandling.call_refusal``) holds the key's two rules, here: a client
may not set it, a station peer must set it to 0, so a peer station cannot make this one ask a
third. The asker itself (async) is ``relay.federation.content``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

HOPS_REMAINING: Final = "hops_remaining"
FANNED_OUT: Final = frozenset({"_content.get_block", "_content.get_manifest"})


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
