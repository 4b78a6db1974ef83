"""``macula-mcp owner show|set|preset`` and ``doctor``'s owner check, in this process: what a
person reads, the exit codes, and bad input refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.doctor_checks import owner_check
from tools.owner.cli import main
from tools.owner.presets import ALL_TOOLS


def run(home: Path, *argv: str) -> int:
    return main(list(argv), {"MACULA_HOME": str(home)})


def test_set_preset_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, "set", "rpc", "0") == 0
    assert f"{len(ALL_TOOLS) - 3} tools on, 3 off" in capsys.readouterr().out
    assert run(tmp_path, "preset", "read-only", "--agent", "alice") == 0
    capsys.readouterr()
    assert run(tmp_path, "show", "--agent", "alice") == 0
    shown = capsys.readouterr().out
    assert "preset: read-only" in shown and "agent: alice" in shown
    assert "off mesh_say" in shown and "agents.alice.preset read-only" in shown
    assert run(tmp_path, "show", "--json") == 0
    view = json.loads(capsys.readouterr().out)
    assert view["off"]["mesh_call"] == "groups.rpc" and view["malformed"] == 0


def test_bad_input_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(tmp_path, "set", "mesh_nope", "0") == 2
    assert "no such tool or group" in capsys.readouterr().err
    assert run(tmp_path, "set", "rpc", "0", "--agent", "../x") == 2
    assert not (tmp_path / "owner.toml").exists()
    with pytest.raises(SystemExit):
        run(tmp_path, "set", "rpc", "2")  # argparse: 0 or 1
    with pytest.raises(SystemExit):
        run(tmp_path, "preset", "everything")


def test_a_malformed_file_is_named_by_show_and_doctor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "owner.toml"
    path.write_text("[groups]\nrpc = 0\nnope = 1\n")
    assert run(tmp_path, "show") == 1
    out, err = capsys.readouterr()
    assert f"MALFORMED: {path}:3: key groups.nope" in out and "groups.nope" in err
    name, passed, detail = owner_check({"MACULA_HOME": str(tmp_path)})
    assert (name, passed) == ("owner switches", False)
    assert f"{path}:3: key groups.nope" in detail and "every switchable tool is off" in detail
    path.write_text('preset = "talk"\n')
    assert owner_check({"MACULA_HOME": str(tmp_path)})[1] is True
    path.unlink()
    assert "every tool on" in owner_check({"MACULA_HOME": str(tmp_path)})[2]
