"""The local station's settings: the port a home asks for first, and its environment variables.

Invariants:
- ``home_port`` is stable for one home's path and spread over ``HOME_PORTS`` (below Linux's
  ephemeral range), so two homes almost never ask for the same port; a taken port is handled
  by the caller (``tools.local_station``: it then listens on a free one and records it);
- ``settings`` fails with a ``ConfigError`` naming the variable and the bad value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.config import macula_home
from macula.errors import ConfigError

PORT_ENV: Final = "MACULA_MCP_LOCAL_STATION_PORT"
TIMEOUT_ENV: Final = "MACULA_MCP_LOCAL_STATION_TIMEOUT_S"
LOG_BYTES_ENV: Final = "MACULA_MCP_LOCAL_STATION_LOG_BYTES"
IDLE_ENV: Final = "MACULA_MCP_LOCAL_STATION_IDLE_S"
CHECK_ENV: Final = "MACULA_MCP_LOCAL_STATION_CHECK_S"  # how often it looks (tests shorten it)
DEFAULT_IDLE_S: Final = 6 * 3600.0
DEFAULT_CHECK_S: Final = 2.0
HOME_PORTS: Final = range(20000, 30000)  # below Linux's ephemeral range (32768-60999)
DEFAULT_TIMEOUT_S: Final = 10.0
DEFAULT_LOG_BYTES: Final = 1 << 20


def home_port(home: Path) -> int:
    """The port this home's local station asks for first: stable for one home's path, and
    almost never another home's."""
    digest = hashlib.sha256(str(home.absolute()).encode()).digest()
    return HOME_PORTS[int.from_bytes(digest[:4], "big") % len(HOME_PORTS)]


@dataclass(frozen=True)
class Settings:
    port: int
    timeout_s: float
    log_bytes: int
    idle_s: float = DEFAULT_IDLE_S
    check_s: float = DEFAULT_CHECK_S


def settings(env: Mapping[str, str]) -> Settings:
    """The local station's settings; ``ConfigError`` naming a bad one."""

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

    port = int(number(PORT_ENV, int, home_port(macula_home(env)), 0))
    if port > 65535:
        raise ConfigError(f"{PORT_ENV} must be 0..65535 (0: any free port), got {port}")
    timeout_s = number(TIMEOUT_ENV, float, DEFAULT_TIMEOUT_S, 0.1)
    log_bytes = int(number(LOG_BYTES_ENV, int, DEFAULT_LOG_BYTES, 1024))
    idle_s = number(IDLE_ENV, float, DEFAULT_IDLE_S, 1.0)
    check_s = number(CHECK_ENV, float, DEFAULT_CHECK_S, 0.05)
    return Settings(port, timeout_s, log_bytes, idle_s, check_s)
