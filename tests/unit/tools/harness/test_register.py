"""``register`` / ``uninstall`` for each harness it knows, in a temporary HOME.

Every test builds its environment from ``tmp_path`` (HOME, XDG_CONFIG_HOME, an empty PATH) and
passes it in: the real HOME is never read or written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.registerkit import (
    EXISTING,
    MACULA,
    MALFORMED,
    environment,
    everything_beside,
    options,
    place,
    text_of,
)
from tools.harness import json_text
from tools.harness.config_formats import ConfigParseError
from tools.harness.harnesses import BY_NAME, ENTRY_NAME, HARNESSES, Harness
from tools.harness.register import (
    ChangedMeanwhile,
    Options,
    backups,
    register_one,
    registration_checks,
    run,
    uninstall_one,
    write_atomic,
)


@pytest.fixture(params=[h.name for h in HARNESSES])
def harness(request: pytest.FixtureRequest) -> Harness:
    return BY_NAME[request.param]


def test_register_then_uninstall_gives_back_every_byte(harness: Harness, tmp_path: Path) -> None:
    opts = options(tmp_path)
    original = EXISTING[harness.name]
    path = place(harness, opts, original, mode=0o600)
    registered = register_one(harness, [MACULA], opts)
    assert registered.status == "registered", registered
    written = text_of(path)
    entry = harness.format.read_entry(written, ENTRY_NAME)
    assert entry == harness.build([MACULA], {}) and harness.is_ours(entry)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the file's mode survives the rename
    [copy] = backups(path)
    assert copy.read_bytes() == original.encode()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # a private original: a private backup
    # what was there stays there, as data
    before_servers = _servers(harness, original)
    after_servers = _servers(harness, written)
    assert {k: v for k, v in after_servers.items() if k != ENTRY_NAME} == before_servers
    # a second register changes nothing, byte for byte, and makes no backup
    snapshot = everything_beside(path)
    again = register_one(harness, [MACULA], opts)
    assert again.status == "unchanged" and everything_beside(path) == snapshot
    removed = uninstall_one(harness, opts)
    assert removed.status == "removed" and "byte for byte" in removed.detail
    assert path.read_bytes() == original.encode()
    assert uninstall_one(harness, opts).status == "not-registered"


def _servers(harness: Harness, text: str) -> dict[str, object]:
    if harness.name == "goose":
        from ruamel.yaml import YAML

        return dict(YAML(typ="safe").load(text)["extensions"])
    if harness.name == "codex":
        return dict(tomllib.loads(text)["mcp_servers"])
    root = json_text.parse(text, jsonc=harness.format.kind == "JSONC").value
    key = {"opencode": "mcp", "vscode": "servers"}.get(harness.name, "mcpServers")
    return dict(root[key])


def test_register_adds_lines_and_changes_no_other_line(harness: Harness, tmp_path: Path) -> None:
    opts = options(tmp_path)
    original = EXISTING[harness.name]
    path = place(harness, opts, original)
    register_one(harness, [MACULA], opts)
    old, new = original.splitlines(), text_of(path).splitlines()
    kept = [line for line in old if line in new]
    changed = [line for line in old if line not in new]
    # at most the old last member's line gains a comma (JSON needs it); nothing else moves
    assert len(changed) <= 1 and len(kept) >= len(old) - 1
    assert all(any(n.startswith(c) for n in new) for c in changed) or harness.name == "cursor"


def test_uninstall_without_backups_removes_just_the_entry(harness: Harness, tmp_path: Path) -> None:
    """Backups deleted: the surgical removal alone still gives back the original bytes."""
    opts = options(tmp_path)
    original = EXISTING[harness.name]
    path = place(harness, opts, original)
    register_one(harness, [MACULA], opts)
    for copy in backups(path):
        copy.unlink()
    outcome = uninstall_one(harness, opts)
    assert outcome.status == "removed" and "entry removed" in outcome.detail
    assert text_of(path) == original
    [copy] = backups(path)  # the surgical path backs up first
    assert harness.format.read_entry(text_of(copy), ENTRY_NAME) is not None


def test_other_changes_after_register_are_kept_by_uninstall(
    harness: Harness, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    path = place(harness, opts, EXISTING[harness.name])
    register_one(harness, ["/usr/bin/other-mcp"], opts)  # stands in for the user's own edit
    text = text_of(path)
    other = harness.format.read_entry(text, ENTRY_NAME)
    edited = harness.format.with_entry(
        harness.format.without_entry(text, ENTRY_NAME), "mine", other
    )
    path.write_text(edited)
    for copy in backups(path):
        copy.unlink()
    register_one(harness, [MACULA], opts)
    assert uninstall_one(harness, opts).status == "removed"
    final = text_of(path)
    assert harness.format.read_entry(final, ENTRY_NAME) is None
    assert harness.format.read_entry(final, "mine") == other


def test_absent_file_is_created_private_and_uninstall_removes_it(
    harness: Harness, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    path = place(harness, opts, None)  # the folder exists: the harness is installed
    if harness.name == "claude-code":  # its folder is HOME: ~/.claude says it is installed
        (path.parent / ".claude").mkdir()
    assert harness.present(opts.env, opts.platform)
    outcome = register_one(harness, [MACULA], opts)
    assert outcome.status == "registered" and "(created)" in outcome.detail
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert harness.format.read_entry(text_of(path), ENTRY_NAME) == harness.build([MACULA], {})
    assert backups(path) == []
    assert register_one(harness, [MACULA], opts).status == "unchanged"
    assert uninstall_one(harness, opts).status == "removed"
    assert not path.exists() and not [p for p in path.parent.iterdir() if p.is_file()]


def test_malformed_config_is_left_untouched_with_a_clear_error(
    harness: Harness, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    broken = MALFORMED[harness.name]
    path = place(harness, opts, broken)
    for outcome in (register_one(harness, [MACULA], opts), uninstall_one(harness, opts)):
        assert outcome.failed and outcome.status == "failed"
        assert str(path) in outcome.detail and "left untouched" in outcome.detail
        assert ("line" in outcome.detail) or ("top level" in outcome.detail)
    assert everything_beside(path) == {path.name: broken.encode()}


def test_dry_run_writes_nothing_and_shows_the_diff(harness: Harness, tmp_path: Path) -> None:
    opts = options(tmp_path, dry_run=True)
    path = place(harness, opts, EXISTING[harness.name])
    outcome = register_one(harness, [MACULA], opts)
    assert outcome.status == "would-register"
    assert outcome.diff.startswith(f"--- {path}\n+++ {path}\n") and MACULA in outcome.diff
    assert everything_beside(path) == {path.name: EXISTING[harness.name].encode()}
    real = options(tmp_path)
    register_one(harness, [MACULA], real)
    snapshot = everything_beside(path)
    assert uninstall_one(harness, opts).status == "would-remove"
    assert everything_beside(path) == snapshot


def test_attach_entry_replaces_the_plain_one_and_uninstall_still_restores(
    harness: Harness, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    original = EXISTING[harness.name]
    path = place(harness, opts, original)
    register_one(harness, [MACULA], opts)
    outcome = register_one(harness, [MACULA, "attach"], opts)
    assert outcome.status == "registered"
    entry = harness.format.read_entry(text_of(path), ENTRY_NAME)
    assert entry == harness.build([MACULA, "attach"], {}) and harness.is_ours(entry)
    assert uninstall_one(harness, opts).status == "removed"
    assert text_of(path) == original


def test_a_hand_written_macula_entry_is_left_unless_forced(
    harness: Harness, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    path = place(harness, opts, EXISTING[harness.name])
    register_one(harness, [MACULA], opts)
    mine = dict(harness.build([MACULA], {"MACULA_MCP_AGENT": "alice"}))  # a user's own edit
    path.write_text(harness.format.with_entry(text_of(path), ENTRY_NAME, mine))
    edited = path.read_bytes()
    for outcome in (register_one(harness, [MACULA], opts), uninstall_one(harness, opts)):
        assert outcome.status == "kept" and outcome.failed and "--force" in outcome.detail
    assert path.read_bytes() == edited
    forced = options(tmp_path, force=True)
    assert register_one(harness, [MACULA, "attach"], forced).status == "registered"
    assert harness.is_ours(harness.format.read_entry(text_of(path), ENTRY_NAME))


def test_stations_from_the_environment_go_into_the_entry(tmp_path: Path) -> None:
    opts = options(tmp_path)
    env = dict(opts.env, MACULA_MESH_STATIONS="abcd@mesh.example:4433")
    opts = Options(env, "linux")
    for harness in HARNESSES:
        path = place(harness, opts, None)
        register_one(harness, [MACULA], opts)
        entry = harness.format.read_entry(text_of(path), ENTRY_NAME)
        assert "abcd@mesh.example:4433" in json.dumps(entry) and harness.is_ours(entry)


def test_doctor_flags_an_entry_pointing_at_a_missing_executable(tmp_path: Path) -> None:
    opts = options(tmp_path)
    assert registration_checks(opts.env, "linux") == [
        ("registrations", True, "in no harness yet (`macula-mcp register`)")
    ]
    real = tmp_path / "bin" / "macula-mcp"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    place(BY_NAME["cursor"], opts, None)
    register_one(BY_NAME["cursor"], [str(real)], opts)
    place(BY_NAME["goose"], opts, None)
    register_one(BY_NAME["goose"], ["/gone/macula-mcp", "attach"], opts)
    checks = {name: (good, detail) for name, good, detail in registration_checks(opts.env, "linux")}
    assert checks["registered in Cursor"][0] is True
    good, detail = checks["registered in Goose"]
    assert good is False and "/gone/macula-mcp does not exist" in detail


def test_platform_paths(tmp_path: Path) -> None:
    env = environment(tmp_path)
    home = Path(env["HOME"])
    mac = {h.name: h.config_path(env, "darwin") for h in HARNESSES}
    assert mac["claude-desktop"] == (
        home / "Library/Application Support/Claude/claude_desktop_config.json"
    )
    assert mac["claude-code"] == home / ".claude.json"
    assert mac["cursor"] == home / ".cursor/mcp.json"
    assert mac["windsurf"] == home / ".codeium/windsurf/mcp_config.json"
    assert mac["opencode"] == home / ".config/opencode/opencode.json"
    assert mac["goose"] == home / ".config/goose/config.yaml"
    assert mac["codex"] == home / ".codex/config.toml"
    assert mac["gemini"] == home / ".gemini/settings.json"
    assert mac["vscode"] == home / "Library/Application Support/Code/User/mcp.json"
    assert BY_NAME["vscode"].config_path(env, "linux") == home / ".config/Code/User/mcp.json"
    moved = dict(env, CODEX_HOME=str(home / "codex-work"), GEMINI_CLI_HOME=str(home / "g"))
    assert BY_NAME["codex"].config_path(moved, "linux") == home / "codex-work/config.toml"
    assert BY_NAME["gemini"].config_path(moved, "linux") == home / "g/.gemini/settings.json"
    linux = BY_NAME["claude-desktop"].config_path(env, "linux")
    assert linux == home / ".config/Claude/claude_desktop_config.json"
    jsonc = home / ".config/opencode/opencode.jsonc"
    jsonc.parent.mkdir(parents=True)
    jsonc.write_text("{}")
    assert BY_NAME["opencode"].config_path(env, "linux") == jsonc


def test_presence(tmp_path: Path) -> None:
    env = environment(tmp_path)
    assert [h.name for h in HARNESSES if h.present(env, "linux")] == []
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text("#!/bin/sh\n")
    (bin_dir / "claude").chmod(0o755)
    env["PATH"] = str(bin_dir)
    assert BY_NAME["claude-code"].present(env, "linux") == str(bin_dir / "claude")
    assert BY_NAME["cursor"].present(env, "linux") is None


def test_opencode_2_nests_servers_under_mcp_servers(tmp_path: Path) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["opencode"]
    original = (
        '{\n  "mcp": {\n    "servers": {\n      "fs": {"type": "local", "command": ["x"]},\n'
        "    },\n  },\n}\n"
    )
    path = place(harness, opts, original)
    register_one(harness, [MACULA], opts)
    tree = json_text.parse(text_of(path), jsonc=True).value
    assert tree["mcp"]["servers"][ENTRY_NAME] == {"type": "local", "command": [MACULA]}
    uninstall_one(harness, opts)
    assert text_of(path) == original


def test_a_symlinked_config_is_written_through(tmp_path: Path) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["cursor"]
    dotfiles = tmp_path / "dotfiles" / "mcp.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text(EXISTING["cursor"])
    link = place(harness, opts, None)
    link.symlink_to(dotfiles)
    register_one(harness, [MACULA], opts)
    assert link.is_symlink() and harness.format.read_entry(text_of(dotfiles), ENTRY_NAME)
    uninstall_one(harness, opts)
    assert link.is_symlink() and text_of(dotfiles) == EXISTING["cursor"]


def test_run_reports_each_harness_and_fails_when_one_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MACULA_MESH_STATIONS", raising=False)
    opts = Options(env, "linux")
    place(BY_NAME["cursor"], opts, EXISTING["cursor"])
    broken = place(BY_NAME["windsurf"], opts, MALFORMED["windsurf"])
    out = io.StringIO()
    assert run("register", [], out) == 1  # windsurf failed
    assert "cursor: registered" in out.getvalue()
    assert text_of(broken) == MALFORMED["windsurf"]
    out = io.StringIO()
    assert run("register", ["--harness", "cursor"], out) == 0
    assert "cursor: unchanged" in out.getvalue()
    assert run("register", ["--harness", "goose"], io.StringIO()) == 1  # asked for, not there
    assert run("uninstall", ["--harness", "cursor"], io.StringIO()) == 0
    assert text_of(Path(env["HOME"]) / ".cursor/mcp.json") == EXISTING["cursor"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("{", "line 1 column 2"),
        ('{\n  "a": 1\n  "b": 2\n}', "line 3 column 3"),
        ('{"a": [1, 2,]}', "line 1 column 12"),
        ('{"a": 1} x', "line 1 column 10"),
        ("// c\n{}", "line 1 column 1"),
    ],
)
def test_json_errors_name_line_and_column(text: str, where: str) -> None:
    with pytest.raises(json_text.JsonTextError, match=where):
        json_text.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "{}\n",
        '{"a": {}}',
        '{"a": {"b": 1}}',
        '{\n\t"a": {\n\t\t"b": 1\n\t}\n}\n',
        '{\r\n  "a": {\r\n    "b": 1 // one\r\n  }\r\n}\r\n',
        '{\n  "a": {\n    "b": 1, // one\n  },\n}',
        '{\n  "x": 0,\n  "a": {\n    "b": [1, 2],\n    "c": {"d": null}\n  }\n}',
    ],
)
def test_json_insert_then_remove_is_the_identity(text: str) -> None:
    value = {"command": "/x/macula-mcp", "args": ["attach"], "env": {"K": "v"}}
    inserted = json_text.set_member(text, ("a",), "macula", value, jsonc=True)
    assert json_text.member_value(inserted, ("a",), "macula", jsonc=True) == value
    removed = json_text.remove_member(inserted, ("a",), "macula", jsonc=True)
    if text in ("{}", "{}\n"):  # the container itself was made: equal as data
        assert json_text.parse(removed).value == {"a": {}}
    else:
        assert removed == text


def test_a_container_of_the_wrong_type_is_a_parse_error(tmp_path: Path) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["cursor"]
    path = place(harness, opts, '{"mcpServers": []}')
    outcome = register_one(harness, [MACULA], opts)
    assert outcome.failed and "mcpServers is not an object" in outcome.detail
    assert text_of(path) == '{"mcpServers": []}'
    with pytest.raises(ConfigParseError):
        BY_NAME["goose"].format.with_entry("extensions: [1]\n", ENTRY_NAME, {})


def test_backup_names_do_not_collide(tmp_path: Path) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["cursor"]
    path = place(harness, opts, EXISTING["cursor"])
    register_one(harness, [MACULA], opts)
    register_one(harness, [MACULA, "attach"], opts)  # same second: a second name
    assert len(backups(path)) == 2
    assert os.path.basename(str(backups(path)[0])).endswith("-1")


@pytest.mark.parametrize(
    "original", ["", "# goose: nothing configured yet\n", "GOOSE_MODEL: x\n", "extensions:\n"]
)
def test_goose_without_extensions_keeps_its_comments_and_comes_back(
    original: str, tmp_path: Path
) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["goose"]
    path = place(harness, opts, original)
    assert register_one(harness, [MACULA], opts).status == "registered"
    written = text_of(path)
    assert written.startswith(original.rstrip("\n").removesuffix("extensions:"))
    assert harness.format.read_entry(written, ENTRY_NAME) == harness.build([MACULA], {})
    assert uninstall_one(harness, opts).status == "removed"
    assert text_of(path) == original


def test_uninstall_with_nothing_installed_is_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in environment(tmp_path).items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    assert run("uninstall", [], out) == 0
    assert run("register", [], out) == 1  # nothing to register into
    assert "not found (skipped): claude-code, claude-desktop" in out.getvalue()


def test_a_file_rewritten_meanwhile_is_not_clobbered(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"numStartups": 2}')  # the harness wrote this after we read "1"
    with pytest.raises(ChangedMeanwhile):
        write_atomic(path, '{"numStartups": 1, "mcpServers": {}}', 0o600, '{"numStartups": 1}')
    with pytest.raises(ChangedMeanwhile):
        write_atomic(path, "{}", 0o600, None)  # we expected no file at all
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temp file left behind
    assert path.read_text() == '{"numStartups": 2}'


def test_claude_config_dir_moves_claude_code_file(tmp_path: Path) -> None:
    env = environment(tmp_path)
    env["CLAUDE_CONFIG_DIR"] = str(tmp_path / "claude-work")
    harness = BY_NAME["claude-code"]
    assert harness.config_path(env, "linux") == tmp_path / "claude-work" / ".claude.json"
    assert harness.present(env, "linux") is None
    (tmp_path / "claude-work").mkdir()
    assert harness.present(env, "linux") == str(tmp_path / "claude-work")


def test_a_folder_where_the_file_should_be_is_a_clear_failure(tmp_path: Path) -> None:
    opts = options(tmp_path)
    harness = BY_NAME["cursor"]
    path = place(harness, opts, None)
    path.mkdir()
    outcome = register_one(harness, [MACULA], opts)
    assert outcome.failed and str(path) in outcome.detail and "Is a directory" in outcome.detail


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.text(max_size=200), st.booleans())
def test_any_text_parses_or_raises_json_text_error(text: str, jsonc: bool) -> None:
    with contextlib.suppress(json_text.JsonTextError):
        json_text.parse(text, jsonc=jsonc)


@given(JSON_VALUES, st.sampled_from([None, 1, 4, "\t"]))
def test_parse_agrees_with_json(value: object, indent: int | str | None) -> None:
    text = json.dumps(value, indent=indent)
    assert json_text.parse(text).value == json.loads(text)
    assert json_text.parse(text, jsonc=True).value == json.loads(text)


@given(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4), st.sampled_from([None, 2, 4]))
def test_insert_then_remove_gives_back_the_text(
    servers: dict[str, object], indent: int | None
) -> None:
    servers.pop(ENTRY_NAME, None)
    text = json.dumps({"other": 1, "mcpServers": servers}, indent=indent)
    inserted = json_text.set_member(text, ("mcpServers",), ENTRY_NAME, {"a": [1]}, jsonc=False)
    assert json.loads(inserted)["mcpServers"] == {**servers, ENTRY_NAME: {"a": [1]}}
    removed = json_text.remove_member(inserted, ("mcpServers",), ENTRY_NAME, jsonc=False)
    assert removed == text or (not servers and json.loads(removed) == json.loads(text))


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(json_text.JsonTextError, match="nested deeper"):
        json_text.parse("[" * 100_000)


@pytest.mark.parametrize(
    ("stations", "named"),
    [
        ("abc@127.0.0.1:4433", "node id is not hex"),
        ("127.0.0.1:99999", "port must be 1..65535"),
        ("127.0.0.1:4433,,", "empty entry"),
        ("127.0.0.1:4433,127.0.0.1:4433", "127.0.0.1:4433"),
    ],
)
def test_register_refuses_a_station_list_macula_mcp_would_refuse(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stations: str,
    named: str,
) -> None:
    env = environment(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MACULA_MESH_STATIONS", stations)
    opts = Options(env, "linux")
    config = place(BY_NAME["cursor"], opts, EXISTING["cursor"])
    assert run("register", ["--harness", "cursor"], io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "MACULA_MESH_STATIONS" in err and named in err, err
    assert text_of(config) == EXISTING["cursor"]  # nothing written
    assert not backups(config)


def test_register_says_it_copied_the_checked_station_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    station = f"{'ab' * 32}@vps.example.org:4433"
    monkeypatch.setenv("MACULA_MESH_STATIONS", station)
    opts = Options(env, "linux")
    config = place(BY_NAME["cursor"], opts, EXISTING["cursor"])
    out = io.StringIO()
    assert run("register", ["--harness", "cursor", "--attach"], out) == 0
    assert f"MACULA_MESH_STATIONS={station}" in out.getvalue()
    assert "copied" in out.getvalue()
    assert station in text_of(config)
