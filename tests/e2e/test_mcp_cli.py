"""``macula-mcp mcp-config`` and ``macula-mcp doctor`` as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from relay.station.station import Station, StationConfig
from support.mcpkit import cli as run


def test_mcp_config_prints_a_ready_entry(tmp_path: Path) -> None:
    done = run(["mcp-config"], dict(os.environ, MACULA_MESH_STATIONS="127.0.0.1:4433"))
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)["mcpServers"]["macula"]
    assert Path(entry["command"]).is_absolute()
    assert entry["env"]["MACULA_MESH_STATIONS"] == "127.0.0.1:4433"


def test_doctor_passes_against_a_live_station_and_names_the_failure_otherwise(
    tmp_path: Path,
) -> None:
    async def with_station() -> tuple[
        subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]
    ]:
        async with Station(StationConfig(data_dir=tmp_path / "station", port=0)) as station:
            env = dict(
                os.environ,
                MACULA_HOME=str(tmp_path / "home"),
                MACULA_MESH_STATIONS=station.endpoint,
                MACULA_MCP_IDENTITY=str(tmp_path / "home" / "id.key"),
                HOME=str(tmp_path / "user"),  # doctor also reads the harness configs there
                XDG_CONFIG_HOME=str(tmp_path / "user" / ".config"),
            )
            good = await asyncio.to_thread(run, ["doctor"], env)
            env["MACULA_MESH_STATIONS"] = "127.0.0.1:9"
            bad = await asyncio.to_thread(run, ["doctor"], env)
            return good, bad

    good, bad = asyncio.run(with_station())
    assert good.returncode == 0, good.stdout + good.stderr
    assert "all checks passed" in good.stdout and "MCP round trip" in good.stdout
    assert "first answer: " in good.stdout and "declined 2026-07-28" in good.stdout
    assert bad.returncode == 1
    assert "[FAIL] station 127.0.0.1:9" in bad.stdout
    assert "[warn] MCP round trip: not tried: no configured station is reachable" in bad.stdout


def test_bad_settings_fail_at_start_in_one_line_naming_the_variable(tmp_path: Path) -> None:
    bad_key = tmp_path / "bad.key"
    bad_key.write_bytes(b"junk")
    bad_key.chmod(0o600)
    home = str(tmp_path / "home")
    cases = {
        "MACULA_MCP_IDENTITY": {"MACULA_MCP_IDENTITY": str(bad_key)},
        "MACULA_MESH_STATIONS": {"MACULA_MESH_STATIONS": "host:0"},
        "MACULA_MCP_NO_RING": {"MACULA_MCP_NO_RING": "yes"},
    }
    for variable, extra in cases.items():
        env = dict(os.environ, MACULA_HOME=home, **extra)
        done = subprocess.run(
            [sys.executable, "-m", "tools.cli"],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert done.returncode == 2, (variable, done.stderr)
        assert done.stdout == ""  # stdout carries protocol only, and there was none
        [line] = done.stderr.strip().splitlines()
        assert variable in line and "Traceback" not in done.stderr
