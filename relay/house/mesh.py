"""The house across stations (docs/federation.md): the agent directory lists the whole mesh,
the station directory learns the mesh's stations.

Invariants:
- Registration stays at the agent's own station; only ``macula.agents.list_v1`` fans out.
- A listing asked by a client fans out to at most ``fanout`` linked stations (``concurrency``
  at once, all within ``timeout_s``). One asked by a station peer answers from this station's
  own entries only, so a listing crosses one link at most and never loops. Whether the asker
  is a station peer is told by the station shell from the connection (a station link), never
  read from the payload, so no client can set it.
- A linked station's answer is untrusted: at most ``min(limit, per_station)`` of its entries
  are looked at, each rebuilt from the known fields after the checks a registration passes
  (node id, its petname, text sizes, offers), and counted only with the agent's own
  ``listing_proof`` (``macula.services.directory_listing``) bound to *that* station, that entry and
  a
  ttl: so a station relays only its own agents' rows, unchanged. The row is dated by the
  proof (``registered_ms`` = its timestamp, never later than now; ``expires_ms`` = timestamp
  + ttl); a proof dated over ``FUTURE_SKEW_MS`` ahead, or expired, drops the row. Anything
  dropped is counted in ``stats`` by why. One station's garbage, silence or failure never
  costs the listing the others' entries.
- One row per node id: a local row wins over a relayed one; between relayed rows, the one the
  agent signed newest. ``limit`` is filled with local rows first, then relayed rows in turn
  from each linked station, so none crowds out the others. Rows are listed newest first (ties
  by node id); each carries ``station`` (hex node id of the station holding the registration)
  and ``relayed`` (1: from a linked station, 0: this station's own); no ``listing_proof``.
- A station's own entry in another's station directory comes from that station itself, asked
  over the authenticated link (``station_entry``): only a view naming the linked node id counts.
No clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from macula.agent.envelope import is_node_hex
from macula.agent.petnames import petname
from macula.agent.proof import verify_proof
from macula.services.directory_listing import listing_procedure, parse_listing_ttl
from macula.services.house import AGENTS_LIST
from macula.services.limits import DEFAULT_AGENTS_LIST, MAX_AGENT_TEXT_CHARS, MAX_AGENTS_LIST
from relay.builtins.arguments import is_text
from relay.builtins.outcome import Outcome
from relay.core.actions import StationReplied
from relay.house.agents import (
    MAX_OFFERS,
    MAX_TTL_S,
    MIN_TTL_S,
)
from relay.house.stations import StationEntry, StationInfo

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_FANOUT",
    "DEFAULT_PER_STATION",
    "DEFAULT_TIMEOUT_MS",
    "AskLinked",
    "LinkedReply",
    "MeshAgentList",
    "VerifiedProofs",
    "linked_asker",
    "linked_entry",
    "merge_agent_lists",
    "station_entry",
]

log = logging.getLogger("macula.relay.house")

DEFAULT_FANOUT: Final = 64  # linked stations asked per listing (the default max_links)
DEFAULT_CONCURRENCY: Final = 16  # of them at once
DEFAULT_TIMEOUT_MS: Final = 2_000  # for all of them together
FUTURE_SKEW_MS: Final = 60_000
DEFAULT_PER_STATION: Final = 100  # rows of one linked station looked at per listing
_ANY_AGE: Final = 1 << 64  # a listing proof's age is checked against its ttl, not a skew
_TEXT_FIELDS: Final = ("operator_name", "session_name", "model", "connected_via")


@dataclass(frozen=True, slots=True)
class LinkedReply:
    """How one linked station answered: ``ok`` and its RESULT payload, or why not."""

    station: bytes
    ok: bool
    payload: object


# (procedure, payload) -> the replies of the linked stations asked
AskLinked = Callable[[str, object], Awaitable[list[LinkedReply]]]
# (station node id, procedure, payload, timeout_s) -> how that CALL settled
CallStation = Callable[[bytes, str, object, float], Awaitable[StationReplied]]


def linked_asker(
    linked: Callable[[], Sequence[bytes]],
    call_station: CallStation,
    *,
    fanout: int = DEFAULT_FANOUT,
    concurrency: int = DEFAULT_CONCURRENCY,
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000,
) -> AskLinked:
    """``ask_linked`` over ``call_station``: the first ``fanout`` of the ``linked`` stations,
    ``concurrency`` at once, every call settled (or given up) within ``timeout_s``."""
    if fanout < 0 or concurrency < 1 or not timeout_s > 0:
        raise ValueError("fanout >= 0, concurrency >= 1 and timeout_s > 0 are needed")

    async def ask(procedure: str, payload: object) -> list[LinkedReply]:
        stations = list(dict.fromkeys(linked()))[:fanout]
        if not stations:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        gate = asyncio.Semaphore(concurrency)

        async def one(node_id: bytes) -> LinkedReply:
            async with gate:
                left = deadline - loop.time()
                if left <= 0:
                    return LinkedReply(node_id, False, "no time left")
                reply = await call_station(node_id, procedure, payload, left)
            return LinkedReply(node_id, reply.ok, reply.payload)

        tasks = [loop.create_task(one(node_id)) for node_id in stations]
        done, late = await asyncio.wait(tasks, timeout=timeout_s + 0.5)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        replies = []
        for node_id, task in zip(stations, tasks, strict=True):
            if task in done and not task.cancelled() and task.exception() is None:
                replies.append(task.result())
            else:
                if task in done and not task.cancelled():
                    log.warning("asking station %s failed", node_id.hex()[:16], exc_info=True)
                replies.append(LinkedReply(node_id, False, "no reply in time"))
        return replies

    return ask


def _entry_fields(value: object) -> dict[str, object] | None:
    """A listed agent's known fields after the checks a registration imposes, or None."""
    if not isinstance(value, dict):
        return None
    node = value.get("node_id")
    if not is_node_hex(node):
        return None
    assert isinstance(node, str)
    if value.get("petname") != petname(bytes.fromhex(node)):
        return None
    entry: dict[str, object] = {"node_id": node, "petname": value["petname"]}
    for name in _TEXT_FIELDS:
        text = value.get(name)
        if text is not None and not is_text(text, 1, MAX_AGENT_TEXT_CHARS):
            return None
        entry[name] = text
    offers = value.get("offers", [])
    if not isinstance(offers, list) or len(offers) > MAX_OFFERS:
        return None
    if not all(is_text(offer, 1, MAX_AGENT_TEXT_CHARS) for offer in offers):
        return None
    entry["offers"] = list(offers)
    return entry


