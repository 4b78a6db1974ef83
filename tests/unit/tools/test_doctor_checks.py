"""``doctor``'s first-contact checks: what it says, and the fix it names, for each problem it
can find (the era without channels, a slow first answer, stale local station files)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools.doctor_checks import _judge, first_answer_check, local_station_check
from tools.local_station.station import StationFiles
from tools.settings import home_port

DECLINED = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "x"}}
MODERN = {"jsonrpc": "2.0", "id": 1, "result": {"supportedVersions": ["2026-07-28"]}}


def test_an_era_without_channels_while_push_is_on_fails_naming_the_fix(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    name, passed, detail = _judge(env, MODERN, 0.2)
    assert (name, passed) == ("first answer", False) and "drops claude/channel" in detail
    assert _judge({**env, "MACULA_MCP_CHANNEL": "0"}, MODERN, 0.2)[1] is True
    assert _judge(env, DECLINED, 0.2)[1] is True


def test_a_slow_first_answer_is_a_warning_that_says_what_happens(tmp_path: Path) -> None:
    _, passed, detail = _judge({"MACULA_HOME": str(tmp_path)}, DECLINED, 2.5)
    assert passed is None and "2.50 s" in detail and "restarts the server" in detail


def test_a_server_that_does_not_answer_fails(tmp_path: Path) -> None:
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    _, passed, detail = first_answer_check({"MACULA_HOME": str(tmp_path)}, silent, 0.5)
    assert passed is False and "no answer" in detail


def test_the_local_station_state_is_told_with_its_fix(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    _, passed, detail = local_station_check(env)
    assert passed is True and f"127.0.0.1:{home_port(tmp_path)} (this home's own port)" in detail
    files = StationFiles(tmp_path)
    files.data_dir.mkdir(parents=True)
    files.pid.write_text("not a pid\n")
    files.endpoint.write_text("x\n")
    _, passed, detail = local_station_check(env)
    assert passed is None and "macula-mcp station stop" in detail


def test_settings_fail_naming_the_variable_and_a_bad_contact_policy_fails_closed(
    tmp_path: Path,
) -> None:
    from tools.doctor_checks import settings_checks

    env = {"MACULA_HOME": str(tmp_path), "MACULA_MCP_AGENT": "ada"}
    assert settings_checks(env) == [
        ("settings", True, "every MACULA_* value the server reads is valid")
    ]
    [check] = settings_checks({**env, "MACULA_MCP_CHANNEL_BURST": "abc"})
    assert check[:2] == ("settings", False) and "MACULA_MCP_CHANNEL_BURST" in check[2]
    assert "invalid literal" not in check[2]
    policy = settings_checks({**env, "MACULA_MCP_CONTACT_POLICY": "yes-please"})
    assert policy[1][:2] == ("contact policy", False)
    assert "MACULA_MCP_CONTACT_POLICY" in policy[1][2] and "closed" in policy[1][2]


@pytest.mark.anyio
async def test_configuration_names_this_homes_own_station_or_the_bad_variable(
    tmp_path: Path,
) -> None:
    from tools.doctor_checks import configuration_check

    env = {"MACULA_HOME": str(tmp_path)}
    (name, passed, detail), probed = await configuration_check(env)
    assert (name, passed) == ("configuration", True)
    assert f"127.0.0.1:{home_port(tmp_path)}" in detail and "this home's own station" in detail
    assert [str(station) for station in probed] == ["127.0.0.1:4433"]  # one run by hand
    (_, passed, detail), probed = await configuration_check(
        {**env, "MACULA_MESH_STATIONS": "nonsense.invalid"}
    )
    assert passed is False and "MACULA_MESH_STATIONS" in detail and probed == []
    (_, passed, detail), _ = await configuration_check({**env, "MACULA_MESH_STATIONS": "a:b:c"})
    assert passed is False and detail.startswith("MACULA_MESH_STATIONS")
