"""What a station holds for the DHT among stations: validated records, newest per signer.

``RecordShelf`` replaces kademlia's one-value-per-key ``IStorage`` (``ForgetfulStorage``).

Invariants:
- Keys: kademlia's 160-bit ids are ``dht_id(x) = SHA-256("macula-v2-dht\\0" || x)[:20]`` for a
  station's 32-byte node id and for a record's 32-byte storage key alike (§10.5), so records
  live at the stations whose ids are closest to their key's digest.
- Values travel as canonical CBOR of an array of records in their wire form (§10.2); the shelf
  keeps, per digest, at most one record per signer: a newer one (``is_newer``) replaces it, an
  older one is ``stale`` and dropped, an identical one is a no-op.
- Every record a peer or this station offers is checked by ``check_record`` before it is held
  (signature, expiry, lifetime cap, clock skew, size, storage key = the type's rule, the trust
  rules of DESIGN.md §3a that the record itself can prove), then by the caps of ``DhtLimits``
  (per signer, per key, per source, for the whole shelf). A full shelf reaps expired records,
  then drops the oldest records of the remote source holding the most bytes, and only if it
  holds more than the offering source would: one source's flood displaces only its own records,
  never those put here (``LOCAL``) or of a smaller source. A refusal is counted in ``stats``
  (``refused_<reason>``); nothing a peer sends raises out of ``accept_value`` or the
  ``IStorage`` methods.
- The Ed25519 check of the same record bytes runs once: ``VerifiedRecords`` (bounded, oldest
  out first) remembers (digest, SHA-256 of the wire bytes) of records that passed
  ``check_record``, and a record identical to one held is ``same`` without a check; expiry is
  checked again on every use, and any new bytes get every check.
- Reads never return an expired record; a reply value is bounded by ``max_reply_bytes``
  (newest first); the rest is read in further pages (``reply_page``), and what a
  ``reply_value`` leaves out is counted (``reply_truncated``).
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

from kademlia.storage import IStorage

from macula.services.house import HOUSE_PROCEDURES
from macula.wire import cbor
from macula.wire.errors import RecordInvalid, WireError
from macula.wire.record_keys import KEY_SIZE, realm_stations_key
from macula.wire.records import (
    DEFAULT_TTL_MS,
    Record,
    RecordType,
    is_newer,
    validate_payload,
)

__all__ = [
    "DHT_ID_SIZE",
    "LOCAL",
    "DhtLimits",
    "DhtRefused",
    "RecordShelf",
    "VerifiedRecords",
    "check_record",
    "decode_value",
    "dht_id",
    "dht_storage_key",
    "encode_value",
    "newest_per_signer",
]

DHT_ID_SIZE: Final = 20
_ID_DOMAIN: Final = b"macula-v2-dht\0"
MIB: Final = 1024 * 1024
# a STORE is one rpcudp request, which refuses more than 8 KiB of msgpack (name + arguments)
STORE_BATCH_BYTES: Final = 7 * 1024 + 512
# the source of a record this station put itself (for itself or for a node attached to it)
LOCAL: Final = b""


def dht_id(key: bytes) -> bytes:
    """The 160-bit kademlia id of a 32-byte node id or storage key."""
    if type(key) is not bytes or len(key) != KEY_SIZE:
        raise ValueError("a node id or storage key is exactly 32 bytes")
    return hashlib.sha256(_ID_DOMAIN + key).digest()[:DHT_ID_SIZE]


@dataclass(frozen=True, slots=True)
class DhtLimits:
    """What one station holds for the mesh at most, and what one reply carries."""

    # CBOR of the wire form; a STORE must fit one UDP request (rpcudp: 8 KiB)
    max_record_bytes: int = 7 * 1024
    max_ttl_ms: int = DEFAULT_TTL_MS
    max_skew_ms: int = 300_000
    records_per_signer: int = 1_000
    bytes_per_signer: int = 4 * MIB
    records_per_key: int = 1_024
    records_total: int = 100_000
    bytes_total: int = 64 * MIB
    # what the records one source (a linked station) stored may take of the shelf; a full
    # shelf makes room by dropping the oldest records of the source holding the most bytes
    records_per_source: int = 10_000
    bytes_per_source: int = 8 * MIB
    # the records in one find_value reply (one UDP datagram); more come in further pages
    max_reply_bytes: int = 16 * 1024
    # records decoded from one peer value (a STORE or a find_value reply)
    max_records_per_value: int = 1_024

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"DhtLimits.{name} must be a positive int, got {value!r}")
        if self.max_record_bytes > STORE_BATCH_BYTES - 16:
            raise ValueError(f"DhtLimits.max_record_bytes must be at most {STORE_BATCH_BYTES - 16}")


class DhtRefused(Exception):
    """A record the DHT will not hold; ``reason`` is the counted name."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def dht_storage_key(record: Record) -> bytes:
    """§10.5's storage key; for realm_stations (0x04) from the ``realm`` its payload names."""
    if record.type == RecordType.REALM_STATIONS:
        realm = record.payload.get("realm")
        if type(realm) is not bytes or len(realm) != KEY_SIZE:
            raise RecordInvalid("bad_payload", "a realm_stations record names its realm (32 bytes)")
        return realm_stations_key(realm)
    return record.storage_key()