@dataclass(frozen=True, slots=True)
class _Relayed:
    entry: dict[str, object]
    station: bytes
    signed_ms: int

    def row(self) -> dict[str, object]:
        return {**self.entry, "station": self.station.hex(), "relayed": 1}


class VerifiedProofs:
    """The listing proofs that verified lately (at most ``capacity``, least recent forgotten
    first), so that listing the same rows again costs no Ed25519. A key is everything the
    signature covers, so a hit is as good as verifying again."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._held: OrderedDict[tuple[str, int, str, str], None] = OrderedDict()

    def verify(self, proof: dict[str, Any], node: bytes, bound: str) -> bool:
        """Whether ``proof`` is ``node``'s signature over ``bound`` (its age is not checked)."""
        timestamp, signature = proof.get("timestamp"), proof.get("signature")
        if type(timestamp) is not int or type(signature) is not str:
            return False  # malformed: it could never verify
        key = (node.hex(), timestamp, bound, signature)
        if key in self._held:
            self._held.move_to_end(key)
            return True
        if verify_proof(proof, node, bound, 0, _ANY_AGE) is not None:
            return False
        self._held[key] = None
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
        return True


def linked_entry(
    value: object, station: bytes, now_ms: int, verified: VerifiedProofs | None = None
) -> tuple[_Relayed | None, str]:
    """A row ``station`` relays, rebuilt from its known fields and dated by what the agent
    signed for ``station`` (``macula.services.directory_listing``); else None and the stats counter
    saying why (``linked_agents_invalid``, ``_unsigned``, ``_forged``, ``_future``,
    ``_expired``)."""
    entry = _entry_fields(value)
    if entry is None:
        return None, "linked_agents_invalid"
    assert isinstance(value, dict)
    proof = value.get("listing_proof")
    ttl = parse_listing_ttl(proof.get("procedure")) if isinstance(proof, dict) else None
    if ttl is None or not MIN_TTL_S <= ttl <= MAX_TTL_S:
        return None, "linked_agents_unsigned"
    node = bytes.fromhex(str(entry["node_id"]))
    bound = listing_procedure(station, ttl, entry)
    assert isinstance(proof, dict)
    if not (verified or VerifiedProofs(0)).verify(proof, node, bound):
        return None, "linked_agents_forged"
    signed: int = proof["timestamp"]
    if signed > now_ms + FUTURE_SKEW_MS:
        return None, "linked_agents_future"
    expires = signed + ttl * 1000
    if expires <= now_ms:
        return None, "linked_agents_expired"
    entry["registered_ms"], entry["expires_ms"] = min(signed, now_ms), expires
    return _Relayed(entry, station, signed), "linked_agents_listed"


