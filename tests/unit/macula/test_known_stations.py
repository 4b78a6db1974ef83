"""``macula.known_stations``: the file of stations pinned on first use, and a data dir's key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from macula.config import known_stations_from_env
from macula.errors import HandshakeError
from macula.keyfile import save_identity
from macula.known_stations import KnownStations, KnownStationsError, station_node_id
from macula.stations import StationAddress, parse_station
from macula.wire.identity import Identity

KEY_A = bytes([0xA1]) * 32
KEY_B = bytes([0xB2]) * 32


def test_first_use_records_then_pins(tmp_path: Path) -> None:
    known = KnownStations(tmp_path / "home" / "known_stations")
    address = parse_station("Station.Example:4433")
    assert known.pin(address) == address  # nothing recorded: dialled unpinned
    known.record(address, KEY_A, KEY_A)
    assert known.path.read_text() == f"station.example:4433 {KEY_A.hex()}\n"
    assert stat.S_IMODE(known.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(known.path.parent.stat().st_mode) == 0o700
    assert known.pin(address) == StationAddress("Station.Example", 4433, KEY_A)
    known.record(address, KEY_A, KEY_A)  # the same key again: nothing appended
    assert len(known.path.read_text().splitlines()) == 1
    other = parse_station("[::1]:5000")
    known.record(other, KEY_B, KEY_B)
    assert known.load() == {"station.example:4433": KEY_A, "[::1]:5000": KEY_B}
    pinned = parse_station(f"{KEY_B.hex()}@station.example:4433")
    assert known.pin(pinned) is pinned  # an explicit pin wins, and is never recorded
    known.record(pinned, KEY_B, KEY_B)
    assert known.load()["station.example:4433"] == KEY_A


def test_a_changed_key_is_refused_saying_how_to_accept_it(tmp_path: Path) -> None:
    known = known_stations_from_env({"MACULA_HOME": str(tmp_path)})  # pins in the variable
    address = parse_station("10.0.0.1:4433")
    known.record(address, KEY_A, KEY_A)
    dialled = known.pin(address)
    mismatch = HandshakeError(
        f"station {dialled} presented certificate key {KEY_B.hex()}, expected {KEY_A.hex()}",
        retryable=False,
    )
    refused = known.refused(address, dialled, mismatch)
    assert isinstance(refused, KnownStationsError) and not refused.retryable
    text = str(refused)
    assert KEY_A.hex() in text and KEY_B.hex() in text
    assert f"remove the line for 10.0.0.1:4433 from {known.path}" in text
    assert "node_id@10.0.0.1:4433 in MACULA_MESH_STATIONS" in text
    # a station's own refusal, a retryable failure, or an unpinned dial stay what they were
    refusal = HandshakeError("refused", 0x03, retryable=False)
    assert known.refused(address, dialled, refusal) is refusal
    transient = HandshakeError("no hello")
    assert known.refused(address, dialled, transient) is transient
    assert known.refused(address, address, mismatch) is mismatch
    # another process recorded another key meanwhile: refused, not overwritten
    with pytest.raises(KnownStationsError, match="remove the line"):
        known.record(address, KEY_B, KEY_B)
    assert known.load() == {"10.0.0.1:4433": KEY_A}


def test_a_certificate_that_disagrees_with_the_hello_is_not_recorded(tmp_path: Path) -> None:
    known = KnownStations(tmp_path / "known_stations")
    with pytest.raises(KnownStationsError, match="certificate key"):
        known.record(parse_station("h:1"), KEY_A, KEY_B)
    with pytest.raises(KnownStationsError, match="certificate key none"):
        known.record(parse_station("h:1"), KEY_A, None)
    assert not known.path.exists()


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("h:1", "expected 'host:port node_id_hex'"),
        (f"h:1 {KEY_A.hex()} extra", "expected 'host:port node_id_hex'"),
        (f"h:1 {KEY_A.hex()[:-2]}", "not 64 hex"),
        ("h:1 zz", "non-hexadecimal|expected"),
        (f"h:99999 {KEY_A.hex()}", "port must be 1..65535"),
        (f"{KEY_A.hex()}@h:1 {KEY_A.hex()}", "has a node id"),
        (f"h:1 {KEY_A.hex()}\nH:1 {KEY_B.hex()}", "listed again with another key"),
    ],
)
def test_malformed_lines_are_reported_with_file_and_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "known_stations"
    path.write_text(f"# pinned stations\n\n{line}\n")
    os.chmod(path, 0o600)
    known = KnownStations(path)
    with pytest.raises(KnownStationsError, match=f"{path} line [34]: .*({problem})") as caught:
        known.pin(parse_station("h:1"))
    assert not caught.value.retryable


def test_a_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "known_stations"
    path.write_text(f"h:1 {KEY_A.hex()}\n")
    os.chmod(path, 0o622)
    with pytest.raises(KnownStationsError, match=r"writable by others.*chmod 600"):
        KnownStations(path).load()
    os.chmod(path, 0o644)  # readable by others is fine: it holds public keys only
    assert KnownStations(path).load() == {"h:1": KEY_A}


def test_the_environment_places_the_file_under_macula_home(tmp_path: Path) -> None:
    known = known_stations_from_env({"MACULA_HOME": str(tmp_path)})
    assert known.path == tmp_path / "known_stations"


def test_a_station_data_dir_gives_its_node_id_from_the_public_part(tmp_path: Path) -> None:
    assert station_node_id(tmp_path / "none") is None
    identity = Identity(bytes(range(32)))
    save_identity(tmp_path / "station" / "station.key", identity)
    assert station_node_id(tmp_path / "station") == identity.node_id
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "station.key").write_bytes(b"junk")
    with pytest.raises(KnownStationsError, match="not a Macula v2 key file"):
        station_node_id(tmp_path / "broken")
