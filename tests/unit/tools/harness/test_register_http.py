"""``register --http`` / ``mcp-config --http`` / ``http-token``: the HTTP form of the entry per
harness, the token kept out of what is printed, files private, stdio-only harnesses refused."""

from __future__ import annotations

import contextlib
import io
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from support.registerkit import EXISTING, environment, place, text_of
from tools.daemon.http import cli as http_cli
from tools.daemon.http.home_token import home_token, port_path
from tools.daemon.http.tokens import TokenBook, agent_token, agent_token_path
from tools.harness.harnesses import BY_NAME, ENTRY_NAME
from tools.harness.http_register import HTTP_HARNESSES, HttpTarget, http_target
from tools.harness.register import Options, register_one, run, uninstall_one

TOKEN = "A" * 43
TARGET = HttpTarget("http://127.0.0.1:4242/mcp", TOKEN)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHAPES: dict[str, dict[str, Any]] = {
    "claude-code": {"type": "http", "url": TARGET.url, "headers": AUTH},
    "cursor": {"url": TARGET.url, "headers": AUTH},
    "vscode": {"type": "http", "url": TARGET.url, "headers": AUTH},
}


def http_options(tmp_path: Path, target: HttpTarget = TARGET) -> Options:
    return Options(environment(tmp_path), "linux", now=1_700_000_000.0, http=target)


@pytest.mark.parametrize("name", HTTP_HARNESSES)
def test_each_http_harness_gets_its_shape_privately_and_uninstall_restores(
    name: str, tmp_path: Path
) -> None:
    harness, opts = BY_NAME[name], http_options(tmp_path)
    path = place(harness, opts, EXISTING[name], mode=0o644)
    done = register_one(harness, [], opts)
    assert done.status == "registered", done.detail
    assert harness.format.read_entry(text_of(path), ENTRY_NAME) == SHAPES[name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds a bearer token now
    assert register_one(harness, [], opts).status == "unchanged"
    assert harness.is_ours(SHAPES[name])
    other_port = HttpTarget("http://127.0.0.1:5000/mcp", "B" * 43)
    assert register_one(harness, [], http_options(tmp_path, other_port)).status == "registered"
    assert uninstall_one(harness, opts).status == "removed"
    assert text_of(path) == EXISTING[name]


def test_a_new_file_is_created_0600(tmp_path: Path) -> None:
    harness, opts = BY_NAME["cursor"], http_options(tmp_path)
    path = place(harness, opts, None)
    assert register_one(harness, [], opts).status == "registered"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(text_of(path))["mcpServers"][ENTRY_NAME] == SHAPES["cursor"]


def test_a_hand_edited_http_entry_is_not_ours(tmp_path: Path) -> None:
    harness = BY_NAME["claude-code"]
    assert not harness.is_ours({**SHAPES["claude-code"], "url": "http://evil.example:1/mcp"})
    assert not harness.is_ours({**SHAPES["claude-code"], "headers": {**AUTH, "X-More": "1"}})
    assert not harness.is_ours({**SHAPES["claude-code"], "headers": {"Authorization": "Bearer x"}})


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - set(HTTP_HARNESSES)))
def test_a_stdio_only_harness_is_refused_clearly(name: str, tmp_path: Path) -> None:
    harness, opts = BY_NAME[name], http_options(tmp_path)
    path = place(harness, opts, EXISTING[name])
    refused = register_one(harness, [], opts)
    assert refused.failed and "--http is for claude-code, cursor, vscode" in refused.detail
    assert text_of(path) == EXISTING[name]


def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "macula"
    for key, value in {**environment(tmp_path), "MACULA_HOME": str(home)}.items():
        monkeypatch.setenv(key, value)
    return home


