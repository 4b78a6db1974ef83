"""The HTTP form of the ``macula`` entry (``register --http``, ``mcp-config --http``): the
daemon's ``http://127.0.0.1:PORT/mcp`` with ``Authorization: Bearer TOKEN``, for the harnesses
that connect to an MCP server over Streamable HTTP without spawning a process.

The shapes, per harness (checked with the search tool, Dec 2026):
- Claude Code: ``mcpServers.NAME = {"type": "http", "url", "headers"}``, as
  ``claude mcp add --transport http NAME URL --header "Authorization: Bearer ..."`` writes it
  (code.claude.com/docs/en/mcp; the shape as users report it in anthropics/claude-code issues
  48514 and 59467);
- Cursor: ``mcpServers.NAME = {"url", "headers"}`` in ``~/.cursor/mcp.json`` (cursor.com/docs/mcp,
  via docs.holistics.io/docs/ai/mcp-server/cursor and docs.apilayer.com's Cursor guide, which
  pass ``"Authorization": "Bearer ..."`` in ``headers``);
- VS Code: ``servers.NAME = {"type": "http", "url", "headers"}`` in the profile's ``mcp.json``
  (code.visualstudio.com/docs/copilot/reference/mcp-configuration).
The other harnesses register keeps the stdio form for (``register --http`` says so and fails
for them; register them without ``--http``).

Invariants:
- the entry is ours only when it is exactly what we write: a loopback ``http`` URL ending in
  ``/mcp`` and one ``Authorization: Bearer`` header of a token's shape;
- the token is a secret: ``redact`` replaces it in anything we print but the entry itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from macula.errors import ConfigError
from tools.daemon.http.guard import host_allowed
from tools.daemon.http.home_token import home_token, port_path
from tools.daemon.http.tokens import agent_token

HTTP_HARNESSES: Final = ("claude-code", "cursor", "vscode")
_TOKEN: Final = re.compile(r"Bearer [A-Za-z0-9_-]{43}")
_URL: Final = re.compile(r"http://([^/]+)/mcp")


@dataclass(frozen=True)
class HttpTarget:
    url: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def redact(self, text: str) -> str:
        return text.replace(self.token, "<token>")


def daemon_port(home: Path) -> int:
    """The port the home's daemon serves HTTP on (its port file), or ConfigError."""
    path = port_path(home)
    try:
        raw = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise ConfigError(
            f"{path} is missing: the daemon serves HTTP once started (`macula-mcp console`), "
            "or pass --port"
        ) from None
    if not raw.isdecimal() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{path} does not hold a port: restart the daemon")
    return int(raw)


def http_target(home: Path, agent: str | None = None, port: int | None = None) -> HttpTarget:
    """The daemon's ``/mcp`` and the token for ``agent`` (None: the home token)."""
    chosen = daemon_port(home) if port is None else port
    token = home_token(home) if agent is None else agent_token(home, agent)
    return HttpTarget(f"http://127.0.0.1:{chosen}/mcp", token)


def _typed(url: str, headers: dict[str, str]) -> dict[str, Any]:
    return {"type": "http", "url": url, "headers": dict(headers)}


def _untyped(url: str, headers: dict[str, str]) -> dict[str, Any]:
    return {"url": url, "headers": dict(headers)}


BUILDERS: Final[dict[str, Callable[[str, dict[str, str]], dict[str, Any]]]] = {
    "claude-code": _typed,
    "cursor": _untyped,
    "vscode": _typed,
}


def http_entry(harness: str, target: HttpTarget) -> dict[str, Any]:
    build = BUILDERS.get(harness)
    if build is None:
        raise ConfigError(
            f"{harness}: register writes only the stdio form for it; --http is for "
            f"{', '.join(HTTP_HARNESSES)}"
        )
    return build(target.url, target.headers)


def is_our_http_entry(harness: str, entry: Any) -> bool:
    """``entry`` is exactly what ``http_entry`` writes for some daemon port and token."""
    build = BUILDERS.get(harness)
    if build is None or not isinstance(entry, Mapping):
        return False
    url, headers = entry.get("url"), entry.get("headers")
    if not isinstance(url, str) or not isinstance(headers, Mapping):
        return False
    matched = _URL.fullmatch(url)
    auth = headers.get("Authorization")
    if matched is None or not host_allowed(matched.group(1)) or not isinstance(auth, str):
        return False
    return _TOKEN.fullmatch(auth) is not None and dict(entry) == build(url, {"Authorization": auth})


def mcp_config_http(target: HttpTarget) -> dict[str, Any]:
    """What ``mcp-config --http`` prints: Claude Code's shape (``.mcp.json``)."""
    return {"mcpServers": {"macula": _typed(target.url, target.headers)}}
