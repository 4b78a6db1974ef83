"""What an agent signs so that its agent-directory row may be relayed by its station.

A registration at station S may carry a ``listing_proof``: an identity proof
(``macula.agent.proof``) bound to ``macula.agents.listed_v1#<S hex>#<ttl s>#<entry digest>``,
signed at the moment of registering. It says "I, this agent, asked station S to list exactly
this entry for ttl seconds from the proof's timestamp". S stores it and hands it out with the
row; any other station checks it before it lists the row as relayed through S, so a linked
station can relay only rows its own agents signed for it, unchanged, and dated no later than
the agent dated them.

The entry digest is SHA-256 (lowercase hex) of the canonical JSON of the entry's fields
(``ENTRY_FIELDS``; an absent text is null, absent offers are ``[]``; keys sorted, no spaces,
UTF-8 unescaped).

Invariants: pure functions, no clock, no I/O; ``listing_procedure`` and ``parse_listing_ttl``
agree (one is the other's inverse on the ttl part).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Final

__all__ = [
    "ENTRY_FIELDS",
    "LISTED_PROCEDURE",
    "entry_digest",
    "listing_procedure",
    "parse_listing_ttl",
]

LISTED_PROCEDURE: Final = "macula.agents.listed_v1"
ENTRY_FIELDS: Final = (
    "node_id",
    "petname",
    "operator_name",
    "session_name",
    "model",
    "connected_via",
    "offers",
)


def entry_digest(entry: Mapping[str, object]) -> str:
    """SHA-256 hex of the entry's canonical JSON (only ``ENTRY_FIELDS``)."""
    canonical = {name: entry.get(name) for name in ENTRY_FIELDS}
    offers = canonical["offers"]
    canonical["offers"] = list(offers) if isinstance(offers, list | tuple) else []
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def listing_procedure(station: bytes, ttl_s: int, entry: Mapping[str, object]) -> str:
    """What a listing proof is bound to: the station, the ttl and the entry's digest."""
    return f"{LISTED_PROCEDURE}#{station.hex()}#{ttl_s}#{entry_digest(entry)}"


def parse_listing_ttl(procedure: object) -> int | None:
    """The ttl (seconds) a listing proof's procedure names, or None if it is not one."""
    if type(procedure) is not str:
        return None
    parts = procedure.split("#")
    if len(parts) != 4 or parts[0] != LISTED_PROCEDURE:
        return None
    ttl = parts[2]
    if not ttl.isascii() or not ttl.isdigit() or len(ttl) > 6 or ttl != str(int(ttl)):
        return None
    return int(ttl)
