"""Every command of ``macula-mcp``, ``macula-relay`` and ``macula-realm`` answers ``--help``
with what it does, its own flags and an example; no help text carries markup or issue numbers.
``macula-relay``'s ``--help`` and ``--print-config`` name the same options.

Parsers are driven in-process (argparse raises ``SystemExit(0)`` after printing); one
subprocess checks the installed ``macula-mcp --help`` as a person runs it."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tools.commands import COMMANDS

# (argv after macula-mcp, flags its help must name, has an example)
MCP_HELPS: list[tuple[list[str], list[str]]] = [
    (["serve"], []),
    (["register"], ["--attach", "--http", "--dry-run", "--force", "--harness"]),
    (["uninstall"], ["--dry-run", "--force", "--harness"]),
    (["mcp-config"], ["--attach", "--http", "--agent", "--port"]),
    (["doctor"], []),
    (["demo"], []),
    (["daemon"], ["start", "stop", "status"]),
    (["daemon", "start"], ["--foreground", "--idle-timeout"]),
    (["daemon", "stop"], ["--wait"]),
    (["daemon", "status"], ["--json"]),
    (["station"], ["status", "stop", "init"]),
    (["station", "status"], ["--json"]),
    (["station", "stop"], ["--json"]),
    (["station", "init"], ["--public", "--port", "--host", "--data-dir", "--json"]),
    (["http-token"], ["--agent"]),
    (["a2a-token"], ["create", "list", "revoke"]),
    (["attach"], []),
    (["console"], ["--open"]),
]


def helped(run: Callable[[], object]) -> str:
    """The help ``run`` prints, checked to exit 0."""
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        run()
    assert done.value.code in (0, None), out.getvalue()
    return out.getvalue()


def clean(text: str) -> None:
    assert "``" not in text
    assert "issue " not in text.lower(), text
    assert not re.search(r"issue\s*#?\d", text, re.IGNORECASE), text


@pytest.mark.parametrize(("argv", "flags"), MCP_HELPS, ids=lambda v: " ".join(v) or "-")
def test_each_macula_mcp_command_has_its_own_help(argv: list[str], flags: list[str]) -> None:
    from tools.cli import main

    text = helped(lambda: main([*argv, "--help"]))
    assert text.startswith(f"usage: macula-mcp {' '.join(argv)}"), text
    assert "example" in text
    for flag in flags:
        assert flag in text, (argv, flag)
    clean(text)


def test_the_top_level_help_lists_every_command_with_its_line() -> None:
    from tools.cli import HANDLERS, main

    assert set(HANDLERS) == {command.name for command in COMMANDS}
    text = helped(lambda: main(["--help"]))
    flat = " ".join(text.split())
    for command in COMMANDS:
        assert f"{command.name} {command.summary}" in flat, command.name
    clean(text)


def test_the_installed_script_lists_http_token_too() -> None:
    script = Path(sys.executable).with_name("macula-mcp")
    done = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "http-token" in done.stdout and "mcp-config" in done.stdout
    attach = subprocess.run(  # the entry point answers it before importing attach
        [str(script), "attach", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert attach.returncode == 0 and "example" in attach.stdout, attach


def test_a_flag_a_command_does_not_take_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tools.cli import main

    for argv in (["doctor", "--attach"], ["mcp-config", "--agent", "a"], ["nonsense"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        assert argv[-1] in capsys.readouterr().err or "--agent" in argv


def test_relay_help_groups_every_flag_with_help_and_its_default() -> None:
    from relay.ops.options import build_parser

    parser = build_parser()
    text = helped(lambda: parser.parse_args(["--help"]))
    clean(text)
    titles = {group.title for group in parser._action_groups}
    for title in ("listening", "client limits", "federation", "realms", "house services"):
        assert any(title in str(t) for t in titles), (title, titles)
    assert "monitor" in " ".join(str(t) for t in titles)
    assert "logging" in " ".join(str(t) for t in titles)
    ungrouped = [a for a in parser._optionals._group_actions if a.dest != "help"]
    assert not ungrouped, [a.option_strings for a in ungrouped]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        assert action.help, action.option_strings
        shown = parser._get_formatter()._get_help_string(action)
        assert shown is not None and "default" in shown, action.option_strings
    for flag in ("--puzzle-difficulty", "--max-subscriptions"):
        assert re.search(rf"{flag}\b[^\n]*\n?[^\n]*\S", text)
        line = text[text.index(flag) :].split("\n  -")[0]
        assert "(default" in line, line


def _help_flags(parser: argparse.ArgumentParser) -> set[str]:
    text = helped(lambda: parser.parse_args(["--help"]))
    return set(re.findall(r"^\s{2}(--[a-z0-9-]+)", text, re.MULTILINE))


def test_relay_help_and_print_config_name_the_same_options(tmp_path: Path) -> None:
    from relay.ops.cli import main
    from relay.ops.options import build_parser

    out = io.StringIO()
    with redirect_stdout(out):
        main(["--print-config", "--data-dir", str(tmp_path)])
    keys = set(re.findall(r"^#?\s*([a-z0-9-]+) =", out.getvalue(), re.MULTILINE))
    listed = _help_flags(build_parser()) - {"--help", "--config", "--print-config"}
    assert keys == {flag[2:] for flag in listed}
    assert "lifetime-check-s" in keys


def test_realm_help_has_no_markup_and_each_command_its_own() -> None:
    from macula.realm.cli import _parser

    parser = _parser()
    text = helped(lambda: parser.parse_args(["--help"]))
    clean(text)
    assert "create" in text and "endorse-station" in text and "example" in text
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subcommands.choices.items():
        own = helped(lambda sub=sub: sub.parse_args(["--help"]))
        clean(own)
        assert own.startswith(f"usage: macula-realm {name}"), own
        assert "example" in own, name
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, (name, action.dest)


def test_mcp_config_refuses_a_station_list_macula_mcp_would_refuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools.cli import main

    monkeypatch.setenv("MACULA_MESH_STATIONS", "zz@127.0.0.1:4433")
    with pytest.raises(SystemExit) as done:
        main(["mcp-config", "--attach"])
    said = capsys.readouterr()
    assert done.value.code == 2 and said.out == ""
    assert "MACULA_MESH_STATIONS" in said.err and "zz@127.0.0.1:4433" in said.err
