"""The mesh side of the A2A door: each A2A client is a mesh requester of its own.

Every client (``tools.a2a.tokens``) has a key in the home; the door opens a ``Node`` for it (on
the stations of the agent it reaches) and a ``macula.agent.tasks.Tasks`` over one SQLite store
(``$MACULA_HOME/a2a/requesters.sqlite3``, 0600 in a 0700 folder). An A2A message is then
handed over exactly as ``mesh_task_send`` hands a task: signed by the client's key, through
the station, so the agent's contact policy, ``state_seq`` order and the one outcome are the
mesh's own, and the requester's copy follows the agent's updates (``Tasks.wait``).

Invariants:
- at most one open requester per client, keyed by the client's node id (never its name: a
  revoked client's name given to a new client reaches none of the old one's tasks); a held
  requester of another node id is closed and replaced, and one whose client is gone
  (revoked) is closed (``close_gone``); each lives in a task of the door's task group,
  entered and exited there (as ``tools.daemon.hosts`` holds runtimes);
- a requester takes no task itself: its contact policy is ``closed``;
- all of them close when the door closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from macula.agent.contact_policy import Mode, PolicyState
from macula.agent.task_messages import TaskLimits
from macula.agent.tasks import Tasks
from macula.clock import now_ms
from macula.keyfile import load_identity
from macula.known_stations import KnownStations
from macula.node.node import Node
from macula.stations import StationAddress
from macula.store.tasks import TaskStore
from tools.a2a.tokens import Client, a2a_dir, client_identity_path

log = logging.getLogger("macula.a2a")

CLOSED = PolicyState(Mode.CLOSED)


@dataclass(eq=False)
class _Open:
    name: str = ""
    tasks: Tasks | None = None
    error: BaseException | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)


class Requesters:
    """The requesters of one door (``async with``)."""

    def __init__(self, home: Path, clock: Callable[[], int] = now_ms) -> None:
        self.home = home
        self.clock = clock
        self.by_client: dict[str, _Open] = {}  # by the client's node id (hex)
        self._store: TaskStore | None = None
        self._group: asyncio.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> Requesters:
        async with contextlib.AsyncExitStack() as stack:
            path = a2a_dir(self.home) / "requesters.sqlite3"
            self._store = await stack.enter_async_context(await TaskStore.open(path))
            self._group = await stack.enter_async_context(asyncio.TaskGroup())
            stack.callback(self._close_all)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def _close_all(self) -> None:
        for one in self.by_client.values():
            one.closing.set()

    async def tasks(
        self,
        client: Client,
        stations: list[StationAddress],
        known: KnownStations,
        limits: TaskLimits,
    ) -> Tasks:
        """The client's requester, opened on first use; a ``MaculaError`` if it cannot open."""
        for node_id, other in list(self.by_client.items()):
            if other.name == client.name and node_id != client.node_id:
                del self.by_client[node_id]  # a revoked client's name, given to a new one
                other.closing.set()
        held = self.by_client.get(client.node_id)
        if held is None or (held.ready.is_set() and held.tasks is None):
            held = _Open(client.name)
            self.by_client[client.node_id] = held
            assert self._group is not None, "requesters not started"
            self._group.create_task(
                self._run(held, client, stations, known, limits), name=f"a2a-{client.name}"
            )
        await held.ready.wait()
        if held.tasks is None:
            raise held.error or RuntimeError("the requester closed")
        return held.tasks

    def close_gone(self, kept: set[str]) -> None:
        """Close the requesters whose client (node id hex) is not in ``kept``: revoked."""
        for node_id in [n for n in self.by_client if n not in kept]:
            self.by_client.pop(node_id).closing.set()

    async def _run(
        self,
        held: _Open,
        client: Client,
        stations: list[StationAddress],
        known: KnownStations,
        limits: TaskLimits,
    ) -> None:
        try:
            async with self._opened(client, stations, known, limits) as tasks:
                held.tasks = tasks
                held.ready.set()
                await held.closing.wait()
        except Exception as exc:  # one client's failure must not take the door down
            held.error = exc
            log.warning("A2A requester %s failed: %s", client.name, exc)
            if self.by_client.get(client.node_id) is held:
                del self.by_client[client.node_id]
        finally:
            held.tasks = None
            held.ready.set()

    @contextlib.asynccontextmanager
    async def _opened(
        self,
        client: Client,
        stations: list[StationAddress],
        known: KnownStations,
        limits: TaskLimits,
    ) -> AsyncIterator[Tasks]:
        identity = await asyncio.to_thread(
            lambda: load_identity(client_identity_path(self.home, client))
        )
        assert self._store is not None
        async with (
            Node(identity, stations, known_stations=known) as node,
            asyncio.TaskGroup() as group,
        ):
            tasks = Tasks(node, self._store, self.clock, policy=lambda: CLOSED, limits=limits)
            await tasks.serve(group)
            try:
                yield tasks
            finally:
                await tasks.stop()