def test_run_register_http_never_prints_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = cli_env(tmp_path, monkeypatch)
    env = environment(tmp_path)
    for name in ("claude-code", "goose"):
        place(BY_NAME[name], Options(env, "linux"), EXISTING[name])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run("register", ["--http", "--port", "4242", "--dry-run"], out) == 0
        assert run("register", ["--http", "--port", "4242"], out) == 0
    token = home_token(home)
    assert token not in out.getvalue() + err.getvalue()
    assert "claude-code: would-register" in out.getvalue() and "<token>" in out.getvalue()
    assert "no HTTP form (skipped; register without --http): goose" in out.getvalue()
    written = json.loads(text_of(Path(env["HOME"]) / ".claude.json"))["mcpServers"][ENTRY_NAME]
    assert written["headers"] == {"Authorization": f"Bearer {token}"}
    with contextlib.redirect_stderr(err):  # named: it fails and says why
        assert run("register", ["--http", "--port", "1", "--harness", "goose"], out) == 1
        assert run("register", ["--agent", "bob"], out) == 1  # --agent needs --http
    assert (
        "--http is for" in err.getvalue() and "--agent and --port go with --http" in err.getvalue()
    )


def test_mcp_config_http_prints_the_entry_of_the_daemons_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = cli_env(tmp_path, monkeypatch)
    assert http_cli.main(["mcp-config", "--http"]) == 1  # no daemon has written its port
    assert "macula-mcp console" in capsys.readouterr().err
    home.mkdir(exist_ok=True)
    (home / "http").mkdir(mode=0o700, exist_ok=True)
    port_path(home).write_text("5151\n")
    assert http_cli.main(["mcp-config", "--http", "--agent", "bob"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "mcpServers": {
            "macula": {
                "type": "http",
                "url": "http://127.0.0.1:5151/mcp",
                "headers": {"Authorization": f"Bearer {agent_token(home, 'bob')}"},
            }
        }
    }
    assert http_target(home).url == "http://127.0.0.1:5151/mcp"


def test_http_token_makes_one_private_token_per_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = cli_env(tmp_path, monkeypatch)
    assert http_cli.main(["http-token", "--agent", "bob"]) == 0
    bob = capsys.readouterr().out.strip()
    assert http_cli.main(["http-token", "--agent", "bob"]) == 0
    assert capsys.readouterr().out.strip() == bob  # the same one, not a new one
    path = agent_token_path(home, "bob")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert http_cli.main(["http-token"]) == 0
    home_one = capsys.readouterr().out.strip()
    book = TokenBook(home)
    assert book.identify(bob) is not None and book.identify(bob).agent == "bob"  # type: ignore[union-attr]
    assert book.identify(home_one).agent == "default"  # type: ignore[union-attr]
    assert book.identify(bob[:-1] + "x") is None and book.identify(None) is None
    path.unlink()  # a removed file revokes its token at once
    assert book.identify(bob) is None
    assert http_cli.main(["http-token", "--agent", "../x"]) == 1
    assert "agent name" in capsys.readouterr().err


def test_the_cli_sends_http_forms_to_http_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools.cli import main

    home = cli_env(tmp_path, monkeypatch)
    with pytest.raises(SystemExit) as done:
        main(["mcp-config", "--http", "--port", "6000"])
    assert done.value.code == 0
    entry = json.loads(capsys.readouterr().out)["mcpServers"]["macula"]
    assert entry["url"] == "http://127.0.0.1:6000/mcp"
    assert entry["headers"]["Authorization"] == f"Bearer {home_token(home)}"
    with pytest.raises(SystemExit) as done:
        main(["http-token", "--agent", "ci"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == agent_token(home, "ci")


def test_doctor_reads_an_http_entry_as_one_and_never_shows_its_token(tmp_path: Path) -> None:
    from tools.harness.register import registration_checks

    opts = http_options(tmp_path)
    place(BY_NAME["vscode"], opts, None)
    assert register_one(BY_NAME["vscode"], [], opts).status == "registered"
    [(name, good, detail)] = registration_checks(opts.env, "linux")
    assert name == "registered in VS Code" and good is True
    assert "http://127.0.0.1:4242/mcp (HTTP)" in detail and TOKEN not in detail
