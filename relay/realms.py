"""Realms a station protects (issue 13): endorsements, revocations, and who may act in a realm.

Sans-I/O, time is always an argument. A protected realm is its tag (``realm_tag(name)``) and
its authority's Ed25519 key. An endorsement is a record 0x05 realm_member_endorsement
(PROTOCOL.md §10) signed by that authority, payload ``member_node`` bytes(32), ``realm``
bytes(32), ``role`` text, ``valid_until`` uint (Unix ms); it is stored under
SHA-256("member_endorsement" ‖ realm ‖ member_node) (``endorsement_key``). A revocation is
either a newer 0x05 under the same key with role ``"revoked"``, or a tombstone 0x0C with
``superseded_type`` 0x05 and ``superseded_key`` that storage key; both signed by the realm's
authority. (The realm helper's ``macula/realm/`` is to replace the record checks at merge.)

Invariants:
- ``check_endorsement`` accepts a record only if it parses, is a 0x05 with that payload,
  names a realm protected here and the presenting node, is signed by that realm's authority
  and by nothing else, is neither expired (record) nor past ``valid_until``, nor revoked;
  every refusal is an ``EndorsementRefused`` with a reason code and a readable detail.
- ``RealmGate`` holds memberships per connection (a reconnect presents again), never per node
  id; a membership ends when its connection goes, its ``valid_until`` passes, or a revocation
  for it is learned (checked on every ``allows``, so delivery stops at once; ``sweep`` also
  drops it, at least every ``sweep_ms``). A station peer is never a member: it ``allows`` a
  protected realm only if it declared that realm as one it protects (CONNECT/HELLO
  ``realms``). Unprotected realms are always allowed.
- Revocations are kept newest per endorsement key, at most ``max_revocations`` (the oldest
  to expire goes first), and forgotten once their record expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from macula.wire.errors import RecordInvalid
from macula.wire.frames import Connect
from macula.wire.identity import realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType

REVOKED_ROLE: Final = "revoked"
DEFAULT_SWEEP_MS: Final = 60_000
DEFAULT_MAX_PRESENTED: Final = 16
DEFAULT_MAX_REVOCATIONS: Final = 100_000


class EndorsementRefused(Exception):
    """Why an endorsement is not accepted: ``reason`` (a code) and ``detail`` (for a person)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
    if (
        type(realm) is not bytes
        or type(member) is not bytes
        or len(realm) != 32
        or len(member) != 32
    ):
        raise RecordInvalid("bad_payload", "an endorsement needs realm and member_node bytes(32)")
    return endorsement_key(realm, member)


@dataclass(frozen=True, slots=True)
class Endorsement:
    realm: bytes
    member_node: bytes
    role: str
    valid_until: int
    record: Record

    @property
    def key(self) -> bytes:
        return endorsement_key(self.realm, self.member_node)


@dataclass(frozen=True, slots=True)
class Revocation:
    key: bytes  # the storage key of the endorsement it revokes
    signer: bytes
    created_at: int
    version: bytes
    expires_at: int

    def revokes(self, endorsement: Endorsement, authority: bytes) -> bool:
        record = endorsement.record
        return (
            self.key == endorsement.key
            and self.signer == authority
            and (self.created_at, self.version) > (record.created_at, record.version)
        )


def _id32(value: object) -> bool:
    return type(value) is bytes and len(value) == 32


def _uint(value: object) -> bool:
    return type(value) is int and value >= 0


