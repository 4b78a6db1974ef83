"""DHT client over the station's ``_dht.*`` built-ins (PROTOCOL.md §6.6, §10).

Invariant: no record reaches the user unless it parses, its signature verifies against its
``key`` and it has not expired (``Record.verify``). Bad ones are dropped and counted in
``stats`` (``bad_signature``, ``expired``, ``malformed``): a station, honest or not, cannot make
us believe a forged or stale record.

Trust (issue 11): a procedure_advertisement is used (to resolve a realm or dial a station) only
when its ``advertiser_node`` is its signer and its ``serving_station`` has a station_endpoint
record signed by that station; a house procedure's
(``macula.services.house.HOUSE_PROCEDURES``) only when the station we are connected to signed
it. Others are skipped and counted in ``stats`` (``foreign_advertiser``,
``no_station_endpoint``, ``house_foreign_signer``, ``wrong_key``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Protocol

from macula.clock import now_ms
from macula.errors import MaculaError, MeshError
from macula.services.house import HOUSE_PROCEDURES
from macula.stations import StationAddress
from macula.wire.codes import ErrorCode
from macula.wire.errors import RecordInvalid
from macula.wire.identity import ZERO_REALM, Identity
from macula.wire.record_keys import station_endpoint_key, storage_key_for_procedure
from macula.wire.records import Record, RecordType, new_record, record_version

DHT_TIMEOUT = 5.0


class ResolveError(MaculaError):
    """The DHT holds no usable record for what was asked."""


class Caller(Protocol):
    """What the DHT and house clients need of a node: calling a procedure."""

    async def call(
        self, realm: bytes, procedure: str, payload: Any = None, *, timeout: float = ...
    ) -> Any: ...


class DhtClient:
    """The DHT through ``caller``; records it creates are signed by ``identity``."""

    def __init__(self, caller: Caller, identity: Identity) -> None:
        self._caller = caller
        self._identity = identity
        self.stats: Counter[str] = Counter()

    async def _builtin(self, procedure: str, payload: Any, timeout: float) -> Any:
        return await self._caller.call(ZERO_REALM, procedure, payload, timeout=timeout)

    async def put_record(self, record: Record, *, timeout: float = DHT_TIMEOUT) -> None:
        answer = await self._builtin("_dht.put_record", record.to_rpc(), timeout)
        if answer != "ok":
            raise MeshError(ErrorCode.UNKNOWN_ERROR, f"put_record answered {answer!r}")

    def _checked(self, raw: Any) -> Record | None:
        try:
            record = Record.from_rpc(raw)
            record.verify(now_ms())
        except RecordInvalid as exc:
            reason = exc.reason if exc.reason in ("bad_signature", "expired") else "malformed"
            self.stats[reason] += 1
            return None
        return record

    async def find_record(self, key: bytes, *, timeout: float = DHT_TIMEOUT) -> Record | None:
        """The first valid record under storage ``key`` (newest first), or None."""
        records = await self.find_records(key, timeout=timeout)
        return records[0] if records else None

    async def find_records(self, key: bytes, *, timeout: float = DHT_TIMEOUT) -> list[Record]:
        answer = await self._builtin("_dht.find_records", {"key": key}, timeout)
        return self._valid_list(answer)

    async def find_records_by_type(
        self, record_type: int, *, timeout: float = DHT_TIMEOUT
    ) -> list[Record]:
        answer = await self._builtin("_dht.find_records_by_type", {"type": record_type}, timeout)
        return self._valid_list(answer)

    def _valid_list(self, answer: Any) -> list[Record]:
        if not isinstance(answer, list):
            self.stats["malformed"] += 1
            return []
        records = [r for r in (self._checked(raw) for raw in answer) if r is not None]
        records.sort(key=lambda r: (r.created_at, r.version), reverse=True)
        return records

    # -- procedures and stations ------------------------------------------------------------

    async def announce_procedure(
        self, realm: bytes, procedure: str, serving_station: bytes, *, ttl_ms: int | None = None
    ) -> Record:
        """Sign and store a procedure_advertisement record (with our ``realm`` as an extra
        payload field, so callers can resolve it)."""
        now = now_ms()
        record = new_record(
            self._identity,
            RecordType.PROCEDURE_ADVERTISEMENT,
            {
                "procedure_uri": procedure,
                "advertiser_node": self._identity.node_id,
                "serving_station": serving_station,
                "realm": realm,
            },
            now_ms=now,
            version=record_version(now, os.urandom(10)),
            ttl_ms=ttl_ms,
        )
        await self.put_record(record)
        return record

    async def procedure_records(
        self, procedure: str, *, signer: bytes | None = None
    ) -> list[Record]:
        """The advertisements of ``procedure`` one may act on, newest first: advertised by
        their signer (and signed by ``signer`` when given), served by a station that has its
        own signed station_endpoint record. The rest are counted in ``stats``."""
        usable: list[Record] = []
        endpoints: dict[bytes, bool] = {}
        for record in await self.find_records(storage_key_for_procedure(procedure)):
            if (
                record.type != RecordType.PROCEDURE_ADVERTISEMENT
                or record.payload.get("procedure_uri") != procedure
            ):
                self.stats["wrong_key"] += 1
                continue
            if signer is not None and record.key != signer:
                house = procedure in HOUSE_PROCEDURES
                self.stats["house_foreign_signer" if house else "foreign_signer"] += 1
                continue
            if record.payload.get("advertiser_node") != record.key:
                self.stats["foreign_advertiser"] += 1
                continue
            serving = record.payload.get("serving_station")
            if type(serving) is not bytes or len(serving) != 32:
                self.stats["malformed"] += 1
                continue
            if serving not in endpoints:
                endpoints[serving] = bool(await self._station_endpoints(serving))
            if not endpoints[serving]:
                self.stats["no_station_endpoint"] += 1
                continue
            usable.append(record)
        return usable

    async def resolve_realm(self, procedure: str, *, station: bytes | None = None) -> bytes:
        """The realm a procedure is advertised in, from its newest usable advertisement
        (``procedure_records``). A house procedure resolves only from a record signed by
        ``station``, the key of the station we are connected to (required for those)."""
        if procedure in HOUSE_PROCEDURES and station is None:
            raise ResolveError(f"{procedure!r} is a house service: resolve it against a station")
        signer = station if procedure in HOUSE_PROCEDURES else None
        for record in await self.procedure_records(procedure, signer=signer):
            realm = record.payload.get("realm")
            if type(realm) is bytes and len(realm) == 32:
                return realm
        raise ResolveError(f"no procedure_advertisement record with a realm for {procedure!r}")

    async def _station_endpoints(self, node_id: bytes) -> list[Record]:
        """Station ``node_id``'s station_endpoint records that it signed itself."""
        found = []
        for record in await self.find_records(station_endpoint_key(node_id)):
            if record.key != node_id or record.type != RecordType.STATION_ENDPOINT:
                self.stats["foreign_endpoint"] += 1
                continue
            found.append(record)
        return found

    async def resolve_station(self, node_id: bytes) -> StationAddress:
        """Where station ``node_id`` listens, from its own signed station_endpoint record."""
        for record in await self._station_endpoints(node_id):
            port = record.payload.get("quic_port")
            hosts = record.payload.get("host_advertised") or []
            for host in hosts:
                if type(host) is bytes and type(port) is int and 0 < port < 65536:
                    return StationAddress(host.decode("utf-8", "replace"), port, node_id)
        raise ResolveError(f"no station_endpoint record for station {node_id.hex()}")
