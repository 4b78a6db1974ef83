"""The station's periodic upkeep: the router core's tick with what rides on it, and the refresh
of this station's own records.

``Ticker.tick_forever`` runs every ``interval_s``: the core's ``tick``, the allowlist file
re-read when it changed, and every ``sweep_ms`` (when realms are protected) a revocation sweep
in the background. ``OwnRecords.refresh_forever`` keeps this station's ``station_endpoint``
record (§10.6, TTL 5 min) and the house services' records fresh in the record store (and the
house records in the DHT), and reaps expired records, every ``interval_s``. Both run until
cancelled; a failed round is logged, not fatal. Each is given, when the station has opened
its parts, exactly the parts it works on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from macula.clock import now_ms
from macula.quic.transport import ALPN
from macula.task_scope import Spawner
from macula.wire.identity import Identity
from macula.wire.records import RecordType, new_record, record_version
from relay.builtins.procedures import Builtins
from relay.core.actions import Action
from relay.core.router import RouterCore
from relay.federation.dht.station import StationDht
from relay.house.services import HouseServices
from relay.station.realm_files import Allowlist
from relay.stores.records import RecordStore

__all__ = ["OwnRecords", "Ticker"]

log = logging.getLogger("macula.relay")


class Ticker:
    def __init__(
        self,
        core: RouterCore,
        run: Callable[[list[Action]], None],
        spawn: Spawner,
        builtins: Builtins,
        allowlist: Allowlist | None,
        *,
        interval_s: float,
        sweep_ms: int,
    ) -> None:
        self._core = core
        self._run = run
        self._spawn = spawn
        self._builtins = builtins
        self._allowlist = allowlist
        self.interval_s = interval_s
        self.sweep_ms = sweep_ms
        self.revocations_checked_ms = 0

    async def tick_forever(self) -> None:
        core = self._core
        # the first sweep is one sweep_ms after the start, not at the first tick: no
        # membership is older than the start, and each endorsement is checked when presented
        self.revocations_checked_ms = now_ms()
        while True:
            await asyncio.sleep(self.interval_s)
            now = now_ms()
            self._run(core.tick(now))
            if self._allowlist is not None:
                self._allowlist.reload()  # a changed file is re-read (mtime and size)
            due = now - self.revocations_checked_ms >= self.sweep_ms
            if core.realms.realms and due:
                self.revocations_checked_ms = now
                self._spawn(self._sweep_quietly(now))

    async def sweep_revocations(self, now: int) -> int:
        """Look up revocations of the current memberships (record store and mesh), then end
        the revoked and expired ones; how many revocations were new."""
        self.revocations_checked_ms = now
        gate = self._core.realms
        learned = await self._builtins.learn_revocations(gate, gate.lookup_keys(), now)
        self._run(self._core.sweep_realms(now))
        return learned

    async def _sweep_quietly(self, now: int) -> None:
        try:
            await self.sweep_revocations(now)
        except Exception:
            log.exception("could not look up realm revocations")


class OwnRecords:
    def __init__(
        self,
        identity: Identity,
        address: tuple[list[str], int],
        records: RecordStore,
        house: HouseServices,
        dht: StationDht,
        *,
        interval_s: float,
    ) -> None:
        self._identity = identity
        self._hosts, self._port = address  # the hosts clients may dial, the QUIC port
        self._records = records
        self._house = house
        self._dht = dht
        self.interval_s = interval_s

    async def refresh_forever(self) -> None:
        """Keep this station's own ``station_endpoint`` record fresh (§10.6, TTL 5 min)."""
        while True:
            await self.refresh_once()
            await asyncio.sleep(self.interval_s)

    async def refresh_once(self, *, publish: bool = True) -> None:
        """Sign this station's records anew and store them in its own record store; with
        ``publish``, put the house advertisements into the DHT too (that may wait on peers).
        ``Station.start`` runs it once unpublished before it reads a datagram, so a client that
        connects at once already resolves the house services (without it, a register call
        made right after start found no advertisement: CI, stop 43)."""
        records, dht, identity = self._records, self._dht, self._identity
        now = now_ms()
        record = new_record(
            identity,
            RecordType.STATION_ENDPOINT,
            {
                "quic_port": self._port,
                "host_advertised": [h.encode() for h in self._hosts],
                "alpn": ALPN,
                "dht_port": dht.port,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
        )
        announced = self._house.records(identity, now)
        try:
            for signed in [record, *announced]:
                await records.put(signed, signed.storage_key(), now)
            for signed in announced if publish else []:  # endpoint: StationDht's own
                await dht.put(signed)
            await records.reap(now)  # §13 #12: expired records also leave the disk
        except Exception:
            log.exception("could not refresh this station's records")
