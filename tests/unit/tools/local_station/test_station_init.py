"""``macula-mcp station init``: the pinned id it prints is the key ``macula-relay`` will use from
that data dir, made once and read after; the station line parses; bad hosts and ports are
refused naming the flag."""

from __future__ import annotations

import io
import json
import shlex
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from macula.config import configured_stations
from macula.known_stations import station_node_id
from tools.local_station.public_init import plan


def test_the_key_is_made_once_and_the_line_pins_it(tmp_path: Path) -> None:
    data = tmp_path / "station"
    first = plan("vps.example.org", 5000, "0.0.0.0", data, {"MACULA_HOME": str(tmp_path)})
    again = plan("vps.example.org", 5000, "0.0.0.0", data, {"MACULA_HOME": str(tmp_path)})
    assert (first.made, again.made) == (1, 0)
    assert first.node_id == again.node_id == station_node_id(data).hex()  # type: ignore[union-attr]
    assert (data.stat().st_mode & 0o777, first.key_file.stat().st_mode & 0o777) == (0o700, 0o600)
    name, value = first.stations_line.split("=", 1)
    (station,) = configured_stations({name: value})
    assert (station.host, station.port, station.node_id) == (
        "vps.example.org",
        5000,
        bytes.fromhex(first.node_id),
    )
    assert first.relay_command[1:] == shlex.split(
        f"--host 0.0.0.0 --port 5000 --advertise-host vps.example.org --data-dir {data}"
    )


def test_the_default_data_dir_is_macula_relays(tmp_path: Path) -> None:
    made = plan("10.0.0.5", 4433, "0.0.0.0", None, {"MACULA_HOME": str(tmp_path)})
    assert made.key_file == tmp_path / "station" / "station.key"
    assert made.stations_line.endswith("@10.0.0.5:4433")


def test_an_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    made = plan("2001:db8::1", 4433, "::", tmp_path / "s", {})
    assert made.stations_line.endswith("@[2001:db8::1]:4433")
    assert "2001:db8::1" in made.relay_command


@pytest.mark.parametrize(
    ("public", "port", "named"),
    [("0.0.0.0", 4433, "--public"), ("::", 4433, "--public"), ("h", 0, "--port"),
     ("h", 70000, "--port"), ("bad host", 4433, "--public"), ("a@b", 4433, "--public")],
)  # fmt: skip
def test_bad_arguments_are_refused_naming_them(
    tmp_path: Path, public: str, port: int, named: str
) -> None:
    from macula.errors import ConfigError

    with pytest.raises(ConfigError, match=named):
        plan(public, port, "0.0.0.0", tmp_path / "s", {})


def test_the_command_prints_the_three_steps_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.local_station.command import main

    monkeypatch.setenv("MACULA_HOME", str(tmp_path))
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(["init", "--public", "vps.example.org"])
    assert done.value.code == 0
    text = out.getvalue()
    assert "--advertise-host vps.example.org" in text and "UDP port 4433" in text
    assert "export MACULA_MESH_STATIONS=" in text and "register --attach" in text
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        main(["init", "--public", "vps.example.org", "--json"])
    view = json.loads(out.getvalue())
    assert view["key_made"] == 0 and view["node_id"] in text
