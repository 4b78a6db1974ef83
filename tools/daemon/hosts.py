"""The daemon's runtimes: one per identity (node id), shared by every session of that agent.

Invariants:
- at most one open runtime per node id: a session of an agent whose runtime is closing waits
  until it has closed, then opens a new one (two Nodes never share one identity's stores);
- a runtime is opened by the first session (settings checked first, off the event loop, as
  ``macula-mcp`` checks them before speaking MCP) and then stays when sessions detach; it is
  closed (its node saying goodbye) when its agent said ``mesh_goodbye`` and its last session
  detached, when it had no session for the idle timeout (``IdleClock``), or when the daemon
  stops;
- a later session whose settings differ from the runtime's is refused, naming the variables
  (never their values); variables that only shape one session (``SESSION_ONLY``) may differ;
- each runtime lives in a task of the daemon's task group, entered and exited there;
- ``spares`` holds MCP servers built ahead for the next session of the agent (one per shape,
  ``tools.daemon.server._shape``), each used by one session only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from macula.config import AGENT_ENV, DEFAULT_HOME, HOME_ENV, IDENTITY_ENV, PREFIX
from macula.errors import ConfigError
from tools.server.runtime import Runtime, open_runtime, preflight
from tools.settings import (
    CHANNEL_ENV,
    DAEMON_PREFIX,
    HTTP_PREFIX,
    LOG_LEVEL_ENV,
    SOCKET_ENV,
    TERSE_TOOLS_ENV,
)

log = logging.getLogger("macula.daemon")

SESSION_ONLY: Final = frozenset(
    {IDENTITY_ENV, AGENT_ENV, TERSE_TOOLS_ENV, LOG_LEVEL_ENV, CHANNEL_ENV}
)
SESSION_ONLY_PREFIXES: Final = (DAEMON_PREFIX, SOCKET_ENV, HTTP_PREFIX)


class IdleClock:
    """When runtimes and the daemon have been idle long enough (times are arguments)."""

    def __init__(self, timeout: float, now: float) -> None:
        self.timeout = timeout
        self.last_activity = now
        self.idle_since: dict[str, float] = {}

    def attached(self, key: str, now: float) -> None:
        self.idle_since.pop(key, None)
        self.last_activity = now

    def detached(self, key: str, now: float, sessions_left: int) -> None:
        if sessions_left == 0:
            self.idle_since[key] = now
        self.last_activity = now

    def forget(self, key: str) -> None:
        self.idle_since.pop(key, None)

    def expired(self, now: float) -> list[str]:
        return [key for key, since in self.idle_since.items() if now - since >= self.timeout]

    def daemon_expired(self, now: float, hosted: int, sessions: int) -> bool:
        return hosted == 0 and sessions == 0 and now - self.last_activity >= self.timeout


class SettingsConflict(ConfigError):
    """A session's settings differ from those its agent's runtime was opened with: the
    variables (never their values) and the command that lets this session's settings win."""

    def __init__(self, message: str, variables: list[str], home: str) -> None:
        super().__init__(message)
        self.variables = variables
        self.command = f"{HOME_ENV}={shlex.quote(home)} macula-mcp daemon stop"

    def problem(self) -> Any:
        from tools.server.runtime_gate import Problem  # the tool error this becomes

        named = ", ".join(self.variables)
        return Problem(
            "daemon_settings_differ",
            str(self),
            f"run `{self.command}`, then reconnect this MCP server (attach starts a daemon "
            f"with this session's settings); or give this session the same {named} as the "
            "running agent. This session retries on every call: it works once that agent's "
            "runtime has closed",
            retryable=1,
            facts={"variables": self.variables, "command": self.command},
        )


@dataclass(eq=False)
class Hosted:
    node_id: str
    env: dict[str, str]
    sessions: int = 0
    runtime: Runtime | None = None
    error: BaseException | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    spares: dict[str, Any] = field(default_factory=dict)  # servers built ahead, by shape

    def view(self, now: float, idle: IdleClock) -> dict[str, Any]:
        runtime = self.runtime
        since = idle.idle_since.get(self.node_id)
        return {
            "node_id": self.node_id,
            "sessions": self.sessions,
            "present": int(bool(runtime and runtime.agent.presence.present)),
            "said_goodbye": int(bool(runtime and runtime.agent.presence.said_goodbye)),
            "idle_s": round(now - since, 1) if since is not None else 0,
        }


