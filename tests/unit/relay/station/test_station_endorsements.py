"""Station endorsements (issue 26), pure and in-process: the record rule, the gate's links, a
station's own endorsements checked at start, the ``macula-realm endorse-station`` command and
the ``macula-relay --realm-endorsement`` flag, and how a station presents them in its
CONNECT and HELLO."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from macula.realm.cli import main as realm_main
from macula.realm.records import (
    STATION_ROLE,
    RealmRecordError,
    build_endorsement,
    build_revocation,
    check_station_endorsement,
)
from macula.wire import cbor
from macula.wire.frames import Connect, Hello, parse_frame
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag
from macula.wire.record_keys import member_endorsement_key
from macula.wire.records import Record
from relay.core.frames import StationFrames
from relay.ops.cli import build_parser, config_from_args
from relay.realms.gate import ProtectedRealm, RealmGate
from relay.realms.links import own_station_endorsements
from relay.station.realm_files import load_station_endorsement

NOW = 1_800_000_000_000
DAY = 86_400_000
AUTHORITY = Identity.generate(os.urandom)
OTHER = Identity.generate(os.urandom)
STATION = Identity.generate(os.urandom)
NAME = "org.example.linked"
REALM = realm_tag(NAME)
PROTECTED = {REALM: ProtectedRealm(NAME, REALM, AUTHORITY.node_id)}


def station_record(
    node: bytes = STATION.node_id,
    *,
    signer: Identity = AUTHORITY,
    role: str = STATION_ROLE,
    at: int = NOW,
    valid_until: int = NOW + 30 * DAY,
) -> dict[str, object]:
    record = build_endorsement(
        signer, NAME, node, role=role, valid_until=valid_until, now_ms=at, random10=os.urandom(10)
    )
    return record.to_rpc()


def test_a_station_endorsement_is_a_0x05_of_role_station_for_that_station() -> None:
    found = check_station_endorsement(
        station_record(),
        realm=REALM,
        authority=AUTHORITY.node_id,
        station=STATION.node_id,
        now_ms=NOW,
    )
    assert found.role == STATION_ROLE and found.member == STATION.node_id
    cases = {
        "not_a_station": station_record(role="member"),
        "wrong_authority": station_record(signer=OTHER),
        "wrong_member": station_record(Identity.generate(os.urandom).node_id),
        "revoked": build_revocation(
            AUTHORITY, NAME, STATION.node_id, now_ms=NOW, random10=os.urandom(10)
        ).to_rpc(),
    }
    for reason, raw in cases.items():
        with pytest.raises(RealmRecordError) as caught:
            check_station_endorsement(
                raw, realm=REALM, authority=AUTHORITY.node_id, station=STATION.node_id, now_ms=NOW
            )
        assert caught.value.reason == reason, raw
    # the record's 48 h DHT lifetime is not required (the station keeps its copy);
    # valid_until is
    later = NOW + 3 * DAY
    assert check_station_endorsement(
        station_record(),
        realm=REALM,
        authority=AUTHORITY.node_id,
        station=STATION.node_id,
        now_ms=later,
    )
    with pytest.raises(RealmRecordError, match="expired"):
        check_station_endorsement(
            station_record(valid_until=NOW + DAY),
            realm=REALM,
            authority=AUTHORITY.node_id,
            station=STATION.node_id,
            now_ms=later,
        )


def test_the_gate_lets_a_link_carry_a_realm_only_with_its_station_endorsement() -> None:
    gate = RealmGate.protecting(PROTECTED.values())
    # a claim (CONNECT/HELLO realms) is not an endorsement: nothing presented, nothing carried
    assert gate.present_station(1, STATION.node_id, [], NOW) == {"accepted": [], "refused": []}
    assert gate.present_station(1, STATION.node_id, "not a list", NOW)["accepted"] == []
    assert not gate.allows(1, True, REALM, NOW)
    assert gate.allows(1, True, realm_tag("org.example.open"), NOW)  # unprotected: as before
    # a member endorsement does not make a station; one for another key neither
    answer = gate.present_station(1, STATION.node_id, [station_record(role="member")], NOW)
    assert [r["reason"] for r in answer["refused"]] == ["not_a_station"]
    answer = gate.present_station(1, STATION.node_id, [station_record(signer=OTHER)], NOW)
    assert [r["reason"] for r in answer["refused"]] == ["wrong_authority"]
    assert not gate.allows(1, True, REALM, NOW)
    answer = gate.present_station(1, STATION.node_id, [station_record()], NOW)
    assert [a["realm"] for a in answer["accepted"]] == [REALM]
    assert gate.allows(1, True, REALM, NOW) and gate.endorsed_realms(1, NOW) == {REALM}
    assert not gate.allows(1, False, REALM, NOW)  # as a client connection it is no member
    assert not gate.allows(2, True, REALM, NOW)  # per link, not per node
    key = member_endorsement_key(REALM, STATION.node_id)
    assert key in gate.lookup_keys()  # where its revocation would be stored
    # a revocation learned: refused at once, ended by the sweep
    revocation = build_endorsement(
        AUTHORITY,
        NAME,
        STATION.node_id,
        role="member",
        valid_until=NOW + DAY,
        now_ms=NOW,
        random10=os.urandom(10),
    )  # a newer member record is not a revocation
    assert not gate.learn(revocation, NOW + 1)
    assert gate.learn(
        build_revocation(AUTHORITY, NAME, STATION.node_id, now_ms=NOW + 1, random10=os.urandom(10)),
        NOW + 1,
    )
    assert not gate.allows(1, True, REALM, NOW + 1)
    assert gate.sweep(NOW + 1) == [(1, REALM)]
    assert gate.endorsed_realms(1, NOW + 1) == frozenset()


def test_a_station_checks_its_own_endorsements_at_start() -> None:
    record = load_record(station_record())
    presented = own_station_endorsements([record], STATION.node_id, PROTECTED, NOW)
    assert presented == [record.to_rpc()]
    problems = {
        "other_node": (load_record(station_record()), Identity.generate(os.urandom).node_id),
        "not_a_station": (load_record(station_record(role="member")), STATION.node_id),
        "wrong_authority": (load_record(station_record(signer=OTHER)), STATION.node_id),
    }
    for reason, (bad, node) in problems.items():
        with pytest.raises(ValueError, match=reason):
            own_station_endorsements([bad], node, PROTECTED, NOW)
    with pytest.raises(ValueError, match="realm_not_protected"):
        own_station_endorsements([record], STATION.node_id, {}, NOW)


def load_record(raw: dict[str, object]) -> Record:
    return Record.from_rpc(raw)


def test_macula_realm_endorse_station_and_the_relay_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "owner"

    def realm(*args: str) -> tuple[int, dict[str, object]]:
        code = realm_main(["--home", str(home), "--json", *args])
        return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    code, created = realm("create", NAME)
    assert code == 0
    authority = str(created["authority"])
    out = tmp_path / "a.endorsement"
    code, done = realm("endorse-station", STATION.node_id.hex(), "--out", str(out))
    assert code == 0 and done["role"] == "station" and done["file"] == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    record = load_station_endorsement(out)
    protected = {REALM: ProtectedRealm(NAME, REALM, bytes.fromhex(authority))}
    assert own_station_endorsements([record], STATION.node_id, protected, record.created_at)
    code, listed = realm("members")
    rows = listed["members"]
    assert code == 0 and isinstance(rows, list)
    assert [(m["node"], m["role"]) for m in rows] == [(STATION.node_id.hex(), "station")]
    code, bad = realm("endorse-station", "zz")
    assert code == 2 and bad["code"] == "bad_node_id"
    # the station takes the file (a bad one stops it before it starts)
    flags = ["--data-dir", str(tmp_path / "s"), "--realm", f"{NAME}={authority}"]
    config = config_from_args(build_parser().parse_args([*flags, "--realm-endorsement", str(out)]))
    assert config.station_endorsements == [record]
    junk = tmp_path / "junk"
    junk.write_bytes(b"\xff\x00")
    with pytest.raises(SystemExit, match="--realm-endorsement"):
        config_from_args(build_parser().parse_args([*flags, "--realm-endorsement", str(junk)]))
    # revoking the station: a revocation record for serve to publish
    code, revoked = realm("revoke", STATION.node_id.hex())
    assert code == 0 and revoked["status"] == "revoked"


def test_a_station_presents_its_endorsements_in_connect_and_in_hello_to_stations() -> None:
    frames = StationFrames(STATION, os.urandom, endorsements=[station_record()])

    def parsed(data: bytes) -> Connect | Hello:
        maps = FrameDecoder().feed(data)
        assert len(maps) == 1
        frame = parse_frame(maps[0])
        assert isinstance(frame, (Connect, Hello)) and frame.verifies(STATION.node_id)
        return frame

    connect = parsed(frames.connect(0, NOW))
    assert isinstance(connect, Connect) and connect.endorsements == frames.endorsements
    to_station = parsed(frames.hello(True, None, NOW, to_station=True))
    assert to_station.extras["endorsements"] == frames.endorsements  # signed with the rest
    assert "endorsements" not in parsed(frames.hello(True, None, NOW)).extras  # to a client
    assert "endorsements" not in parsed(frames.hello(False, 16, NOW, to_station=True)).extras


def test_a_link_vouches_only_for_members_of_realms_it_may_carry_and_within_bounds() -> None:
    gate = RealmGate.protecting(PROTECTED.values(), max_vouched=2)
    members = [Identity.generate(os.urandom).node_id for _ in range(3)]
    records = [station_record(m, role="member") for m in members]
    answer = gate.take_vouches(1, records[:1], NOW)  # the link is not endorsed for R
    assert answer == {"kept": 0, "refused": [{"index": 0, "reason": "realm_not_protected"}]}
    gate.present_station(1, STATION.node_id, [station_record()], NOW)
    answer = gate.take_vouches(1, [*records, {"payload": {}}, "junk"], NOW)
    reasons = [r["reason"] for r in answer["refused"]]
    assert answer["kept"] == 2 and reasons == ["too_many", "bad_payload", "bad_payload"]
    assert gate.vouched_for(1, REALM, members[0], NOW)
    assert not gate.vouched_for(1, REALM, members[2], NOW)  # over the bound: not kept
    assert not gate.vouched_for(2, REALM, members[0], NOW)  # per link
    assert gate.take_vouches(1, "not a list", NOW) == {"kept": 0, "refused": []}
    over = gate.take_vouches(1, [records[0]] * 65, NOW)  # a vouch carries at most 64
    assert over["kept"] == 64 and over["refused"] == [{"index": 64, "reason": "too_many"}]
    revocation = build_revocation(
        AUTHORITY, NAME, members[0], now_ms=NOW + 1, random10=os.urandom(10)
    )
    assert gate.learn(revocation, NOW + 1)
    assert not gate.vouched_for(1, REALM, members[0], NOW + 1)  # at once
    gate.sweep(NOW + 1)
    assert (REALM, members[0]) not in gate.vouched[1]
    gate.forget(1)
    assert not gate.vouched_for(1, REALM, members[1], NOW + 1)


def test_memberships_accepted_here_wait_to_be_vouched_for_on_the_links() -> None:
    gate = RealmGate.protecting(PROTECTED.values())
    member = Identity.generate(os.urandom).node_id
    gate.present(7, member, [station_record(member, role="member")], NOW)
    fresh = gate.drain_vouches()
    assert [e.member for e in fresh] == [member] and gate.drain_vouches() == []
    assert [e.member for e in gate.local_members(REALM)] == [member]
    gate.present_station(8, STATION.node_id, [station_record()], NOW)
    assert gate.drain_vouches() == []  # a station's endorsement is not a member to vouch for


def test_macula_relay_refuses_to_start_with_an_endorsement_of_another_station(
    tmp_path: Path,
) -> None:
    """A real ``macula-relay`` process: the endorsement is for another node, so it exits 1
    with the reason on stderr (no traceback) instead of starting a station no peer accepts."""
    record = load_record(station_record())  # for STATION, not for this data dir's key
    path = tmp_path / "x.endorsement"
    path.write_bytes(cbor.encode(record.to_rpc()))
    command = [sys.executable, "-m", "relay.ops.cli", "--port", "0", "--dht-port", "0"]
    command += ["--data-dir", str(tmp_path / "s"), "--realm", f"{NAME}={AUTHORITY.node_id.hex()}"]
    done = subprocess.run(
        [*command, "--realm-endorsement", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "--realm-endorsement refused: other_node" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
