"""``macula-mcp station status|stop``: the local station (``tools.local_station``) from a shell.

``status`` shows state, pid, endpoint, uptime, whether it answered a handshake with its key,
and where it logs (``--json``: one object, no booleans); exit 0 when it runs, 3 when not.
``stop`` sends SIGTERM and waits while it says goodbye to its clients; exit 0 when it stopped
or none ran, 1 when it could not be stopped (the message says what to do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from macula.config import macula_home
from macula.errors import MaculaError
from macula.stations import parse_station
from tools.local_station import (
    LocalStationError,
    local_station_status,
    presented_key,
    stop_local_station,
)


def _answered(endpoint: str) -> int:
    address = parse_station(endpoint)
    return int(asyncio.run(presented_key(address, timeout=3)) == address.node_id)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="macula-mcp station",
        description="The local station: the background station macula-mcp starts when no "
        "station is configured (MACULA_MESH_STATIONS), shared by this MACULA_HOME's sessions.",
    )
    parser.add_argument("action", choices=["status", "stop"])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    try:
        home = macula_home()
        status = local_station_status(home)
    except MaculaError as exc:
        print(f"macula-mcp station: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.action == "status":
        view: dict[str, Any] = status.view()
        if status.state == "running" and status.endpoint is not None:
            view["answered"] = _answered(status.endpoint)
        _show(view, args.json)
        raise SystemExit(0 if status.state == "running" else 3)
    try:
        stopped = stop_local_station(home)
    except LocalStationError as exc:
        print(f"macula-mcp station stop: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    said = f"stopped the local station (pid {status.pid})" if stopped else "none was running"
    _show({"stopped": int(stopped), "pid": status.pid if stopped else None, "detail": said},
          args.json)  # fmt: skip


def _show(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(view))
        return
    for key, value in view.items():
        if value is not None and value != "":
            print(f"{key}: {value}")
