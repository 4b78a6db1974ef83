"""``macula-relay``: run a station.

Prints exactly one line on stdout once it listens — ``node_id@host:port`` — and logs on
stderr (``key=value`` fields). SIGINT/SIGTERM: GOODBYE to every client, connections and
stores closed, exit 0 within 5 s. Bad options fail at once with a message naming them.

``--endpoint-file``/``--pid-file`` (what ``macula-mcp`` uses to find the station it started):
written 0600 once it listens (whole, by rename), removed on a clean exit when they still hold
this station's lines. ``--log-file``: logs go to that file, rotated at ``--log-max-bytes``
keeping ``--log-backups`` old ones, instead of stderr. ``--exit-when-gone PATH`` and
``--idle-exit-s N``: the station stops by itself once PATH is gone or after N s with no
connection (``relay.ops.lifetime``), as on SIGTERM. ``--workers N`` (``relay.workers.balancer``): N
station
processes behind the one port under a parent (``relay.workers.supervisor``) that prints the line
and writes the files once all of them listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import logging.handlers
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from macula.config import macula_home
from macula.errors import ConfigError
from macula.logformat import JsonFormatter, KeyValueFormatter
from macula.private_file import write_private
from macula.quic.event_loop import run as run_loop
from macula.wire.framing import MAX_FRAME_SIZE
from macula.wire.records import Record
from relay.core.policy import PuzzleMode, Quotas, StationPolicy
from relay.federation.dht.station import DhtConfig
from relay.federation.dht.storage import DhtLimits
from relay.house.history import HistoryBounds
from relay.house.services import HouseConfig
from relay.ops import config_file, service
from relay.ops.lifetime import LifetimeRule, watch
from relay.ops.options import BOUNDS, DHT_CAPS, build_parser
from relay.realms.admission import AdmissionMode, AllowlistError
from relay.realms.links import StationEndorsementError
from relay.station.realm_files import Allowlist, load_station_endorsement
from relay.station.station import Station, StationConfig
from relay.stores.records import StoreLimits
from relay.workers import balancer as workers
from relay.workers import start as worker_start

__all__ = ["build_parser", "config_from_args", "main", "serve"]

SHUTDOWN_BUDGET_S = 4.5


def _check_listen(args: argparse.Namespace) -> None:
    """The ports and the client rules that argparse alone does not bound."""
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"macula-relay: --port must be 0..65535, got {args.port}")
    if args.dht_port is not None and not 0 <= args.dht_port <= 65535:
        raise SystemExit(f"macula-relay: --dht-port must be 0..65535, got {args.dht_port}")
    if args.dht_port and args.dht_port == args.port:
        raise SystemExit("macula-relay: --dht-port cannot share the QUIC --port")
    if not 0 <= args.puzzle_difficulty <= 64:
        raise SystemExit("macula-relay: --puzzle-difficulty must be 0..64")
    if args.max_clock_skew_ms < 0:
        raise SystemExit("macula-relay: --max-clock-skew-ms must be >= 0")
    if args.max_control_frame_size > MAX_FRAME_SIZE:
        raise SystemExit(f"macula-relay: --max-control-frame-size must be <= {MAX_FRAME_SIZE}")


def _policy(args: argparse.Namespace) -> StationPolicy:
    quotas = Quotas(
        max_subscriptions=args.max_subscriptions,
        max_advertisements=args.max_advertisements,
        max_pending_calls=args.max_pending_calls,
        max_streams=args.max_streams,
        publish_rate=args.publish_rate,
        publish_burst=args.publish_rate * 2,
        call_rate=args.call_rate,
        call_burst=args.call_rate * 2,
        max_outbound_bytes=args.max_outbound_bytes,
        station_event_rate=args.station_event_rate,
        station_event_burst=args.station_event_rate * 2,
    )
    return StationPolicy(
        puzzle_mode=PuzzleMode(args.puzzle),
        puzzle_difficulty=args.puzzle_difficulty,
        max_clock_skew_ms=args.max_clock_skew_ms,
        quotas=quotas,
        quic_retry=not args.no_quic_retry,
        max_inbound_links=args.max_inbound_links,
        replay_cache_per_link=args.replay_cache_per_link,
        replay_signers_per_link=args.replay_signers_per_link,
        realm_sweep_ms=args.realm_sweep_ms,
        **{name: getattr(args, name) for _, name, _ in BOUNDS},
    )


def _realm_parts(args: argparse.Namespace) -> tuple[AdmissionMode, list[Record]]:
    """The admission mode (its allowlist file checked) and this station's endorsements."""
    admission = AdmissionMode(args.admission)
    if admission is AdmissionMode.ALLOWLIST and args.allowlist is None:
        raise SystemExit("macula-relay: --admission allowlist needs --allowlist FILE")
    if args.allowlist is not None:
        try:
            Allowlist.load(args.allowlist)  # a bad file fails here, naming its line
        except AllowlistError as exc:
            raise SystemExit(f"macula-relay: --allowlist {exc}") from None
    if admission is AdmissionMode.MEMBERS and not args.realm:
        raise SystemExit("macula-relay: --admission members needs at least one --realm")
    names = [realm.name for realm in args.realm]
    if len(set(names)) != len(names):
        raise SystemExit("macula-relay: a --realm is named twice")
    station_endorsements = []
    for path in args.realm_endorsement:
        try:
            station_endorsements.append(load_station_endorsement(path))
        except ValueError as exc:
            raise SystemExit(f"macula-relay: --realm-endorsement {exc}") from None
    return admission, station_endorsements


