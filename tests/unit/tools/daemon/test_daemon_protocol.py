"""The attach preamble and the daemon's reply: good lines parse, every bad one says why."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from macula.config import AGENT_ENV, IDENTITY_ENV, identity_path, macula_home
from tools.daemon import protocol
from tools.daemon.hosts import IdleClock, differing
from tools.daemon.server import session_env
from tools.settings import DAEMON_IDLE_ENV as IDLE_ENV
from tools.settings import DaemonSettingError, DaemonSettings, SocketSetupError, home_dir


def line(**body: object) -> bytes:
    return json.dumps(body).encode() + b"\n"


def test_a_preamble_round_trips_with_only_forwarded_variables() -> None:
    env = {
        "MACULA_MCP_AGENT": "ada",
        "CLAUDE_CODE_SESSION_ID": "s1",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    parsed = protocol.parse_preamble(protocol.encode_preamble("attach", env, 42))
    assert parsed == protocol.Preamble(
        "attach", protocol.VERSION, 42, {"MACULA_MCP_AGENT": "ada", "CLAUDE_CODE_SESSION_ID": "s1"}
    )


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"not json\n", "not JSON"),
        (b"[1, 2]\n", "not a JSON object"),
        (b"\xff\xfe\n", "not JSON"),
        (line(macula="dance", version="1", ppid=1, env={}), "'macula' must be one of"),
        (line(macula="attach", version="", ppid=1, env={}), "'version'"),
        (line(macula="attach", version=7, ppid=1, env={}), "'version'"),
        (line(macula="attach", version="1", ppid=-1, env={}), "'ppid'"),
        (line(macula="attach", version="1", ppid=True, env={}), "'ppid'"),
        (line(macula="attach", version="1", ppid=1, env=[]), "'env'"),
        (line(macula="attach", version="1", ppid=1, env={"MACULA_X": 1}), "not a string"),
        (line(macula="attach", version="1", ppid=1, env={"PATH": "/bin"}), "not a variable"),
        (line(macula="attach", version="1", ppid=1, env={"MACULA_X": "a\x00b"}), "NUL"),
        (b"{" + b" " * protocol.MAX_PREAMBLE + b"}", "longer than"),
    ],
)
def test_a_bad_preamble_is_refused_naming_the_fault(raw: bytes, says: str) -> None:
    with pytest.raises(protocol.PreambleError, match=says):
        protocol.parse_preamble(raw)


def test_replies_parse_and_a_refusal_needs_its_detail() -> None:
    assert protocol.parse_reply(protocol.encode_reply({"ok": 1, "pid": 3}))["pid"] == 3
    refused = protocol.parse_reply(protocol.encode_reply({"ok": 0, "detail": "no"}))
    assert refused["detail"] == "no"
    for bad in (b'{"ok": 0}', b'{"ok": true}', b'{"pid": 1}', b"[]", b"nope"):
        with pytest.raises(protocol.PreambleError):
            protocol.parse_reply(bad)


def test_the_version_mismatch_message_names_both_versions_and_the_way_out() -> None:
    detail = protocol.mismatch_detail("0.0.9+daemon1", protocol.VERSION, "/h/daemon/mcp.sock")
    assert "0.0.9+daemon1" in detail and protocol.VERSION in detail
    assert "/h/daemon/mcp.sock" in detail and "macula-mcp daemon stop" in detail
    assert "\n" not in detail


def test_the_version_is_the_package_version() -> None:
    assert importlib.metadata.version("macula-mesh") == protocol.PACKAGE_VERSION


@pytest.mark.parametrize("raw", [None, "/tmp/h", "~/elsewhere", "rel/home"])
def test_the_light_home_agrees_with_the_library(raw: str | None) -> None:
    env = {} if raw is None else {"MACULA_HOME": raw}
    assert home_dir(env) == macula_home(env)


@pytest.mark.parametrize("raw", ["", "  ", "a\x00b"])
def test_a_bad_home_is_an_error(raw: str) -> None:
    with pytest.raises(SocketSetupError, match="MACULA_HOME"):
        home_dir({"MACULA_HOME": raw})


def test_the_session_identity_is_the_one_plain_macula_mcp_would_use(tmp_path: Path) -> None:
    home = tmp_path / "h"
    mine = {"MACULA_HOME": str(home)}
    by_harness = session_env(protocol.Preamble("attach", "v", 777, mine), home)
    assert by_harness[IDENTITY_ENV] == str(home / "sessions" / "ppid-777.key")
    named = {"MACULA_HOME": str(home), AGENT_ENV: "ada"}
    by_name = session_env(protocol.Preamble("attach", "v", 777, named), home)
    assert identity_path(by_name) == home / "agents" / "ada.key"
    assert IDENTITY_ENV not in by_name
    session = mine | {"CLAUDE_CODE_SESSION_ID": "abc"}
    by_session = session_env(protocol.Preamble("attach", "v", 777, session), home)
    assert identity_path(by_session) == home / "sessions" / "abc.key"


def test_a_session_of_another_home_is_refused(tmp_path: Path) -> None:
    other = {"MACULA_HOME": str(tmp_path / "other")}
    with pytest.raises(Exception, match="MACULA_HOME"):
        session_env(protocol.Preamble("attach", "v", 1, other), tmp_path / "h")


def test_idle_clock_expires_runtimes_then_the_daemon() -> None:
    idle = IdleClock(timeout=10.0, now=0.0)
    assert not idle.daemon_expired(9.9, hosted=0, sessions=0)
    assert idle.daemon_expired(10.0, hosted=0, sessions=0)
    idle.attached("a", 1.0)
    idle.attached("b", 1.0)
    idle.detached("a", 2.0, sessions_left=1)  # another session of a remains: not idle
    assert idle.expired(100.0) == []
    idle.detached("a", 3.0, sessions_left=0)
    idle.detached("b", 5.0, sessions_left=0)
    assert idle.expired(12.9) == []
    assert idle.expired(13.0) == ["a"]
    idle.forget("a")
    assert idle.expired(15.0) == ["b"]
    idle.attached("b", 15.0)  # a new session of b: idle no more
    assert idle.expired(100.0) == []
    assert not idle.daemon_expired(100.0, hosted=1, sessions=0)
    assert not idle.daemon_expired(100.0, hosted=0, sessions=1)
    assert idle.daemon_expired(25.0, hosted=0, sessions=0)


def test_settings_that_shape_a_runtime_must_agree_but_session_ones_may_differ() -> None:
    base = {"MACULA_MESH_STATIONS": "a:1", "MACULA_MCP_AGENT": "ada", "CLAUDE_CODE_SESSION_ID": "1"}
    same = base | {"MACULA_MCP_TERSE_TOOLS": "1", "CLAUDE_CODE_SESSION_ID": "2"}
    assert differing(base, same | {"MACULA_MCP_IDENTITY": "/k", "MACULA_MCP_SOCKET": "/s"}) == []
    other = base | {"MACULA_MESH_STATIONS": "b:2", "MACULA_MCP_CONTACT_POLICY": "open"}
    assert differing(base, other) == ["MACULA_MCP_CONTACT_POLICY", "MACULA_MESH_STATIONS"]


def test_attach_and_the_daemon_cli_import_neither_the_sdk_nor_the_mesh_library() -> None:
    code = (
        "import sys, tools.entry, tools.daemon.attach, tools.daemon.command;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('mcp', 'mcp_types', 'macula', 'relay', 'aioquic', 'asyncio', 'pydantic', 'nacl')"
        " and m not in ('macula', 'macula.help_format')];"  # the --help layout: argparse only
        "print(','.join(heavy))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == ""


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        (IDLE_ENV, "0"),
        (IDLE_ENV, "soon"),
        (IDLE_ENV, "-5"),
        ("MACULA_MCP_DAEMON_MAX_LINE", "10"),
        ("MACULA_MCP_DAEMON_LOG_BYTES", "1e20"),
        ("MACULA_MCP_DAEMON_LOG_FILES", "0"),
    ],
)
def test_a_bad_daemon_setting_names_itself(name: str, raw: str) -> None:
    with pytest.raises(DaemonSettingError, match=name):
        DaemonSettings.from_env({"MACULA_HOME": "/h", name: raw})


def test_daemon_settings_have_defaults() -> None:
    settings = DaemonSettings.from_env({"MACULA_HOME": "/h"})
    assert settings.idle_timeout == 24 * 3600
    assert settings.log_file == Path("/h/logs/daemon.log")
    assert settings.log_bytes > 0 and settings.log_files > 0 and settings.max_line > 4096
    assert DaemonSettings.from_env({"MACULA_HOME": "/h", IDLE_ENV: "1.5"}).idle_timeout == 1.5
