"""The server's runtime while it may not be open yet: the MCP handshake never waits on it.

A server that cannot reach its stations, or whose settings are wrong, or (attached) whose
daemon runs the agent with other settings, still speaks MCP: every tool answers the
``Problem`` (``code``, ``detail``, ``retryable``, ``next_action`` and what was tried), and
``mesh://status`` says the same. Meanwhile the gate keeps opening the runtime in the
background (1 s doubling to 30 s, as the node's reconnect), and a tool call wakes it at once:
the call after the cause is gone works.

Invariants:
- one keeper task (owned by the gate's task group) opens the runtime; once open it stays open
  until the gate closes, and a failure after that is not the gate's to hide (it propagates);
- a tool call waits for the first attempt's outcome (at most ``FIRST_WAIT_S``), and after a
  failure for one more attempt (at most ``RETRY_WAIT_S``), never longer;
- every failure is turned into a ``Problem`` in one function, ``problem_of``; a problem names
  the variable at fault or the stations tried, and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Final

from mcp_types import CallToolResult

from macula.client.backoff import Backoff
from macula.config import PREFIX, STATIONS_ENV
from macula.errors import BrokenError, ConfigError, HandshakeError, MaculaError
from macula.stations import StationAddress
from tools.server.results import fail
from tools.server.runtime import Runtime

log = logging.getLogger("macula.tools")

FIRST_WAIT_S: Final = 45.0  # the first attempt: up to three rounds of a 10 s connect timeout
# a stuck close (seen: an open cut short by the session ending, under load) is cancelled
CLOSE_WAIT_S: Final = 4.0
CLOSE_TRIES: Final = 3
RETRY_WAIT_S: Final = 5.0  # a call after a failure waits this long for one more attempt
RETRY_BACKOFF: Final = Backoff(first_connect_attempts=1)  # attempts after the first: one round
_VARIABLE: Final = re.compile(rf"\b({PREFIX}[A-Z0-9_]+)")


@dataclass(frozen=True)
class Problem:
    """Why the tools cannot work now, and what fixes it (``fail``'s shape, plus facts)."""

    code: str
    detail: str
    next_action: str
    retryable: int = 1
    facts: Mapping[str, Any] = field(default_factory=dict)

    def result(self) -> CallToolResult:
        return fail(
            self.code, self.detail, retryable=self.retryable, next_action=self.next_action,
            **dict(self.facts),
        )  # fmt: skip

    def view(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "detail": self.detail,
            "retryable": self.retryable,
            "next_action": self.next_action,
            **self.facts,
        }


def configuration_problem(exc: ConfigError) -> Problem:
    """A malformed setting: the variable it names, and that a restart is needed."""
    text = str(exc)
    found = _VARIABLE.search(text)
    variable = found.group(1) if found else None
    fix = (
        f"fix {variable} in this MCP server's environment (the harness's entry for macula), "
        "then restart the server"
        if variable
        else "fix the named setting, then restart the server"
    )
    facts = {"variable": variable} if variable else {}
    return Problem("configuration", text, fix, retryable=0, facts=facts)


def station_problem(exc: MaculaError | OSError, stations: Sequence[str]) -> Problem:
    """No station answered: which were tried, what happened, how to fix it."""
    names = ", ".join(stations) or "this home's local station"
    detail = f"cannot reach {names}: {exc}"
    if stations:
        fix = (
            f"start the station ({names}), or correct {STATIONS_ENV} in this server's "
            f"environment (unset it to use this home's own local station) and restart; this "
            "server retries in the background, so the next call works once a station answers"
        )
    else:
        fix = (
            "run `macula-mcp doctor` to see why the local station does not answer; this "
            "server retries in the background, so the next call works once it does"
        )
    facts = {"stations": list(stations), "tried": str(exc)}
    return Problem("station_unreachable", detail, fix, retryable=1, facts=facts)


def problem_of(exc: BaseException, stations: Sequence[str]) -> Problem:
    """The one place a failure to open the runtime becomes a ``Problem``."""
    own = getattr(exc, "problem", None)
    if callable(own):
        made = own()
        if isinstance(made, Problem):
            return made
    if isinstance(exc, ConfigError):
        return configuration_problem(exc)
    if isinstance(exc, (BrokenError, HandshakeError, OSError)):
        return station_problem(exc, stations)
    return Problem(
        "runtime_failed",
        f"{type(exc).__name__}: {exc}",
        "read detail; this server retries in the background",
        retryable=1,
    )


async def unresolved(stations: Sequence[StationAddress]) -> ConfigError | None:
    """When no station's host name resolves (``nonsense``), the setting is wrong, not the
    network: a ``ConfigError`` naming ``MACULA_MESH_STATIONS`` (None when any resolves)."""
    if not stations:
        return None
    loop = asyncio.get_running_loop()
    failed: list[str] = []
    for station in stations:
        try:
            ipaddress.ip_address(station.host)
            return None  # an address: nothing to resolve
        except ValueError:
            pass
        try:
            await loop.getaddrinfo(station.host, station.port, type=socket.SOCK_DGRAM)
            return None
        except OSError:
            failed.append(station.host)
    return ConfigError(
        f"{STATIONS_ENV}: no address for {', '.join(map(repr, failed))}: give each station as "
        "host:port or node_id@host:port of a station that runs (a name that resolves, or an "
        "IP address)"
    )


Opener = Callable[[int], AbstractAsyncContextManager[Runtime]]  # attempt number -> runtime
Using = Callable[[Runtime], AbstractAsyncContextManager[Any]]  # what to hold while it is open


class RuntimeGate:
    """Opens the runtime in the background and retries; tools ask ``usable``."""

    def __init__(
        self,
        opener: Opener | None,
        *,
        stations: Sequence[StationAddress] = (),
        using: Using | None = None,
        problem: Problem | None = None,
        backoff: Backoff | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.opener = opener
        self.env = dict(env or {})  # the settings it opens with (mesh://status warns of some)
        self.stations = list(stations)
        self.using = using
        self.runtime: Runtime | None = None
        self.problem = problem  # a problem known before the first attempt (a bad setting)
        self.attempts = 0
        self.backoff = backoff or Backoff()
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._group: asyncio.TaskGroup | None = None
        self._keeper: asyncio.Task[None] | None = None
        self.on_open: list[Callable[[Runtime | None], None]] = []

    async def __aenter__(self) -> RuntimeGate:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        if self.opener is not None:  # None: only the problem, for as long as the session lives
            self._keeper = self._group.create_task(self._keep(), name="runtime-gate")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()
        self._wake.set()
        if self.runtime is None and self._keeper is not None:
            self._keeper.cancel()  # an attempt in progress is not waited for
        if self._keeper is not None:  # the runtime winds down, or is cut short: exit is bounded
            for _ in range(CLOSE_TRIES):
                done, _ = await asyncio.wait({self._keeper}, timeout=CLOSE_WAIT_S)
                if done:
                    break
                log.warning("the runtime did not close within %.0f s: cancelling it", CLOSE_WAIT_S)
                self._keeper.cancel()
        if self._group is not None:
            group, self._group = self._group, None
            await group.__aexit__(None, None, None)

    def _note(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _keep(self) -> None:
        while not self._closing.is_set():
            misnamed = await unresolved(self.stations)  # no dial can help: said at once
            if misnamed is not None:
                self._failed(misnamed)
                await self._pause(self.backoff.delay(max(self.attempts - 1, 0)))
                continue
            assert self.opener is not None
            try:
                async with (
                    self.opener(self.attempts) as runtime,
                    self.using(runtime) if self.using else contextlib.nullcontext(),
                ):
                    self._opened(runtime)
                    await self._closing.wait()
                    self._opened(None)
                    return
            except (MaculaError, OSError) as exc:
                if self.runtime is not None:
                    raise  # it was open: a later failure is the server's, as before
                self._failed(exc)
            await self._pause(self.backoff.delay(max(self.attempts - 1, 0)))

    def _opened(self, runtime: Runtime | None) -> None:
        if runtime is not None and self.problem is not None:
            log.warning("the mesh is usable now (after %d failed attempts)", self.attempts)
        self.runtime = runtime
        self.problem = None
        for listener in self.on_open:
            listener(runtime)
        self._note()

    def _failed(self, exc: BaseException) -> None:
        self.attempts += 1
        known = self.problem
        self.problem = problem_of(exc, [str(station) for station in self.stations])
        said = known is not None and known.detail == self.problem.detail  # at start-up
        level = logging.WARNING if self.attempts == 1 and not said else logging.INFO
        log.log(level, "mesh not usable (attempt %d): %s", self.attempts, self.problem.detail)
        self._note()

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less when a call asked for an attempt (even during the last)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def usable(self) -> Runtime | Problem:
        """The runtime, or the problem that stops it: waits for the first attempt's outcome,
        and after a failure wakes the keeper and waits for one more attempt (bounded)."""
        if self.runtime is not None:
            return self.runtime
        if self.opener is None and self.problem is not None:
            return self.problem
        if self.attempts == 0 and self.problem is None:
            await self._wait(FIRST_WAIT_S)
        elif self.problem is not None:
            self._wake.set()
            await self._wait(RETRY_WAIT_S)
        if self.runtime is not None:
            return self.runtime
        return self.problem or Problem(
            "starting",
            "the mesh connection is still being set up",
            "call again in a few seconds",
            retryable=1,
        )

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    def view(self) -> dict[str, Any]:
        """What ``mesh://status`` says while the runtime is not open."""
        state = "connecting" if self.problem is None else "not_usable"
        found: dict[str, Any] = {"connected": 0, "state": state, "attempts": self.attempts}
        if self.problem is not None:
            found["problem"] = self.problem.view()
        return found


@contextlib.asynccontextmanager
async def fixed(runtime: Runtime) -> AsyncIterator[Runtime]:
    """An opener for a runtime that is open already (lent by the daemon)."""
    yield runtime


def startup_problem(
    env: Mapping[str, str], say: Callable[[str], None] | None = None
) -> Problem | None:
    """Check every setting before serving (``preflight``): a bad one is said on stderr, loudly,
    and returned for the tools to answer; warnings (a contact policy that means ``closed``)
    are said too."""
    import sys

    from tools.server.runtime import preflight, startup_warnings

    tell = say or (lambda text: print(f"macula-mcp: {text}", file=sys.stderr, flush=True))
    for warning in startup_warnings(env):
        tell(f"WARNING: {warning}")
    try:
        preflight(env)
    except ConfigError as exc:
        problem = configuration_problem(exc)
        tell(f"ERROR: {exc}; every tool answers this until it is fixed ({problem.next_action})")
        return problem
    return None
