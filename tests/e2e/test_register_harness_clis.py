"""``macula-mcp register`` checked by the harnesses' own command-line tools: after register,
``codex mcp list`` lists macula enabled and ``gemini mcp list`` lists it connected (it starts
``macula-mcp``, which reaches a real station on loopback); after uninstall the file is back byte
for byte (and codex lists only what was there). Gemini CLI takes about 5 s to start here: it
runs once, in the slow set. Each test runs when its CLI is on PATH (``.ci/run`` installs the
pinned versions) and is skipped, saying so, otherwise. HOME is a temporary folder."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from relay.station.station import Station
from support.registerkit import EXISTING
from tools.harness.harnesses import BY_NAME, ENTRY_NAME
from tools.harness.register import run as register_cli
from tools.launch import server_command

PLATFORM = "darwin" if sys.platform == "darwin" else "linux"
CODEX = shutil.which("codex")
GEMINI = shutil.which("gemini")


STATIONS = "ab" * 32 + "@127.0.0.1:4433"  # register refuses a malformed list (a short id)


def home_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment with HOME (and everything found from it) in ``tmp_path``; PATH keeps
    node (the CLIs need it) and this environment's scripts."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MACULA_", "XDG_", "CODEX_", "GEMINI_", "GOOGLE_"))
    }
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), **extra)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def registering(command: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``macula-mcp register|uninstall --harness NAME`` in this process (the subprocess form is
    tested in test_register_cli.py), in ``env``; what it printed. It must succeed."""
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    assert register_cli(command.split()[0], command.split()[1:], out) == 0, out.getvalue()
    return out.getvalue()


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=False
    )


@pytest.mark.skipif(CODEX is None, reason="codex is not on PATH (npm install -g @openai/codex)")
def test_codex_lists_macula_enabled_then_forgets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CODEX is not None
    env = home_env(tmp_path, MACULA_MESH_STATIONS=STATIONS)  # an env inline table
    config = BY_NAME["codex"].config_path(env, PLATFORM)
    config.parent.mkdir()
    config.write_text(EXISTING["codex"])
    assert "codex: registered" in registering("register --harness codex", env, monkeypatch)
    listed = run([CODEX, "mcp", "list", "--json"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    servers = {server["name"]: server for server in json.loads(listed.stdout)}
    assert servers.keys() == {"github", ENTRY_NAME}
    macula = servers[ENTRY_NAME]
    assert macula["enabled"] is True and macula["transport"]["type"] == "stdio"
    assert [macula["transport"]["command"], *macula["transport"]["args"]] == server_command()
    assert macula["transport"]["env"] == {"MACULA_MESH_STATIONS": STATIONS}
    assert servers["github"]["transport"]["env"] == {"GITHUB_HOST": "github.example"}
    assert "byte for byte" in registering("uninstall --harness codex", env, monkeypatch)
    assert config.read_text() == EXISTING["codex"]
    after = run([CODEX, "mcp", "list", "--json"], env, tmp_path)
    assert [server["name"] for server in json.loads(after.stdout)] == ["github"]


# slow: Gemini CLI alone takes about 5 s to start here, the whole test 12-16 s on 2 busy cores
@pytest.mark.slow
@pytest.mark.skipif(
    GEMINI is None, reason="gemini is not on PATH (npm install -g @google/gemini-cli)"
)
@pytest.mark.anyio
async def test_gemini_lists_macula_connected(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert GEMINI is not None
    # register writes MACULA_MESH_STATIONS into the entry; trust the folder mcp list runs in
    # (an untrusted folder lists stdio servers as disabled, by design)
    env = home_env(tmp_path, MACULA_MESH_STATIONS=station.endpoint)
    settings = BY_NAME["gemini"].config_path(env, PLATFORM)
    settings.parent.mkdir()
    settings.write_text(EXISTING["gemini"])
    assert "gemini: registered" in registering("register --harness gemini", env, monkeypatch)
    project = tmp_path / "project"
    project.mkdir()
    trusted = dict(env, GEMINI_CLI_TRUST_WORKSPACE="true")
    trusted.pop("MACULA_MESH_STATIONS")  # from the entry only
    listed = await anyio.to_thread.run_sync(run, [GEMINI, "mcp", "list"], trusted, project)
    assert listed.returncode == 0, listed.stderr
    shown = listed.stdout + listed.stderr  # it writes the list to stderr when not a terminal
    lines = [x for x in shown.splitlines() if f" {ENTRY_NAME}: " in x]
    assert len(lines) == 1, (listed.stdout, listed.stderr)
    [line] = lines
    assert line.startswith("✓") and line.endswith("- Connected"), listed.stdout
    assert server_command()[0] in line
    assert "byte for byte" in registering("uninstall --harness gemini", env, monkeypatch)
    assert settings.read_text() == EXISTING["gemini"]
