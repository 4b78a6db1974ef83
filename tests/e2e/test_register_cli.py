"""``macula-mcp register`` / ``uninstall`` / ``mcp-config --attach`` / ``doctor`` as a person runs
them: the real CLI in a subprocess, HOME and XDG_CONFIG_HOME in ``tmp_path``, PATH holding only
this environment's scripts (so no real ``claude`` is found, and the real HOME is never touched)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from support.mcpkit import cli
from support.registerkit import EXISTING, MALFORMED
from tools.harness.harnesses import BY_NAME, ENTRY_NAME, HARNESSES

PLATFORM = "darwin" if sys.platform == "darwin" else "linux"


def home_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MACULA_", "XDG_"))}
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        PATH=str(Path(sys.executable).parent),
        MACULA_HOME=str(tmp_path / "macula"),
    )
    return env


def files(env: dict[str, str]) -> dict[Path, bytes | None]:
    found: dict[Path, bytes | None] = {}
    for harness in HARNESSES:
        path = harness.config_path(env, PLATFORM)
        found[path] = path.read_bytes() if path.exists() else None
    return found


def test_register_twice_then_uninstall_in_a_temporary_home(tmp_path: Path) -> None:
    env = home_env(tmp_path)
    for harness in HARNESSES:  # every harness installed; half with a config already there
        path = harness.config_path(env, PLATFORM)
        path.parent.mkdir(parents=True, exist_ok=True)
        if harness.name in ("claude-code", "cursor", "opencode", "goose", "codex", "vscode"):
            path.write_bytes(EXISTING[harness.name].encode())
    (Path(env["HOME"]) / ".claude").mkdir()
    before = files(env)

    dry = cli(["register", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    assert files(env) == before and "+++ " in dry.stdout

    first = cli(["register"], env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count(": registered: ") == len(HARNESSES)
    registered = files(env)
    for path, data in registered.items():
        assert data is not None and b"macula-mcp" in data, path
    second = cli(["register"], env)
    assert second.returncode == 0 and second.stdout.count(": unchanged: ") == len(HARNESSES)
    assert files(env) == registered

    config = cli(["mcp-config", "--attach"], env)
    attach_entry = json.loads(config.stdout)["mcpServers"][ENTRY_NAME]
    assert attach_entry["args"] == ["attach"] and Path(attach_entry["command"]).is_absolute()
    attach = cli(["register", "--attach", "--harness", "cursor", "--harness", "goose"], env)
    assert attach.returncode == 0, attach.stderr
    for name in ("cursor", "goose"):
        harness = BY_NAME[name]
        text = harness.config_path(env, PLATFORM).read_bytes().decode()
        command = harness.command_of(harness.format.read_entry(text, ENTRY_NAME))
        assert command is not None and command[0] == [attach_entry["command"], "attach"]

    gone = cli(["uninstall"], env)
    assert gone.returncode == 0, gone.stderr
    assert files(env) == before  # byte for byte, and absent where it was absent
    assert cli(["uninstall"], env).stdout.count(": not-registered: ") == len(HARNESSES)


def test_a_malformed_config_is_untouched_and_the_others_still_register(tmp_path: Path) -> None:
    env = home_env(tmp_path)
    for harness in HARNESSES:
        harness.config_path(env, PLATFORM).parent.mkdir(parents=True, exist_ok=True)
    (Path(env["HOME"]) / ".claude").mkdir()
    goose = BY_NAME["goose"].config_path(env, PLATFORM)
    goose.write_text(MALFORMED["goose"])
    done = cli(["register"], env)
    assert done.returncode == 1
    [error] = [line for line in done.stderr.splitlines() if line.startswith("goose:")]
    assert str(goose) in error and "not valid YAML" in error and "left untouched" in error
    assert "Traceback" not in done.stderr
    assert goose.read_text() == MALFORMED["goose"] and sorted(goose.parent.iterdir()) == [goose]
    assert done.stdout.count(": registered: ") == len(HARNESSES) - 1


# slow: doctor flagging a moved executable is unit-tested (test_register.py); this runs the whole
# doctor
@pytest.mark.slow
def test_doctor_flags_a_registration_whose_executable_is_gone(tmp_path: Path) -> None:
    env = home_env(tmp_path)
    cursor = BY_NAME["cursor"]
    path = cursor.config_path(env, PLATFORM)
    path.parent.mkdir(parents=True)
    entry = cursor.build([str(tmp_path / "moved" / "macula-mcp")], {})
    path.write_text(json.dumps({"mcpServers": {ENTRY_NAME: entry}}))
    env["MACULA_MESH_STATIONS"] = "127.0.0.1:9"  # nothing listens: that check fails fast too
    done = cli(["doctor"], env)
    assert done.returncode == 1
    [line] = [x for x in done.stdout.splitlines() if x.startswith("[") and "in Cursor" in x]
    assert line.startswith("[FAIL]") and "does not exist" in line and str(path) in line