def _trusted(record: Record) -> None:
    """DESIGN.md §3a, where the record alone proves it (station_endpoint: by its key rule)."""
    payload = record.payload
    if record.type == RecordType.PROCEDURE_ADVERTISEMENT:
        if payload.get("advertiser_node") != record.key:
            raise DhtRefused("foreign_advertiser", "advertiser_node is not the signer")
        house = payload.get("procedure_uri") in HOUSE_PROCEDURES
        if house and payload.get("serving_station") != record.key:
            raise DhtRefused("house_foreign_signer", "a house service is announced by its station")
    elif (
        record.type == RecordType.CONTENT_ANNOUNCEMENT
        and payload.get("announcer_node") != record.key
    ):
        raise DhtRefused("foreign_announcer", "announcer_node is not the signer")


class VerifiedRecords:
    """Which record bytes passed ``check_record`` under which digest (at most ``size``)."""

    def __init__(self, size: int = 8_192) -> None:
        if type(size) is not int or size < 0:
            raise ValueError("VerifiedRecords size must be an int >= 0")
        self.size = size
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self.hits = 0

    @staticmethod
    def _key(dkey: bytes, wire: bytes) -> bytes:
        return dkey + hashlib.sha256(wire).digest()

    def __contains__(self, item: tuple[bytes, bytes]) -> bool:
        key = self._key(*item)
        if key not in self._seen:
            return False
        self._seen.move_to_end(key)
        return True

    def add(self, dkey: bytes, wire: bytes) -> None:
        if not self.size:
            return
        self._seen[self._key(dkey, wire)] = None
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


def wire_bytes(record: Record) -> bytes:
    """Canonical CBOR of ``record``'s wire form (``DhtRefused`` ``bad_record`` if none)."""
    try:
        return cbor.encode(record.to_wire())
    except WireError as exc:
        raise DhtRefused("bad_record", exc.detail) from None


def check_record(
    record: Record,
    dkey: bytes,
    now_ms: int,
    limits: DhtLimits,
    *,
    wire: bytes | None = None,
    verified: VerifiedRecords | None = None,
) -> int:
    """Raise ``DhtRefused`` unless ``record`` may be held under digest ``dkey``; its size.
    ``wire``: its bytes if already encoded; ``verified``: bytes already checked under
    ``dkey`` skip everything but the expiry (the rest cannot change for the same bytes, and
    the clock-skew check only gets easier as time passes)."""
    if wire is None:
        wire = wire_bytes(record)
    size = len(wire)
    if verified is not None and (dkey, wire) in verified:
        if record.is_expired(now_ms):
            raise DhtRefused("expired", f"expires_at {record.expires_at} <= now {now_ms}")
        verified.hits += 1
        return size
    _check_new(record, dkey, now_ms, limits, size)
    if verified is not None:
        verified.add(dkey, wire)
    return size


