"""Every ``MACULA_*`` variable that only the MCP server (``tools/``) reads is named and parsed here.

The library's and the station's own variables (``MACULA_HOME``, ``MACULA_MESH_STATIONS``, the
agent's ``MACULA_MCP_*``...) are named and parsed in ``macula.config``; no other module of
``macula/``, ``relay/`` or ``tools/`` writes a ``MACULA_`` name (``tests/unit/
test_settings_shape.py`` checks).

Invariants:
- light: the standard library only at import, as ``attach`` and the daemon CLI, which read
  their settings without the mesh library; so the library names that path needs (``PREFIX``,
  ``HOME_ENV``, ``DEFAULT_HOME``, ``STATIONS_ENV``) are restated here, and a unit test keeps
  them equal to ``macula.config``'s. A reader that raises the library's ``ConfigError``
  imports it where it runs.
- every bad value is an error whose message starts with the variable at fault: a
  ``DaemonSettingError`` (daemon, attach), else a ``ConfigError``.
- ``home_dir`` mirrors ``macula.config.macula_home`` on the light path (a unit test keeps
  them equal); ``socket_path`` is the daemon's socket, ``$MACULA_HOME/daemon/mcp.sock`` or
  ``MACULA_MCP_SOCKET``, checked to fit ``AF_UNIX`` (too long: a ``SocketSetupError`` naming
  ``MACULA_MCP_SOCKET``).
- ``home_port`` is stable for one home's path and spread over ``HOME_PORTS`` (below Linux's
  ephemeral range), so two homes almost never ask for the same port; a taken port is handled
  by the caller (``tools.local_station.station``: it then listens on a free one and records it).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

# the library's, restated for the light path (macula.config; a unit test keeps them equal)
PREFIX: Final = "MACULA_"
HOME_ENV: Final = "MACULA_HOME"
DEFAULT_HOME: Final = "~/.macula"
STATIONS_ENV: Final = "MACULA_MESH_STATIONS"

# the server's shape and log
TERSE_TOOLS_ENV: Final = "MACULA_MCP_TERSE_TOOLS"  # 1: terse tool descriptions
LOG_LEVEL_ENV: Final = "MACULA_MCP_LOG_LEVEL"
# pushes into the session (tools.server.channel)
CHANNEL_ENV: Final = "MACULA_MCP_CHANNEL"
CHANNEL_PER_MIN_ENV: Final = "MACULA_MCP_CHANNEL_PER_MIN"
CHANNEL_BURST_ENV: Final = "MACULA_MCP_CHANNEL_BURST"
CHANNEL_MAX_CHARS_ENV: Final = "MACULA_MCP_CHANNEL_MAX_CHARS"
CHANNEL_QUEUE_ENV: Final = "MACULA_MCP_CHANNEL_QUEUE"
# the daemon sessions attach to (tools.daemon.command*, tools.daemon.attach)
SOCKET_ENV: Final = "MACULA_MCP_SOCKET"
DAEMON_PREFIX: Final = "MACULA_MCP_DAEMON_"
HTTP_PREFIX: Final = "MACULA_MCP_HTTP_"
DAEMON_START_ENV: Final = "MACULA_MCP_DAEMON_START_S"
DAEMON_IDLE_ENV: Final = "MACULA_MCP_DAEMON_IDLE_S"
DAEMON_MAX_LINE_ENV: Final = "MACULA_MCP_DAEMON_MAX_LINE"
DAEMON_LOG_BYTES_ENV: Final = "MACULA_MCP_DAEMON_LOG_BYTES"
DAEMON_LOG_FILES_ENV: Final = "MACULA_MCP_DAEMON_LOG_FILES"
HTTP_PORT_ENV: Final = "MACULA_MCP_HTTP_PORT"  # the console and /mcp; 0 or unset: a free port
HTTP_MAX_SESSIONS_ENV: Final = "MACULA_MCP_HTTP_MAX_SESSIONS"  # /mcp sessions open at once
# the A2A door (tools.a2a.door): always on the loopback listener; HOST:PORT serves it (and only
# it) there too, beyond loopback (the explicit flag); URL is the base the Agent Cards name
A2A_LISTEN_ENV: Final = "MACULA_MCP_HTTP_A2A_LISTEN"
A2A_URL_ENV: Final = "MACULA_MCP_HTTP_A2A_URL"
# the local station macula-mcp starts when none is configured (tools.local_station.station)
LOCAL_STATION_PORT_ENV: Final = "MACULA_MCP_LOCAL_STATION_PORT"
LOCAL_STATION_TIMEOUT_ENV: Final = "MACULA_MCP_LOCAL_STATION_TIMEOUT_S"
LOCAL_STATION_LOG_BYTES_ENV: Final = "MACULA_MCP_LOCAL_STATION_LOG_BYTES"
LOCAL_STATION_IDLE_ENV: Final = "MACULA_MCP_LOCAL_STATION_IDLE_S"
LOCAL_STATION_CHECK_ENV: Final = "MACULA_MCP_LOCAL_STATION_CHECK_S"  # tests shorten it
# set (never read) for each run of a served command (tools.groups.serve_gate)
CALLER_ENV: Final = "MACULA_CALLER"
PROCEDURE_ENV: Final = "MACULA_PROCEDURE"
REALM_ENV: Final = "MACULA_REALM"

DEFAULT_LOG_LEVEL: Final = "INFO"
DEFAULT_START_S: Final = 30.0
DEFAULT_IDLE_S: Final = 24 * 3600.0
DEFAULT_MAX_LINE: Final = 64 * 1024 * 1024  # bytes of one MCP message on the socket
DEFAULT_LOG_BYTES: Final = 1024 * 1024
DEFAULT_LOG_FILES: Final = 3
DEFAULT_HTTP_MAX_SESSIONS: Final = 64
MAX_HTTP_MAX_SESSIONS: Final = 1024  # each holds a server and an event store in memory
DEFAULT_LOCAL_IDLE_S: Final = 6 * 3600.0
DEFAULT_LOCAL_CHECK_S: Final = 2.0
HOME_PORTS: Final = range(20000, 30000)  # below Linux's ephemeral range (32768-60999)
DEFAULT_LOCAL_TIMEOUT_S: Final = 10.0
DEFAULT_LOCAL_LOG_BYTES: Final = 1 << 20


def terse_tools(env: Mapping[str, str]) -> bool:
    """Whether ``MACULA_MCP_TERSE_TOOLS`` asks for terse tool descriptions (exactly "1")."""
    return terse_text(env) == "1"


def terse_text(env: Mapping[str, str]) -> str:
    """``MACULA_MCP_TERSE_TOOLS`` as given ("0" when unset): part of a server's shape."""
    return env.get(TERSE_TOOLS_ENV, "0")


