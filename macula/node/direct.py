"""Direct dial (``Node.call(..., direct=True)``): call a procedure at the station serving it.

Invariants:
- the serving station comes from the DHT (procedure_advertisement, then that station's own
  station_endpoint record) and its key is pinned on the connection: no unsigned hint is dialled,
  and only an advertisement whose advertiser is its signer, naming a station with a self-signed
  station_endpoint record, is used (``DhtClient.procedure_records``);
- at most one connection per remote station, held open while the node lives (its task belongs
  to the node's task group) and forgotten when it ends; the node's own station is reused as is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from macula.errors import MaculaError
from macula.node.session import Session, SessionOwner
from macula.services.dht import DhtClient, ResolveError
from macula.stations import StationAddress
from macula.wire.identity import Identity


class DirectDialer:
    """Pinned sessions to the stations that serve procedures, by station key.

    ``home(timeout)`` is the node's own live session; ``spawn`` runs a task in the node's
    group (``ClosedError`` when the node is closed).
    """

    def __init__(
        self,
        identity: Identity,
        owner: SessionOwner,
        dht: DhtClient,
        home: Callable[[float], Awaitable[Session]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._identity = identity
        self._owner = owner
        self._dht = dht
        self._home = home
        self._spawn = spawn
        self._sessions: dict[bytes, Session] = {}
        self._lock = asyncio.Lock()

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def session(self, procedure: str, timeout: float, connect_timeout: float) -> Session:
        records = await self._dht.procedure_records(procedure)
        serving = records[0].payload.get("serving_station") if records else None
        if type(serving) is not bytes:
            raise ResolveError(
                f"no usable procedure_advertisement record for {procedure!r} (advertised by "
                "its signer, naming a station with its own station_endpoint record)"
            )
        home = await self._home(timeout)
        if serving == home.station_key:
            return home
        async with self._lock:
            cached = self._sessions.get(serving)
            if cached is not None and cached.alive:
                return cached
            address = await self._dht.resolve_station(serving)
            ready: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
            self._spawn(self._hold(address, ready, connect_timeout))
            session = await ready
            self._sessions[serving] = session
            return session

    async def _hold(
        self, address: StationAddress, ready: asyncio.Future[Session], connect_timeout: float
    ) -> None:
        """Keep a pinned connection to another station open while the node lives."""
        try:
            async with Session.connect(
                self._identity, address, self._owner, timeout=connect_timeout
            ) as session:
                ready.set_result(session)
                await session.ended.wait()
        except MaculaError as exc:
            if not ready.done():
                ready.set_exception(exc)
        finally:
            if address.node_id is not None:
                self._sessions.pop(address.node_id, None)
