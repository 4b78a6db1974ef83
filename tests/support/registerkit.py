"""Configuration texts of every harness ``register`` knows, for its unit and end-to-end tests:
realistic ones (other servers, comments where the format has them, unusual indentation) and
malformed ones; a temporary HOME's environment, and placing a config where a harness reads it."""

from __future__ import annotations

from pathlib import Path

from tools.harness.harnesses import Harness
from tools.harness.register import Options

# Realistic content: other servers, comments where the format has them, unusual indentation.
EXISTING: dict[str, str] = {
    "claude-code": (
        "{\n"
        '    "numStartups": 41,\n'
        '    "projects": {\n'
        '        "/home/me/src/app": {"mcpServers": {"local-db": {"command": "db-mcp"}}}\n'
        "    },\n"
        '    "mcpServers": {\n'
        '        "github": {"type": "stdio", "command": "npx", "args": ["-y", "gh"], "env": {}}\n'
        "    },\n"
        '    "oauthAccount": {"emailAddress": "me@example.org"}\n'
        "}\n"
    ),
    "claude-desktop": (
        '{\r\n\t"mcpServers": {\r\n\t\t"filesystem": {\r\n\t\t\t"command": "npx",\r\n'
        '\t\t\t"args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me"]\r\n'
        '\t\t}\r\n\t},\r\n\t"globalShortcut": "Ctrl+Space"\r\n}'
    ),
    "cursor": '{"mcpServers": {"browser": {"command": "npx", "args": ["@playwright/mcp"]}}}\n',
    "windsurf": (
        '{\n   "mcpServers": {\n      "zapier": {"serverUrl": "https://actions.example/sse"},\n'
        '      "git": {"command": "uvx", "args": ["mcp-server-git"], "disabled": true}\n'
        "   }\n}\n"
    ),
    "opencode": (
        "{\n"
        "  // opencode: my global settings\n"
        '  "$schema": "https://opencode.ai/config.json",\n'
        '  "theme": "tokyonight",\n'
        '  "mcp": {\n'
        '    "fs": {"type": "local", "command": ["npx", "fs"]}, // the filesystem\n'
        "    /* a remote one */\n"
        '    "docs": {"type": "remote", "url": "https://docs.example/mcp"},\n'
        "  },\n"
        "}\n"
    ),
    "goose": (
        "# goose configuration, edited by hand\n"
        "GOOSE_PROVIDER: anthropic   # the provider\n"
        "GOOSE_MODEL: claude-sonnet-4\n"
        "extensions:\n"
        "    developer:\n"
        "        bundled: true\n"
        "        enabled: true      # keep this one on\n"
        "        name: developer\n"
        "        timeout: 300\n"
        "        type: builtin\n"
        "    github:\n"
        "        args:\n"
        "        - -y\n"
        '        - "@modelcontextprotocol/server-github"\n'
        "        cmd: npx\n"
        "        enabled: false\n"
        "        envs: {}\n"
        "        type: stdio\n"
        "GOOSE_MODE: smart_approve\n"
    ),
}

EXISTING.update(
    {
        "codex": (
            "# Codex: my settings\n"
            'model = "gpt-5-codex"  # the default model\n'
            'approval_policy = "on-request"\n'
            "\n"
            "[mcp_servers.github]\n"
            'command = "npx"\n'
            'args = ["-y", "@modelcontextprotocol/server-github"]\n'
            "\n"
            "[mcp_servers.github.env]  # its token comes from the shell\n"
            'GITHUB_HOST = "github.example"\n'
            "\n"
            "[profiles.fast]\n"
            'model = "o4-mini"\n'
        ),
        "gemini": (
            "{\n"
            "  // Gemini CLI: chosen with /auth\n"
            '  "security": {"auth": {"selectedType": "oauth-personal"}},\n'
            '  "mcpServers": {\n'
            '    "notes": {"command": "/opt/notes/bin/notes-mcp", "args": [], "trust": false}\n'
            "  },\n"
            '  "ui": {"theme": "GitHub"}\n'
            "}\n"
        ),
        "vscode": (
            "{\n"
            "\t// VS Code: MCP: Open User Configuration\n"
            '\t"servers": {\n'
            '\t\t"playwright": {"type": "stdio", "command": "npx", "args": ["@playwright/mcp"]},\n'
            '\t\t"docs": {"type": "http", "url": "https://docs.example/mcp"}, // remote\n'
            "\t},\n"
            '\t"inputs": []\n'
            "}\n"
        ),
    }
)

MALFORMED: dict[str, str] = {
    "claude-code": '{"mcpServers": {"github": {"command": "npx",}}}',  # trailing comma: not JSON
    "claude-desktop": '{"mcpServers": {\n  "a": {"command": "x"}\n',
    "cursor": '{"mcpServers": {"a": {"command": "x"}} // a comment\n}',
    "windsurf": "[1, 2]",
    "opencode": '{\n  "mcp": {"fs": {"type": "local" "command": ["x"]}}\n}',
    "goose": "extensions:\n  developer: {enabled: true\n  github: [\n",
    "codex": '[mcp_servers.github\ncommand = "npx"\n',
    "gemini": '{"mcpServers": {"notes": {"command": "notes-mcp"}}\n',
    "vscode": '{"servers": {"a": {"command" "x"}}}',
}


MACULA = "/opt/macula/bin/macula-mcp"


def environment(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PATH": ""}


def options(tmp_path: Path, **kw: object) -> Options:
    return Options(environment(tmp_path), "linux", now=1_700_000_000.0, **kw)  # type: ignore[arg-type]


def place(harness: Harness, opts: Options, text: str | None, mode: int = 0o644) -> Path:
    path = harness.config_path(opts.env, opts.platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_bytes(text.encode())
        path.chmod(mode)
    return path


def text_of(path: Path) -> str:
    """The file's text exactly (``read_text`` would turn CRLF into LF)."""
    return path.read_bytes().decode()


def everything_beside(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.parent.iterdir() if p.is_file()}
