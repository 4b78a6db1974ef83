"""What the console shows: one JSON snapshot of everything the daemon hosts, read through the
agent layer (``Runtime.agent``), never by opening SQLite by hand.

Invariants:
- reading never changes what the agents see: rooms are read with ``peek`` (read marks left
  alone), waits and ring queues are never consumed;
- the shapes follow the tools' views (``tools.groups.agent_views``,
``tools.groups.tasks.task_view``): 0/1
  integers, never booleans, every node id with its petname;
- the agent directory (a mesh call) is read at most once per ``DIRECTORY_TTL_S`` per identity
  (``DirectoryCache``); a failure there shows as an error string, never breaks the snapshot;
- no token, key or path of a key file is ever part of a snapshot;
- each room appears once, in ``rooms`` (``tools.daemon.console.rooms_view``), however many hosted
  identities are in it; an identity's ``rooms`` only names their topics;
- ``agent_name`` is ``MACULA_MCP_AGENT`` only when it chose the key (no ``MACULA_MCP_IDENTITY``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from macula.agent.petnames import petname
from macula.clock import now_ms
from macula.config import AGENT_ENV, IDENTITY_ENV
from macula.errors import MaculaError
from macula.realm.authority import Realm, RealmError, list_realms
from macula.realm.codes import display
from tools.a2a.outbound import outbound_of
from tools.daemon.console.rooms_view import known_names, merged_rooms
from tools.groups.agent_views import ring_view, with_petname
from tools.groups.realms import membership_store
from tools.groups.tasks import task_view
from tools.server.runtime import Runtime

log = logging.getLogger("macula.console")

DIRECTORY_TTL_S: Final = 5.0
MAX_MESSAGES: Final = 50
MAX_TASKS: Final = 50


class ConsoleSource(Protocol):
    """What the console reads from the daemon (``tools.daemon.server.Daemon`` is one)."""

    @property
    def home(self) -> Path: ...

    def runtimes(self) -> list[Runtime]: ...


class DirectoryCache:
    """The agent directory (roster merged with the stations' directory), per identity."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._rows: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    async def agents(self, runtime: Runtime) -> list[dict[str, Any]]:
        key = runtime.node.identity.node_id.hex()
        found = self._rows.get(key)
        if found is not None and self.clock() - found[0] < DIRECTORY_TTL_S:
            return found[1]
        rows = await runtime.agent.agents(limit=200)
        self._rows[key] = (self.clock(), rows)
        return rows


def _policy_view(runtime: Runtime) -> dict[str, Any]:
    policy = runtime.agent.rings.policy()
    trusted = [
        {"node_id": hexa, "petname": petname(bytes.fromhex(hexa))}
        for hexa in policy.allowlist
        if len(hexa) == 64
    ]
    return {"contact_policy": policy.mode.label, "policy_error": policy.error, "trusted": trusted}


async def _room_views(runtime: Runtime) -> list[dict[str, Any]]:
    rooms = runtime.agent.rooms
    threads = await rooms.recent_threads(MAX_MESSAGES)
    joined = {m.room_topic: m for m in await rooms.transcript.joined_rooms()}
    views = []
    for thread in threads:
        topic = thread.room_topic
        keyed = None if rooms.keys is None else await rooms.keys.store.room(topic)
        membership = joined.get(topic)
        views.append(
            {
                "room_topic": topic,
                "purpose": None if membership is None else membership.purpose,
                "role": None if membership is None else membership.role,
                "realm": rooms.realm_of(topic).hex(),
                "private": int(keyed is not None),
                "unread": thread.unread,
                "messages": [with_petname(m) for m in thread.messages],
            }
        )
    return views


async def _realm_views(runtime: Runtime) -> list[dict[str, Any]]:
    store = membership_store(runtime)
    memberships = await asyncio.to_thread(store.memberships)
    return [m.view() for m in memberships]


def agent_name(runtime: Runtime) -> str | None:
    """The name a person gave this agent (``MACULA_MCP_AGENT``), when that chose its key."""
    env = runtime.env
    name = env.get(AGENT_ENV)
    return name if name and not env.get(IDENTITY_ENV) else None


async def _a2a_urls(runtime: Runtime) -> dict[bytes, str]:
    """The URL of each A2A agent this identity handed tasks to, by its peer marker."""
    outbound = await outbound_of(runtime)
    return {} if outbound is None else dict(outbound.urls)


async def identity_view(runtime: Runtime, directory: DirectoryCache) -> dict[str, Any]:
    """One hosted identity: who it is, its stations, rooms, rings, tasks, realms, policy."""
    agent = runtime.agent
    me = agent.identity_view()
    try:
        present: list[dict[str, Any]] | str = await directory.agents(runtime)
    except MaculaError as exc:
        present = str(exc)
    pending = [
        ring_view(r) | {"peer_petname": petname(r.peer)} for r in await agent.rings.pending()
    ]
    tasks = await agent.tasks.list_tasks(limit=MAX_TASKS)
    urls = await _a2a_urls(runtime)
    return {
        "node_id": me["node_id"],
        "petname": me["petname"],
        "agent_name": agent_name(runtime),
        "operator_name": me["profile"].get("operator_name"),
        "present": me["present"],
        "profile": me["profile"],
        "stations": [str(s) for s in runtime.stations],
        "policy": _policy_view(runtime),
        "directory": present,
        "rooms": await _room_views(runtime),
        "rings": pending,
        "tasks": [task_view(t, a2a=urls) for t in tasks],
        "realms": await _realm_views(runtime),
    }


def owned_realms(home: Path, now: int) -> list[dict[str, Any]]:
    """Realms whose authority key is in this home, each with its pending joins (blocking I/O:
    call it in a thread)."""
    views: list[dict[str, Any]] = []
    for name in list_realms(home):
        try:
            realm = Realm(home, name).open()
            pending = realm.pending(now)
            authority = realm.authority.node_id.hex()
        except (RealmError, OSError) as exc:
            views.append({"name": name, "error": str(exc), "pending": []})
            continue
        views.append(
            {
                "name": name,
                "authority": authority,
                "pending": [
                    {
                        "code": display(s.code),
                        "node_id": s.node.hex(),
                        "petname": petname(s.node),
                        "requested_at": s.created_at,
                        "expires_at": s.expires_at,
                    }
                    for s in pending
                ],
            }
        )
    return views


async def snapshot(
    source: ConsoleSource, directory: DirectoryCache, person: dict[str, Any]
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict: each room once (``rooms``, merged
    across the hosted identities in it), and the names a person gave (``names``)."""
    identities: list[dict[str, Any]] = []
    for runtime in _live(source.runtimes()):
        try:
            identities.append(await identity_view(runtime, directory))
        except Exception:  # a closing runtime must not take the page down
            log.warning("an identity could not be read for the console", exc_info=True)
    realms = await asyncio.to_thread(owned_realms, source.home, now_ms())
    rooms = merged_rooms(identities)
    for identity in identities:
        identity["rooms"] = [r["room_topic"] for r in identity["rooms"]]
    return {
        "person": person,
        "identities": identities,
        "rooms": rooms,
        "names": known_names(identities),
        "owned_realms": realms,
    }


def _live(runtimes: Sequence[Runtime]) -> list[Runtime]:
    return sorted(runtimes, key=lambda r: r.node.identity.node_id.hex())