def endorsement_fields(record: Record) -> tuple[bytes, bytes, str, int]:
    """(realm, member_node, role, valid_until) of a 0x05, or ``EndorsementRefused``."""
    if record.type != RecordType.REALM_MEMBER_ENDORSEMENT:
        raise EndorsementRefused(
            "not_an_endorsement", f"record type 0x{record.type:02x}, expected 0x05"
        )
    p = record.payload
    problems = [
        f"{name} must be {kind}"
        for name, kind, ok in (
            ("member_node", "bytes(32)", _id32(p.get("member_node"))),
            ("realm", "bytes(32)", _id32(p.get("realm"))),
            ("role", "text", isinstance(p.get("role"), str)),
            ("valid_until", "a uint (Unix ms)", _uint(p.get("valid_until"))),
        )
        if not ok
    ]
    if problems:
        raise EndorsementRefused("bad_payload", "; ".join(problems))
    return p["realm"], p["member_node"], p["role"], p["valid_until"]


def check_endorsement(
    raw: object,
    *,
    node_id: bytes,
    realms: Mapping[bytes, ProtectedRealm],
    revocations: Mapping[bytes, Revocation],
    now_ms: int,
) -> Endorsement:
    """The endorsement ``raw`` (RPC form) grants ``node_id``, or ``EndorsementRefused``."""
    try:
        record = Record.from_rpc(raw)
    except RecordInvalid as exc:
        raise EndorsementRefused("bad_record", exc.detail) from None
    realm, member, role, valid_until = endorsement_fields(record)
    protected = realms.get(realm)
    if protected is None:
        raise EndorsementRefused("realm_not_protected", "this station does not protect that realm")
    if record.key != protected.authority:
        raise EndorsementRefused(
            "wrong_authority", f"signed by {record.key.hex()[:16]}, not the realm's authority"
        )
    try:
        record.verify(now_ms)
    except RecordInvalid as exc:
        reason = "expired" if exc.reason == "expired" else "bad_signature"
        raise EndorsementRefused(reason, exc.detail) from None
    if member != node_id:
        raise EndorsementRefused(
            "other_node", f"endorses {member.hex()[:16]}, not this connection's node"
        )
    if role == REVOKED_ROLE:
        raise EndorsementRefused("revoked", "this record is a revocation")
    if valid_until <= now_ms:
        raise EndorsementRefused("expired", f"valid_until {valid_until} <= now {now_ms}")
    endorsement = Endorsement(realm, member, role, valid_until, record)
    revocation = revocations.get(endorsement.key)
    if revocation is not None and revocation.revokes(endorsement, protected.authority):
        raise EndorsementRefused("revoked", "the realm's authority revoked this membership")
    return endorsement


def revocation_of(record: Record, authorities: Iterable[bytes], now_ms: int) -> Revocation | None:
    """The revocation ``record`` carries (signed by one of ``authorities``), else None."""
    if record.key not in set(authorities):
        return None
    p = record.payload
    if record.type == RecordType.REALM_MEMBER_ENDORSEMENT:
        if p.get("role") != REVOKED_ROLE or not _id32(p.get("realm")):
            return None
        if not _id32(p.get("member_node")):
            return None
        key = endorsement_key(p["realm"], p["member_node"])
    elif record.type == RecordType.TOMBSTONE:
        if p.get("superseded_type") != RecordType.REALM_MEMBER_ENDORSEMENT:
            return None
        if not _id32(p.get("superseded_key")):
            return None
        key = p["superseded_key"]
    else:
        return None
    try:
        record.verify(now_ms)
    except RecordInvalid:
        return None
    return Revocation(key, record.key, record.created_at, record.version, record.expires_at)