def log_level(env: Mapping[str, str], default: str = DEFAULT_LOG_LEVEL) -> str:
    """The logging level ``MACULA_MCP_LOG_LEVEL`` names (``default`` when unset), upper-cased."""
    return env.get(LOG_LEVEL_ENV, default).upper()


def channel_text(env: Mapping[str, str]) -> str:
    """``MACULA_MCP_CHANNEL`` as given, "1" when unset or blank: part of a server's shape."""
    return env.get(CHANNEL_ENV, "1").strip() or "1"


# -- the daemon ----------------------------------------------------------------------------------

SOCKET_DIR: Final = "daemon"
SOCKET_NAME: Final = "mcp.sock"
# sun_path holds 108 bytes on Linux, 104 on the BSDs and macOS, NUL included
MAX_SOCKET_PATH: Final = 107 if sys.platform.startswith("linux") else 103


class SocketSetupError(Exception):
    """The socket cannot be placed or claimed (message names the setting to change)."""


def home_dir(env: Mapping[str, str]) -> Path:
    raw = env.get(HOME_ENV)
    if raw is not None and (not raw.strip() or "\x00" in raw):
        raise SocketSetupError(f"{HOME_ENV} is set but empty or contains NUL: fix or unset it")
    try:
        home = Path(raw if raw is not None else DEFAULT_HOME).expanduser().absolute()
    except RuntimeError as exc:
        raise SocketSetupError(f"{HOME_ENV}: cannot expand it: {exc}") from None
    if home.exists() and not home.is_dir():
        raise SocketSetupError(f"{HOME_ENV}: {home} exists and is not a directory")
    return home


