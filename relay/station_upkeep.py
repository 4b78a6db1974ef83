"""The station's periodic upkeep: the router core's tick, the allowlist re-read, the realm
revocation sweep, and the refresh of this station's own records.

``Upkeep.tick_forever`` runs every ``tick_interval_s``: the core's ``tick``, the allowlist file
re-read when it changed, and every ``policy.realm_sweep_ms`` (when realms are protected) a
revocation sweep in the background. ``refresh_forever`` keeps this station's
``station_endpoint`` record (§10.6, TTL 5 min) and the house services' records fresh in the
record store (and the house records in the DHT), and reaps expired records, every
``endpoint_refresh_s``. Both run until cancelled; a failed round is logged, not fatal.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, Protocol

from macula.clock import now_ms
from macula.transport import ALPN
from macula.wire.identity import Identity
from macula.wire.records import RecordType, new_record, record_version
from relay.actions import Action
from relay.builtins import Builtins
from relay.core import RouterCore
from relay.federation.dht import StationDht
from relay.house.services import HouseServices
from relay.realm_files import Allowlist
from relay.station_config import StationConfig
from relay.store import RecordStore

log = logging.getLogger("macula.relay")


class UpkeepShell(Protocol):
    """What the upkeep needs of the station (``relay.station.Station`` is one)."""

    config: StationConfig
    identity: Identity | None
    allowlist: Allowlist | None
    port: int

    @property
    def core(self) -> RouterCore: ...

    @property
    def builtins(self) -> Builtins | None: ...

    @property
    def records(self) -> RecordStore | None: ...

    @property
    def house(self) -> HouseServices | None: ...

    @property
    def dht_or_none(self) -> StationDht | None: ...

    def run(self, actions: list[Action]) -> None: ...

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None: ...


class Upkeep:
    def __init__(self, shell: UpkeepShell) -> None:
        self.shell = shell
        self.revocations_checked_ms = 0

    async def tick_forever(self) -> None:
        shell = self.shell
        # the first sweep is one realm_sweep_ms after the start, not at the first tick: no
        # membership is older than the start, and each endorsement is checked when presented
        self.revocations_checked_ms = now_ms()
        while True:
            await asyncio.sleep(shell.config.tick_interval_s)
            now = now_ms()
            shell.run(shell.core.tick(now))
            if shell.allowlist is not None:
                shell.allowlist.reload()  # a changed file is re-read (mtime and size)
            due = now - self.revocations_checked_ms >= shell.config.policy.realm_sweep_ms
            if shell.core.realms.realms and due:
                self.revocations_checked_ms = now
                shell.spawn(self._sweep_quietly(now))

    async def sweep_revocations(self, now: int) -> int:
        """Look up revocations of the current memberships (record store and mesh), then end
        the revoked and expired ones; how many revocations were new."""
        shell = self.shell
        assert shell.builtins is not None
        self.revocations_checked_ms = now
        gate = shell.core.realms
        learned = await shell.builtins.learn_revocations(gate, gate.lookup_keys(), now)
        shell.run(shell.core.sweep_realms(now))
        return learned

    async def _sweep_quietly(self, now: int) -> None:
        try:
            await self.sweep_revocations(now)
        except Exception:
            log.exception("could not look up realm revocations")

    async def refresh_forever(self) -> None:
        """Keep this station's own ``station_endpoint`` record fresh (§10.6, TTL 5 min)."""
        while True:
            await self.refresh_once()
            await asyncio.sleep(self.shell.config.endpoint_refresh_s)

    async def refresh_once(self, *, publish: bool = True) -> None:
        """Sign this station's records anew and store them in its own record store; with
        ``publish``, put the house advertisements into the DHT too (that may wait on peers).
        ``Station.start`` runs it once unpublished before it returns, so a client that
        connects at once already resolves the house services (without it, a register call
        made right after start found no advertisement: CI, stop 43)."""
        shell, config = self.shell, self.shell.config
        identity, records, dht = shell.identity, shell.records, shell.dht_or_none
        assert identity is not None and records is not None
        hosts = list(dict.fromkeys([*config.advertised_hosts, config.host]))
        now = now_ms()
        record = new_record(
            identity,
            RecordType.STATION_ENDPOINT,
            {
                "quic_port": shell.port,
                "host_advertised": [h.encode() for h in hosts],
                "alpn": ALPN,
                "dht_port": dht.port if dht else 0,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
        )
        announced = shell.house.records(identity, now) if shell.house else []
        try:
            for signed in [record, *announced]:
                await records.put(signed, signed.storage_key(), now)
            for signed in announced if dht and publish else []:  # endpoint: StationDht's own
                assert dht is not None
                await dht.put(signed)
            await records.reap(now)  # §13 #12: expired records also leave the disk
        except Exception:
            log.exception("could not refresh this station's records")
