"""``macula-mcp station status|stop``: the local station (``tools.local_station.station``) from a
shell;
``station init``: the commands for a station on another host (``tools.local_station.public_init``).

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

from macula.config import HOME_ENV, STATIONS_ENV, macula_home
from macula.errors import MaculaError
from macula.stations import parse_station
from tools.commands import parser_for
from tools.local_station.public_init import add_flags as add_init_flags
from tools.local_station.public_init import run as run_init
from tools.local_station.station import (
    LocalStationError,
    local_station_status,
    presented_key,
    stop_local_station,
)


def _answered(endpoint: str) -> int:
    address = parse_station(endpoint)
    return int(asyncio.run(presented_key(address, timeout=3)) == address.node_id)


def _parser() -> argparse.ArgumentParser:
    parser = parser_for(
        "station",
        "The local station (status, stop): the background station macula-mcp starts when no "
        f"station is configured ({STATIONS_ENV}), shared by this {HOME_ENV}'s sessions. "
        "Or (init) the commands for a station on another host that laptops share.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, summary, example in (
        ("status", "the local station's state, pid, endpoint, uptime and log", "status --json"),
        ("stop", "stop the local station: it says goodbye to its clients", "stop"),
        (
            "init",
            "make (or read) a station key here and print the exact commands for this host "
            "and for each laptop",
            "init --public vps.example.org --port 4433",
        ),
    ):
        one = sub.add_parser(
            action,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}.",
            epilog=f"example:\n  macula-mcp station {example}",
            formatter_class=parser.formatter_class,
        )
        if action != "init":
            one.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_init_flags(sub.choices["init"])
    return parser


def main(argv: Sequence[str]) -> None:
    args = _parser().parse_args(list(argv))
    if args.action == "init":
        raise SystemExit(run_init(args))
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
