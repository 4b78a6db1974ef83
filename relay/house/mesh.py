"""The house across stations (docs/federation.md): the agent directory lists the whole mesh,
the station directory learns the mesh's stations.

Invariants:
- Registration stays at the agent's own station; only ``macula.agents.list_v1`` fans out.
- A listing asked by a client fans out to at most ``fanout`` linked stations (``concurrency``
  at once, all within ``timeout_s``). One asked by a station peer answers from this station's
  own entries only, so a listing crosses one link at most and never loops. Whether the asker
  is a station peer is told by the station shell from the connection (a station link), never
  read from the payload, so no client can set it.
- A linked station's answer is untrusted: only its first ``limit`` entries are looked at, each
  rebuilt from the known fields after the checks a registration passes (node id, its petname,
  text sizes, offers) and sane times (unexpired, registered no later than ``FUTURE_SKEW_MS``
  from now, living at most ``MAX_TTL_S``); anything else is dropped and counted in ``stats``.
  One station's garbage, silence or failure never costs the listing the others' entries.
- Merged entries are deduplicated by node id (the newest registration wins), newest first
  (ties by node id), at most ``limit``; each carries ``station``, the hex node id of the
  station that listed it (where the agent registered).
- A station's own entry in another's station directory comes from that station itself, asked
  over the authenticated link (``station_entry``): only a view naming the linked node id counts.
No clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from macula.agent.envelope import is_node_hex
from macula.agent.petnames import petname
from relay.actions import StationReplied
from relay.arguments import is_text
from relay.house.agents import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    MAX_OFFERS,
    MAX_TEXT_CHARS,
    MAX_TTL_S,
    PROCEDURE_LIST,
)
from relay.house.stations import StationEntry, StationInfo
from relay.outcome import Outcome

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_FANOUT",
    "DEFAULT_TIMEOUT_MS",
    "AskLinked",
    "LinkedReply",
    "MeshAgentList",
    "linked_asker",
    "merge_agent_lists",
    "station_entry",
]

log = logging.getLogger("macula.relay.house")

DEFAULT_FANOUT: Final = 64  # linked stations asked per listing (the default max_links)
DEFAULT_CONCURRENCY: Final = 16  # of them at once
DEFAULT_TIMEOUT_MS: Final = 2_000  # for all of them together
FUTURE_SKEW_MS: Final = 60_000
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


def _agent_entry(value: object, now_ms: int) -> dict[str, object] | None:
    """A linked station's listed agent rebuilt from its known fields, or None if it fails a
    check a registration (or a sane clock) would impose."""
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
        if text is not None and not is_text(text, 1, MAX_TEXT_CHARS):
            return None
        entry[name] = text
    offers = value.get("offers", [])
    if not isinstance(offers, list) or len(offers) > MAX_OFFERS:
        return None
    if not all(is_text(offer, 1, MAX_TEXT_CHARS) for offer in offers):
        return None
    entry["offers"] = list(offers)
    registered, expires = value.get("registered_ms"), value.get("expires_ms")
    if type(registered) is not int or type(expires) is not int:
        return None
    if registered > now_ms + FUTURE_SKEW_MS or expires <= now_ms:
        return None
    if not registered < expires <= registered + MAX_TTL_S * 1000:
        return None
    entry["registered_ms"], entry["expires_ms"] = registered, expires
    return entry


def merge_agent_lists(
    own_station: bytes,
    own_agents: Sequence[dict[str, object]],
    replies: Sequence[LinkedReply],
    limit: int,
    now_ms: int,
    stats: Counter[str],
) -> list[dict[str, object]]:
    """This station's listed agents and the linked stations' (checked), one row per node id
    (the newest registration), newest first, at most ``limit``; each with its ``station``."""
    rows: dict[str, dict[str, object]] = {}

    def keep(entry: dict[str, object], station: bytes) -> None:
        node = entry["node_id"]
        assert isinstance(node, str)
        held = rows.get(node)
        if held is not None:
            stats["linked_agent_duplicates"] += 1
            if _newest_key(held) >= _newest_key(entry):
                return
        rows[node] = {**entry, "station": station.hex()}

    for entry in own_agents:
        keep(entry, own_station)
    for reply in replies:
        if reply.station == own_station:
            continue
        if not reply.ok:
            stats["linked_lists_failed"] += 1
            continue
        agents = reply.payload.get("agents") if isinstance(reply.payload, dict) else None
        if not isinstance(agents, list):
            stats["linked_lists_invalid"] += 1
            continue
        if len(agents) > limit:
            stats["linked_agents_over_limit"] += len(agents) - limit
        for value in agents[:limit]:
            checked = _agent_entry(value, now_ms)
            if checked is None:
                stats["linked_agents_invalid"] += 1
                continue
            stats["linked_agents_listed"] += 1
            keep(checked, reply.station)
    ordered = sorted(rows.values(), key=_order)
    return ordered[:limit]


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

    async def list(self, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """The merged listing; the local refusal (bad arguments) when there is one."""
        own = await self.local(PROCEDURE_LIST, payload, caller, now_ms)
        if own.is_error or not isinstance(own.payload, dict):
            return own
        limit = _limit_of(payload)
        try:
            replies = await self.ask_linked(PROCEDURE_LIST, {"limit": limit})
        except Exception:  # asking is best effort: this station's own listing still stands
            log.exception("asking the linked stations for their agents failed")
            replies = []
        self.stats["mesh_lists"] += 1
        own_agents = [a for a in own.payload.get("agents", []) if isinstance(a, dict)]
        merged = merge_agent_lists(self.station_id, own_agents, replies, limit, now_ms, self.stats)
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
    if type(value) is int and 1 <= value <= MAX_LIST_LIMIT:
        return value
    return DEFAULT_LIST_LIMIT


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
