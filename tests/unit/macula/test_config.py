"""``macula.config``: one MACULA_HOME, one default identity for the library and macula-mcp."""

from __future__ import annotations

from pathlib import Path

import pytest

from macula.config import identity_from_env, identity_path, macula_home, mesh_stations_from_env
from macula.errors import ConfigError
from macula.node.node import Node
from macula.store.base import paths_from_env
from relay.ops.cli import build_parser, config_from_args
from tools.server.runtime import preflight


def test_macula_home_is_resolved_and_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert macula_home({}) == tmp_path / ".macula"
    monkeypatch.chdir(tmp_path)
    assert macula_home({"MACULA_HOME": "rel"}) == tmp_path / "rel"  # absolute, chdir-proof
    for bad in ("", "  ", "a\x00b"):
        with pytest.raises(ConfigError, match=r"^MACULA_HOME"):
            macula_home({"MACULA_HOME": bad})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"MACULA_HOME: .* not a directory"):
        macula_home({"MACULA_HOME": str(tmp_path / "file")})
    assert paths_from_env({"MACULA_HOME": "rel"}).roster.parent == macula_home(
        {"MACULA_HOME": "rel"}
    )


def test_the_station_cli_defaults_under_macula_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MACULA_HOME", str(tmp_path / "home"))
    args = build_parser().parse_args([])
    assert config_from_args(args).data_dir == tmp_path / "home" / "station"
    monkeypatch.setenv("MACULA_HOME", "")
    with pytest.raises(SystemExit, match="MACULA_HOME"):
        config_from_args(build_parser().parse_args([]))
    given = build_parser().parse_args(["--data-dir", str(tmp_path / "d")])
    assert config_from_args(given).data_dir == tmp_path / "d"


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"CLAUDE_CODE_SESSION_ID": "s-1"},
        {"MACULA_MCP_AGENT": "ada"},
        {"MACULA_MCP_IDENTITY": "keys/own.key"},
        {"MACULA_MCP_AGENT": "ada", "MACULA_MCP_IDENTITY": "keys/own.key"},
    ],
)
def test_node_from_env_and_macula_mcp_are_the_same_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, str]
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"MACULA_HOME": str(tmp_path / "home")} | extra
    node = Node.from_env(env | {"MACULA_MESH_STATIONS": "127.0.0.1:4433"})
    assert preflight(env).node_id == node.identity.node_id
    assert identity_path(env).exists()
    assert identity_from_env(env).node_id == node.identity.node_id


def test_identity_settings_fail_naming_their_variable(tmp_path: Path) -> None:
    home = {"MACULA_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"^MACULA_MCP_IDENTITY is set but empty"):
        identity_path(home | {"MACULA_MCP_IDENTITY": " "})
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "bad.key").write_bytes(b"junk")
    (tmp_path / "agents" / "bad.key").chmod(0o600)
    with pytest.raises(ConfigError, match=r"^MACULA_MCP_AGENT: key file .* not a Macula v2"):
        identity_from_env(home | {"MACULA_MCP_AGENT": "bad"})
    with pytest.raises(ConfigError, match=r"^MACULA_MESH_STATIONS is empty"):
        mesh_stations_from_env(home)
    assert [s.port for s in mesh_stations_from_env({"MACULA_MESH_STATIONS": "h:1,h:2"})] == [1, 2]


def test_the_slow_consumer_bound_is_an_operator_flag(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path / "d")]
    default = config_from_args(build_parser().parse_args(base))
    assert default.policy.quotas.max_outbound_bytes == 16 * 1024 * 1024
    given = build_parser().parse_args([*base, "--max-outbound-bytes", "65536"])
    assert config_from_args(given).policy.quotas.max_outbound_bytes == 65536
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--max-outbound-bytes", "0"])