def runtime_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape a runtime (and must agree between sessions of one agent)."""
    return {
        name: value
        for name, value in env.items()
        if name.startswith(PREFIX)
        and name not in SESSION_ONLY
        and not name.startswith(SESSION_ONLY_PREFIXES)
    }


def differing(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    left, right = runtime_settings(a), runtime_settings(b)
    return sorted(name for name in left.keys() | right.keys() if left.get(name) != right.get(name))


class Hosts:
    """The runtimes of one daemon, keyed by node id (hex)."""

    def __init__(
        self, group: asyncio.TaskGroup, idle: IdleClock, clock: Callable[[], float]
    ) -> None:
        self.group = group
        self.idle = idle
        self.clock = clock
        self.by_id: dict[str, Hosted] = {}

    @property
    def sessions(self) -> int:
        return sum(h.sessions for h in self.by_id.values())

    @contextlib.asynccontextmanager
    async def session(self, env: dict[str, str]) -> AsyncIterator[Hosted]:
        """One attached session: the runtime of its identity, opened if needed."""
        identity = await asyncio.to_thread(preflight, env)
        key = identity.node_id.hex()
        hosted = await self._hosted(key, env)
        hosted.sessions += 1
        try:
            await hosted.ready.wait()
            if hosted.runtime is None:
                raise hosted.error or RuntimeError("the runtime closed while opening")
            self.idle.attached(key, self.clock())
            log.info("session attached to %s (%d attached)", key[:16], hosted.sessions)
            yield hosted
        finally:
            hosted.sessions -= 1
            self.idle.detached(key, self.clock(), hosted.sessions)
            log.info("session detached from %s (%d left)", key[:16], hosted.sessions)
            runtime = hosted.runtime
            if hosted.sessions == 0 and runtime and runtime.agent.presence.said_goodbye:
                log.info("%s said goodbye and has no session: closing it", key[:16])
                hosted.closing.set()

    async def _hosted(self, key: str, env: dict[str, str]) -> Hosted:
        while (existing := self.by_id.get(key)) is not None and existing.closing.is_set():
            await existing.closed.wait()
        if existing is not None:
            if names := differing(existing.env, env):
                raise SettingsConflict(
                    f"the daemon already runs agent {key[:16]} with other settings "
                    f"({', '.join(names)} differ): use the same settings, or restart it with "
                    f"`macula-mcp daemon stop`",
                    names,
                    env.get(HOME_ENV, DEFAULT_HOME),
                )
            return existing
        hosted = Hosted(key, env)
        self.by_id[key] = hosted
        self.group.create_task(self._host(hosted), name=f"runtime-{key[:16]}")
        return hosted

    async def _host(self, hosted: Hosted) -> None:
        try:
            async with open_runtime(hosted.env) as runtime:
                hosted.runtime = runtime
                hosted.ready.set()
                log.info("runtime of %s opened", hosted.node_id[:16])
                await hosted.closing.wait()
        except Exception as exc:  # one agent's failure must not take the daemon down
            hosted.error = exc
            log.warning("runtime of %s failed: %s", hosted.node_id[:16], exc, exc_info=exc)
        finally:
            hosted.runtime = None
            hosted.closing.set()
            hosted.ready.set()
            self.by_id.pop(hosted.node_id, None)
            self.idle.forget(hosted.node_id)
            hosted.closed.set()
            log.info("runtime of %s closed", hosted.node_id[:16])

    def close_expired(self) -> None:
        for key in self.idle.expired(self.clock()):
            hosted = self.by_id.get(key)
            self.idle.forget(key)
            if hosted is not None and hosted.sessions == 0:
                log.info("%s idle for %g s: closing it", key[:16], self.idle.timeout)
                hosted.closing.set()

    async def close_all(self) -> None:
        hosted = list(self.by_id.values())
        for one in hosted:
            one.closing.set()
        for one in hosted:
            await one.closed.wait()
