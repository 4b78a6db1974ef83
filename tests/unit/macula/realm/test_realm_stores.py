"""A realm's state file (sessions, decisions, wrong codes, members) and a node's memberships:
behaviour and permissions."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from macula.errors import MeshError
from macula.realm.authority import Realm, RealmError, list_realms
from macula.realm.codes import GuessLimiter, display
from macula.realm.membership import MembershipStore, memberships_path
from macula.realm.records import REVOKED_ROLE, build_endorsement, check_endorsement
from macula.wire.identity import Identity, realm_tag
from macula.wire.records import Record
from support.paths import file_mode

NOW = 1_800_000_000_000
NAME = "org.example.team"
ALICE = Identity(bytes([5]) * 32)
BOB = Identity(bytes([7]) * 32)


def make_realm(home: Path, **kw: Any) -> Realm:
    realm = Realm(home, NAME, **kw)
    realm.create(difficulty=0)
    return realm


def test_create_makes_private_files_and_refuses_twice(tmp_path: Path) -> None:
    realm = make_realm(tmp_path)
    assert file_mode(realm.key_path) == 0o600 and file_mode(realm.state_path) == 0o600
    assert file_mode(realm.folder) == 0o700 and file_mode(realm.folder.parent) == 0o700
    assert list_realms(tmp_path) == [NAME]
    with pytest.raises(RealmError) as excinfo:
        Realm(tmp_path, NAME).create(difficulty=0)
    assert excinfo.value.code == "exists"
    with pytest.raises(RealmError):
        Realm(tmp_path, "Bad Name")
    with pytest.raises(RealmError) as excinfo:
        Realm(tmp_path, "org.example.none").open()
    assert excinfo.value.code == "no_realm"


def test_a_loose_key_file_is_refused(tmp_path: Path) -> None:
    realm = make_realm(tmp_path)
    os.chmod(realm.key_path, 0o644)
    with pytest.raises(Exception, match="accessible by others"):
        Realm(tmp_path, NAME).open()


def test_approve_signs_an_endorsement_and_deny_does_not(tmp_path: Path) -> None:
    realm = make_realm(tmp_path)
    session = realm.start_session(ALICE.node_id, NOW)
    assert realm.status_of(ALICE.node_id, NOW) == ("pending", None)
    assert [s.code for s in realm.pending(NOW)] == [session.code]
    decided = realm.decide(display(session.code).lower(), True, NOW + 1)
    assert decided.status == "approved" and decided.node == ALICE.node_id
    status, member = realm.status_of(ALICE.node_id, NOW + 2)
    assert status == "approved" and member is not None
    check_endorsement(
        member.record,
        realm=realm_tag(NAME),
        authority=realm.authority.node_id,
        member=ALICE.node_id,
        now_ms=NOW + 2,
    )
    with pytest.raises(RealmError) as excinfo:
        realm.decide(session.code, False, NOW + 3)
    assert excinfo.value.code == "decided"
    bob = realm.start_session(BOB.node_id, NOW)
    assert realm.decide(bob.code, False, NOW + 1).status == "denied"
    assert realm.status_of(BOB.node_id, NOW + 2) == ("denied", None)
    assert [m.node for m in realm.members()] == [ALICE.node_id]


def test_a_new_start_replaces_the_code_and_sessions_expire(tmp_path: Path) -> None:
    realm = make_realm(tmp_path, session_ttl_ms=1000)
    first = realm.start_session(ALICE.node_id, NOW)
    second = realm.start_session(ALICE.node_id, NOW + 1)
    assert first.code != second.code
    assert [s.code for s in realm.pending(NOW + 2)] == [second.code]
    with pytest.raises(RealmError) as excinfo:
        realm.decide(first.code, True, NOW + 2)
    assert excinfo.value.code == "decided"
    assert realm.status_of(ALICE.node_id, NOW + 5000)[0] == "expired"
    with pytest.raises(RealmError) as excinfo:
        realm.decide(second.code, True, NOW + 5000)
    assert excinfo.value.code == "expired"


def test_too_many_pending_requests_are_refused(tmp_path: Path) -> None:
    realm = make_realm(tmp_path, max_pending=1)
    realm.start_session(ALICE.node_id, NOW)
    with pytest.raises(RealmError) as excinfo:
        realm.start_session(BOB.node_id, NOW)
    assert excinfo.value.code == "busy"


def test_wrong_codes_are_rate_limited_even_the_right_one(tmp_path: Path) -> None:
    realm = make_realm(tmp_path, limiter=GuessLimiter(max_wrong=3, window_ms=60_000))
    session = realm.start_session(ALICE.node_id, NOW)
    wrong = "2222-2222" if session.code != "22222222" else "3333-3333"
    for i in range(3):
        with pytest.raises(RealmError) as excinfo:
            realm.decide(wrong, True, NOW + i)
        assert excinfo.value.code == "unknown_code"
    with pytest.raises(RealmError) as excinfo:
        realm.decide(session.code, True, NOW + 10)
    assert excinfo.value.code == "rate_limited"
    with pytest.raises(RealmError) as excinfo:
        realm.decide("not a code", True, NOW + 10)
    assert excinfo.value.code == "bad_code"  # malformed: said so, not counted
    # the window passes: the right code works
    assert realm.decide(session.code, True, NOW + 60_010).status == "approved"


def test_revoke_signs_a_revocation_that_is_published_once(tmp_path: Path) -> None:
    realm = make_realm(tmp_path)
    realm.decide(realm.start_session(ALICE.node_id, NOW).code, True, NOW)
    [endorsement] = realm.unpublished()
    realm.mark_published(endorsement)
    assert realm.unpublished() == []
    revocation = realm.revoke(ALICE.node_id, NOW + 5)
    assert revocation.payload["role"] == REVOKED_ROLE
    assert revocation.storage_key() == endorsement.storage_key()
    assert realm.unpublished() == [revocation]
    assert realm.status_of(ALICE.node_id, NOW + 6)[0] == "revoked"
    with pytest.raises(RealmError) as excinfo:
        realm.revoke(ALICE.node_id, NOW + 7)
    assert excinfo.value.code == "revoked"
    with pytest.raises(RealmError) as excinfo:
        realm.revoke(BOB.node_id, NOW + 7)
    assert excinfo.value.code == "not_member"


# --- the member's side ------------------------------------------------------------------------

AUTH = Identity(bytes([1]) * 32)


def endorsement(member: Identity = ALICE, valid_until: int = NOW + 86_400_000) -> Record:
    return build_endorsement(
        AUTH, NAME, member.node_id, valid_until=valid_until, now_ms=NOW, random10=bytes(10)
    )


def store(tmp_path: Path, now: int = NOW) -> MembershipStore:
    return MembershipStore(memberships_path(tmp_path, ALICE.node_id), ALICE, clock=lambda: now)


def held(record: Record) -> Any:
    return check_endorsement(
        record, realm=realm_tag(NAME), authority=AUTH.node_id, member=ALICE.node_id, now_ms=NOW
    )


def test_memberships_are_stored_private_and_listed_without_credentials(tmp_path: Path) -> None:
    memberships = store(tmp_path)
    memberships.put(held(endorsement()), NOW)
    assert file_mode(memberships.path) == 0o600 and file_mode(memberships.path.parent) == 0o700
    [m] = memberships.memberships()
    view = m.view()
    assert view == {
        "name": NAME,
        "realm": realm_tag(NAME).hex(),
        "authority": AUTH.node_id.hex(),
        "role": "member",
        "joined_at": NOW,
        "valid_until": NOW + 86_400_000,
    }
    assert store(tmp_path, NOW + 86_400_000).memberships() == []  # expired: not shown


def test_a_tampered_or_foreign_entry_is_skipped(tmp_path: Path) -> None:
    memberships = store(tmp_path)
    memberships.put(held(endorsement()), NOW)
    data = json.loads(memberships.path.read_text())
    bob = build_endorsement(
        AUTH, NAME, BOB.node_id, valid_until=NOW + 1000, now_ms=NOW, random10=bytes(10)
    )
    from macula.wire import cbor

    data["memberships"].append({"realm": "x", "record": cbor.encode(bob.to_rpc()).hex()})
    data["memberships"].append({"realm": "y", "record": "zz"})
    memberships.path.write_text(json.dumps(data))
    assert len(memberships.memberships()) == 1
    assert memberships.stats["skipped_wrong_member"] == 1
    assert memberships.stats["skipped_malformed"] == 1
    memberships.path.write_text("{not json")
    assert memberships.memberships() == [] and memberships.stats["unreadable"] == 1


class FakeStation:
    def __init__(self, error: int | None = None) -> None:
        self.error = error
        self.sent: list[Any] = []

    async def builtin(self, procedure: str, payload: Any, timeout: float) -> Any:
        self.sent.append((procedure, payload))
        if self.error is not None:
            raise MeshError(self.error)
        return {"accepted": [realm_tag(NAME)]}


class FakeDht:
    def __init__(self, records: list[Record]) -> None:
        self.records = records

    async def find_records(self, key: bytes, *, timeout: float = 5.0) -> list[Record]:
        return [r for r in self.records if r.storage_key() == key]


@pytest.mark.anyio
async def test_present_sends_records_and_tolerates_a_station_without_it(tmp_path: Path) -> None:
    memberships = store(tmp_path)
    assert await memberships.present(FakeStation()) is None  # nothing held: nothing sent
    memberships.put(held(endorsement()), NOW)
    station = FakeStation()
    assert await memberships.present(station) is not None
    [(procedure, payload)] = station.sent
    assert procedure == "_realm.present"
    assert Record.from_rpc(payload["endorsements"][0]) == endorsement()  # the station's shape
    assert await memberships.present(FakeStation(error=0x01)) is None
    assert memberships.stats["station_without_present"] == 1
    with pytest.raises(MeshError):
        await memberships.present(FakeStation(error=0x0F))


@pytest.mark.anyio
async def test_a_revocation_in_the_dht_removes_the_membership(tmp_path: Path) -> None:
    from macula.realm.records import build_revocation

    memberships = store(tmp_path)
    memberships.put(held(endorsement()), NOW)
    forged = build_revocation(BOB, NAME, ALICE.node_id, now_ms=NOW + 1, random10=bytes(10))
    await memberships.refresh(FakeDht([forged]))
    assert len(memberships.memberships()) == 1  # not signed by the authority: ignored
    revocation = build_revocation(AUTH, NAME, ALICE.node_id, now_ms=NOW + 1, random10=bytes(10))
    station = FakeStation()
    assert await memberships.present(station, FakeDht([revocation])) is None
    assert memberships.memberships() == [] and station.sent == []


def test_codes_differ_across_many_sessions(tmp_path: Path) -> None:
    counter = itertools.count()
    realm = make_realm(tmp_path, max_pending=500)
    codes = {realm.start_session(bytes([next(counter) % 256]) * 32, NOW).code for _ in range(50)}
    assert len(codes) == 50
