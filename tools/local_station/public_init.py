"""``macula-mcp station init --public HOST``: the exact commands for a station that agents on
other machines share (docs/two-machines.md), run on the host that will carry the station.

Invariants:
- the station key is the one ``macula-relay`` uses: ``DATA_DIR/station.key`` (the data dir
  ``macula-relay`` defaults to, ``$MACULA_HOME/station``, unless ``--data-dir``); made here
  (0600, in a 0700 folder) when it does not exist yet, read when it does, so the pinned id
  printed is the station's real one, before and after it first starts;
- the line each laptop needs is ``MACULA_MESH_STATIONS=NODE_ID@HOST:PORT``, checked by the
  library's own parser (``macula.config.configured_stations``) before it is printed;
- nothing else is written; nothing is started.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from macula.config import HOME_ENV, STATIONS_ENV, configured_stations, macula_home
from macula.errors import ConfigError
from macula.keyfile import KeyFileError, load_or_create_identity
from macula.known_stations import STATION_KEY_FILE, station_node_id
from macula.stations import DEFAULT_PORT
from tools.local_station.station import (
    RELAY_DIR,  # macula-relay's default data dir under MACULA_HOME
)

UNSPECIFIED_HOSTS: Final = frozenset({"0.0.0.0", "::", "[::]", ""})


@dataclass(frozen=True)
class StationPlan:
    node_id: str
    made: int  # 1: the key was made now, 0: it was there
    key_file: Path
    relay_command: list[str]
    stations_line: str  # MACULA_MESH_STATIONS=NODE_ID@HOST:PORT

    def laptop_commands(self) -> list[str]:
        return [
            f"export {self.stations_line}",
            "uv run macula-mcp register --attach",
            "uv run macula-mcp doctor",
        ]


def _relay_program() -> str:
    """``macula-relay`` beside this interpreter (a checkout's .venv), else on PATH by name."""
    beside = Path(sys.executable).with_name("macula-relay")
    return str(beside) if beside.exists() else shutil.which("macula-relay") or "macula-relay"


def plan(
    public: str, port: int, bind: str, data_dir: Path | None, env: Mapping[str, str]
) -> StationPlan:
    """The station's key (made when missing) and the commands; ``ConfigError`` naming a bad
    argument."""
    if public.strip("[]") in UNSPECIFIED_HOSTS:
        raise ConfigError(f"--public {public!r}: the name or address the laptops dial, not a bind")
    if any(c.isspace() or c in "@/,=" for c in public):
        raise ConfigError(f"--public {public!r}: a host name or address, nothing else")
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: must be 1..65535")
    folder = data_dir if data_dir is not None else macula_home(env) / RELAY_DIR
    key_file = folder / STATION_KEY_FILE
    existed = station_node_id(folder) is not None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        identity = load_or_create_identity(key_file)
    except KeyFileError as exc:
        raise ConfigError(f"station key {key_file}: {exc}") from None
    host = f"[{public}]" if ":" in public and not public.startswith("[") else public
    station = f"{identity.node_id.hex()}@{host}:{port}"
    configured_stations({STATIONS_ENV: station})  # what each laptop will be given must parse
    command = [_relay_program(), "--host", bind, "--port", str(port), "--advertise-host"]
    command += [public.strip("[]"), "--data-dir", str(folder)]
    return StationPlan(
        identity.node_id.hex(), int(not existed), key_file, command, f"{STATIONS_ENV}={station}"
    )


def add_flags(parent: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``init`` flags (added by ``tools.local_station.command`` to its ``init`` action)."""
    parent.add_argument(
        "--public",
        required=True,
        metavar="HOST",
        help="the host name or address the laptops dial (the station's certificate names it)",
    )
    parent.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="the station's UDP port (QUIC)"
    )
    parent.add_argument(
        "--host", default="0.0.0.0", help="the address the station binds (every interface)"
    )
    parent.add_argument(
        "--data-dir",
        type=Path,
        help=f"the station's key, certificate and stores (default ${HOME_ENV}/station, "
        "as macula-relay)",
    )
    parent.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parent


def run(args: argparse.Namespace) -> int:
    try:
        made = plan(args.public, args.port, args.host, args.data_dir, os.environ)
    except (ConfigError, OSError) as exc:
        print(f"macula-mcp station init: {exc}", file=sys.stderr)
        return 2
    if args.json:
        view = {
            "node_id": made.node_id,
            "key_made": made.made,
            "key_file": str(made.key_file),
            "relay_command": made.relay_command,
            "stations_line": made.stations_line,
            "laptop_commands": made.laptop_commands(),
        }
        print(json.dumps(view))
        return 0
    said = "made now" if made.made else "already there"
    dht = args.port + 1
    print(
        f"station key {made.node_id} ({made.key_file}, {said})\n\n"
        "1. On this host, start the station and keep it running (a service: docs/operations.md):\n"
        f"  {shlex.join(made.relay_command)}\n"
        f"   It prints {made.stations_line.split('=', 1)[1]} once it listens.\n"
        f"2. Open UDP port {args.port} to the laptops (and UDP {dht} if other stations will "
        "link to this one).\n"
        "3. On each laptop, in the macula checkout:\n"
        + "".join(f"  {line}\n" for line in made.laptop_commands())
    )
    return 0
