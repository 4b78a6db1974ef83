"""The default station on loopback, ``127.0.0.1:4433``: used only when it is this user's.

``macula-mcp`` without ``MACULA_MESH_STATIONS`` uses the station at ``DEFAULT_STATION`` or
starts an embedded one there. Anybody on the machine can bind that port first, so what
answers there is dialled pinned to a key this ``MACULA_HOME`` knows: the public part of
``$MACULA_HOME/embedded-station/station.key`` (the embedded station's) or
``$MACULA_HOME/station/station.key`` (``macula-relay``'s default data dir).

Invariants:
- a station answering at ``DEFAULT_STATION`` with one of those keys is returned pinned
  (``node_id@127.0.0.1:4433``), so a later reconnect refuses an impostor too;
- one answering with another key, or when this home has no station key to compare with, is
  refused (``ForeignStationError``, not retryable) naming the key it presented, the key(s)
  expected and their data dirs, and what to do; it is never used unpinned;
- nothing answering is ``None``: the caller may start its own station.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from macula.config import macula_home
from macula.errors import HandshakeError
from macula.known_stations import STATION_KEY_FILE, station_node_id
from macula.stations import StationAddress, parse_station
from macula.transport import client_configuration, dial

DEFAULT_STATION: Final = "127.0.0.1:4433"
EMBEDDED_DIR: Final = "embedded-station"  # the embedded station's data dir under MACULA_HOME
RELAY_DIR: Final = "station"  # macula-relay's default data dir under MACULA_HOME
PROBE_TIMEOUT_S: Final = 1.0


class ForeignStationError(HandshakeError):
    """The station at the default address is not this user's (message says what to do)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def embedded_data_dir(env: Mapping[str, str]) -> Path:
    return macula_home(env) / EMBEDDED_DIR


def own_station_keys(env: Mapping[str, str]) -> dict[bytes, Path]:
    """node id -> data dir, for each station key this ``MACULA_HOME`` holds."""
    home = macula_home(env)
    keys: dict[bytes, Path] = {}
    for data_dir in (home / EMBEDDED_DIR, home / RELAY_DIR):
        node_id = station_node_id(data_dir)
        if node_id is not None:
            keys.setdefault(node_id, data_dir)
    return keys


async def presented_key(address: StationAddress, timeout: float = PROBE_TIMEOUT_S) -> bytes | None:
    """The certificate key of whatever completes a QUIC handshake at ``address`` (``b""``
    when it shows no Ed25519 key), or None when nothing does."""
    try:
        async with dial(
            address.host, address.port, client_configuration(server_name=address.host),
            timeout=timeout,
        ) as protocol:  # fmt: skip
            return protocol.peer_certificate_key() or b""
    except (OSError, TimeoutError, ConnectionError):
        return None


def foreign_station(
    address: StationAddress, presented: bytes, expected: Mapping[bytes, Path], home: Path
) -> ForeignStationError:
    shown = presented.hex() if presented else "no Ed25519 key"
    use = (
        f"set MACULA_MESH_STATIONS={presented.hex()}@{address}"
        if presented
        else "set MACULA_MESH_STATIONS"
    )
    if expected:
        ours = " or ".join(
            f"{key.hex()} (from {data_dir / STATION_KEY_FILE})"
            for key, data_dir in expected.items()
        )
        return ForeignStationError(
            f"the station at {address} presented key {shown}, expected {ours}: another program, "
            f"perhaps another user's station, holds the port. Stop it so macula-mcp can start "
            f"its own, or, if you trust it, {use}"
        )
    return ForeignStationError(
        f"the station at {address} presented key {shown}, and this MACULA_HOME ({home}) has no "
        f"station key to check it against ({home / EMBEDDED_DIR / STATION_KEY_FILE} or "
        f"{home / RELAY_DIR / STATION_KEY_FILE}): it may be another user's. If you trust it, "
        f"{use}; otherwise stop it so macula-mcp can start its own"
    )


async def own_default_station(env: Mapping[str, str]) -> StationAddress | None:
    """The default station pinned to its key when it is this home's; None when nothing
    answers; ``ForeignStationError`` when something else does."""
    default = parse_station(DEFAULT_STATION)
    presented = await presented_key(default)
    if presented is None:
        return None
    expected = own_station_keys(env)
    if presented in expected:
        return StationAddress(default.host, default.port, presented)
    raise foreign_station(default, presented, expected, macula_home(env))