def _check_new(record: Record, dkey: bytes, now_ms: int, limits: DhtLimits, size: int) -> None:
    if size > limits.max_record_bytes:
        raise DhtRefused("too_large", f"{size} bytes, at most {limits.max_record_bytes}")
    try:
        record.verify(now_ms)
        validate_payload(record.type, record.payload)
        key = dht_storage_key(record)
    except RecordInvalid as exc:
        raise DhtRefused(exc.reason, exc.detail) from None
    if dht_id(key) != dkey:
        raise DhtRefused("wrong_key", "the record's storage key rule gives another key")
    lifetime = record.expires_at - record.created_at
    if lifetime > limits.max_ttl_ms:
        raise DhtRefused("ttl_too_long", f"lifetime {lifetime} ms, at most {limits.max_ttl_ms}")
    if record.created_at - now_ms > limits.max_skew_ms:
        raise DhtRefused("clock_skew", f"created_at is more than {limits.max_skew_ms} ms ahead")
    _trusted(record)


def encode_value(records: Iterable[Record]) -> bytes:
    return cbor.encode([record.to_wire() for record in records])


def decode_value(value: object, limits: DhtLimits, stats: Counter[str]) -> list[Record]:
    """The records a peer's value carries; what does not parse is counted and skipped."""
    if type(value) is not bytes:
        stats["refused_bad_value"] += 1
        return []
    try:
        items = cbor.decode(value)
    except WireError:
        stats["refused_bad_value"] += 1
        return []
    if not isinstance(items, list) or len(items) > limits.max_records_per_value:
        stats["refused_bad_value"] += 1
        return []
    records = []
    for item in items:
        try:
            records.append(Record.from_wire(item))
        except WireError:
            stats["refused_bad_record"] += 1
    return records


def newest_per_signer(records: Iterable[Record]) -> list[Record]:
    """One record per signer (the newest, §10.5), newest first."""
    best: dict[bytes, Record] = {}
    for record in records:
        held = best.get(record.key)
        if held is None or is_newer(record, held):
            best[record.key] = record
    return sorted(best.values(), key=lambda r: (r.created_at, r.version), reverse=True)


class _Held(NamedTuple):
    record: Record
    wire: bytes  # canonical CBOR of the wire form
    dkey: bytes
    source: bytes  # who stored it: LOCAL, or the storing station's DHT id


