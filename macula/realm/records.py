"""Realm records (PROTOCOL.md §10, issue 13): directory (0x03), endorsement and revocation (0x05).

Invariants:
- A realm has a name; its tag is ``realm_tag(name)``. Its authority is one Ed25519 key, the
  signer (``key``) of its directory record, of every endorsement and of every revocation.
- An endorsement is a 0x05 record signed by the authority with payload ``realm`` bytes(32),
  ``realm_name`` text, ``member_node`` bytes(32), ``role`` text and ``valid_until`` uint (Unix
  ms). Its storage key is SHA-256("member_endorsement" || realm || member_node) (§10.5).
- A revocation is the same record with role ``revoked`` and a later ``created_at``. Why not a
  tombstone (0x0C): a tombstone's storage key is its signer's key, and a store keeps one record
  per (storage key, signer), so an authority's second tombstone would erase its first. The
  revocation lands under the endorsement's own storage key from the same signer and replaces it
  everywhere the endorsement was stored; a station asking for the endorsement gets the
  revocation back. ``is_newer`` orders the two.
- The record's ``expires_at`` is its DHT lifetime (at most 48 h, republished by the authority);
  ``valid_until`` is the membership's. ``check_endorsement`` checks both unless told the record
  may be an old stored copy (``live_record=False``).
- A station endorsement (issue 26) is an endorsement whose ``member_node`` is a station's node
  id and whose role is ``station``: the authority lets that station carry the realm's traffic
  over its links. ``check_station_endorsement`` accepts only that role, and does not require the
  record's DHT lifetime (the station presents the copy it was given; ``valid_until`` and
  revocations bound it).
- ``check_*`` trust nothing the record says about itself: the signer must be the *expected*
  authority, the member the *expected* node, the realm the expected tag. Each failure is one
  ``RealmRecordError`` whose ``reason`` is one of ``REASONS``; nothing else is raised.
- Sans-I/O: time and randomness are arguments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from macula.errors import MaculaError
from macula.wire.errors import RecordInvalid
from macula.wire.identity import Identity, realm_tag, verify
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType, is_newer, new_record, record_version

REVOKED_ROLE: Final = "revoked"
DEFAULT_ROLE: Final = "member"
STATION_ROLE: Final = "station"  # a station endorsement: that station may carry the realm
DEFAULT_VALID_MS: Final = 30 * 24 * 3600 * 1000  # §10.7: valid_until defaults to 30 days
RECORD_TTL_MS: Final = 48 * 3600 * 1000  # the DHT lifetime; the authority republishes
POLICY_APPROVAL: Final = "approval"  # a person approves each join
MAX_NAME: Final = 128
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9._-]*")
_ROLE: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")

REASONS: Final = (
    "malformed",  # not a record, or not this kind of record
    "bad_signature",  # forged: the signature does not verify against its signer
    "wrong_authority",  # signed by a key that is not the realm's authority
    "wrong_realm",  # for another realm
    "wrong_member",  # for another node
    "expired",  # valid_until (or the record's own expires_at) has passed
    "revoked",  # a revocation, or superseded by one
    "not_a_station",  # a valid endorsement, but not with the role ``station``
)


class RealmRecordError(MaculaError):
    """A realm record was refused; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def name_problem(name: object) -> str | None:
    """None for a usable realm name (lowercase, digits, '.', '_', '-', 1-128), else why not."""
    if type(name) is not str or not 1 <= len(name) <= MAX_NAME:
        return f"a realm name is 1-{MAX_NAME} characters"
    if not _NAME.fullmatch(name):
        return "a realm name is lowercase letters, digits, '.', '_' and '-', starting alphanumeric"
    return None


def role_problem(role: object) -> str | None:
    if type(role) is not str or not _ROLE.fullmatch(role):
        return "a role is 1-32 lowercase letters, digits, '_' or '-', starting with a letter"
    if role == REVOKED_ROLE:
        return f"{REVOKED_ROLE!r} is the role of a revocation, not of a member"
    return None


@dataclass(frozen=True, slots=True)
class Endorsement:
    """A checked endorsement: ``record`` is the signed 0x05 record it was read from."""

    realm: bytes
    realm_name: str
    authority: bytes
    member: bytes
    role: str
    valid_until: int
    record: Record

    @property
    def storage_key(self) -> bytes:
        return member_endorsement_key(self.realm, self.member)


