"""A node's confirmed realm memberships, on disk, and presenting them to its station.

``$MACULA_HOME/memberships/<node id hex>.json`` (0600 in a 0700 folder) holds, per realm, the
endorsement the realm's authority signed for this node (RPC form, CBOR as hex) and when it was
stored. Nothing pending is ever written here: a join in progress lives only in memory
(``macula.realm.joiner``).

Invariants:
- ``memberships()`` lists only endorsements that pass ``check_endorsement`` for this node now
  (their stored record may be older than 48 h: ``live_record=False``); anything else in the
  file is skipped and counted in ``stats``, never shown and never presented.
- Writes are atomic (temp file, fsync, rename), 0600; an unreadable file reads as empty and is
  counted (``unreadable``), never crashes a node.
- ``present`` sends the stored records to the station once per call (``Node`` calls it after
  each handshake): ``_realm.present`` with a bare array of RPC-form records. A station without
  the built-in answers 0x01 ``unknown_next_peer``: tolerated and counted, not an error. Before
  presenting it looks each endorsement up in the DHT: a newer one signed by the same authority
  replaces it (refreshing its 48 h), a revocation removes it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from macula.clock import MsClock, now_ms
from macula.errors import MaculaError, MeshError
from macula.private_file import write_private
from macula.realm.records import (
    REVOKED_ROLE,
    Endorsement,
    RealmRecordError,
    check_endorsement,
    read_member_record,
)
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.identity import Identity
from macula.wire.records import Record, is_newer

log = logging.getLogger("macula.realm.membership")

PRESENT_PROCEDURE: Final = "_realm.present"
PRESENT_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Membership:
    endorsement: Endorsement
    joined_at: int

    def view(self) -> dict[str, Any]:
        """What an agent may see: no record, no signature (not a credential either way)."""
        e = self.endorsement
        return {
            "name": e.realm_name,
            "realm": e.realm.hex(),
            "authority": e.authority.hex(),
            "role": e.role,
            "joined_at": self.joined_at,
            "valid_until": e.valid_until,
        }


class Builtins(Protocol):
    async def builtin(self, procedure: str, payload: Any, timeout: float) -> Any: ...


class RecordFinder(Protocol):
    async def find_records(self, key: bytes, *, timeout: float = ...) -> list[Record]: ...


class NodeLike(Protocol):
    @property
    def dht(self) -> RecordFinder: ...


def memberships_path(home: Path, node_id: bytes) -> Path:
    return home / "memberships" / f"{node_id.hex()}.json"


class MembershipStore:
    def __init__(self, path: Path, identity: Identity, clock: MsClock = now_ms) -> None:
        self.path = path
        self.identity = identity
        self.clock = clock
        self.stats: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1

    def _entries(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            self._count("unreadable")
            return []
        entries = data.get("memberships") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def _write(self, entries: list[dict[str, Any]]) -> None:
        write_private(self.path, json.dumps({"memberships": entries}).encode("utf-8"))

    def _read(self, entry: dict[str, Any]) -> Membership | None:
        try:
            record = Record.from_rpc(cbor.decode(bytes.fromhex(str(entry["record"]))))
            found = read_member_record(record, authority=record.key)
            endorsement = check_endorsement(
                record,
                realm=found.realm,
                authority=found.authority,
                member=self.identity.node_id,
                now_ms=self.clock(),
                live_record=False,
            )
        except (KeyError, ValueError, MaculaError) as exc:
            reason = exc.reason if isinstance(exc, RealmRecordError) else "malformed"
            self._count(f"skipped_{reason}")
            return None
        joined = entry.get("joined_at")
        return Membership(endorsement, joined if type(joined) is int else 0)

    def memberships(self) -> list[Membership]:
        found = [m for m in map(self._read, self._entries()) if m is not None]
        return sorted(found, key=lambda m: m.endorsement.realm_name)

    def get(self, realm: bytes) -> Membership | None:
        return next((m for m in self.memberships() if m.endorsement.realm == realm), None)

    def put(self, endorsement: Endorsement, joined_at: int) -> None:
        """Store (or replace) the membership in ``endorsement.realm``."""
        entries = [e for e in self._entries() if e.get("realm") != endorsement.realm.hex()]
        blob = cbor.encode(endorsement.record.to_rpc()).hex()
        entries.append({"realm": endorsement.realm.hex(), "record": blob, "joined_at": joined_at})
        self._write(entries)

    def remove(self, realm: bytes) -> bool:
        entries = self._entries()
        kept = [e for e in entries if e.get("realm") != realm.hex()]
        if len(kept) != len(entries):
            self._write(kept)
        return len(kept) != len(entries)

    # -- presenting ------------------------------------------------------------------------------

    async def refresh(self, dht: RecordFinder) -> None:
        """Newer copies from the DHT replace ours; a revocation there removes ours."""
        for membership in self.memberships():
            held = membership.endorsement
            try:
                records = await dht.find_records(held.storage_key, timeout=PRESENT_TIMEOUT_S)
            except (MaculaError, OSError) as exc:
                log.debug("could not refresh a membership: %s", exc)
                return
            for record in records:
                if record.key != held.authority or not is_newer(record, held.record):
                    continue
                try:
                    newer = read_member_record(record, authority=held.authority)
                except RealmRecordError:
                    continue
                if newer.member != held.member or newer.realm != held.realm:
                    continue
                if newer.role == REVOKED_ROLE:
                    self.remove(held.realm)
                    self._count("revoked")
                    log.info("the authority of realm %s revoked this membership", held.realm_name)
                else:
                    self.put(newer, membership.joined_at)
                    self._count("refreshed")
                break

    async def present(self, station: Builtins, dht: RecordFinder | None = None) -> Any:
        """Present every membership to ``station``; its answer, or None if nothing was sent or
        the station does not know ``_realm.present``."""
        if dht is not None and self.memberships():
            await self.refresh(dht)
        records = [m.endorsement.record.to_rpc() for m in self.memberships()]
        if not records:
            return None
        try:
            answer = await station.builtin(
                PRESENT_PROCEDURE, {"endorsements": records}, PRESENT_TIMEOUT_S
            )
        except MeshError as exc:
            if exc.code == ErrorCode.UNKNOWN_NEXT_PEER:
                self._count("station_without_present")
                return None
            raise
        self._count("presented")
        return answer

    async def present_on(self, node: NodeLike, session: Builtins) -> list[bytes]:
        """``Node``'s presenter: present on ``session``; the realms the station accepted (none
        if it does not know ``_realm.present``; a realm it does not protect is refused, counted
        ``refused_by_station``)."""
        answer = await self.present(session, node.dht)
        if not isinstance(answer, dict):
            return []
        refused = answer.get("refused")
        if isinstance(refused, list) and refused:
            self._count("refused_by_station")  # e.g. a realm this station does not protect
        accepted = answer.get("accepted")
        if not isinstance(accepted, list):
            return []
        return [
            entry["realm"]
            for entry in accepted
            if isinstance(entry, dict) and type(entry.get("realm")) is bytes
        ]