def _store_limits(args: argparse.Namespace) -> StoreLimits:
    if args.content_keep_ms < 0:
        raise SystemExit("macula-relay: --content-keep-ms must be >= 0")
    return StoreLimits(
        records_per_signer=args.max_records_per_signer,
        record_bytes_per_signer=args.max_record_bytes_per_signer,
        records_total=args.max_records,
        record_bytes_total=args.max_record_bytes,
        max_record_ttl_ms=args.max_record_ttl_ms,
        content_bytes_total=args.max_content_bytes,
        content_keep_ms=args.content_keep_ms,
        max_find_reply_bytes=args.max_find_reply_bytes,
        max_find_by_type=args.max_find_by_type,
    )


def _house(args: argparse.Namespace) -> HouseConfig:
    if args.lat is not None and not -90 <= args.lat <= 90:
        raise SystemExit("macula-relay: --lat must be -90..90")
    if args.lng is not None and not -180 <= args.lng <= 180:
        raise SystemExit("macula-relay: --lng must be -180..180")
    if not 0 <= args.directory_puzzle_difficulty <= 64:
        raise SystemExit("macula-relay: --directory-puzzle-difficulty must be 0..64")
    return HouseConfig(
        memory=not args.no_memory,
        station_directory=not args.no_station_directory,
        agent_directory=not args.no_agent_directory,
        city=args.city,
        country=args.country,
        continent=args.continent,
        lat=args.lat,
        lng=args.lng,
        memory_max_bytes=args.memory_max_bytes,
        memory_max_chunks_per_node=args.memory_max_chunks_per_node,
        memory_deposit_rate=args.memory_deposit_rate,
        memory_query_rate=args.memory_query_rate,
        directory_max_agents=args.directory_max_agents,
        directory_puzzle_difficulty=args.directory_puzzle_difficulty,
        reservations=not args.no_reservations,
        reservations_max_total=args.reservations_max_total,
        history=not args.no_history,
        history_bounds=HistoryBounds(
            max_per_room=args.history_max_per_room,
            max_events=args.history_max_events,
            max_age_ms=args.history_max_age_s * 1000,
            max_expired=args.history_max_expired,
        ),
    )


def config_from_args(args: argparse.Namespace) -> StationConfig:
    """The station's configuration from the parsed options; ``SystemExit`` naming the first
    option that is out of bounds (the sections checked in one fixed order)."""
    _check_listen(args)
    policy = _policy(args)
    if args.known_peers_max < 0:
        raise SystemExit("macula-relay: --known-peers-max must be >= 0")
    dht_limits = DhtLimits(**{name: getattr(args, f"dht_{name}") for _, name, _ in DHT_CAPS})
    admission, station_endorsements = _realm_parts(args)
    store_limits = _store_limits(args)
    house = _house(args)
    try:
        data_dir = args.data_dir or macula_home() / "station"
    except ConfigError as exc:
        raise SystemExit(f"macula-relay: {exc}") from None
    return StationConfig(
        data_dir=data_dir,
        host=args.host,
        port=args.port,
        dht_port=args.dht_port,
        advertised_hosts=args.advertise_host,
        policy=policy,
        house=house,
        store_limits=store_limits,
        peers=args.peer,
        max_links=args.max_links,
        discover_interval_s=args.discover_interval,
        known_peers_max=args.known_peers_max,
        dht=DhtConfig(limits=dht_limits),
        realms=args.realm,
        station_endorsements=station_endorsements,
        admission=admission,
        allowlist=args.allowlist,
    )