@dataclass(frozen=True, slots=True)
class Directory:
    """A checked realm directory record."""

    name: str
    realm: bytes
    authority: bytes
    policy: str
    join_procedure: str
    record: Record


def join_procedure(name: str) -> str:
    """The procedure a realm's join service answers, in the all-zero realm (non-members call
    it, so it cannot live in the protected realm itself)."""
    return f"realm.{name}.join"


# --- building ----------------------------------------------------------------------------------


def _version(now_ms: int, random10: bytes) -> bytes:
    return record_version(now_ms, random10)


def build_endorsement(
    authority: Identity,
    name: str,
    member: bytes,
    *,
    role: str = DEFAULT_ROLE,
    valid_until: int,
    now_ms: int,
    random10: bytes,
) -> Record:
    if problem := name_problem(name) or role_problem(role):
        raise RealmRecordError("malformed", problem)
    if type(member) is not bytes or len(member) != 32:
        raise RealmRecordError("malformed", "member_node must be 32 bytes")
    if valid_until <= now_ms:
        raise RealmRecordError("expired", "valid_until must be in the future")
    return _member_record(authority, name, member, role, valid_until, now_ms, random10)


def build_revocation(
    authority: Identity, name: str, member: bytes, *, now_ms: int, random10: bytes
) -> Record:
    """The record that replaces ``member``'s endorsement: role ``revoked``, valid until now."""
    if problem := name_problem(name):
        raise RealmRecordError("malformed", problem)
    return _member_record(authority, name, member, REVOKED_ROLE, now_ms, now_ms, random10)


def _member_record(
    authority: Identity,
    name: str,
    member: bytes,
    role: str,
    valid_until: int,
    now_ms: int,
    random10: bytes,
) -> Record:
    payload = {
        "realm": realm_tag(name),
        "realm_name": name,
        "member_node": member,
        "role": role,
        "valid_until": valid_until,
    }
    return new_record(
        authority,
        RecordType.REALM_MEMBER_ENDORSEMENT,
        payload,
        now_ms=now_ms,
        version=_version(now_ms, random10),
        ttl_ms=RECORD_TTL_MS,
    )


def build_directory(
    authority: Identity, name: str, *, now_ms: int, random10: bytes, policy: str = POLICY_APPROVAL
) -> Record:
    if problem := name_problem(name):
        raise RealmRecordError("malformed", problem)
    payload = {
        "name": name,
        "realm": realm_tag(name),
        "authority": authority.node_id,
        "policy": policy,
        "join_procedure": join_procedure(name),
    }
    return new_record(
        authority,
        RecordType.REALM_DIRECTORY,
        payload,
        now_ms=now_ms,
        version=_version(now_ms, random10),
        ttl_ms=RECORD_TTL_MS,
    )


# --- checking ----------------------------------------------------------------------------------


def as_record(raw: object) -> Record:
    """A ``Record`` from a record or its RPC form; ``RealmRecordError("malformed")`` else."""
    if isinstance(raw, Record):
        return raw
    try:
        return Record.from_rpc(raw)
    except RecordInvalid as exc:
        raise RealmRecordError("malformed", f"not a record: {exc.detail}") from None


def _signed_by(record: Record, authority: bytes) -> None:
    if record.key != authority:
        raise RealmRecordError(
            "wrong_authority",
            f"signed by {record.key.hex()[:16]}…, not by the realm's authority "
            f"{authority.hex()[:16]}…",
        )
    signature = record.signature
    if signature is None or not verify(record.key, record.signable_bytes(), signature):
        raise RealmRecordError("bad_signature", "the signature does not verify (forged or altered)")


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if type(value) is not str:
        raise RealmRecordError("malformed", f"payload {key} must be text")
    return value


def _id32(payload: dict[str, Any], key: str) -> bytes:
    value = payload.get(key)
    if type(value) is not bytes or len(value) != 32:
        raise RealmRecordError("malformed", f"payload {key} must be 32 bytes")
    return value


