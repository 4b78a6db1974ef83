"""Which stations a link names, and what this station tells its links of others (issue 37),
pure.

A station that joins through one ``--peer`` learns the rest of the mesh from it at once
instead of at the next discovery round (30 s): on every link that comes up both stations
introduce themselves with a CALL of ``MESH_PROCEDURE`` carrying their own signed
station_endpoint record (``more`` 1), and the answer lists the answering station's other
linked stations, each by *that station's own* record. A station introducing itself on its
first link (``first`` 1: a newcomer) has its record passed on to the other links of the
station it joined (``more`` 0: nothing is answered), so the stations already in the mesh learn
of the newcomer at once (and dial it unless its own dial linked them first); later links of
the newcomer are not passed on (the stations it joined through told everyone already: one
burst per join, not one per link). The shell
(``relay.station.mesh``) makes the calls and dials what is learned.

Invariants (DESIGN.md §3a: a station's endpoint counts only from that station's own key):
- every record taken is a station_endpoint (0x12) checked as the DHT checks one (signature,
  expiry, clock skew, lifetime cap, size, storage-key rule: ``check_record``) and naming a
  usable address (``endpoint_address``); a peer forwards records, it never vouches for them;
  nothing unsigned or signed by another key counts;
- a list holds at most ``max_records`` records; a bigger list, or a payload of another shape,
  is ignored whole; every refused list or record is counted in ``stats`` (``mesh_<reason>``)
  and named in ``MeshNews.refused`` (the shell counts it on the link too), and nothing here
  raises on what a peer sends;
- the record a link's own station signed is kept as that station's (newest wins) until
  ``unlinked``; ``MeshNews.own`` is set only the first time one is kept for a link, so a
  station passes a newcomer on once per link-up, never on a refresh (no gossip storm);
- time is an argument (``now_ms``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from macula.services.refusals import (
    MESH_BAD_ENDPOINT,
    MESH_BAD_LIST,
    MESH_BAD_RECORD,
    MESH_LIST_TOO_LONG,
    MESH_NOT_ENDPOINT,
    MESH_REFUSED_PREFIX,
)
from macula.wire.errors import WireError
from macula.wire.record_keys import station_endpoint_key
from macula.wire.records import Record, RecordType, is_newer
from relay.federation.addresses import StationAddress, endpoint_address
from relay.federation.dht.storage import (
    DhtLimits,
    DhtRefused,
    VerifiedRecords,
    check_record,
    dht_id,
)

__all__ = [
    "MAX_MESH_RECORDS",
    "MESH_PROCEDURE",
    "MeshNews",
    "MeshRoster",
    "flag",
    "mesh_payload",
]

MESH_PROCEDURE: Final = "_mesh.stations"  # station to station only (relay.core.calls)
MAX_MESH_RECORDS: Final = 64  # records in one list (the default --max-links)


@dataclass(frozen=True, slots=True)
class MeshNews:
    """What one list told: the sender's own record when it is new for its link (to pass
    on), the other stations it named, each by its own valid record, and the counters of what
    was refused (each also in ``MeshRoster.stats``)."""

    own: Record | None = None
    stations: list[StationAddress] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def mesh_payload(records: Iterable[Record], *, more: int, first: int = 0) -> dict[str, Any]:
    """A ``MESH_PROCEDURE`` argument or answer: the records' wire forms; ``more`` 1 asks the
    callee for its linked stations, ``first`` 1 says this is the caller's only link."""
    return {"records": [record.to_wire() for record in records], "more": more, "first": first}


def flag(payload: object, name: str) -> bool:
    """Is ``payload``'s int flag ``name`` 1 (anything else, a missing one included: no)."""
    return isinstance(payload, dict) and type(payload.get(name)) is int and payload[name] == 1


class MeshRoster:
    """The own records of linked stations, and the checks of what a link says."""

    def __init__(
        self,
        limits: DhtLimits | None = None,
        *,
        max_records: int = MAX_MESH_RECORDS,
        verified: VerifiedRecords | None = None,
    ) -> None:
        self.limits = DhtLimits() if limits is None else limits
        self.max_records = max_records
        self.verified = VerifiedRecords(1_024) if verified is None else verified
        self.stats: Counter[str] = Counter()
        self._own: dict[bytes, Record] = {}  # linked station -> its own newest record

    def take(self, sender: bytes, payload: object, now_ms: int) -> MeshNews:
        """What linked station ``sender`` sent (a call's argument or its answer)."""
        refused: list[str] = []
        items = self._items(payload, refused)
        if items is None:
            return MeshNews(refused=refused)
        own: Record | None = None
        named: dict[bytes, StationAddress] = {}
        for item in items:
            checked = self._checked(item, now_ms, refused)
            if checked is None:
                continue
            record, address = checked
            if record.key == sender:
                own = self._keep_own(sender, record) or own
            elif record.key not in named:
                named[record.key] = address
        self.stats["mesh_stations_named"] += len(named)
        return MeshNews(own, list(named.values()), refused)

    def _refuse(self, counter: str, refused: list[str]) -> None:
        self.stats[counter] += 1
        refused.append(counter)

    def _items(self, payload: object, refused: list[str]) -> list[Any] | None:
        items = payload.get("records") if isinstance(payload, dict) else None
        if not isinstance(items, list):
            self._refuse(MESH_BAD_LIST, refused)
            return None
        if len(items) > self.max_records:
            self._refuse(MESH_LIST_TOO_LONG, refused)
            return None
        self.stats["mesh_lists"] += 1
        return items

    def _checked(
        self, item: object, now_ms: int, refused: list[str]
    ) -> tuple[Record, StationAddress] | None:
        """``item`` as a valid station_endpoint record and the address it names, or None
        (counted)."""
        try:
            record = Record.from_wire(item)
        except WireError:
            self._refuse(MESH_BAD_RECORD, refused)
            return None
        if record.type != RecordType.STATION_ENDPOINT:
            self._refuse(MESH_NOT_ENDPOINT, refused)
            return None
        try:
            dkey = dht_id(station_endpoint_key(record.key))
            check_record(record, dkey, now_ms, self.limits, verified=self.verified)
        except DhtRefused as exc:
            self._refuse(f"{MESH_REFUSED_PREFIX}{exc.reason}", refused)
            return None
        except (WireError, ValueError):
            self._refuse(MESH_BAD_RECORD, refused)
            return None
        address = endpoint_address(record)
        if address is None:
            self._refuse(MESH_BAD_ENDPOINT, refused)
            return None
        return record, address

    def _keep_own(self, sender: bytes, record: Record) -> Record | None:
        """Keep ``sender``'s own record (newest wins); it, if none was kept for the link."""
        held = self._own.get(sender)
        if held is None:
            self._own[sender] = record
            return record
        if is_newer(record, held):
            self._own[sender] = record
        return None

    def record_of(self, node_id: bytes, now_ms: int) -> Record | None:
        """Linked station ``node_id``'s own record, if one is kept and unexpired."""
        record = self._own.get(node_id)
        return None if record is None or record.is_expired(now_ms) else record

    def unlinked(self, node_id: bytes) -> None:
        """The link with ``node_id`` went: its record goes (a new link introduces it anew)."""
        self._own.pop(node_id, None)

    def listing(self, records: Iterable[Record | None]) -> list[Record]:
        """At most ``max_records`` of ``records`` (Nones skipped), one per station."""
        out: dict[bytes, Record] = {}
        for record in records:
            if record is not None and record.key not in out:
                out[record.key] = record
                if len(out) >= self.max_records:
                    break
        return list(out.values())

    def __len__(self) -> int:
        return len(self._own)
