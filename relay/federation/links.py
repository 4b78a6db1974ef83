"""Which peer stations this station dials, and when it dials them again (the link shell).

``LinkManager`` keeps one task per target station: it runs the injected ``run_link`` (dial,
pin, handshake, then wait until the link is lost) and, when that returns or fails, waits a
capped exponential backoff with jitter before dialling again. Targets are the ``--peer``
entries, the stations ``remembered`` from before a restart (``relay.federation.known_peers``)
what the injected ``discover`` returns (the DHT's ``stations()``; none by default) and what a
link names (``learn``: its linked stations, ``relay.federation.mesh_roster``), dialled at once.
Invariants: at most ``max_links`` targets at once; never itself, never a station it already has
a link with (``has_link``: e.g. one that dialled this station), never two tasks for one
station (a ``sibling``, another worker of this station, holds its node id: dialled all the
same); a discovered target that discovery no longer names is dropped while it is not linked (a
learned one only once it was learned a discovery interval ago: the DHT may not know it yet);
a remembered one likewise, but only once discovery has named another station (until then the
DHT knows nobody, and the remembered stations are how this one finds the mesh again);
after ``halt`` nothing new is dialled; ``stop`` cancels and awaits every task it started.
Its tasks run through the injected ``spawn`` (the station's task group; a plain loop task when
used on its own), kept in a ``macula.task_scope.TaskScope``.
Time and sleep are injected (``clock``, ``sleep``, ``jitter``), so tests step them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from macula.task_scope import Spawner, TaskScope

log = logging.getLogger("macula.relay")


class StationLike(Protocol):
    """What a target needs (``relay.federation.addresses.StationAddress`` fits)."""

    @property
    def node_id(self) -> bytes: ...

    @property
    def host(self) -> str: ...

    @property
    def quic_port(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LinkTarget:
    node_id: bytes
    host: str
    quic_port: int

    def __str__(self) -> str:
        return f"{self.node_id.hex()[:16]}@{self.host}:{self.quic_port}"


def parse_peer(value: str) -> LinkTarget:
    """``NODE_ID@HOST:PORT`` (node id: 64 hex digits; IPv6 hosts in brackets) or ValueError."""
    node_hex, at, address = value.strip().partition("@")
    if not at:
        raise ValueError(f"{value!r}: expected NODE_ID@HOST:PORT")
    try:
        node_id = bytes.fromhex(node_hex)
    except ValueError:
        raise ValueError(f"{value!r}: the node id is not hex") from None
    if len(node_id) != 32:
        raise ValueError(f"{value!r}: the node id must be 64 hex digits (32 bytes)")
    host, colon, port_text = address.rpartition(":")
    if not colon or not host:
        raise ValueError(f"{value!r}: expected HOST:PORT after '@'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 0 < int(port_text) <= 0xFFFF:
        raise ValueError(f"{value!r}: the port must be 1..65535")
    return LinkTarget(node_id, host, int(port_text))


class LinkFailed(Exception):
    """A link could not be established (wrong key, refused, no HELLO)."""


LINK_FAILURES = (OSError, TimeoutError, ConnectionError, LinkFailed)


class LinkManager:
    def __init__(
        self,
        own_id: bytes,
        *,
        run_link: Callable[[LinkTarget], Awaitable[None]],
        has_link: Callable[[bytes], bool],
        peers: Sequence[LinkTarget] = (),
        siblings: Sequence[LinkTarget] = (),
        remembered: Sequence[LinkTarget] = (),
        discover: Callable[[], Awaitable[Sequence[StationLike]]] | None = None,
        max_links: int = 64,
        discover_interval_s: float = 30.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stable_s: float = 10.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        spawn: Spawner | None = None,
    ) -> None:
        self.own_id = own_id
        self._run_link = run_link
        self._has_link = has_link
        self._peers = list(peers)
        self._siblings = list(siblings)  # workers of this station: they share its node id
        self._remembered_targets = list(remembered)
        self._discover = discover
        self.max_links = max_links
        self.discover_interval_s = discover_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s  # a link up this long resets the backoff
        self._sleep = sleep
        self._clock = clock
        self._jitter = jitter
        self.targets: dict[bytes, LinkTarget] = {}
        self._pinned: set[bytes] = set()  # ``--peer`` entries: never dropped
        self._remembered: set[bytes] = set()  # kept until discovery names another station
        self._learned: dict[bytes, float] = {}  # named by a link -> when (``learn``)
        self._scope = TaskScope(spawn)
        self._tasks: dict[bytes, asyncio.Task[None]] = {}  # one per target, in the scope
        self.halted = False
        self.attempts = 0  # dials started, in all

    def start(self) -> None:
        for target in self._peers:
            if self._add(target):
                self._pinned.add(target.node_id)
        for target in self._siblings:
            if self._add(target, sibling=True):
                self._pinned.add(target.node_id)
        for target in self._remembered_targets:
            if self._add(target):
                self._remembered.add(target.node_id)
        if self._discover is not None:
            self._scope.spawn(self._discovering())

    def halt(self) -> None:
        """From now on nothing is dialled (the station is stopping)."""
        self.halted = True

    async def stop(self) -> None:
        self.halt()
        await self._scope.aclose()
        self._tasks.clear()

    def _add(self, target: LinkTarget, sibling: bool = False, after_s: float = 0.0) -> bool:
        node_id = target.node_id
        if self.halted or (node_id == self.own_id and not sibling) or node_id in self._tasks:
            return False
        if len(self._tasks) >= self.max_links:
            log.warning("not linking %s: already %d links (max_links)", target, self.max_links)
            return False
        task = self._scope.spawn(self._keep(target, after_s))
        if task is None:  # the station is stopping
            return False
        self.targets[node_id] = target
        self._tasks[node_id] = task
        task.add_done_callback(functools.partial(self._finished, node_id))
        return True

    def learn(self, found: Sequence[StationLike], *, after_s: float = 0.0) -> int:
        """Stations a link named (each by its own signed record): dialled like discovered
        ones, within ``max_links``, the first time ``after_s`` from now (a station told of a
        newcomer waits: the newcomer dials it, and two dials at once cost a duplicate link);
        how many new targets."""
        added = 0
        for station in found:
            if len(self._tasks) >= self.max_links:
                break
            node_id = station.node_id
            if node_id in self._tasks or self._has_link(node_id):
                continue
            if self._add(LinkTarget(node_id, station.host, station.quic_port), after_s=after_s):
                self._learned[node_id] = self._clock()
                added += 1
        return added

    def _recently_learned(self, node_id: bytes) -> bool:
        learned = self._learned.get(node_id)
        return learned is not None and self._clock() - learned < self.discover_interval_s

    def _finished(self, node_id: bytes, task: asyncio.Task[None]) -> None:
        if self._tasks.get(node_id) is task:
            del self._tasks[node_id]
            self.targets.pop(node_id, None)
            self._learned.pop(node_id, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("link task for %s failed", node_id.hex()[:16], exc_info=task.exception())

    async def _keep(self, target: LinkTarget, after_s: float = 0.0) -> None:
        """Dial ``target`` (first after ``after_s``) and dial again whenever the link is
        lost, backing off."""
        if after_s > 0:
            await self._sleep(after_s)
        failures = 0
        while not self.halted:
            if self._has_link(target.node_id):  # e.g. it dialled us: nothing to do for now
                await self._sleep(self.backoff_max_s)
                continue
            started = self._clock()
            self.attempts += 1
            try:
                await self._run_link(target)
            except LINK_FAILURES as exc:
                log.info("link to %s: %s", target, exc or type(exc).__name__)
            except Exception:  # a bug must not end the redialling
                log.exception("link to %s failed unexpectedly", target)
            if self._clock() - started >= self.stable_s:
                failures = 0
            if self.halted:
                return
            await self._sleep(self.backoff(failures))
            failures += 1

    def backoff(self, failures: int) -> float:
        """Seconds before the next dial after ``failures`` short-lived attempts: doubling
        from ``backoff_base_s``, capped at ``backoff_max_s``, then jittered to 50..100 %."""
        delay = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(failures, 32))
        return float(delay * (0.5 + 0.5 * self._jitter()))

    async def _discovering(self) -> None:
        assert self._discover is not None
        while not self.halted:
            try:
                found = await self._discover()
            except Exception:  # discovery is best effort: the next round tries again
                log.warning("station discovery failed", exc_info=True)
                found = []
            named = {station.node_id for station in found}
            if named - {self.own_id}:
                self._remembered.clear()  # the DHT knows the mesh: it decides from now on
            for station in found:
                if len(self._tasks) >= self.max_links:
                    break
                if station.node_id not in self._tasks and not self._has_link(station.node_id):
                    self._add(LinkTarget(station.node_id, station.host, station.quic_port))
            for node_id in list(self._tasks):
                if (
                    node_id not in named
                    and node_id not in self._pinned
                    and node_id not in self._remembered
                    and not self._recently_learned(node_id)
                    and not self._has_link(node_id)
                ):
                    self._tasks[node_id].cancel()  # discovery no longer knows it
            await self._sleep(self.discover_interval_s)