def socket_path(env: Mapping[str, str]) -> Path:
    """The daemon's socket for this environment, checked to fit ``AF_UNIX``."""
    raw = env.get(SOCKET_ENV)
    if raw is not None:
        if not raw.strip() or "\x00" in raw:
            raise SocketSetupError(f"{SOCKET_ENV} is set but empty or contains NUL")
        path = Path(raw).expanduser().absolute()
    else:
        path = home_dir(env) / SOCKET_DIR / SOCKET_NAME
    check_length(path)
    return path


def check_length(path: Path) -> None:
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise SocketSetupError(
            f"the daemon's socket path {path} is {size} bytes, longer than a Unix socket allows "
            f"here ({MAX_SOCKET_PATH}): set {SOCKET_ENV} to a shorter path, e.g. "
            f"/tmp/macula-{os.getuid()}/mcp.sock (or use a shorter {HOME_ENV})"
        )


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


def daemon_start_s(env: Mapping[str, str]) -> float:
    """How long ``attach`` waits for a daemon it started (``MACULA_MCP_DAEMON_START_S``)."""
    raw = env.get(DAEMON_START_ENV)
    if raw is None:
        return DEFAULT_START_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise DaemonSettingError(f"{DAEMON_START_ENV} must be seconds in (0, 3600], not {raw!r}")
    return value


@dataclass(frozen=True)
class DaemonSettings:
    """The daemon's settings (``home`` and ``socket``: ``home_dir`` and ``socket_path``)."""

    home: Path
    socket: Path
    idle_timeout: float
    max_line: int
    log_bytes: int
    log_files: int
    http_port: int = 0
    http_max_sessions: int = DEFAULT_HTTP_MAX_SESSIONS
    a2a: A2ASettings = field(default_factory=lambda: A2ASettings())

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DaemonSettings:
        return cls(
            home=home_dir(env),
            socket=socket_path(env),
            idle_timeout=_number(env, DAEMON_IDLE_ENV, DEFAULT_IDLE_S, 0.01, 10 * 365 * 86400.0),
            max_line=int(_number(env, DAEMON_MAX_LINE_ENV, DEFAULT_MAX_LINE, 4096, 2**31)),
            log_bytes=int(_number(env, DAEMON_LOG_BYTES_ENV, DEFAULT_LOG_BYTES, 4096, 2**31)),
            log_files=int(_number(env, DAEMON_LOG_FILES_ENV, DEFAULT_LOG_FILES, 1, 100)),
            http_port=_port(env, HTTP_PORT_ENV),
            http_max_sessions=_count(
                env, HTTP_MAX_SESSIONS_ENV, DEFAULT_HTTP_MAX_SESSIONS, MAX_HTTP_MAX_SESSIONS
            ),
            a2a=A2ASettings.from_env(env),
        )

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "daemon.log"


# -- the local station ---------------------------------------------------------------------------


def home_port(home: Path) -> int:
    """The port this home's local station asks for first: stable for one home's path, and
    almost never another home's."""
    digest = hashlib.sha256(str(home.absolute()).encode()).digest()
    return HOME_PORTS[int.from_bytes(digest[:4], "big") % len(HOME_PORTS)]


@dataclass(frozen=True)
class LocalStationSettings:
    port: int
    timeout_s: float
    log_bytes: int
    idle_s: float = DEFAULT_LOCAL_IDLE_S
    check_s: float = DEFAULT_LOCAL_CHECK_S