class RecordShelf(IStorage):  # type: ignore[misc]  # kademlia ships no type hints
    """Records by 160-bit digest, one per signer, within ``DhtLimits``."""

    def __init__(
        self,
        limits: DhtLimits,
        clock: Callable[[], int],
        verified: VerifiedRecords | None = None,
    ) -> None:
        self.limits = limits
        self.clock = clock
        self.verified = VerifiedRecords() if verified is None else verified
        self.stats: Counter[str] = Counter()
        self._keys: dict[bytes, dict[bytes, _Held]] = {}
        self._signer_rows: Counter[bytes] = Counter()
        self._signer_bytes: Counter[bytes] = Counter()
        # per source: what it holds, oldest first (the order a full shelf drops them in)
        self._source_held: dict[bytes, OrderedDict[tuple[bytes, bytes], None]] = {}
        self._source_bytes: Counter[bytes] = Counter()
        self.rows = 0
        self.bytes = 0

    # -- putting --

    def offer(self, dkey: bytes, record: Record, now_ms: int, source: bytes = LOCAL) -> str:
        """Hold ``record`` under ``dkey`` for ``source``: ``stored``, ``same``, ``stale``, or
        ``DhtRefused``."""
        wire = wire_bytes(record)
        held = self._keys.get(dkey, {}).get(record.key)
        if held is not None and not held.record.is_expired(now_ms) and held.wire == wire:
            self.stats["same"] += 1
            return "same"  # these very bytes were checked when they were stored
        check_record(record, dkey, now_ms, self.limits, wire=wire, verified=self.verified)
        live = held is not None and not held.record.is_expired(now_ms)
        if live and held is not None and not is_newer(record, held.record):
            self.stats["stale"] += 1
            return "stale"
        self._check_caps(dkey, record.key, len(wire), held, now_ms)
        self._check_source(source, len(wire), held, now_ms)
        held = self._keys.get(dkey, {}).get(record.key)  # making room may have dropped it
        if held is not None:
            self._drop(held)
        self._add(_Held(record, wire, dkey, source))
        self.stats["stored"] += 1
        return "stored"

    def _check_caps(
        self, dkey: bytes, signer: bytes, size: int, held: _Held | None, now_ms: int
    ) -> None:
        limits = self.limits
        old = 0 if held is None else len(held.wire)
        new_row = int(held is None)
        if new_row and self._signer_rows[signer] >= limits.records_per_signer:
            raise DhtRefused("signer_records", f"{limits.records_per_signer} records per signer")
        if size > old and self._signer_bytes[signer] - old + size > limits.bytes_per_signer:
            raise DhtRefused("signer_bytes", f"{limits.bytes_per_signer} bytes per signer")
        if new_row and len(self._keys.get(dkey, {})) >= limits.records_per_key:
            raise DhtRefused("key_records", f"{limits.records_per_key} records per key")

    def _check_source(self, source: bytes, size: int, held: _Held | None, now_ms: int) -> None:
        """The source's own caps, then room in the whole shelf: expired records reaped, then
        the oldest records of the source holding the most bytes dropped, if that is not
        ``source`` and holds more than ``source`` would (a flood only ever displaces itself)."""
        limits = self.limits
        mine = held is not None and held.source == source
        old = len(held.wire) if mine and held is not None else 0
        rows = len(self._source_held.get(source, ()))
        if source != LOCAL:
            if not mine and rows >= limits.records_per_source:
                raise DhtRefused("source_records", f"{limits.records_per_source} per source")
            if self._source_bytes[source] - old + size > limits.bytes_per_source:
                raise DhtRefused("source_bytes", f"{limits.bytes_per_source} bytes per source")
        new_row = int(held is None)
        freed = 0 if held is None else len(held.wire)

        def full() -> bool:
            return (
                self.rows + new_row > limits.records_total
                or self.bytes - freed + size > limits.bytes_total
            )

        if not full():
            return
        self.reap(now_ms)
        if held is not None and self._keys.get(held.dkey, {}).get(held.record.key) is not held:
            held, new_row, freed = None, 1, 0  # reaped: a new row after all
        while full():
            victim = self._fattest(source, size)
            if victim is None:
                if self.rows + new_row > limits.records_total:
                    raise DhtRefused("total_records", f"{limits.records_total} records held")
                raise DhtRefused("total_bytes", f"{limits.bytes_total} bytes held")
            self._drop(victim)
            self.stats["dropped_for_room"] += 1
            if held is not None and victim is held:
                held, new_row, freed = None, 1, 0

    def _fattest(self, source: bytes, size: int) -> _Held | None:
        """The oldest record of the remote source holding the most bytes, if it holds more
        than ``source`` would with ``size`` more (never one of ``source``'s own)."""
        remote = [s for s in self._source_held if s != LOCAL and s != source]
        if not remote:
            return None
        fattest = max(remote, key=lambda s: self._source_bytes[s])
        if source != LOCAL and self._source_bytes[fattest] <= self._source_bytes[source] + size:
            return None
        dkey, signer = next(iter(self._source_held[fattest]))
        return self._keys[dkey][signer]

    def _add(self, held: _Held) -> None:
        self._keys.setdefault(held.dkey, {})[held.record.key] = held
        self._signer_rows[held.record.key] += 1
        self._signer_bytes[held.record.key] += len(held.wire)
        self._source_held.setdefault(held.source, OrderedDict())[held.dkey, held.record.key] = None
        self._source_bytes[held.source] += len(held.wire)
        self.rows += 1
        self.bytes += len(held.wire)

    def _drop(self, held: _Held) -> None:
        signers = self._keys[held.dkey]
        del signers[held.record.key]
        if not signers:
            del self._keys[held.dkey]
        signer = held.record.key
        self._signer_rows[signer] -= 1
        self._signer_bytes[signer] -= len(held.wire)
        if self._signer_rows[signer] <= 0:
            del self._signer_rows[signer]
            del self._signer_bytes[signer]
        mine = self._source_held[held.source]
        del mine[held.dkey, signer]
        self._source_bytes[held.source] -= len(held.wire)
        if not mine:
            del self._source_held[held.source]
            del self._source_bytes[held.source]
        self.rows -= 1
        self.bytes -= len(held.wire)

    def accept(self, dkey: bytes, record: Record, now_ms: int, source: bytes = LOCAL) -> bool:
        """``offer`` that counts a refusal instead of raising; True if now held."""
        try:
            return self.offer(dkey, record, now_ms, source) != "stale"
        except DhtRefused as exc:
            self.stats[f"refused_{exc.reason}"] += 1
            return False

    def accept_value(self, dkey: object, value: object, now_ms: int, source: bytes = LOCAL) -> int:
        """A peer's STORE: every record it carries offered; how many are now held."""
        if type(dkey) is not bytes or len(dkey) != DHT_ID_SIZE:
            self.stats["refused_bad_key"] += 1
            return 0
        records = decode_value(value, self.limits, self.stats)
        return sum(self.accept(dkey, record, now_ms, source) for record in records)

    def reap(self, now_ms: int) -> int:
        """Drop expired records; how many."""
        gone = [
            held
            for signers in self._keys.values()
            for held in signers.values()
            if held.record.is_expired(now_ms)
        ]
        for held in gone:
            self._drop(held)
        self.stats["reaped"] += len(gone)
        return len(gone)

    # -- reading --

    def digests(self) -> list[bytes]:
        return list(self._keys)

    def records(self, dkey: bytes, now_ms: int) -> list[Record]:
        """Unexpired records under ``dkey``, newest first."""
        signers = self._keys.get(dkey, {})
        alive = [h.record for h in signers.values() if not h.record.is_expired(now_ms)]
        return newest_per_signer(alive)

    def reply_value(self, dkey: bytes, now_ms: int) -> bytes:
        """The value a find_value answers: newest first within ``max_reply_bytes``."""
        value, following = self.reply_page(dkey, now_ms)
        if following:
            self.stats["reply_truncated"] += 1
        return value

    def reply_page(self, dkey: bytes, now_ms: int, skip: int = 0) -> tuple[bytes, int]:
        """The records under ``dkey`` newest first from the ``skip``-th, within
        ``max_reply_bytes`` (one record at least), and where the next page starts (0: none)."""
        records = self.records(dkey, now_ms)[skip:]
        budget, used = self.limits.max_reply_bytes - 8, 0
        page: list[Record] = []
        for record in records:
            size = len(cbor.encode(record.to_wire()))
            if page and used + size > budget:
                break
            page.append(record)
            used += size
        return encode_value(page), (skip + len(page) if len(page) < len(records) else 0)

    @staticmethod
    def _batches(records: list[Record], budget: int) -> list[bytes]:
        batches: list[list[Record]] = [[]]
        used = 0
        for record in records:
            size = len(cbor.encode(record.to_wire()))
            if used + size > budget - 8 and batches[-1]:
                batches.append([])
                used = 0
            batches[-1].append(record)
            used += size
        return [encode_value(batch) for batch in batches]

    def store_batches(self, records: list[Record]) -> list[bytes]:
        """``records`` as values that each fit one STORE request."""
        return self._batches(records, STORE_BATCH_BYTES) if records else []

    # -- kademlia's IStorage --

    def __setitem__(self, key: bytes, value: object) -> None:
        self.accept_value(key, value, self.clock())

    def __getitem__(self, key: bytes) -> bytes:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        now = self.clock()
        return self.reply_value(key, now) if self.records(key, now) else default

    def iter_older_than(self, seconds_old: float) -> list[tuple[bytes, bytes]]:
        return []  # replication is StationDht's own loop (it re-stores everything it holds)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        now = self.clock()
        for dkey in self.digests():
            for batch in self.store_batches(self.records(dkey, now)):
                yield dkey, batch
