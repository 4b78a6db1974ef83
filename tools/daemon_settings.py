"""The daemon's settings, read from the environment (``tools.daemon`` and the daemon itself,
``tools.daemon_server``, both use them; a bad one raises ``DaemonSettingError`` naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.daemon_socket import home_dir, socket_path

IDLE_ENV: Final = "MACULA_MCP_DAEMON_IDLE_S"
DEFAULT_IDLE_S: Final = 24 * 3600.0
MAX_LINE_ENV: Final = "MACULA_MCP_DAEMON_MAX_LINE"
DEFAULT_MAX_LINE: Final = 64 * 1024 * 1024  # bytes of one MCP message on the socket
LOG_BYTES_ENV: Final = "MACULA_MCP_DAEMON_LOG_BYTES"
LOG_FILES_ENV: Final = "MACULA_MCP_DAEMON_LOG_FILES"
DEFAULT_LOG_BYTES: Final = 1024 * 1024
DEFAULT_LOG_FILES: Final = 3
HTTP_PORT_ENV: Final = "MACULA_MCP_HTTP_PORT"  # the console and /mcp; 0 or unset: a free port
HTTP_MAX_SESSIONS_ENV: Final = "MACULA_MCP_HTTP_MAX_SESSIONS"  # /mcp sessions open at once
DEFAULT_HTTP_MAX_SESSIONS: Final = 64
MAX_HTTP_MAX_SESSIONS: Final = 1024  # each holds a server and an event store in memory


class DaemonSettingError(ValueError):
    """A daemon setting out of range (message names the variable)."""


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise DaemonSettingError(f"{name} must be a number in [{low:g}, {high:g}], not {raw!r}")
    return value


def _port(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return 0
    if not raw.isdecimal() or int(raw) > 65535:
        raise DaemonSettingError(f"{name} must be a port number 0-65535 (0: any free), not {raw!r}")
    return int(raw)


def _count(env: Mapping[str, str], name: str, default: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdecimal() or not 1 <= int(raw) <= high:
        raise DaemonSettingError(f"{name} must be a whole number 1-{high}, not {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class DaemonSettings:
    home: Path
    socket: Path
    idle_timeout: float
    max_line: int
    log_bytes: int
    log_files: int
    http_port: int = 0
    http_max_sessions: int = DEFAULT_HTTP_MAX_SESSIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DaemonSettings:
        return cls(
            home=home_dir(env),
            socket=socket_path(env),
            idle_timeout=_number(env, IDLE_ENV, DEFAULT_IDLE_S, 0.01, 10 * 365 * 86400.0),
            max_line=int(_number(env, MAX_LINE_ENV, DEFAULT_MAX_LINE, 4096, 2**31)),
            log_bytes=int(_number(env, LOG_BYTES_ENV, DEFAULT_LOG_BYTES, 4096, 2**31)),
            log_files=int(_number(env, LOG_FILES_ENV, DEFAULT_LOG_FILES, 1, 100)),
            http_port=_port(env, HTTP_PORT_ENV),
            http_max_sessions=_count(
                env, HTTP_MAX_SESSIONS_ENV, DEFAULT_HTTP_MAX_SESSIONS, MAX_HTTP_MAX_SESSIONS
            ),
        )

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "daemon.log"