def local_station_settings(env: Mapping[str, str]) -> LocalStationSettings:
    """The local station's settings; ``ConfigError`` naming a bad one."""
    from macula.config import macula_home
    from macula.errors import ConfigError

    def number(name: str, kind: type[int] | type[float], default: float, low: float) -> float:
        text = env.get(name, "").strip()
        if not text:
            return default
        try:
            value = kind(text)
        except ValueError:
            raise ConfigError(f"{name}={text[:40]!r} is not a number") from None
        if value < low:
            raise ConfigError(f"{name} must be >= {low}, got {text[:40]}")
        return value

    port = int(number(LOCAL_STATION_PORT_ENV, int, home_port(macula_home(env)), 0))
    if port > 65535:
        raise ConfigError(
            f"{LOCAL_STATION_PORT_ENV} must be 0..65535 (0: any free port), got {port}"
        )
    timeout_s = number(LOCAL_STATION_TIMEOUT_ENV, float, DEFAULT_LOCAL_TIMEOUT_S, 0.1)
    log_bytes = int(number(LOCAL_STATION_LOG_BYTES_ENV, int, DEFAULT_LOCAL_LOG_BYTES, 1024))
    idle_s = number(LOCAL_STATION_IDLE_ENV, float, DEFAULT_LOCAL_IDLE_S, 1.0)
    check_s = number(LOCAL_STATION_CHECK_ENV, float, DEFAULT_LOCAL_CHECK_S, 0.05)
    return LocalStationSettings(port, timeout_s, log_bytes, idle_s, check_s)


# -- the channel ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelSettings:
    """What ``tools.server.channel`` pushes into a session, and how often."""

    enabled: int = 1
    per_minute: float = 6.0
    burst: int = 3
    max_chars: int = 300
    queue: int = 100

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ChannelSettings:
        from macula.errors import ConfigError

        enabled = channel_text(env)
        if enabled not in ("0", "1"):
            raise ConfigError(f"{CHANNEL_ENV} must be 0 or 1, not {enabled!r}")
        return cls(
            enabled=int(enabled),
            per_minute=_channel_number(env, CHANNEL_PER_MIN_ENV, cls.per_minute, 0.01, 6000),
            burst=int(_channel_number(env, CHANNEL_BURST_ENV, cls.burst, 1, 1000, integer=True)),
            max_chars=int(
                _channel_number(env, CHANNEL_MAX_CHARS_ENV, cls.max_chars, 40, 8000, integer=True)
            ),
            queue=int(_channel_number(env, CHANNEL_QUEUE_ENV, cls.queue, 1, 100_000, integer=True)),
        )


def _channel_number(
    env: Mapping[str, str],
    name: str,
    default: float,
    low: float,
    high: float,
    *,
    integer: bool = False,
) -> float:
    from macula.errors import ConfigError

    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind} in [{low:g}, {high:g}], not {raw!r}")
    return value


# -- the A2A door ----------------------------------------------------------------------------


@dataclass(frozen=True)
class A2ASettings:
    """Where the A2A door is served beyond loopback (``listen``: host and port, or None: only on
    the loopback listener) and the base URL its Agent Cards name (None: the URL asked for)."""

    listen: tuple[str, int] | None = None
    public_url: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> A2ASettings:
        raw = env.get(A2A_LISTEN_ENV, "").strip()
        listen: tuple[str, int] | None = None
        if raw:
            host, _, port = raw.rpartition(":")
            host = host.strip("[]")
            if not host or not port.isdecimal() or not 0 < int(port) <= 65535:
                raise DaemonSettingError(
                    f"{A2A_LISTEN_ENV} must be HOST:PORT (e.g. 0.0.0.0:8443), not {raw!r}"
                )
            listen = (host, int(port))
        url = env.get(A2A_URL_ENV, "").strip().rstrip("/") or None
        if url is not None and not url.startswith(("https://", "http://")):
            raise DaemonSettingError(
                f"{A2A_URL_ENV} must be an http(s) URL (e.g. https://agents.example.org), "
                f"not {url!r}"
            )
        return cls(listen, url)
