"""``macula-relay --workers N``: one station as N processes behind one UDP port.

The parent (``relay.workers.supervisor``) runs no station itself: it makes the station's key and
certificate once, gives each worker a data dir of its own holding copies of them
(``<data-dir>/workers/<i>``, 0700, files 0600), and starts each worker as ``macula-relay`` with
the same options plus ``--worker-role``. Every worker binds the public port with SO_REUSEPORT
(Linux hashes a datagram's 4-tuple to one socket of the group, so a client's connection stays
with one worker) and a second QUIC listener on 127.0.0.1 where the other workers dial it: the
workers are linked as one federation, so a client on one worker sees the events and calls of
clients on another. All workers hold the same key, so clients see one node id; the federation
keeps one link per node id (``relay.federation.handshake``), so a worker can hold a link with
one other worker only: ``MAX_WORKERS`` is 2 until links between workers are told apart by
more than the node id (docs/operations.md says what that needs).

This module is the pure part: the count (checked, and its default), a worker's role as a flag,
each worker's command line, its data dir, and its log lines' ``worker=`` label.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from macula.keyfile import load_or_create_identity
from relay.federation.links import LinkTarget
from relay.station.config import StationConfig

MAX_WORKERS = 2  # see the module's docstring: one link per node id in the federation
# what a worker copies from the station's data dir: its key and its certificate
SHARED_FILES = ("station.key", "station-cert.pem", "station-key.pem")


def default_count(host: str, cores: int | None) -> int:
    """1, wherever the station listens: ``--workers 2`` is opt-in. Departure from issue 27
    (one per core on a public address), on figures: on 2 cores two workers moved 0.70x the
    pub/sub and 0.76x the fan-out of one (docs/performance.md, "Every core"), and a worker's
    restart re-hashes the other's clients; ``host`` and ``cores`` are kept for when links
    between workers are told apart and more workers pay."""
    del host, cores
    return 1


def worker_count(args: argparse.Namespace) -> int:
    """``--workers`` checked (``SystemExit`` naming it), or its default for ``--host``."""
    if args.workers is None:
        return default_count(args.host, os.cpu_count())
    count = int(args.workers)
    if not 1 <= count <= MAX_WORKERS:
        raise SystemExit(
            f"macula-relay: --workers must be 1..{MAX_WORKERS}, got {count} (the workers share"
            " the station's node id and a station keeps one link per node id; docs/operations.md)"
        )
    if count > 1 and args.idle_exit_s is not None:
        raise SystemExit(
            "macula-relay: --idle-exit-s cannot be used with --workers > 1"
            " (each worker would idle out on its own)"
        )
    return count


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What one worker is told: its index, its link port, and the link ports it dials."""

    index: int
    count: int
    link_port: int
    dials: tuple[int, ...] = ()

    def flag(self) -> str:
        dials = ",".join(str(port) for port in self.dials)
        return f"{self.index}/{self.count}:{self.link_port}:{dials}"


def parse_role(text: str) -> WorkerRole:
    """``I/N:LINK_PORT:PORT,PORT`` (what ``WorkerRole.flag`` writes) or ``ArgumentTypeError``."""
    try:
        share, link, dials = text.split(":")
        index, count = (int(part) for part in share.split("/"))
        ports = tuple(int(port) for port in dials.split(",") if port)
        role = WorkerRole(index, count, int(link), ports)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker role") from None
    if not 0 <= role.index < role.count or not all(
        0 < port <= 0xFFFF for port in (role.link_port, *role.dials)
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker role")
    return role


def roles(count: int, link_ports: list[int]) -> list[WorkerRole]:
    """Each worker's role: worker ``i`` dials every worker after it, so each pair has one
    link, dialled by the lower index (a restarted worker is dialled again by the lower one,
    or dials again the higher ones)."""
    return [
        WorkerRole(index, count, link_ports[index], tuple(link_ports[index + 1 :]))
        for index in range(count)
    ]


def worker_dir(data_dir: Path, index: int) -> Path:
    return data_dir / "workers" / str(index)


def prepare_worker_dir(data_dir: Path, index: int) -> Path:
    """``<data-dir>/workers/<index>`` (0700) holding copies (0600) of the station's key and
    certificate, which must exist in ``data_dir``; stores of its own are made there."""
    directory = worker_dir(data_dir, index)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o700)
    os.chmod(directory, 0o700)
    for name in SHARED_FILES:
        source, copy = data_dir / name, directory / name
        if copy.exists() and copy.read_bytes() == source.read_bytes():
            continue
        temporary = directory / f".{name}.copy"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as out, source.open("rb") as given:
            shutil.copyfileobj(given, out)
        os.replace(temporary, copy)
    return directory


def worker_log_file(log_file: Path, index: int) -> Path:
    """Worker ``index``'s own rotated log beside the parent's: ``relay.log`` ->
    ``relay.worker1.log`` (one rotating file per process)."""
    return log_file.with_name(f"{log_file.stem}.worker{index}{log_file.suffix}")


def worker_command(
    base: list[str],
    argv: list[str],
    role: WorkerRole,
    *,
    data_dir: Path,
    port: int,
    args: argparse.Namespace,
) -> list[str]:
    """Worker ``role``'s command line: the parent's options, then what differs (later flags
    win): one worker, its role, data dir, the shared port, its DHT port (the first worker
    keeps the configured one, the others take any free port), its monitor and log file."""
    extra = [
        "--workers",
        "1",
        "--worker-role",
        role.flag(),
        "--data-dir",
        str(worker_dir(data_dir, role.index)),
        "--port",
        str(port),
    ]
    if role.index > 0 or args.port == 0:  # one configured DHT port: the first worker's
        extra += ["--dht-port", "0"]
    if args.monitor is not None:
        host, monitor_port = args.monitor
        shown = f"[{host}]" if ":" in host else host
        extra += ["--monitor", f"{shown}:{monitor_port + role.index if monitor_port else 0}"]
    if args.log_file is not None:
        extra += ["--log-file", str(worker_log_file(args.log_file, role.index))]
    return [*base, *argv, *extra]


class WorkerLabel(logging.Formatter):
    """Another formatter's lines, labelled with the worker: ``worker=1 ts=...`` (key=value)
    or a ``"worker": 1`` field (JSON)."""

    def __init__(self, inner: logging.Formatter, index: int, json_lines: bool) -> None:
        super().__init__()
        self.inner = inner
        self.index = index
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        if not self.json_lines:
            return f"worker={self.index} {line}"
        fields = json.loads(line)
        return json.dumps({"worker": self.index, **fields})


def worker_config(config: StationConfig, role: WorkerRole) -> StationConfig:
    """A worker's station configuration: the shared port bound with SO_REUSEPORT, its link
    listener, and the workers it dials (they hold the key in its data dir)."""
    node_id = load_or_create_identity(config.data_dir / "station.key").node_id
    siblings = [LinkTarget(node_id, "127.0.0.1", port) for port in role.dials]
    return dataclasses.replace(config, reuse_port=True, link_port=role.link_port, siblings=siblings)
