"""relay.realms.gate and relay.realms.admission, pure (issue 13): the ``--realm`` flag, endorsement
and revocation checks, the gate's memberships under a driven clock, the allowlist file, and
the ``macula-relay`` flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from macula.realm.records import build_endorsement, build_revocation
from macula.wire.codes import ErrorCode
from macula.wire.frames import CAP_STATION, Connect, new_frame_id
from macula.wire.identity import Identity, realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record, RecordType, new_record, record_version
from relay.realms.admission import AdmissionMode, AllowlistError, ConnectRule, parse_allowlist
from relay.realms.gate import (
    EndorsementRefused,
    ProtectedRealm,
    RealmGate,
    check_endorsement,
    parse_realm_flag,
    record_storage_key,
    revocation_of,
)
from relay.station.realm_files import Allowlist
from support.stationcli import cli_config

NOW = 1_800_000_000_000
AUTHORITY = Identity.generate(os.urandom)
MEMBER = Identity.generate(os.urandom)
STATION = Identity.generate(os.urandom)
NAME = "org.example.team"
REALM = realm_tag(NAME)
PROTECTED = ProtectedRealm("org.example.team", REALM, AUTHORITY.node_id)


def endorsement(
    member: bytes = MEMBER.node_id,
    *,
    signer: Identity = AUTHORITY,
    role: str = "member",
    valid_until: int = NOW + 3_600_000,
    at: int = NOW,
    name: str = NAME,
    realm: bytes | None = None,
) -> Record:
    """Built by hand (not ``macula.realm.records``) so a test can make bad ones."""
    payload = {
        "member_node": member,
        "realm": realm_tag(name) if realm is None else realm,
        "realm_name": name,
        "role": role,
        "valid_until": valid_until,
    }
    version = record_version(at, os.urandom(10))
    return new_record(
        signer, RecordType.REALM_MEMBER_ENDORSEMENT, payload, now_ms=at, version=version
    )


def tombstone(
    key: bytes, *, signer: Identity = AUTHORITY, kind: int = 0x05, at: int = NOW + 1
) -> Record:
    payload = {"superseded_key": key, "superseded_type": kind, "replaced_at": at, "reason": "x"}
    version = record_version(at, os.urandom(10))
    return new_record(signer, RecordType.TOMBSTONE, payload, now_ms=at, version=version)


def test_the_realm_flag() -> None:
    realm = parse_realm_flag(f"org.example.team={AUTHORITY.node_id.hex()}")
    assert realm == PROTECTED
    for bad, why in (
        ("org.example.team", "NAME=AUTHORITY_KEY"),
        (f"={AUTHORITY.node_id.hex()}", "NAME=AUTHORITY_KEY"),
        ("team=zz", "not hex"),
        ("team=abcd", "32 bytes"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_realm_flag(bad)


def check(raw: object, node: bytes = MEMBER.node_id, now: int = NOW) -> str:
    try:
        check_endorsement(raw, node_id=node, realms={REALM: PROTECTED}, revocations={}, now_ms=now)
    except EndorsementRefused as exc:
        assert exc.detail
        return exc.reason
    return "accepted"


def test_endorsement_checks() -> None:
    good = endorsement()
    assert check(good.to_rpc()) == "accepted"
    assert check(good.to_rpc(), now=NOW + 3_600_000) == "expired"  # valid_until reached
    assert check(good.to_rpc(), node=AUTHORITY.node_id) == "other_node"
    assert check(endorsement(signer=MEMBER).to_rpc()) == "wrong_authority"
    forged = {**good.to_rpc(), "signature": bytes(64)}
    assert check(forged) == "bad_signature"
    assert check(endorsement(name="elsewhere").to_rpc()) == "realm_not_protected"
    # a name that does not hash to the tag, a missing name: not an endorsement's payload
    assert check(endorsement(name="elsewhere", realm=REALM).to_rpc()) == "bad_payload"
    nameless = new_record(
        AUTHORITY,
        RecordType.REALM_MEMBER_ENDORSEMENT,
        {k: v for k, v in good.payload.items() if k != "realm_name"},
        now_ms=NOW,
        version=record_version(NOW, os.urandom(10)),
    )
    assert check(nameless.to_rpc()) == "bad_payload"
    # what the realm's CLI builds is accepted as it is
    built = build_endorsement(
        AUTHORITY, NAME, MEMBER.node_id, valid_until=NOW + 1000, now_ms=NOW, random10=bytes(10)
    )
    assert check(built.to_rpc()) == "accepted"
    assert check(tombstone(member_endorsement_key(REALM, MEMBER.node_id)).to_rpc()) == (
        "not_an_endorsement"
    )
    bad_payload = new_record(
        AUTHORITY,
        RecordType.REALM_MEMBER_ENDORSEMENT,
        {"member_node": b"x", "realm": REALM, "role": 1, "valid_until": -1},
        now_ms=NOW,
        version=record_version(NOW, os.urandom(10)),
    )
    assert check(bad_payload.to_rpc()) == "bad_payload"
    assert check({"type": 5}) == "bad_record"
    assert check(None) == "bad_record"


def test_what_is_a_revocation() -> None:
    key = member_endorsement_key(REALM, MEMBER.node_id)
    authorities = [AUTHORITY.node_id]
    revoked = endorsement(role="revoked", at=NOW + 1)
    found = revocation_of(revoked, authorities, NOW)
    assert found is not None and found.key == key
    # the same record the realm's CLI builds (macula.realm.records) is one
    built = build_revocation(AUTHORITY, NAME, MEMBER.node_id, now_ms=NOW, random10=bytes(10))
    assert revocation_of(built, authorities, NOW) is not None
    # not revocations: a plain endorsement, a tombstone (one rule set: records.py says why),
    # a stranger's, a forged one, an expired one
    assert revocation_of(endorsement(), authorities, NOW) is None
    assert revocation_of(tombstone(key), authorities, NOW) is None
    assert revocation_of(endorsement(role="revoked", signer=MEMBER), authorities, NOW) is None
    forged = Record.from_rpc({**revoked.to_rpc(), "signature": bytes(64)})
    assert revocation_of(forged, authorities, NOW) is None
    assert revocation_of(revoked, authorities, revoked.expires_at) is None
    assert record_storage_key(revoked) == key


def test_the_gate_under_a_driven_clock() -> None:
    gate = RealmGate.protecting([PROTECTED], sweep_ms=60_000)
    good = endorsement()
    assert not gate.allows(1, False, REALM, NOW)
    assert gate.allows(1, False, realm_tag("open"), NOW)  # unprotected: unchanged
    answer = gate.present(1, MEMBER.node_id, [good.to_rpc()], NOW)
    assert [a["realm"] for a in answer["accepted"]] == [REALM]
    assert gate.allows(1, False, REALM, NOW)
    assert not gate.allows(2, False, REALM, NOW)  # another connection of the same node
    assert not gate.allows(1, True, REALM, NOW)  # a station peer is never a member
    station = endorsement(STATION.node_id, role="station")
    assert gate.present_station(3, STATION.node_id, [station.to_rpc()], NOW)["refused"] == []
    assert gate.allows(3, True, REALM, NOW)
    assert not gate.allows(4, True, REALM, NOW)  # another link
    # a revocation learned: refused at once, ended by the sweep
    assert gate.sweep_due(NOW)
    assert gate.sweep(NOW) == []
    assert not gate.sweep_due(NOW + 59_999)
    assert not gate.learn(tombstone(member_endorsement_key(REALM, MEMBER.node_id)), NOW)
    assert gate.allows(1, False, REALM, NOW)
    assert gate.learn(endorsement(role="revoked", at=NOW + 1), NOW)
    older = endorsement(role="revoked", at=NOW)
    assert not gate.learn(older, NOW)  # not newer than the one known
    assert not gate.allows(1, False, REALM, NOW)
    assert gate.sweep_due(NOW)  # learning brings the sweep forward
    assert gate.sweep(NOW) == [(1, REALM)]
    # an older revocation does not revoke a newer endorsement
    renewed = endorsement(at=NOW + 10)
    answer = gate.present(1, MEMBER.node_id, [renewed.to_rpc()], NOW + 10)
    assert answer["refused"] == [], answer
    # valid_until passes: refused, and swept
    assert not gate.allows(1, False, REALM, NOW + 3_600_000)
    assert gate.sweep(NOW + 3_600_000) == [(1, REALM), (3, REALM)]  # the station's as well
    gate.forget(3)
    assert not gate.allows(3, True, REALM, NOW)


def test_revocations_are_bounded() -> None:
    gate = RealmGate.protecting([PROTECTED], max_revocations=2)
    for _ in range(3):
        gate.learn(endorsement(Identity.generate(os.urandom).node_id, role="revoked"), NOW)
    assert len(gate.revocations) == 2


def test_the_allowlist_file(tmp_path: Path) -> None:
    a, b = os.urandom(32), os.urandom(32)
    assert parse_allowlist(f"# ids\n{a.hex()}\n\n  {b.hex()}  # b\n") == {a, b}
    with pytest.raises(AllowlistError, match="line 2"):
        parse_allowlist(f"{a.hex()}\n{a.hex()[:10]}\n")
    path = tmp_path / "allow"
    path.write_text(a.hex())
    allowlist = Allowlist.load(path)
    assert allowlist.ids == {a} and not allowlist.reload()
    path.write_text(f"{a.hex()}\n{b.hex()}\n")
    assert allowlist.reload() and allowlist.ids == {a, b}
    path.write_text("garbage, longer than before\n")
    assert not allowlist.reload() and allowlist.ids == {a, b}
    assert allowlist.failed_reloads == 1
    path.unlink()
    assert not allowlist.reload() and allowlist.ids == {a, b}
    with pytest.raises(AllowlistError, match="cannot read"):
        Allowlist.load(path)


def connect(node: Identity, capabilities: int = 0) -> Connect:
    return Connect(
        frame_id=new_frame_id(NOW, os.urandom(10)),
        sent_at_ms=NOW,
        capabilities=capabilities,
        node_id=node.node_id,
        station_id=node.node_id,
        puzzle_evidence=node.puzzle_evidence,
    )


def test_the_connect_rule(tmp_path: Path) -> None:
    station = Identity.generate(os.urandom)
    assert ConnectRule().refusal(connect(MEMBER), 0) is None
    path = tmp_path / "allow"
    path.write_text(MEMBER.node_id.hex())
    rule = ConnectRule(AdmissionMode.ALLOWLIST, Allowlist.load(path), frozenset())
    assert rule.refusal(connect(MEMBER), 0) is None
    refusal = rule.refusal(connect(AUTHORITY), 0)
    assert refusal is not None and refusal[0] == ErrorCode.UNAUTHORIZED
    assert rule.refusal(connect(station, CAP_STATION), 0) is not None
    members = ConnectRule(AdmissionMode.MEMBERS, None, frozenset({station.node_id}))
    assert members.refusal(connect(station, CAP_STATION), 0) is None  # a configured peer
    assert members.refusal(connect(MEMBER), 1) is None
    refusal = members.refusal(connect(MEMBER), 0)
    assert refusal is not None and refusal[0] == ErrorCode.TARGET_REALM_REFUSED


def test_the_relay_flags(tmp_path: Path) -> None:
    key = AUTHORITY.node_id.hex()
    path = tmp_path / "allow"
    path.write_text(MEMBER.node_id.hex())
    config = cli_config("--realm", f"org.example.team={key}", "--admission", "allowlist",
                   "--allowlist", str(path), "--realm-sweep-ms", "1000")  # fmt: skip
    assert config.realms == [PROTECTED]  # type: ignore[attr-defined]
    assert config.admission is AdmissionMode.ALLOWLIST  # type: ignore[attr-defined]
    assert config.policy.realm_sweep_ms == 1000  # type: ignore[attr-defined]
    for argv, why in (
        (["--admission", "allowlist"], "needs --allowlist"),
        (["--admission", "members"], "needs at least one --realm"),
        (["--realm", f"a={key}", "--realm", f"a={key}"], "named twice"),
        (["--allowlist", str(tmp_path / "missing")], "cannot read"),
    ):
        with pytest.raises(SystemExit, match=why):
            cli_config(*argv)
    path.write_text("nonsense\n")
    with pytest.raises(SystemExit, match="line 1"):
        cli_config("--allowlist", str(path))
    with pytest.raises(SystemExit):
        cli_config("--realm", "no-key")
