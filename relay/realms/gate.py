"""Realms a station protects (issue 13): who may act in a realm, from endorsements and revocations.

Sans-I/O, time is always an argument. A protected realm is its tag (``realm_tag(name)``) and
its authority's Ed25519 key. The record rules (what an endorsement and a revocation are, how
each is checked) are ``macula.realm.records``, the same ones the client and the realm's join
service use; this module only maps their refusals to the reasons a station reports and keeps
the station's state. A revocation is a newer 0x05 under the endorsement's storage key with
role ``"revoked"`` (records.py says why not a tombstone).

Invariants:
- ``check_endorsement`` accepts a record only if it parses, is a 0x05, names a realm
  protected here, passes ``records.check_endorsement`` for that realm's authority and the
  presenting node, and no known revocation is newer; every refusal is an
  ``EndorsementRefused`` whose reason is one of ``STATION_REASONS`` with a readable detail.
- ``RealmGate`` holds memberships per connection (a reconnect presents again), never per node
  id; a membership ends when its connection goes, its ``valid_until`` passes, or a revocation
  for it is learned (checked on every ``allows``, so delivery stops at once; ``sweep`` also
  drops it, at least every ``sweep_ms``). A station peer is never a member: it ``allows`` a
  protected realm only while it holds a *station endorsement* of that realm (role ``station``,
  signed by this station's authority for the realm, for the peer's own node id; issue 26),
  presented in its CONNECT ``endorsements`` or its HELLO's ``endorsements`` key, checked here,
  ended like a membership (valid_until, revocation, sweep). What a station says about itself
  (CONNECT/HELLO ``realms``) grants nothing: the same name under another authority key is
  another realm, and any connection may set the station bit. Unprotected realms are always
  allowed.
- A linked station vouches for its members (issue 26): it hands over their endorsements
  (``take_vouches``), which this station checks itself (signed by the realm's authority, for
  that member, unrevoked) and keeps per link, at most ``max_vouched`` a link, only for realms
  the link may carry. ``vouched_for`` is True only for such a checked endorsement, still valid:
  a frame a link relays in a protected realm counts only if its publisher or caller is one.
  Memberships accepted here wait in ``to_vouch`` until the core tells its links
  (``drain_vouches``; the queue holds at most ``max_vouched``).
- Revocations are kept newest per endorsement key, at most ``max_revocations`` (the oldest
  to expire goes first), and forgotten once their record expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from macula.realm import records as rules
from macula.realm.records import REVOKED_ROLE, Endorsement, RealmRecordError
from macula.wire.errors import RecordInvalid
from macula.wire.frames import Connect
from macula.wire.identity import realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType, is_newer

DEFAULT_SWEEP_MS: Final = 60_000
DEFAULT_MAX_PRESENTED: Final = 16
DEFAULT_MAX_REVOCATIONS: Final = 100_000
DEFAULT_MAX_VOUCHED: Final = 10_000  # members a link may vouch for
VOUCH_BATCH: Final = 64  # endorsements one vouch may carry

# The reasons a station reports (``_realm.present``), and the record rules' reasons they map.
STATION_REASONS: Final = (
    "bad_record",  # not a record at all
    "not_an_endorsement",  # a record, not a 0x05
    "bad_payload",  # a 0x05 whose payload is not an endorsement's (or whose name and tag differ)
    "realm_not_protected",
    "wrong_authority",
    "bad_signature",
    "other_node",
    "expired",
    "revoked",
    "not_a_station",  # a station presented an endorsement whose role is not ``station``
    "too_many",  # a vouch over ``VOUCH_BATCH`` endorsements, or a link over ``max_vouched``
)
_REASON_OF: Final = {
    "malformed": "bad_payload",
    "wrong_realm": "bad_payload",  # its realm_name does not hash to its realm
    "wrong_member": "other_node",
}


class EndorsementRefused(RealmRecordError):
    """Why a station does not accept an endorsement: ``reason`` is one of ``STATION_REASONS``,
    ``detail`` is for a person."""


@dataclass(frozen=True, slots=True)
class ProtectedRealm:
    name: str
    tag: bytes
    authority: bytes


def parse_realm_flag(text: str) -> ProtectedRealm:
    """``NAME=AUTHORITY_KEY`` (64 hex) -> the realm; ``ValueError`` naming what is wrong."""
    name, sep, key_hex = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{text!r}: expected NAME=AUTHORITY_KEY (64 hex digits)")
    if problem := rules.name_problem(name):
        raise ValueError(f"{text!r}: {problem}")
    try:
        authority = bytes.fromhex(key_hex.strip())
    except ValueError:
        raise ValueError(f"{text!r}: the authority key is not hex") from None
    if len(authority) != 32:
        raise ValueError(f"{text!r}: the authority key must be 32 bytes (64 hex digits)")
    return ProtectedRealm(name, realm_tag(name), authority)


def endorsement_key(realm: bytes, member_node: bytes) -> bytes:
    """The storage key of a 0x05 record (§10.5)."""
    return member_endorsement_key(realm, member_node)


def record_storage_key(record: Record) -> bytes:
    """``record.storage_key()``, and for a 0x05 the key derived from its payload
    (``RecordInvalid`` ``bad_payload`` if the payload lacks ``realm``/``member_node``)."""
    if record.type != RecordType.REALM_MEMBER_ENDORSEMENT:
        return record.storage_key()
    realm, member = record.payload.get("realm"), record.payload.get("member_node")
    if not _id32(realm) or not _id32(member):
        raise RecordInvalid("bad_payload", "an endorsement needs realm and member_node bytes(32)")
    assert isinstance(realm, bytes) and isinstance(member, bytes)
    return endorsement_key(realm, member)


@dataclass(frozen=True, slots=True)
class Revocation:
    """A checked revocation (``records.read_member_record`` with role ``revoked``)."""

    key: bytes  # the storage key of the endorsement it revokes
    signer: bytes
    record: Record

    @property
    def expires_at(self) -> int:
        return self.record.expires_at

    def revokes(self, endorsement: Endorsement) -> bool:
        return (
            self.key == endorsement.storage_key
            and self.signer == endorsement.authority
            and is_newer(self.record, endorsement.record)
        )


def _id32(value: object) -> bool:
    return type(value) is bytes and len(value) == 32


def check_endorsement(
    raw: object,
    *,
    node_id: bytes,
    realms: Mapping[bytes, ProtectedRealm],
    revocations: Mapping[bytes, Revocation],
    now_ms: int,
    station: bool = False,
) -> Endorsement:
    """The endorsement ``raw`` (RPC form) grants ``node_id``, or ``EndorsementRefused``; with
    ``station``, a station endorsement (``records.check_station_endorsement``)."""
    try:
        record = Record.from_rpc(raw)
    except RecordInvalid as exc:
        raise EndorsementRefused("bad_record", exc.detail) from None
    if record.type != RecordType.REALM_MEMBER_ENDORSEMENT:
        raise EndorsementRefused(
            "not_an_endorsement", f"record type 0x{record.type:02x}, expected 0x05"
        )
    realm = record.payload.get("realm")
    if not _id32(realm):
        raise EndorsementRefused("bad_payload", "payload realm must be 32 bytes")
    protected = realms.get(realm) if isinstance(realm, bytes) else None
    if protected is None:
        raise EndorsementRefused("realm_not_protected", "this station does not protect that realm")
    try:
        if station:
            endorsement = rules.check_station_endorsement(
                record,
                realm=protected.tag,
                authority=protected.authority,
                station=node_id,
                now_ms=now_ms,
            )
        else:
            endorsement = rules.check_endorsement(
                record,
                realm=protected.tag,
                authority=protected.authority,
                member=node_id,
                now_ms=now_ms,
            )
    except RealmRecordError as exc:
        raise EndorsementRefused(_REASON_OF.get(exc.reason, exc.reason), exc.detail) from None
    revocation = revocations.get(endorsement.storage_key)
    if revocation is not None and revocation.revokes(endorsement):
        raise EndorsementRefused("revoked", "the realm's authority revoked this membership")
    return endorsement


def revocation_of(record: Record, authorities: Iterable[bytes], now_ms: int) -> Revocation | None:
    """The revocation ``record`` is (a 0x05 with role ``revoked`` signed by one of
    ``authorities``, not expired), else None."""
    if record.key not in set(authorities) or record.expires_at <= now_ms:
        return None
    try:
        found = rules.read_member_record(record, authority=record.key)
    except RealmRecordError:
        return None
    if found.role != REVOKED_ROLE:
        return None
    return Revocation(found.storage_key, found.authority, record)


@dataclass(slots=True)
class RealmGate:
    """Who may act in which protected realm, per connection (see the module invariants)."""

    realms: dict[bytes, ProtectedRealm] = field(default_factory=dict)
    sweep_ms: int = DEFAULT_SWEEP_MS
    max_presented: int = DEFAULT_MAX_PRESENTED
    max_revocations: int = DEFAULT_MAX_REVOCATIONS
    max_vouched: int = DEFAULT_MAX_VOUCHED
    members: dict[int, dict[bytes, Endorsement]] = field(default_factory=dict)
    stations: dict[int, dict[bytes, Endorsement]] = field(default_factory=dict)  # endorsed links
    vouched: dict[int, dict[tuple[bytes, bytes], Endorsement]] = field(default_factory=dict)
    to_vouch: list[Endorsement] = field(default_factory=list)  # local, not yet told to links
    revocations: dict[bytes, Revocation] = field(default_factory=dict)
    last_sweep_ms: int = 0
    swept: int = 0  # memberships ended by sweeps, all told

    @classmethod
    def protecting(cls, realms: Iterable[ProtectedRealm], **limits: Any) -> RealmGate:
        return cls(realms={r.tag: r for r in realms}, **limits)

    def protects(self, realm: bytes) -> bool:
        return realm in self.realms

    @property
    def tags(self) -> list[bytes]:
        return sorted(self.realms)

    # --- memberships --------------------------------------------------------------------

    def allows(self, conn: int, is_station: bool, realm: bytes, now_ms: int) -> bool:
        """May connection ``conn`` subscribe, publish, advertise, call, receive in ``realm``?"""
        if realm not in self.realms:
            return True
        if is_station:
            grant = self.stations.get(conn, {}).get(realm)
            return grant is not None and self._valid(grant, now_ms, live_record=False)
        endorsement = self.members.get(conn, {}).get(realm)
        return endorsement is not None and self._valid(endorsement, now_ms)

    def _valid(self, endorsement: Endorsement, now_ms: int, *, live_record: bool = True) -> bool:
        if endorsement.valid_until <= now_ms:
            return False
        if live_record and endorsement.record.is_expired(now_ms):
            return False
        revocation = self.revocations.get(endorsement.storage_key)
        return revocation is None or not revocation.revokes(endorsement)

    def present(
        self,
        conn: int,
        node_id: bytes,
        endorsements: list[object],
        now_ms: int,
        *,
        station: bool = False,
    ) -> dict[str, Any]:
        """Check each endorsement for ``conn`` (of ``node_id``); the accepted ones make it a
        member (with ``station``: a station endorsed for the realm). The answer lists accepted
        realms and, per refused one, a reason."""
        accepted: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        held = self.stations if station else self.members
        for index, raw in enumerate(endorsements):
            try:
                endorsement = check_endorsement(
                    raw,
                    node_id=node_id,
                    realms=self.realms,
                    revocations=self.revocations,
                    now_ms=now_ms,
                    station=station,
                )
            except EndorsementRefused as exc:
                refusal: dict[str, Any] = {"index": index, "reason": exc.reason}
                refusal["detail"] = exc.detail
                realm = _realm_of(raw)
                if realm is not None:
                    refusal["realm"] = realm
                refused.append(refusal)
                continue
            held.setdefault(conn, {})[endorsement.realm] = endorsement
            if not station and len(self.to_vouch) < self.max_vouched:
                self.to_vouch.append(endorsement)
            accepted.append(
                {
                    "realm": endorsement.realm,
                    "name": self.realms[endorsement.realm].name,
                    "role": endorsement.role,
                    "valid_until": endorsement.valid_until,
                }
            )
        return {"accepted": accepted, "refused": refused}

    def connect_members(self, conn: int, connect: Connect, now_ms: int) -> int:
        """Memberships from a CONNECT's ``endorsements`` (at most ``max_presented``); how many
        realms the connection is now a member of."""
        if connect.endorsements:
            self.present(conn, connect.node_id, connect.endorsements[: self.max_presented], now_ms)
        return len(self.members.get(conn, {}))

    def present_station(
        self, conn: int, node_id: bytes, endorsements: object, now_ms: int
    ) -> dict[str, Any]:
        """A station peer's station endorsements (its CONNECT ``endorsements`` or HELLO
        ``endorsements``; at most ``max_presented``, anything not a list is none): the
        accepted ones let link ``conn`` carry their realms. Replaces what it held before."""
        self.stations.pop(conn, None)
        if not self.realms or not isinstance(endorsements, list):
            return {"accepted": [], "refused": []}
        raw = endorsements[: self.max_presented]
        return self.present(conn, node_id, raw, now_ms, station=True)

    def endorsed_realms(self, conn: int, now_ms: int) -> frozenset[bytes]:
        """The protected realms link ``conn`` may carry now."""
        held = self.stations.get(conn, {})
        return frozenset(r for r, e in held.items() if self._valid(e, now_ms, live_record=False))

    def forget(self, conn: int) -> None:
        self.members.pop(conn, None)
        self.stations.pop(conn, None)
        self.vouched.pop(conn, None)

    # --- members vouched for by a linked station ---------------------------------------

    def take_vouches(self, conn: int, endorsements: object, now_ms: int) -> dict[str, Any]:
        """Link ``conn`` vouches for these members (their endorsements, RPC form): each is
        checked here and kept if the link may carry its realm. How many were kept, and per
        refused one its index and reason."""
        if not isinstance(endorsements, list):
            endorsements = []
        carries = self.endorsed_realms(conn, now_ms)
        held = self.vouched.setdefault(conn, {})
        kept = 0
        refused: list[dict[str, Any]] = []
        for index, raw in enumerate(endorsements):
            member = _member_of(raw)
            try:
                if index >= VOUCH_BATCH:
                    raise EndorsementRefused("too_many", f"at most {VOUCH_BATCH} a vouch")
                if member is None:
                    raise EndorsementRefused("bad_payload", "no member_node bytes(32)")
                endorsement = check_endorsement(
                    raw,
                    node_id=member,
                    realms=self.realms,
                    revocations=self.revocations,
                    now_ms=now_ms,
                )
                if endorsement.realm not in carries:
                    raise EndorsementRefused("realm_not_protected", "this link may not carry it")
                key = (endorsement.realm, member)
                if key not in held and len(held) >= self.max_vouched:
                    raise EndorsementRefused("too_many", f"over {self.max_vouched} a link")
            except EndorsementRefused as exc:
                refused.append({"index": index, "reason": exc.reason})
                continue
            held[key] = endorsement
            kept += 1
        return {"kept": kept, "refused": refused}

    def vouched_for(self, conn: int, realm: bytes, member: bytes, now_ms: int) -> bool:
        """Did link ``conn`` vouch for ``member`` in ``realm`` with a still valid endorsement?"""
        endorsement = self.vouched.get(conn, {}).get((realm, member))
        return endorsement is not None and self._valid(endorsement, now_ms, live_record=False)

    def drain_vouches(self) -> list[Endorsement]:
        """The memberships accepted here since the last drain (for the links)."""
        fresh, self.to_vouch = self.to_vouch, []
        return fresh

    def local_members(self, realm: bytes) -> list[Endorsement]:
        """The endorsements of this station's own members in ``realm``."""
        return [held[realm] for held in self.members.values() if realm in held]

    # --- revocations ------------------------------------------------------------------

    def learn(self, record: Record, now_ms: int) -> bool:
        """Keep the revocation ``record`` carries, if any; True if it is a new one."""
        revocation = revocation_of(record, (r.authority for r in self.realms.values()), now_ms)
        if revocation is None:
            return False
        known = self.revocations.get(revocation.key)
        if known is not None and not is_newer(revocation.record, known.record):
            return False
        self.revocations[revocation.key] = revocation
        if len(self.revocations) > self.max_revocations:
            first = min(self.revocations.values(), key=lambda r: r.expires_at)
            del self.revocations[first.key]
        self.last_sweep_ms = 0  # sweep at the next tick
        return True

    def lookup_keys(self) -> set[bytes]:
        """Storage keys where a revocation of a current member may be stored: each
        endorsement's key (a revocation is a newer 0x05 under it)."""
        held = [*self.members.values(), *self.stations.values()]
        return {e.storage_key for grants in held for e in grants.values()}

    def sweep_due(self, now_ms: int) -> bool:
        return bool(self.realms) and now_ms - self.last_sweep_ms >= self.sweep_ms

    def sweep(self, now_ms: int) -> list[tuple[int, bytes]]:
        """End the memberships and station endorsements that expired or were revoked;
        (conn, realm) of each."""
        self.last_sweep_ms = now_ms
        ended: list[tuple[int, bytes]] = []
        for table, live in ((self.members, True), (self.stations, False)):
            for conn, held in table.items():
                for realm, endorsement in list(held.items()):
                    if not self._valid(endorsement, now_ms, live_record=live):
                        del held[realm]
                        ended.append((conn, realm))
        for vouched in self.vouched.values():
            for pair, endorsement in list(vouched.items()):
                if not self._valid(endorsement, now_ms, live_record=False):
                    del vouched[pair]
        for key, revocation in list(self.revocations.items()):
            if revocation.expires_at <= now_ms:
                del self.revocations[key]
        self.swept += len(ended)
        return ended


def _member_of(raw: object) -> bytes | None:
    if isinstance(raw, Mapping):
        payload = raw.get("payload")
        if isinstance(payload, Mapping) and _id32(payload.get("member_node")):
            member: bytes = payload["member_node"]
            return member
    return None


def _realm_of(raw: object) -> bytes | None:
    if isinstance(raw, Mapping):
        payload = raw.get("payload")
        if isinstance(payload, Mapping) and _id32(payload.get("realm")):
            realm: bytes = payload["realm"]
            return realm
    return None
