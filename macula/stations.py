"""Station addresses: ``host:port`` or ``node_id@host:port`` (IPv6 as ``[addr]:port``).

The pinned form makes the client check both the TLS certificate key and the HELLO node id
against ``node_id`` (PROTOCOL.md §1.2, §5.5).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from macula.errors import ConfigError

DEFAULT_PORT = 4433


@dataclass(frozen=True, slots=True)
class StationAddress:
    host: str
    port: int = DEFAULT_PORT
    node_id: bytes | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        pin = f"{self.node_id.hex()}@" if self.node_id else ""
        return f"{pin}{host}:{self.port}"


def parse_station(text: str, *, source: str = "station") -> StationAddress:
    """Parse one station address; ``ConfigError`` names ``source`` and the problem."""
    raw = text.strip()
    if raw.startswith("quic://"):
        raw = raw[len("quic://") :]
    node_id = None
    if "@" in raw:
        pin, raw = raw.split("@", 1)
        try:
            node_id = bytes.fromhex(pin)
        except ValueError:
            raise ConfigError(f"{source}: {text!r}: node id is not hex") from None
        if len(node_id) != 32:
            raise ConfigError(f"{source}: {text!r}: node id must be 64 hex characters")
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep:
            raise ConfigError(f"{source}: {text!r}: unclosed '[' in IPv6 address")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ConfigError(f"{source}: {text!r}: expected ':port' after ']'")
    else:
        host, _, port_text = raw.rpartition(":") if ":" in raw else (raw, "", "")
    if not host:
        raise ConfigError(f"{source}: {text!r}: missing host")
    port = DEFAULT_PORT
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"{source}: {text!r}: port must be 1..65535")
        port = int(port_text)
    return StationAddress(host, port, node_id)


def parse_station_list(text: str, *, source: str) -> list[StationAddress]:
    """Comma-separated station addresses; empty entries are an error, not silently skipped."""
    entries = [part.strip() for part in text.split(",")]
    if not text.strip():
        return []
    if any(not entry for entry in entries):
        raise ConfigError(f"{source}: empty entry in {text!r}")
    return [parse_station(entry, source=source) for entry in entries]


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address, bracketed or not (a name that resolves elsewhere is
    not): the one test behind the station's retry choice, the monitor's and the workers' and
    the daemon's loopback-only checks."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