@dataclass(slots=True)
class RealmGate:
    """Who may act in which protected realm, per connection (see the module invariants)."""

    realms: dict[bytes, ProtectedRealm] = field(default_factory=dict)
    sweep_ms: int = DEFAULT_SWEEP_MS
    max_presented: int = DEFAULT_MAX_PRESENTED
    max_revocations: int = DEFAULT_MAX_REVOCATIONS
    members: dict[int, dict[bytes, Endorsement]] = field(default_factory=dict)
    station_realms: dict[int, frozenset[bytes]] = field(default_factory=dict)
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
        protected = self.realms.get(realm)
        if protected is None:
            return True
        if is_station:
            return realm in self.station_realms.get(conn, frozenset())
        endorsement = self.members.get(conn, {}).get(realm)
        return endorsement is not None and self._valid(endorsement, protected, now_ms)

    def _valid(self, endorsement: Endorsement, protected: ProtectedRealm, now_ms: int) -> bool:
        if endorsement.valid_until <= now_ms or endorsement.record.is_expired(now_ms):
            return False
        revocation = self.revocations.get(endorsement.key)
        return revocation is None or not revocation.revokes(endorsement, protected.authority)

    def present(
        self, conn: int, node_id: bytes, endorsements: list[object], now_ms: int
    ) -> dict[str, Any]:
        """Check each endorsement for ``conn`` (of ``node_id``); the accepted ones make it a
        member. The answer lists accepted realms and, per refused one, a reason."""
        accepted: list[dict[str, Any]] = []
        refused: list[dict[str, Any]] = []
        for index, raw in enumerate(endorsements):
            try:
                endorsement = check_endorsement(
                    raw,
                    node_id=node_id,
                    realms=self.realms,
                    revocations=self.revocations,
                    now_ms=now_ms,
                )
            except EndorsementRefused as exc:
                refusal: dict[str, Any] = {"index": index, "reason": exc.reason}
                refusal["detail"] = exc.detail
                realm = _realm_of(raw)
                if realm is not None:
                    refusal["realm"] = realm
                refused.append(refusal)
                continue
            self.members.setdefault(conn, {})[endorsement.realm] = endorsement
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

    def declare_station(self, conn: int, realms: object) -> None:
        """A station peer said (CONNECT/HELLO ``realms``) which realms it protects."""
        if isinstance(realms, list):
            self.station_realms[conn] = frozenset(r for r in realms if _id32(r))

    def forget(self, conn: int) -> None:
        self.members.pop(conn, None)
        self.station_realms.pop(conn, None)

    # --- revocations ------------------------------------------------------------------

    def learn(self, record: Record, now_ms: int) -> bool:
        """Keep the revocation ``record`` carries, if any; True if it is a new one."""
        revocation = revocation_of(record, (r.authority for r in self.realms.values()), now_ms)
        if revocation is None:
            return False
        known = self.revocations.get(revocation.key)
        if known is not None and (known.created_at, known.version) >= (
            revocation.created_at,
            revocation.version,
        ):
            return False
        self.revocations[revocation.key] = revocation
        if len(self.revocations) > self.max_revocations:
            first = min(self.revocations.values(), key=lambda r: r.expires_at)
            del self.revocations[first.key]
        self.last_sweep_ms = 0  # sweep at the next tick
        return True

    def lookup_keys(self) -> set[bytes]:
        """Storage keys where a revocation of a current member may be stored: each
        endorsement's key (a newer 0x05) and each authority's (its tombstones)."""
        keys = {e.key for held in self.members.values() for e in held.values()}
        return keys | {r.authority for r in self.realms.values()} if keys else keys

    def sweep_due(self, now_ms: int) -> bool:
        return bool(self.realms) and now_ms - self.last_sweep_ms >= self.sweep_ms

    def sweep(self, now_ms: int) -> list[tuple[int, bytes]]:
        """End the memberships that expired or were revoked; (conn, realm) of each."""
        self.last_sweep_ms = now_ms
        ended: list[tuple[int, bytes]] = []
        for conn, held in self.members.items():
            for realm, endorsement in list(held.items()):
                if not self._valid(endorsement, self.realms[realm], now_ms):
                    del held[realm]
                    ended.append((conn, realm))
        for key, revocation in list(self.revocations.items()):
            if revocation.expires_at <= now_ms:
                del self.revocations[key]
        self.swept += len(ended)
        return ended


def _realm_of(raw: object) -> bytes | None:
    if isinstance(raw, Mapping):
        payload = raw.get("payload")
        if isinstance(payload, Mapping) and _id32(payload.get("realm")):
            realm: bytes = payload["realm"]
            return realm
    return None
