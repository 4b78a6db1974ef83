"""The station as a service: its operator options and what runs beside it while it serves.

``add_flags`` adds ``--config``, ``--print-config``, ``--monitor``, ``--monitor-public``,
``--monitor-max-clients``, ``--monitor-timeout-s`` and ``--log-format`` to the parser;
``check`` refuses a monitor address off loopback unless ``--monitor-public`` says so (the port
has no authentication). ``Service`` is entered once the station listens: it opens the monitor,
tells systemd READY (``relay.ops.sdnotify``), pings its watchdog when one is asked for, and on
SIGHUP re-reads the options and applies what can change live (``relay.ops.reload``). ``stopping``
turns /healthz to 503 and tells systemd STOPPING before the station drains.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from macula.stations import is_loopback_host
from relay.monitor.figures import Lifecycle
from relay.monitor.port import Monitor, parse_address
from relay.ops.config_file import ConfigFileError
from relay.ops.reload import reload
from relay.ops.sdnotify import Notifier
from relay.station.station import Station

log = logging.getLogger("macula.relay")


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_flags(
    parser: argparse._ActionsContainer,
    monitor: argparse._ActionsContainer | None = None,
    logs: argparse._ActionsContainer | None = None,
) -> None:
    """``--config``/``--print-config`` to ``parser``, the monitor's flags to ``monitor`` and
    ``--log-format`` to ``logs`` (each an argument group of the same parser, or the parser)."""
    parser.add_argument(
        "--config", type=Path, help="read options from this TOML file (flags override it)"
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective configuration, exit"
    )
    monitor = parser if monitor is None else monitor
    monitor.add_argument(
        "--monitor",
        type=_address,
        metavar="HOST:PORT",
        help="serve /healthz /status /connections /links /metrics and a status page here"
        " (off by default; no authentication: loopback unless --monitor-public)",
    )
    monitor.add_argument(
        "--monitor-public",
        action="store_true",
        help="allow a --monitor address other than loopback (anyone who reaches it reads it)",
    )
    monitor.add_argument(
        "--monitor-max-clients",
        type=int,
        default=16,
        help="monitor connections at once; more get 503 (default 16)",
    )
    monitor.add_argument(
        "--monitor-timeout-s",
        type=float,
        default=5.0,
        help="seconds a monitor client has to send its request (default 5)",
    )
    (parser if logs is None else logs).add_argument(
        "--log-format", choices=["kv", "json"], default="kv", help="key=value (default) or JSON"
    )


def check(args: argparse.Namespace) -> None:
    if (
        args.monitor is not None
        and not is_loopback_host(args.monitor[0])
        and not args.monitor_public
    ):
        raise SystemExit(
            f"macula-relay: --monitor {args.monitor[0]} is not loopback; the monitor has no"
            " authentication, add --monitor-public to serve it there anyway"
        )
    if args.monitor_max_clients < 1 or args.monitor_timeout_s <= 0:
        raise SystemExit("macula-relay: --monitor-max-clients and --monitor-timeout-s must be > 0")


@dataclass
class ServiceOptions:
    args: argparse.Namespace
    # the options again, read afresh (SIGHUP): the command line over the config file
    reparse: Callable[[], argparse.Namespace] | None = None


class Service:
    def __init__(self, station: Station, options: ServiceOptions) -> None:
        self.station = station
        self.options = options
        self.args = options.args
        self.lifecycle = Lifecycle()
        self.notifier = Notifier.from_environment()
        self.monitor: Monitor | None = None
        self._watchdog: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Service:
        args = self.args
        if args.monitor is not None:
            self.monitor = Monitor(
                self.station,
                self.lifecycle,
                max_clients=args.monitor_max_clients,
                read_timeout_s=args.monitor_timeout_s,
            )
            host, port = await self.monitor.start(*args.monitor)
            log.info("monitor listening on http://%s:%d/", host, port)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        self.lifecycle.ready = 1
        self.notifier.ready(f"serving {self.station.endpoint}")
        if self.notifier.watchdog_s is not None:
            self._watchdog = self.station.spawn(self._ping(self.notifier.watchdog_s))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stopping()
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._watchdog is not None:  # a task of the station's group: cancelled here first
            self._watchdog.cancel()
            await asyncio.wait([self._watchdog])
        if self.monitor is not None:
            await self.monitor.close()

    def stopping(self) -> None:
        if not self.lifecycle.draining:
            self.lifecycle.draining = 1
            self.notifier.stopping()

    def reload(self) -> None:
        """SIGHUP: read the options again and apply what can change live."""
        if self.options.reparse is None:
            log.info("SIGHUP: nothing to reload")
            return
        self.notifier.reloading(time.monotonic_ns() // 1000)
        try:
            new = self.options.reparse()
        except (ConfigFileError, SystemExit) as exc:
            log.error("SIGHUP: configuration not reloaded, keeping the old one: %s", exc)
        else:
            for dest in reload(self.station, self.args, new):
                setattr(new, dest, getattr(self.args, dest))  # what runs is what is compared
            self.args = new
        self.notifier.ready(f"serving {self.station.endpoint}")

    async def _ping(self, interval_s: float) -> None:
        while True:  # the loop turning is what the watchdog checks
            self.notifier.watchdog()
            await asyncio.sleep(interval_s)
