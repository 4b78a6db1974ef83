"""What the MCP server holds while it runs: one Node, one Agent, receipts, served commands.

Start-up (``open_runtime``): identity from ``MACULA_MCP_IDENTITY``, else a named one
(``MACULA_MCP_AGENT``), else one per harness session (``CLAUDE_CODE_SESSION_ID``, else the
parent pid), all under ``MACULA_HOME``; stations from ``MACULA_MESH_STATIONS`` (those without
a node id pinned on first use in ``$MACULA_HOME/known_stations``), else ``127.0.0.1:4433``
pinned to this home's own station key (``tools.local_station.station``: another user's station there
is
refused), else the local station: a background process shared by this home's sessions, started
by the first one that needs it (said on stderr) and left running when it ends.
Every tool runs through ``run_tool``: idempotency receipts, presence on first mesh use, and
errors mapped in one place (``tools.server.results.from_error``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_types import CallToolResult

from macula.agent.agent import Agent, AgentSettings
from macula.agent.contact_policy import ENV_OVERRIDE as POLICY_ENV
from macula.agent.contact_policy import parse_override
from macula.client.backoff import Backoff
from macula.clock import now_ms
from macula.config import (
    HOME_ENV,
    RINGS_DB_ENV,
    ROSTER_DB_ENV,
    TRANSCRIPT_DB_ENV,
    configured_stations,
    identity_from_env,
    known_stations_from_env,
    macula_home,
)
from macula.errors import BrokenError, MaculaError
from macula.node.node import Node
from macula.realm.membership import MembershipStore, memberships_path
from macula.stations import StationAddress
from macula.store.base import StorePaths, paths_from_env
from macula.wire.identity import Identity
from tools.groups.text_limits import MAX_IDEMPOTENCY_KEY
from tools.local_station import station as local_station
from tools.server.receipts import ReceiptStore, args_digest
from tools.server.results import InvalidArgument, bad_argument, fail, from_error, ok
from tools.settings import ChannelSettings, local_station_settings, terse_tools

log = logging.getLogger("macula.tools")


def agent_settings(env: Mapping[str, str], identity: Identity) -> AgentSettings:
    """Agent settings; stores default to a folder of this identity's own (rooms joined and
    rings are per agent), unless the ``MACULA_MCP_*_DB`` variables place them."""
    settings = AgentSettings.from_env(env)
    own = macula_home(env) / "agents" / identity.node_id.hex()[:16]
    shared = paths_from_env(env)
    defaults = paths_from_env({HOME_ENV: str(own)})
    paths = StorePaths(
        roster=shared.roster if env.get(ROSTER_DB_ENV) else defaults.roster,
        transcript=shared.transcript if env.get(TRANSCRIPT_DB_ENV) else defaults.transcript,
        rings=shared.rings if env.get(RINGS_DB_ENV) else defaults.rings,
    )
    return dataclasses.replace(settings, paths=paths)


@dataclass
class Runtime:
    node: Node
    agent: Agent
    receipts: ReceiptStore
    env: Mapping[str, str]
    stations: list[StationAddress]
    embedded_station: str | None = None
    terse: bool = False
    served: dict[str, Any] = field(default_factory=dict)  # procedure name -> serving record
    counters: dict[str, int] = field(default_factory=dict)
    a2a: Any = None  # tools.a2a.outbound.Outbound, opened by the first task tool that needs it

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1


async def _stations(env: Mapping[str, str]) -> tuple[list[StationAddress], str | None]:
    configured = configured_stations(env)  # every entry: the node fails over along them
    if configured:
        return configured, None
    # this home's station, pinned (ForeignStationError when someone else's holds the port);
    # the local station process is started when none runs, and outlives this session
    station, local = await local_station.default_station(env)
    return [station], local


def preflight(env: Mapping[str, str]) -> Identity:
    """Check every setting before speaking MCP: a bad value fails here, naming itself."""
    identity = identity_from_env(env)
    if not configured_stations(env):
        local_station_settings(env)
    agent_settings(env, identity)
    ChannelSettings.from_env(env)
    return identity


def startup_warnings(env: Mapping[str, str]) -> list[str]:
    """Settings that do not stop the server but change what it does, said at start-up."""
    raw = env.get(POLICY_ENV)
    if raw and raw.strip() and parse_override(raw) is None:
        return [
            f"{POLICY_ENV}={raw!r} is not open, ask, allowlist, closed or 1..4: every ring is "
            "refused (closed) until it is fixed"
        ]
    return []


def station_names(env: Mapping[str, str]) -> list[StationAddress]:
    """The stations this server dials (none: this home's local station, or a bad setting)."""
    with contextlib.suppress(MaculaError):
        return configured_stations(env)
    return []


@contextlib.asynccontextmanager
async def open_runtime(
    env: Mapping[str, str] | None = None, backoff: Backoff | None = None
) -> AsyncIterator[Runtime]:
    """The runtime (``backoff``: the node's; its ``first_connect_attempts`` bounds the wait
    for the first station)."""
    environ = dict(os.environ if env is None else env)
    identity = preflight(environ)  # every setting first: a bad one starts nothing (no station)
    terse = terse_tools(environ)
    receipts_path = macula_home(environ) / "receipts" / f"{identity.node_id.hex()[:16]}.sqlite3"
    stations, embedded = await _stations(environ)
    async with (
        Node(
            identity,
            stations,
            known_stations=known_stations_from_env(environ),
            backoff=backoff,
            presenter=MembershipStore(
                memberships_path(macula_home(environ), identity.node_id), identity
            ).present_on,
        ) as node,
        Agent(node, agent_settings(environ, identity)) as agent,
        await ReceiptStore.open(receipts_path) as receipts,
    ):
        runtime = Runtime(node, agent, receipts, environ, stations, embedded, terse)
        try:
            yield runtime
        finally:
            if runtime.a2a is not None:  # its followers end before the agent and its stores
                await runtime.a2a.close()


def check_key(idempotency_key: str | None) -> str | None:
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        return f"must be 1-{MAX_IDEMPOTENCY_KEY} characters"
    return None


async def run_tool(
    runtime: Runtime,
    tool: str,
    args: dict[str, Any],
    work: Callable[[], Awaitable[dict[str, Any]]],
    *,
    idempotency_key: str | None = None,
    mesh: bool = True,
) -> CallToolResult:
    """Run one tool call: receipts first, presence on first mesh use, errors mapped once."""
    problem = check_key(idempotency_key)
    if problem:
        return bad_argument("idempotency_key", problem)
    digest = args_digest(args)
    if idempotency_key is not None:
        found = await runtime.receipts.find(tool, idempotency_key)
        if found is not None:
            stored_digest, result = found
            if stored_digest != digest:
                return fail(
                    "idempotency_conflict",
                    f"idempotency_key {idempotency_key!r} was used with different arguments",
                    retryable=False,
                    next_action="use a new idempotency_key for a different request",
                )
            return ok(result | {"replayed": 1})
    runtime.count(tool)
    try:
        if mesh:
            await runtime.agent.ensure_present()
        result = await work()
    except (MaculaError, InvalidArgument, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            return fail(
                "os_error", str(exc), retryable=False, next_action="check the path or command"
            )
        return from_error(exc if not isinstance(exc, ConnectionError) else BrokenError(str(exc)))
    except Exception as exc:  # a bug: logged with its traceback, answered without one
        return from_error(exc)
    if idempotency_key is not None:
        await runtime.receipts.store(tool, idempotency_key, digest, result, now_ms())
    return ok(result)
