"""Codex CLI's ``config.toml`` through ``register`` / ``uninstall``: the TOML cases the shared
per-harness tests (``test_register.py``) do not reach. Temporary HOME; the real one is never
read or written."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomlkit
from hypothesis import given, settings
from hypothesis import strategies as st

from support.registerkit import EXISTING, MACULA, everything_beside, options, place, text_of
from tools.harness.config_formats import ConfigParseError, TomlFormat
from tools.harness.harnesses import BY_NAME, ENTRY_NAME
from tools.harness.register import (
    Options,
    backups,
    register_one,
    registration_checks,
    uninstall_one,
)

CODEX = BY_NAME["codex"]
TOML = TomlFormat(("mcp_servers",))
STATIONS = "ab12@127.0.0.1:4433"


def test_a_fresh_file_is_one_table_codex_reads_as_its_own() -> None:
    text = TOML.with_entry(None, ENTRY_NAME, CODEX.build([MACULA], {"MACULA_MESH_STATIONS": "x"}))
    assert text == (
        "[mcp_servers.macula]\n"
        'command = "/opt/macula/bin/macula-mcp"\n'
        "args = []\n"
        'env = {MACULA_MESH_STATIONS = "x"}\n'
    )
    assert tomllib.loads(text) == {
        "mcp_servers": {
            ENTRY_NAME: {"command": MACULA, "args": [], "env": {"MACULA_MESH_STATIONS": "x"}}
        }
    }


def test_comments_other_servers_and_later_tables_stay(tmp_path: Path) -> None:
    opts = options(tmp_path)
    original = EXISTING["codex"]
    path = place(CODEX, opts, original)
    assert register_one(CODEX, [MACULA, "attach"], opts).status == "registered"
    written = text_of(path)
    assert written.startswith(original)  # every byte before stays, comments included
    assert written[len(original) :].startswith("\n[mcp_servers.macula]\n")
    data = tomllib.loads(written)
    assert data["mcp_servers"]["github"]["env"] == {"GITHUB_HOST": "github.example"}
    assert data["profiles"] == {"fast": {"model": "o4-mini"}}
    assert data["mcp_servers"][ENTRY_NAME] == {"command": MACULA, "args": ["attach"]}
    assert uninstall_one(CODEX, opts).status == "removed"
    assert text_of(path) == original


@pytest.mark.parametrize(
    "original",
    ["", "\n", "# nothing yet\n", 'model = "o3"', 'model = "o3"\n\n', "[mcp_servers]\n"],
)
def test_uninstall_without_a_backup_takes_the_table_back_off(original: str) -> None:
    entry = CODEX.build([MACULA], {"MACULA_MESH_STATIONS": STATIONS})
    written = TOML.with_entry(original, ENTRY_NAME, entry)
    assert TOML.read_entry(written, ENTRY_NAME) == entry
    assert TOML.with_entry(written, ENTRY_NAME, entry) == written  # idempotent, byte for byte
    back = TOML.without_entry(written, ENTRY_NAME)
    if original == 'model = "o3"':  # "x" and "x\n" give the same text: the newline stays
        assert back == original + "\n"
    else:
        assert back == original


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mcp_servers = 3\n", "mcp_servers is not a table"),
        ('mcp_servers = { gh = { command = "npx" } }\n', "cannot add a [mcp_servers.macula]"),
        ('model = "o3"\nmodel = "o4"\n', "not valid TOML"),
        ('[mcp_servers.gh]\ncommand = "npx\n', "line 2"),
    ],
)
def test_a_file_register_cannot_extend_is_left_untouched(
    text: str, message: str, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    path = place(CODEX, opts, text)
    outcome = register_one(CODEX, [MACULA], opts)
    assert outcome.failed and message in outcome.detail and "left untouched" in outcome.detail
    assert everything_beside(path) == {path.name: text.encode()}


def test_a_hand_written_entry_is_taken_out_keeping_everything_else(tmp_path: Path) -> None:
    opts = options(tmp_path)
    original = (
        "# mine\n"
        "[mcp_servers.macula]  # my own\n"
        'command = "/home/me/macula-mcp"\n'
        "[mcp_servers.macula.env]\n"
        'MACULA_MCP_AGENT = "alice"\n'
        "\n"
        "[mcp_servers.github]\n"
        'command = "npx"\n'
        "\n"
        "[profiles.fast]  # quick\n"
        'model = "o4-mini"\n'
    )
    path = place(CODEX, opts, original)
    assert register_one(CODEX, [MACULA], opts).status == "kept"
    forced = Options(opts.env, opts.platform, force=True, now=opts.now)
    assert register_one(CODEX, [MACULA], forced).status == "registered"
    data = tomllib.loads(text_of(path))
    assert data["mcp_servers"][ENTRY_NAME] == {"command": MACULA, "args": []}
    assert data["mcp_servers"]["github"] == {"command": "npx"}
    assert "# quick" in text_of(path) and "# mine" in text_of(path)
    assert uninstall_one(CODEX, opts).status == "removed"  # no backup without macula: entry out
    final = text_of(path)
    assert ENTRY_NAME not in tomllib.loads(final)["mcp_servers"]
    assert final.startswith("# mine\n") and final.endswith(
        '[profiles.fast]  # quick\nmodel = "o4-mini"\n'
    )


def test_an_entry_followed_by_later_edits_is_removed_alone(tmp_path: Path) -> None:
    opts = options(tmp_path)
    path = place(CODEX, opts, EXISTING["codex"])
    register_one(CODEX, [MACULA], opts)
    later = text_of(path) + '\n[profiles.deep]  # added after register\nmodel = "o3"\n'
    path.write_text(later)
    outcome = uninstall_one(CODEX, opts)
    assert outcome.status == "removed" and "other changes since register kept" in outcome.detail
    data = tomllib.loads(text_of(path))
    assert ENTRY_NAME not in data["mcp_servers"] and data["profiles"]["deep"] == {"model": "o3"}
    assert "# added after register" in text_of(path) and "# Codex: my settings" in text_of(path)
    assert len(backups(path)) == 2  # register's and uninstall's


def test_codex_home_moves_the_file_and_presence_needs_its_folder(tmp_path: Path) -> None:
    opts = options(tmp_path)
    env = dict(opts.env, CODEX_HOME=str(tmp_path / "codex-work"))
    assert CODEX.present(env, "linux") is None
    (tmp_path / "codex-work").mkdir()
    assert CODEX.present(env, "linux") == str(tmp_path / "codex-work")
    moved = Options(env, "linux")
    assert register_one(CODEX, [MACULA], moved).status == "registered"
    assert (tmp_path / "codex-work" / "config.toml").exists()


SERVER = st.fixed_dictionaries(
    {"command": st.text(min_size=1, max_size=8)},
    optional={
        "args": st.lists(st.text(max_size=6), max_size=3),
        "env": st.dictionaries(st.from_regex(r"[A-Z_]{1,6}", fullmatch=True), st.text(max_size=5)),
    },
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,7}", fullmatch=True), SERVER, max_size=3),
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers(), max_size=3),
    st.booleans(),
)
def test_any_codex_file_comes_back_byte_for_byte(
    servers: dict[str, object], top: dict[str, int], attach: bool
) -> None:
    servers.pop(ENTRY_NAME, None)
    top.pop("mcp_servers", None)
    text = tomlkit.dumps({**top, "mcp_servers": servers} if servers else top)
    entry = CODEX.build([MACULA, *(["attach"] if attach else [])], {})
    written = TOML.with_entry(text, ENTRY_NAME, entry)
    assert tomllib.loads(written)["mcp_servers"] == {**servers, ENTRY_NAME: entry}
    assert TOML.without_entry(written, ENTRY_NAME) == text


def test_read_entry_reports_a_broken_file_with_its_line() -> None:
    with pytest.raises(ConfigParseError, match="line 3"):
        TOML.read_entry("[a]\nx = 1\ny = = 2\n", ENTRY_NAME)


def test_doctor_lists_the_new_harnesses_like_the_others(tmp_path: Path) -> None:
    opts = options(tmp_path)
    real = tmp_path / "bin" / "macula-mcp"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    for name in ("codex", "gemini", "vscode"):
        place(BY_NAME[name], opts, EXISTING[name])
        assert register_one(BY_NAME[name], [str(real)], opts).status == "registered"
    checks = {name: (good, detail) for name, good, detail in registration_checks(opts.env, "linux")}
    for title in ("Codex CLI", "Gemini CLI", "VS Code"):
        good, detail = checks[f"registered in {title}"]
        assert good is True and str(real) in detail
    broken = BY_NAME["codex"].config_path(opts.env, "linux")
    broken.write_text("[mcp_servers.macula\n")
    good, detail = dict((n, (g, d)) for n, g, d in registration_checks(opts.env, "linux"))[
        "registered in Codex CLI"
    ]
    assert good is False and str(broken) in detail and "not valid TOML" in detail


def test_a_crlf_file_gets_crlf_lines_and_comes_back() -> None:
    original = '# on Windows once\r\nmodel = "o3"\r\n\r\n[mcp_servers.gh]\r\ncommand = "npx"\r\n'
    entry = CODEX.build([MACULA], {"MACULA_MESH_STATIONS": STATIONS})
    written = TOML.with_entry(original, ENTRY_NAME, entry)
    assert written.startswith(original) and "\n" not in written.replace("\r\n", "")
    assert TOML.read_entry(written, ENTRY_NAME) == entry
    assert TOML.without_entry(written, ENTRY_NAME) == original
