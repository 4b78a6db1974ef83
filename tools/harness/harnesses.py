"""The MCP clients ``macula-mcp register`` knows: where each keeps its configuration on Linux and
macOS, in which format, and the shape of one stdio server entry in it.

Invariants:
- everything is computed from an environment mapping (``HOME``, ``XDG_CONFIG_HOME``, ``PATH``)
  and a platform name passed in, never from the process's own: tests run in a temporary HOME.
- a harness is *present* when its configuration file or its configuration folder exists (a
  harness on PATH whose folder is missing has not been run yet: register does not create it); for
  Claude Code, whose file lives directly in HOME (which always exists), also when its ``~/.claude``
  folder exists or ``claude`` is on PATH (its own convention: it is a command-line tool).
- register never creates a folder: it writes a file into a folder that is already there.
- an entry is *ours* when it is exactly what register writes for some macula command: the
  ``macula-mcp`` script (any absolute path) or ``python -m tools.cli``, with no argument or
  ``attach``, and only ``MACULA_MESH_STATIONS`` in its environment, or exactly the HTTP form
  ``register --http`` writes (``tools.harness.http_register``). Anything else named ``macula`` was
  written or edited by hand.

Sources (checked with the search tool, Nov 2026; cited per harness below).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from macula.config import STATIONS_ENV
from tools.harness.config_formats import ConfigFormat, JsonFormat, TomlFormat, YamlFormat
from tools.harness.http_register import is_our_http_entry

ENTRY_NAME = "macula"
ENV_KEYS = frozenset({STATIONS_ENV})  # the only variables register writes
GOOSE_TIMEOUT_S = 300  # goose's own default for a stdio extension
# Gemini CLI's own default for a session's requests (connect included); stated in the entry
# because `gemini mcp list` otherwise gives a server 5 s to start and calls a slower start
# "Disconnected" (MCP_LIST_DEFAULT_TIMEOUT_MSEC vs MCP_DEFAULT_TIMEOUT_MSEC in its bundle)
GEMINI_TIMEOUT_MS = 600_000


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    if not home:
        raise ValueError("HOME is not set: cannot find the harnesses' configuration")
    return Path(home)


def _xdg_config(env: Mapping[str, str]) -> Path:
    configured = env.get("XDG_CONFIG_HOME")
    return Path(configured) if configured else _home(env) / ".config"


@dataclass(frozen=True)
class Harness:
    name: str  # what --harness takes
    title: str
    locate: Callable[[Mapping[str, str], str], Path]  # (env, platform) -> configuration file
    format: ConfigFormat
    build: Callable[[list[str], dict[str, str]], dict[str, Any]]  # (command, env) -> entry
    command_of: Callable[[Mapping[str, Any]], tuple[list[str], dict[str, str]] | None]
    executables: tuple[str, ...] = ()  # on PATH counts as present
    marker_dirs: Callable[[Mapping[str, str], str], list[Path]] = lambda env, platform: []

    def config_path(self, env: Mapping[str, str], platform: str) -> Path:
        return self.locate(env, platform)

    def present(self, env: Mapping[str, str], platform: str) -> str | None:
        """Why this harness counts as installed (a path or an executable), or ``None``."""
        path = self.config_path(env, platform)
        for candidate in (path, path.parent, *self.marker_dirs(env, platform)):
            if candidate.exists() and candidate != _home(env):
                return str(candidate)
        for executable in self.executables:
            found = shutil.which(executable, path=env.get("PATH", ""))
            if found:
                return found
        return None

    def is_ours(self, entry: Any) -> bool:
        if not isinstance(entry, Mapping):
            return False
        if is_our_http_entry(self.name, entry):  # register --http's (tools.harness.http_register)
            return True
        parsed = self.command_of(entry)
        if parsed is None:
            return False
        command, environment = parsed
        return (
            is_macula_command(command)
            and set(environment) <= ENV_KEYS
            and dict(entry) == self.build(command, environment)
        )


def is_macula_command(command: list[str]) -> bool:
    """``/abs/macula-mcp [attach]`` or ``/abs/python -m tools.cli [attach]``."""
    if not command or not PurePath(command[0]).is_absolute():
        return False
    if PurePath(command[0]).name == "macula-mcp":
        rest = command[1:]
    elif command[1:3] == ["-m", "tools.cli"]:
        rest = command[3:]
    else:
        return False
    return rest in ([], ["attach"])


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _string_map(value: Any) -> dict[str, str] | None:
    if value is None:
        return {}
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    return None


def _mcp_servers_entry(with_type: bool) -> Callable[[list[str], dict[str, str]], dict[str, Any]]:
    def build(command: list[str], environment: dict[str, str]) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "stdio"} if with_type else {}
        entry.update(command=command[0], args=command[1:])
        if environment or with_type:
            entry["env"] = dict(environment)
        return entry

    return build


def _mcp_servers_command(entry: Mapping[str, Any]) -> tuple[list[str], dict[str, str]] | None:
    command, args, environment = entry.get("command"), entry.get("args", []), entry.get("env")
    env = _string_map(environment)
    if not isinstance(command, str) or not _strings(args) or env is None:
        return None
    return [command, *args], env


def _gemini_entry(command: list[str], environment: dict[str, str]) -> dict[str, Any]:
    entry = _mcp_servers_entry(with_type=False)(command, environment)
    entry["timeout"] = GEMINI_TIMEOUT_MS
    return entry


def _opencode_entry(command: list[str], environment: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "local", "command": list(command)}
    if environment:
        entry["environment"] = dict(environment)
    return entry


def _opencode_command(entry: Mapping[str, Any]) -> tuple[list[str], dict[str, str]] | None:
    command, env = entry.get("command"), _string_map(entry.get("environment"))
    if not _strings(command) or not command or env is None:
        return None
    return list(command), env


def _goose_entry(command: list[str], environment: dict[str, str]) -> dict[str, Any]:
    return {
        "enabled": True,
        "type": "stdio",
        "name": ENTRY_NAME,
        "description": "Macula agent mesh",
        "cmd": command[0],
        "args": command[1:],
        "envs": dict(environment),
        "timeout": GOOSE_TIMEOUT_S,
    }


def _goose_command(entry: Mapping[str, Any]) -> tuple[list[str], dict[str, str]] | None:
    cmd, args, env = entry.get("cmd"), entry.get("args", []), _string_map(entry.get("envs"))
    if not isinstance(cmd, str) or not _strings(args) or env is None:
        return None
    return [cmd, *args], env


def _opencode_servers(root: Mapping[str, Any]) -> tuple[str, ...]:
    """opencode 2 nests servers under ``mcp.servers``; 1.x puts them directly under ``mcp``.
    Follow the file: nested only when ``mcp.servers`` is already there as a map of servers."""
    mcp = root.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, Mapping) else None
    if isinstance(servers, Mapping) and "type" not in servers:
        return ("mcp", "servers")
    return ("mcp",)


def _claude_code_file(env: Mapping[str, str], platform: str) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) / ".claude.json" if configured else _home(env) / ".claude.json"


def _opencode_file(env: Mapping[str, str], platform: str) -> Path:
    folder = _xdg_config(env) / "opencode"
    for name in ("opencode.json", "opencode.jsonc"):
        if (folder / name).exists():
            return folder / name
    return folder / "opencode.json"


def _claude_desktop_file(env: Mapping[str, str], platform: str) -> Path:
    if platform == "darwin":
        return _home(env) / "Library/Application Support/Claude/claude_desktop_config.json"
    return _xdg_config(env) / "Claude" / "claude_desktop_config.json"


def _codex_file(env: Mapping[str, str], platform: str) -> Path:
    configured = env.get("CODEX_HOME")
    return (Path(configured) if configured else _home(env) / ".codex") / "config.toml"


def _gemini_file(env: Mapping[str, str], platform: str) -> Path:
    configured = env.get("GEMINI_CLI_HOME")  # replaces HOME; the .gemini folder stays
    return (Path(configured) if configured else _home(env)) / ".gemini" / "settings.json"


def _vscode_file(env: Mapping[str, str], platform: str) -> Path:
    if platform == "darwin":
        return _home(env) / "Library/Application Support/Code/User/mcp.json"
    return _xdg_config(env) / "Code" / "User" / "mcp.json"


def _mcp_servers_harness(
    name: str,
    title: str,
    locate: Callable[[Mapping[str, str], str], Path],
    *,
    with_type: bool = False,
    executables: tuple[str, ...] = (),
    marker_dirs: Callable[[Mapping[str, str], str], list[Path]] = lambda env, platform: [],
) -> Harness:
    """A harness whose JSON file holds its servers in a root ``mcpServers`` map:
    {name: {"command", "args", "env"}} (and "type": "stdio" with ``with_type``)."""
    return Harness(
        name=name,
        title=title,
        locate=locate,
        format=JsonFormat(lambda root: ("mcpServers",), jsonc=False),
        build=_mcp_servers_entry(with_type=with_type),
        command_of=_mcp_servers_command,
        executables=executables,
        marker_dirs=marker_dirs,
    )


HARNESSES: tuple[Harness, ...] = (
    # Claude Code: user scope lives in the root ``mcpServers`` of ~/.claude.json (local scope is
    # projects[<path>].mcpServers of the same file; project scope is .mcp.json), or of
    # $CLAUDE_CONFIG_DIR/.claude.json when that is set. Entries as `claude mcp add` writes them:
    # {"type": "stdio", "command", "args", "env"}. Sources: code.claude.com/docs/en/mcp via
    # developersdigest.tech/mcp-servers/clients/claude-code; anthropics/claude-code issues 4193
    # (a maintainer: "User config: ~/.claude.json") and 48448 (CLAUDE_CONFIG_DIR/.claude.json).
    _mcp_servers_harness(
        "claude-code",
        "Claude Code",
        _claude_code_file,
        with_type=True,
        executables=("claude",),
        marker_dirs=lambda env, platform: [
            Path(env.get("CLAUDE_CONFIG_DIR") or _home(env) / ".claude")
        ],
    ),
    # Claude Desktop: macOS ~/Library/Application Support/Claude/claude_desktop_config.json
    # (Windows %APPDATA%\Claude). There is no official Linux build; community builds use
    # $XDG_CONFIG_HOME/Claude/claude_desktop_config.json. {"mcpServers": {name: {"command",
    # "args", "env"}}}. Sources: modelcontextprotocol.io quickstart via
    # github.com/confluentinc/mcp-confluent docs/configuring-claude-desktop.md;
    # app.unpkg.com/@sigyl-dev/cli src/lib/claude-config.ts (linux path).
    _mcp_servers_harness("claude-desktop", "Claude Desktop", _claude_desktop_file),
    # Cursor: global ~/.cursor/mcp.json (project: .cursor/mcp.json), both platforms;
    # {"mcpServers": {name: {"command", "args", "env"}}}. Sources: cursor.com/docs/mcp via
    # developersdigest.tech/mcp-servers/clients/cursor; mcpbundles.com/guides/cursor.
    _mcp_servers_harness(
        "cursor", "Cursor", lambda env, platform: _home(env) / ".cursor" / "mcp.json"
    ),
    # Windsurf (Cascade): ~/.codeium/windsurf/mcp_config.json on macOS and Linux;
    # {"mcpServers": {name: {"command", "args", "env"}}} (remote ones use "serverUrl").
    # Sources: docs.windsurf.com/windsurf/cascade/mcp via confluentinc/mcp-confluent
    # docs/configuring-windsurf.md; docs.rs lorum docs/tools/windsurf.md.
    _mcp_servers_harness(
        "windsurf",
        "Windsurf",
        lambda env, platform: _home(env) / ".codeium" / "windsurf" / "mcp_config.json",
    ),
    # opencode: global ~/.config/opencode/opencode.json or .jsonc (JSON with comments), XDG on
    # both platforms. 1.x: "mcp": {name: {"type": "local", "command": [argv...],
    # "environment": {...}}}; 2.x nests them under "mcp.servers" and has no "enabled" field, and
    # both reject unknown fields (additionalProperties: false), so the entry carries only these.
    # Sources: opencode.ai/docs/mcp-servers (thdxr.dev.opencode.ai mirror),
    # opencode.ai/v2/docs/mcp-servers, gitlab.com/gitlab-org/orbit/knowledge-graph MR 1302.
    Harness(
        name="opencode",
        title="opencode",
        locate=_opencode_file,
        format=JsonFormat(_opencode_servers, jsonc=True),
        build=_opencode_entry,
        command_of=_opencode_command,
    ),
    # Goose: ~/.config/goose/config.yaml on macOS and Linux (Windows %APPDATA%\Block\goose\
    # config); "extensions": {key: {enabled, type: stdio, name, cmd, args, envs, timeout,
    # description}} (enabled sits beside the flattened ExtensionConfig). Sources:
    # block.github.io/goose/docs/guides/config-files; github.com/dyoshikawa/rulesync issue 1114;
    # goose's openapi ExtensionConfigOneOf1 (stdio: cmd, args, envs, env_keys, timeout).
    Harness(
        name="goose",
        title="Goose",
        locate=lambda env, platform: _xdg_config(env) / "goose" / "config.yaml",
        format=YamlFormat(("extensions",)),
        build=_goose_entry,
        command_of=_goose_command,
    ),
    # Codex CLI: ~/.codex/config.toml, or $CODEX_HOME/config.toml, on both platforms; servers
    # are [mcp_servers.NAME] tables {command, args, env, ...}, which `codex mcp add` writes and
    # `codex mcp list` reads. Sources: developers.openai.com/codex/mcp and config reference;
    # checked against @openai/codex 0.171.0 here (`codex mcp add`, `codex mcp list --json`).
    Harness(
        name="codex",
        title="Codex CLI",
        locate=_codex_file,
        format=TomlFormat(("mcp_servers",)),
        build=_mcp_servers_entry(with_type=False),
        command_of=_mcp_servers_command,
    ),
    # Gemini CLI: ~/.gemini/settings.json ($GEMINI_CLI_HOME replaces HOME), read through
    # strip-json-comments, so JSON with comments; "mcpServers": {name: {command, args, env}} as
    # `gemini mcp add -s user` writes it, plus "timeout" (see GEMINI_TIMEOUT_MS). Sources: the
    # package's docs/reference/configuration.md and docs/tools/mcp-server.md; checked against
    # @google/gemini-cli 0.61.0 here.
    Harness(
        name="gemini",
        title="Gemini CLI",
        locate=_gemini_file,
        format=JsonFormat(lambda root: ("mcpServers",), jsonc=True),
        build=_gemini_entry,
        command_of=_mcp_servers_command,
    ),
    # VS Code: the user profile's mcp.json (~/.config/Code/User on Linux, XDG_CONFIG_HOME
    # honoured; ~/Library/Application Support/Code/User on macOS), JSON with comments;
    # "servers": {name: {"type": "stdio", "command", "args", "env"}}. Source:
    # code.visualstudio.com/docs/agents/reference/mcp-configuration.
    Harness(
        name="vscode",
        title="VS Code",
        locate=_vscode_file,
        format=JsonFormat(lambda root: ("servers",), jsonc=True),
        build=_mcp_servers_entry(with_type=True),
        command_of=_mcp_servers_command,
    ),
)

BY_NAME: dict[str, Harness] = {harness.name: harness for harness in HARNESSES}
