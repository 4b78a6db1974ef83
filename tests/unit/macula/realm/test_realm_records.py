"""Realm records: building, and every refusal of ``check_endorsement`` / ``check_directory``."""

from __future__ import annotations

import dataclasses

import pytest

from macula.realm.records import (
    REVOKED_ROLE,
    RealmRecordError,
    build_directory,
    build_endorsement,
    build_revocation,
    check_directory,
    check_endorsement,
    check_not_revoked,
    name_problem,
    role_problem,
)
from macula.wire.identity import Identity, realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType

NOW = 1_800_000_000_000
DAY = 86_400_000
AUTHORITY = Identity(bytes([1]) * 32)
MALLORY = Identity(bytes([2]) * 32)
MEMBER = Identity(bytes([3]) * 32)
OTHER = Identity(bytes([4]) * 32)
NAME = "org.example.team"
REALM = realm_tag(NAME)


def endorse(
    signer: Identity = AUTHORITY,
    member: bytes = MEMBER.node_id,
    name: str = NAME,
    valid_until: int = NOW + DAY,
    now: int = NOW,
) -> Record:
    return build_endorsement(
        signer, name, member, valid_until=valid_until, now_ms=now, random10=bytes(10)
    )


def check(record: object, now: int = NOW, **overrides: object) -> object:
    args: dict[str, object] = {
        "realm": REALM,
        "authority": AUTHORITY.node_id,
        "member": MEMBER.node_id,
        "now_ms": now,
    }
    args.update(overrides)
    return check_endorsement(record, **args)  # type: ignore[arg-type]


def reason(record: object, now: int = NOW, **overrides: object) -> str:
    with pytest.raises(RealmRecordError) as excinfo:
        check(record, now, **overrides)
    return excinfo.value.reason


def test_a_valid_endorsement_passes_also_in_rpc_form() -> None:
    record = endorse()
    assert record.type == RecordType.REALM_MEMBER_ENDORSEMENT
    assert record.key == AUTHORITY.node_id
    assert record.storage_key() == member_endorsement_key(REALM, MEMBER.node_id)
    found = check(record.to_rpc())
    assert found.member == MEMBER.node_id and found.role == "member"  # type: ignore[attr-defined]
    assert found.realm_name == NAME and found.valid_until == NOW + DAY  # type: ignore[attr-defined]


def test_a_forged_endorsement_is_refused_as_bad_signature() -> None:
    record = endorse()
    forged = dataclasses.replace(record, payload={**record.payload, "role": "admin"})
    assert reason(forged) == "bad_signature"
    flipped = bytes([record.signature[0] ^ 1]) + record.signature[1:]  # type: ignore[index]
    assert reason(dataclasses.replace(record, signature=flipped)) == "bad_signature"


def test_an_endorsement_for_another_node_is_refused() -> None:
    assert reason(endorse(member=OTHER.node_id)) == "wrong_member"


def test_an_expired_endorsement_is_refused() -> None:
    assert reason(endorse(valid_until=NOW + 10), now=NOW + 10) == "expired"
    # the DHT copy's own lifetime (48 h) ended, though valid_until has not
    assert reason(endorse(valid_until=NOW + 30 * DAY), now=NOW + 3 * DAY) == "expired"
    held = check(endorse(valid_until=NOW + 30 * DAY), now=NOW + 3 * DAY, live_record=False)
    assert held is not None


def test_an_endorsement_signed_by_another_key_is_refused() -> None:
    assert reason(endorse(signer=MALLORY)) == "wrong_authority"


def test_an_endorsement_for_another_realm_is_refused() -> None:
    assert reason(endorse(name="org.example.other")) == "wrong_realm"


def test_a_revocation_is_refused_and_supersedes() -> None:
    endorsement = check(endorse())
    revocation = build_revocation(
        AUTHORITY, NAME, MEMBER.node_id, now_ms=NOW + 1, random10=bytes(10)
    )
    assert revocation.payload["role"] == REVOKED_ROLE
    assert revocation.storage_key() == endorse().storage_key()  # replaces it in a store
    assert reason(revocation, now=NOW + 2) == "revoked"
    with pytest.raises(RealmRecordError) as excinfo:
        check_not_revoked(endorsement, [revocation])  # type: ignore[arg-type]
    assert excinfo.value.reason == "revoked"
    # a revocation signed by someone else, or older, changes nothing
    foreign = build_revocation(MALLORY, NAME, MEMBER.node_id, now_ms=NOW + 1, random10=bytes(10))
    older = build_revocation(AUTHORITY, NAME, MEMBER.node_id, now_ms=NOW - 1, random10=bytes(10))
    check_not_revoked(endorsement, [foreign, older])  # type: ignore[arg-type]


def test_malformed_input_is_refused_as_malformed() -> None:
    for raw in (None, 5, {"type": 5}, b"x"):
        assert reason(raw) == "malformed"
    directory = build_directory(AUTHORITY, NAME, now_ms=NOW, random10=bytes(10))
    assert reason(directory) == "malformed"  # a 0x03 is not an endorsement


def test_building_refuses_bad_input() -> None:
    with pytest.raises(RealmRecordError):
        endorse(name="Bad Name")
    with pytest.raises(RealmRecordError):
        endorse(valid_until=NOW)
    with pytest.raises(RealmRecordError):
        endorse(member=b"short")
    with pytest.raises(RealmRecordError):
        build_endorsement(
            AUTHORITY,
            NAME,
            MEMBER.node_id,
            role=REVOKED_ROLE,
            valid_until=NOW + DAY,
            now_ms=NOW,
            random10=bytes(10),
        )


def test_names_and_roles() -> None:
    assert name_problem("org.example.team") is None
    for bad in ("", "Org", "a b", "-x", "x" * 129, 5):
        assert name_problem(bad) is not None
    assert role_problem("member") is None and role_problem("admin") is None
    for bad in ("", "Member", "revoked", "x" * 40):
        assert role_problem(bad) is not None


def test_directory_record_checks() -> None:
    record = build_directory(AUTHORITY, NAME, now_ms=NOW, random10=bytes(10))
    found = check_directory(record.to_rpc(), now_ms=NOW, name=NAME, authority=AUTHORITY.node_id)
    assert found.authority == AUTHORITY.node_id and found.join_procedure == f"realm.{NAME}.join"
    assert record.storage_key() == AUTHORITY.node_id

    def refused(raw: object, **kw: object) -> str:
        with pytest.raises(RealmRecordError) as excinfo:
            check_directory(raw, now_ms=kw.pop("now", NOW), **kw)  # type: ignore[arg-type]
        return excinfo.value.reason

    assert refused(record, name="org.example.other") == "wrong_realm"
    assert refused(record, authority=MALLORY.node_id) == "wrong_authority"
    assert refused(record, now=NOW + 3 * DAY) == "expired"
    forged = dataclasses.replace(record, payload={**record.payload, "policy": "open"})
    assert refused(forged) == "bad_signature"
    # mallory signs a directory naming the real authority: refused
    payload = dict(record.payload)
    stolen = build_directory(MALLORY, NAME, now_ms=NOW, random10=bytes(10))
    lying = Record(stolen.type, MALLORY.node_id, stolen.version, NOW, NOW + DAY, payload)
    assert refused(lying.signed(MALLORY)) == "wrong_authority"
