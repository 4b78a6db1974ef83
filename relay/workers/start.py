"""What the parent of ``macula-relay --workers N`` does before it supervises: the station's key
and certificate made once in the data dir, a data dir per worker holding copies of them, the
shared port chosen (``--port 0``: a free one), a free loopback port per worker for the links
between workers, and each worker's command line (``relay.workers.balancer``); then
``relay.workers.supervisor.Supervisor`` runs them.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable

from macula.quic.event_loop import run as run_loop
from relay.station import build as station_build
from relay.station.config import StationConfig
from relay.workers import balancer as workers
from relay.workers.supervisor import Supervisor

WORKER_BASE = [sys.executable, "-m", "relay.ops.cli"]


def free_udp_ports(host: str, count: int) -> list[int]:
    """``count`` distinct UDP ports free on ``host`` now (held together while chosen)."""
    sockets = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def supervisor_for(
    argv: list[str],
    args: argparse.Namespace,
    config: StationConfig,
    count: int,
    on_ready: Callable[[str], None],
) -> Supervisor:
    identity, *_ = station_build.identity_and_certificate(config)
    port = config.port or free_udp_ports(config.host, 1)[0]
    link_ports = free_udp_ports("127.0.0.1", count)
    commands = []
    for role in workers.roles(count, link_ports):
        workers.prepare_worker_dir(config.data_dir, role.index)
        commands.append(
            workers.worker_command(
                WORKER_BASE, argv, role, data_dir=config.data_dir, port=port, args=args
            )
        )
    endpoint = f"{identity.node_id.hex()}@{config.host}:{port}"
    return Supervisor(commands, endpoint, on_ready=lambda: on_ready(endpoint))


def run_workers(
    argv: list[str],
    args: argparse.Namespace,
    config: StationConfig,
    count: int,
    on_ready: Callable[[str], None],
) -> int:
    """Start ``count`` workers and supervise them until the station stops; the exit code."""

    async def main() -> int:
        return await supervisor_for(argv, args, config, count, on_ready).run()

    return run_loop(main())