def merge_agent_lists(
    own_station: bytes,
    own_agents: Sequence[dict[str, object]],
    replies: Sequence[LinkedReply],
    limit: int,
    now_ms: int,
    stats: Counter[str],
    per_station: int = DEFAULT_PER_STATION,
    verified: VerifiedProofs | None = None,
) -> list[dict[str, object]]:
    """This station's listed agents and the linked stations' (checked), one row per node id,
    newest first, at most ``limit``; each with its ``station`` and ``relayed`` (0/1).

    A local row wins over a relayed one; between relayed rows, the one the agent signed
    newest. The ``limit`` is filled with local rows first, then relayed ones taken in turn
    from each station (its newest first, at most ``per_station`` looked at), so no linked
    station crowds out the others."""
    local: dict[str, dict[str, object]] = {}
    for entry in own_agents:
        node = str(entry.get("node_id"))
        if node not in local:
            clean = {k: v for k, v in entry.items() if k != "listing_proof"}
            local[node] = {**clean, "station": own_station.hex(), "relayed": 0}
    relayed: dict[str, _Relayed] = {}
    for reply in replies:
        most = min(limit, per_station)
        for candidate in _checked_rows(own_station, reply, most, now_ms, stats, verified):
            node = str(candidate.entry["node_id"])
            held = relayed.get(node)
            if node in local or held is not None:
                stats["linked_agent_duplicates"] += 1
            if node in local or (held is not None and held.signed_ms >= candidate.signed_ms):
                continue
            relayed[node] = candidate
    chosen = sorted(local.values(), key=_order)[:limit]
    chosen.extend(_in_turn(relayed.values(), limit - len(chosen)))
    return sorted(chosen, key=_order)


def _checked_rows(
    own_station: bytes,
    reply: LinkedReply,
    most: int,
    now_ms: int,
    stats: Counter[str],
    verified: VerifiedProofs | None,
) -> list[_Relayed]:
    """The rows of one linked station's reply that pass ``linked_entry``."""
    if reply.station == own_station:
        return []
    if not reply.ok:
        stats["linked_lists_failed"] += 1
        return []
    agents = reply.payload.get("agents") if isinstance(reply.payload, dict) else None
    if not isinstance(agents, list):
        stats["linked_lists_invalid"] += 1
        return []
    if len(agents) > most:
        stats["linked_agents_over_limit"] += len(agents) - most
    rows = []
    for value in agents[:most]:
        checked, counter = linked_entry(value, reply.station, now_ms, verified)
        stats[counter] += 1
        if checked is not None:
            rows.append(checked)
    return rows


def _in_turn(rows: Iterable[_Relayed], room: int) -> list[dict[str, object]]:
    """Up to ``room`` rows, one from each station in turn, each station's newest first."""
    queues: dict[bytes, list[_Relayed]] = {}
    for row in sorted(rows, key=lambda r: (-r.signed_ms, str(r.entry["node_id"]))):
        queues.setdefault(row.station, []).append(row)
    taken: list[dict[str, object]] = []
    depth = 0
    while len(taken) < room and any(len(queue) > depth for queue in queues.values()):
        for queue in queues.values():
            if depth < len(queue) and len(taken) < room:
                taken.append(queue[depth].row())
        depth += 1
    return taken


def _newest_key(entry: dict[str, object]) -> int:
    registered = entry.get("registered_ms")
    return registered if type(registered) is int else 0


def _order(entry: dict[str, object]) -> tuple[int, str]:
    return (-_newest_key(entry), str(entry["node_id"]))


class MeshAgentList:
    """``macula.agents.list_v1`` for a client: this station's listing merged with every linked
    station's (asked with ``ask_linked``)."""

    def __init__(
        self,
        station_id: bytes,
        local: Callable[[str, object, bytes, int], Awaitable[Outcome]],
        ask_linked: AskLinked,
    ) -> None:
        self.station_id = station_id
        self.local = local
        self.ask_linked = ask_linked
        self.stats: Counter[str] = Counter()
        self.verified = VerifiedProofs()

    async def list(self, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """The merged listing; the local refusal (bad arguments) when there is one."""
        own = await self.local(AGENTS_LIST, payload, caller, now_ms)
        if own.is_error or not isinstance(own.payload, dict):
            return own
        limit = _limit_of(payload)
        try:
            replies = await self.ask_linked(AGENTS_LIST, {"limit": limit})
        except Exception:  # asking is best effort: this station's own listing still stands
            log.exception("asking the linked stations for their agents failed")
            replies = []
        self.stats["mesh_lists"] += 1
        own_agents = [a for a in own.payload.get("agents", []) if isinstance(a, dict)]
        merged = merge_agent_lists(
            self.station_id, own_agents, replies, limit, now_ms, self.stats, verified=self.verified
        )
        return Outcome.result(
            {
                "count": len(merged),
                "agents": merged,
                "stations_asked": len(replies),
                "stations_answered": sum(1 for r in replies if r.ok),
            }
        )


def _limit_of(payload: object) -> int:
    """The listing's ``limit`` (the local handler has accepted the arguments already)."""
    value = payload.get("limit") if isinstance(payload, dict) else None
    if type(value) is int and 1 <= value <= MAX_AGENTS_LIST:
        return value
    return DEFAULT_AGENTS_LIST


def station_entry(view: object, node_id: bytes) -> StationEntry | None:
    """Station ``node_id``'s entry from a station-directory view it gave of itself, or None
    when the view is not that station's or not valid."""
    if not isinstance(view, dict) or view.get("node_id") != node_id.hex():
        return None
    fields: dict[str, Any] = {
        name: view.get(name)
        for name in ("host", "port", "city", "country", "continent", "lat", "lng")
    }
    try:
        return StationEntry(node_id, StationInfo(**fields))
    except (TypeError, ValueError):
        return None