def _remove_if_holds(path: Path, text: str) -> None:
    """Remove ``path`` unless another station has written its own line there since."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            path.unlink()


async def serve(
    config: StationConfig,
    endpoint_file: Path | None = None,
    pid_file: Path | None = None,
    lifetime: LifetimeRule | None = None,
    lifetime_check_s: float = 2.0,
    options: service.ServiceOptions | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    options = options or service.ServiceOptions(build_parser().parse_args([]))
    async with Station(config) as station, service.Service(station, options) as running:
        files = [(endpoint_file, f"{station.endpoint}\n"), (pid_file, f"{os.getpid()}\n")]
        written = [(path, text) for path, text in files if path is not None]
        try:
            for path, text in written:
                try:
                    write_private(path, text.encode(), parents=False)
                except OSError as exc:
                    raise SystemExit(f"macula-relay: cannot write {path}: {exc}") from None
            print(station.endpoint, flush=True)
            if lifetime is not None and lifetime.active:
                reason = await watch(
                    lifetime, station.connection_count, stop, check_s=lifetime_check_s
                )
            else:
                reason = None
                await stop.wait()
            logging.getLogger("macula.relay").info(
                "%s, stopping", "signal received" if reason is None else reason
            )
            running.stopping()  # /healthz 503, systemd told STOPPING
            await asyncio.wait_for(station.stop(), SHUTDOWN_BUDGET_S)
        finally:
            for path, text in written:
                _remove_if_holds(path, text)


def _options(argv: Sequence[str]) -> tuple[argparse.Namespace, config_file.Loaded]:
    """The command line over its ``--config`` file; a bad file exits naming its line."""
    try:
        return config_file.parse(build_parser(), argv)
    except config_file.ConfigFileError as exc:
        raise SystemExit(f"macula-relay: {exc}") from None


def _log_handler(args: argparse.Namespace) -> logging.Handler:
    """stderr or the rotated ``--log-file``; a worker's lines are labelled with its index."""
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if args.log_file is not None:
        try:
            handler = logging.handlers.RotatingFileHandler(
                args.log_file, maxBytes=args.log_max_bytes, backupCount=args.log_backups
            )
        except OSError as exc:
            raise SystemExit(f"macula-relay: --log-file {args.log_file}: {exc}") from None
    json_lines = args.log_format == "json"
    formatter: logging.Formatter = JsonFormatter() if json_lines else KeyValueFormatter()
    if args.worker_role is not None:
        formatter = workers.WorkerLabel(formatter, args.worker_role.index, json_lines)
    handler.setFormatter(formatter)
    return handler


def _serve_workers(
    argv: list[str], args: argparse.Namespace, config: StationConfig, count: int
) -> None:
    """The parent of ``--workers N``: its files are written once every worker is up."""
    written: list[tuple[Path, str]] = []

    def ready(endpoint: str) -> None:
        files = [(args.endpoint_file, f"{endpoint}\n"), (args.pid_file, f"{os.getpid()}\n")]
        for path, text in files:
            if path is not None:
                write_private(path, text.encode(), parents=False)
                written.append((path, text))

    try:
        code = worker_start.run_workers(argv, args, config, count, ready)
    finally:
        for path, text in written:
            _remove_if_holds(path, text)
    if code:
        raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, loaded = _options(argv)
    if args.print_config:
        print(config_file.render(build_parser(), args), end="")
        return
    service.check(args)
    logging.basicConfig(level=args.log_level.upper(), handlers=[_log_handler(args)])
    logging.getLogger("quic").setLevel(logging.WARNING)
    for chatty in ("kademlia", "rpcudp"):  # the DHT package logs every lookup at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        count = workers.worker_count(args)
        config = config_from_args(args)
    except SystemExit as exc:  # a check naming a --flag: also where the file set it
        raise SystemExit(loaded.blame(str(exc.code))) from None
    if args.worker_role is None and count > 1:
        return _serve_workers(argv, args, config, count)
    options = service.ServiceOptions(args, reparse=lambda: _options(argv)[0])
    lifetime = LifetimeRule(args.exit_when_gone, args.idle_exit_s)
    files = (args.endpoint_file, args.pid_file)
    if args.worker_role is not None:  # a worker: its parent writes the files
        config = workers.worker_config(config, args.worker_role)
        files = (None, None)
    try:
        run_loop(serve(config, *files, lifetime, args.lifetime_check_s, options))
    except (ConfigError, StationEndorsementError) as exc:  # e.g. MACULA_LOOP names no loop
        raise SystemExit(f"macula-relay: {exc}") from None
    except OSError as exc:
        raise SystemExit(
            f"macula-relay: cannot listen on {config.host}:{config.port}: {exc}"
        ) from None


if __name__ == "__main__":
    main()