def read_member_record(raw: object, *, authority: bytes) -> Endorsement:
    """An endorsement *or revocation* signed by ``authority``: shape and signature only."""
    record = as_record(raw)
    if record.type != RecordType.REALM_MEMBER_ENDORSEMENT:
        raise RealmRecordError("malformed", f"record type 0x{record.type:02x} is not 0x05")
    _signed_by(record, authority)
    payload = record.payload
    realm, member = _id32(payload, "realm"), _id32(payload, "member_node")
    name, role = _text(payload, "realm_name"), _text(payload, "role")
    valid_until = payload.get("valid_until")
    if type(valid_until) is not int or valid_until < 0:
        raise RealmRecordError("malformed", "payload valid_until must be a uint (Unix ms)")
    if realm_tag(name) != realm:
        raise RealmRecordError("wrong_realm", f"realm_name {name!r} does not hash to realm")
    return Endorsement(realm, name, record.key, member, role, valid_until, record)


def check_endorsement(
    raw: object,
    *,
    realm: bytes,
    authority: bytes,
    member: bytes,
    now_ms: int,
    live_record: bool = True,
) -> Endorsement:
    """The endorsement of ``member`` in ``realm`` by ``authority``, valid at ``now_ms``, or
    ``RealmRecordError``: malformed, wrong_authority, bad_signature, wrong_realm, wrong_member,
    revoked, expired (checked in that order)."""
    found = read_member_record(raw, authority=authority)
    if found.realm != realm:
        raise RealmRecordError("wrong_realm", f"for realm {found.realm.hex()[:16]}…")
    if found.member != member:
        raise RealmRecordError("wrong_member", f"for node {found.member.hex()[:16]}…")
    if found.role == REVOKED_ROLE:
        raise RealmRecordError("revoked", "this record revokes the membership")
    if found.valid_until <= now_ms:
        raise RealmRecordError("expired", f"valid_until {found.valid_until} <= now {now_ms}")
    if live_record and found.record.expires_at <= now_ms:
        raise RealmRecordError(
            "expired", "the record's DHT lifetime ended; the authority republishes a fresh one"
        )
    return found


def check_station_endorsement(
    raw: object, *, realm: bytes, authority: bytes, station: bytes, now_ms: int
) -> Endorsement:
    """The station endorsement of ``station`` for ``realm`` by ``authority``, valid at
    ``now_ms`` (its ``valid_until``; the record's DHT lifetime is not required), or
    ``RealmRecordError``: the reasons of ``check_endorsement``, then ``not_a_station``."""
    found = check_endorsement(
        raw, realm=realm, authority=authority, member=station, now_ms=now_ms, live_record=False
    )
    if found.role != STATION_ROLE:
        raise RealmRecordError(
            "not_a_station", f"role {found.role!r}: a station needs a {STATION_ROLE!r} endorsement"
        )
    return found


def check_not_revoked(endorsement: Endorsement, others: list[Record]) -> None:
    """``revoked`` if any of ``others`` is a revocation by the same authority, for the same
    member and realm, newer than ``endorsement`` (forged or foreign ones are ignored)."""
    for raw in others:
        try:
            other = read_member_record(raw, authority=endorsement.authority)
        except RealmRecordError:
            continue
        if (
            other.role == REVOKED_ROLE
            and other.realm == endorsement.realm
            and other.member == endorsement.member
            and is_newer(other.record, endorsement.record)
        ):
            raise RealmRecordError("revoked", "the authority revoked this membership")


def check_directory(
    raw: object, *, now_ms: int, name: str | None = None, authority: bytes | None = None
) -> Directory:
    """A realm directory record signed by the authority it names (and by ``authority`` when
    given), for ``name`` when given, not expired."""
    record = as_record(raw)
    if record.type != RecordType.REALM_DIRECTORY:
        raise RealmRecordError("malformed", f"record type 0x{record.type:02x} is not 0x03")
    payload = record.payload
    named = _id32(payload, "authority")
    if named != record.key:
        raise RealmRecordError("wrong_authority", "signed by a key other than the one it names")
    _signed_by(record, authority if authority is not None else named)
    realm_name = _text(payload, "name")
    if name_problem(realm_name) or realm_tag(realm_name) != _id32(payload, "realm"):
        raise RealmRecordError("wrong_realm", "name and realm do not match")
    if name is not None and realm_name != name:
        raise RealmRecordError("wrong_realm", f"for realm {realm_name!r}, not {name!r}")
    if record.expires_at <= now_ms:
        raise RealmRecordError("expired", "the directory record expired")
    policy, procedure = _text(payload, "policy"), _text(payload, "join_procedure")
    return Directory(realm_name, realm_tag(realm_name), named, policy, procedure, record)
