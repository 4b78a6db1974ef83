"""``macula-relay``: run a station.

Prints exactly one line on stdout once it listens — ``node_id@host:port`` — and logs on
stderr (``key=value`` fields). SIGINT/SIGTERM: GOODBYE to every client, connections and
stores closed, exit 0 within 5 s. Bad options fail at once with a message naming them.

``--endpoint-file``/``--pid-file`` (what ``macula-mcp`` uses to find the station it started):
written 0600 once it listens (whole, by rename), removed on a clean exit when they still hold
this station's lines. ``--log-file``: logs go to that file, rotated at ``--log-max-bytes``
keeping ``--log-backups`` old ones, instead of stderr. ``--exit-when-gone PATH`` and
``--idle-exit-s N``: the station stops by itself once PATH is gone or after N s with no
connection (``relay.lifetime``), as on SIGTERM.
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
from collections.abc import Callable, Sequence
from pathlib import Path

from macula.config import macula_home
from macula.errors import ConfigError
from macula.event_loop import run as run_loop
from macula.logformat import JsonFormatter, KeyValueFormatter
from macula.wire.framing import MAX_FRAME_SIZE
from relay import config_file, service
from relay.federation.dht import DhtConfig
from relay.federation.dht_storage import DhtLimits
from relay.federation.links import LinkTarget, parse_peer
from relay.house.history import HistoryBounds
from relay.house.services import HouseConfig
from relay.lifetime import LifetimeRule, watch
from relay.policy import PuzzleMode, Quotas, StationPolicy
from relay.realm_admission import AdmissionMode, AllowlistError
from relay.realm_files import Allowlist, load_station_endorsement
from relay.realm_links import StationEndorsementError
from relay.realms import ProtectedRealm, parse_realm_flag
from relay.station import Station, StationConfig
from relay.store import StoreLimits

SHUTDOWN_BUDGET_S = 4.5


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def _realm(text: str) -> ProtectedRealm:
    try:
        return parse_realm_flag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _peer(text: str) -> LinkTarget:
    try:
        return parse_peer(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_BOUNDS = (  # (flag, StationPolicy field, help): positive integers (issue 11)
    ("--max-name-bytes", "max_name_bytes", "UTF-8 bytes of a topic or procedure name"),
    ("--max-control-frame-size", "max_control_frame_size", "bytes of a control-stream frame"),
    (
        "--max-control-frame-items",
        "max_control_frame_items",
        "CBOR items in one control-stream frame",
    ),
    (
        "--max-stream-frame-items",
        "max_stream_frame_items",
        "CBOR items in one content or stream-RPC frame",
    ),
    (
        "--max-pre-handshake-bytes",
        "max_pre_handshake_bytes",
        "bytes a connection may send before its CONNECT is accepted",
    ),
    ("--handshake-timeout-ms", "handshake_timeout_ms", "time a connection has to CONNECT"),
    ("--max-connections", "max_connections", "open connections in all"),
    (
        "--max-connections-per-address",
        "max_connections_per_address",
        "open connections per source address",
    ),
    (
        "--log-summary-ms",
        "log_summary_ms",
        "at most one log line of a connection's refused frames per this interval",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    defaults = Quotas()
    policy = StationPolicy()
    parser = argparse.ArgumentParser(
        prog="macula-relay", description="Run a Macula wire v2 station."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=4433, help="UDP port (default 4433, 0 = any free)"
    )
    parser.add_argument(
        "--dht-port",
        type=int,
        default=None,
        help="UDP port of the DHT among stations (default: --port + 1, any free when --port is 0)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="key, certificate and stores (default $MACULA_HOME/station)",
    )
    parser.add_argument(
        "--advertise-host",
        action="append",
        default=[],
        metavar="NAME",
        help="host name or IP clients dial (certificate SAN, station_endpoint record); repeatable",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--log-file", type=Path, help="log to this file (rotated), not stderr")
    parser.add_argument(
        "--log-max-bytes",
        type=_positive(int),
        default=1 << 20,
        help="rotate --log-file at this size (default 1 MiB)",
    )
    parser.add_argument(
        "--log-backups",
        type=_positive(int),
        default=3,
        help="rotated log files kept (default 3)",
    )
    parser.add_argument(
        "--endpoint-file", type=Path, help="write node_id@host:port here once listening"
    )
    parser.add_argument("--pid-file", type=Path, help="write this process's id here once listening")
    parser.add_argument(
        "--exit-when-gone",
        type=Path,
        metavar="PATH",
        help="exit by itself once PATH no longer exists (checked every 2 s)",
    )
    parser.add_argument(
        "--idle-exit-s",
        type=_positive(float),
        metavar="SECONDS",
        help="exit by itself after this long with no connection open (default: never)",
    )
    parser.add_argument(  # how often those two are checked (tests shorten it)
        "--lifetime-check-s", type=_positive(float), default=2.0, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--puzzle",
        default="off",
        choices=[m.value for m in PuzzleMode],
        help="S/Kademlia puzzle policy for clients (default off)",
    )
    parser.add_argument("--puzzle-difficulty", type=int, default=8)
    parser.add_argument(
        "--max-clock-skew-ms",
        type=int,
        default=300_000,
        help="refuse frames whose sent_at_ms is further off; 0 disables replay checks",
    )
    parser.add_argument(
        "--max-subscriptions", type=_positive(int), default=defaults.max_subscriptions
    )
    parser.add_argument(
        "--max-advertisements", type=_positive(int), default=defaults.max_advertisements
    )
    parser.add_argument(
        "--max-pending-calls", type=_positive(int), default=defaults.max_pending_calls
    )
    parser.add_argument("--max-streams", type=_positive(int), default=defaults.max_streams)
    parser.add_argument(
        "--publish-rate",
        type=_positive(float),
        default=defaults.publish_rate,
        help="publishes per second per connection (burst: twice that)",
    )
    parser.add_argument(
        "--call-rate",
        type=_positive(float),
        default=defaults.call_rate,
        help="calls per second per connection (burst: twice that)",
    )
    limits = StoreLimits()
    for flag, value, text in (
        ("--max-records-per-signer", limits.records_per_signer, "DHT records one signer may hold"),
        ("--max-record-bytes-per-signer", limits.record_bytes_per_signer, "bytes of those"),
        ("--max-records", limits.records_total, "DHT records the station holds"),
        ("--max-record-bytes", limits.record_bytes_total, "bytes of those"),
        ("--max-record-ttl-ms", limits.max_record_ttl_ms, "longest record lifetime accepted"),
        ("--max-content-bytes", limits.content_bytes_total, "content held (LRU collected)"),
        ("--max-find-reply-bytes", limits.max_find_reply_bytes, "records in one find reply"),
        ("--max-find-by-type", limits.max_find_by_type, "records in one find-by-type reply"),
    ):
        _positive_int_flag(parser, flag, value, text)
    parser.add_argument(
        "--content-keep-ms",
        type=int,
        default=limits.content_keep_ms,
        help="content used this recently is never collected to make room"
        f" (default {limits.content_keep_ms})",
    )
    parser.add_argument(
        "--max-outbound-bytes",
        type=_positive(int),
        default=defaults.max_outbound_bytes,
        help="unsent bytes queued for one client before it is closed as a slow consumer",
    )
    for flag, name, text in _BOUNDS:
        _positive_int_flag(parser, flag, getattr(policy, name), text)
    parser.add_argument(
        "--no-quic-retry",
        action="store_true",
        help="no QUIC address validation (Retry; on by default unless bound to loopback)",
    )
    parser.add_argument("--no-memory", action="store_true", help="do not serve shared memory")
    parser.add_argument(
        "--no-station-directory", action="store_true", help="do not serve the station directory"
    )
    parser.add_argument(
        "--no-agent-directory", action="store_true", help="do not serve the agent directory"
    )
    for name in ("city", "country", "continent"):
        parser.add_argument(f"--{name}", help=f"this station's {name} (station directory)")
    parser.add_argument("--lat", type=float, help="latitude, -90..90 (station directory)")
    parser.add_argument("--lng", type=float, help="longitude, -180..180 (station directory)")
    # house-service limits (relay.house.services.HouseConfig)
    house = HouseConfig()
    parser.add_argument(
        "--memory-max-bytes",
        type=_positive(int),
        default=house.memory_max_bytes,
        help="shared memory: total bytes stored for all depositors (default 256 MiB)",
    )
    parser.add_argument(
        "--memory-max-chunks-per-node",
        type=_positive(int),
        default=house.memory_max_chunks_per_node,
        help="shared memory: chunks one depositor may hold",
    )
    parser.add_argument(
        "--memory-deposit-rate",
        type=_positive(float),
        default=house.memory_deposit_rate,
        help="shared memory: deposits per second per node (burst: four times that)",
    )
    parser.add_argument(
        "--memory-query-rate",
        type=_positive(float),
        default=house.memory_query_rate,
        help="shared memory: queries per second per node (burst: four times that)",
    )
    parser.add_argument(
        "--directory-max-agents",
        type=_positive(int),
        default=house.directory_max_agents,
        help="agent directory: live entries",
    )
    parser.add_argument(
        "--directory-puzzle-difficulty",
        type=int,
        default=house.directory_puzzle_difficulty,
        help="agent directory: identity puzzle bits a registrant must meet, 0..64 (0: none)",
    )
    parser.add_argument(
        "--peer",
        type=_peer,
        action="append",
        default=[],
        metavar="NODE_ID@HOST:PORT",
        help="a station to link with (its node id pins its key); repeatable",
    )
    parser.add_argument(
        "--max-links",
        type=_positive(int),
        default=StationConfig.max_links,
        help="peer stations this station dials at most (default 64)",
    )
    _federation_flags(parser, policy)
    _history_flags(parser, house)
    parser.add_argument(
        "--realm",
        type=_realm,
        action="append",
        default=[],
        metavar="NAME=AUTHORITY_KEY",
        help="protect this realm: only holders of an endorsement signed by AUTHORITY_KEY "
        "(64 hex) may subscribe, publish, advertise or call in it; repeatable",
    )
    parser.add_argument(
        "--realm-endorsement",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="this station's station endorsement of a --realm (macula-realm endorse-station "
        "--out FILE), presented on every link: peers carry the realm only to endorsed "
        "stations; repeatable",
    )
    parser.add_argument(
        "--admission",
        choices=[m.value for m in AdmissionMode],
        default=AdmissionMode.OPEN.value,
        help="who may connect: open (default), allowlist (--allowlist), members (an "
        "endorsement of a --realm in the CONNECT)",
    )
    parser.add_argument(
        "--allowlist",
        type=Path,
        help="node ids allowed to connect, 64 hex one a line (re-read when it changes)",
    )
    parser.add_argument(
        "--realm-sweep-ms",
        type=_positive(int),
        default=policy.realm_sweep_ms,
        help="re-check realm memberships for revocation and expiry this often (default 60000)",
    )
    service.add_flags(parser)  # --config, --monitor, --log-format (relay.service)
    return parser


_DHT_CAPS = (  # (flag, DhtLimits field, help): what this station holds for the mesh's DHT
    ("--dht-max-records", "records_total", "DHT records held for the mesh"),
    ("--dht-max-bytes", "bytes_total", "bytes of those"),
    ("--dht-max-records-per-signer", "records_per_signer", "of those, by one signer"),
    ("--dht-max-bytes-per-signer", "bytes_per_signer", "bytes of one signer's"),
)


def _federation_flags(parser: argparse.ArgumentParser, policy: StationPolicy) -> None:
    """The operator's federation knobs (docs/federation.md)."""
    config = StationConfig(data_dir=Path())
    parser.add_argument(
        "--max-inbound-links",
        type=_positive(int),
        default=policy.max_inbound_links,
        help=f"links other stations may open to this one (default {policy.max_inbound_links})",
    )
    parser.add_argument(
        "--discover-interval",
        type=_positive(float),
        default=config.discover_interval_s,
        help="seconds between looks at the DHT for stations to link with"
        f" (default {config.discover_interval_s:g})",
    )
    parser.add_argument(
        "--known-peers-max",
        type=int,
        default=config.known_peers_max,
        help="stations remembered in the data dir and dialled after a restart, 0: none"
        f" (default {config.known_peers_max})",
    )
    rate = policy.quotas.station_event_rate
    parser.add_argument(
        "--station-event-rate",
        type=_positive(float),
        default=rate,
        help=f"EVENTs per second one peer station may send (burst: twice that; over it the"
        f" link is paused) (default {rate:g})",
    )
    for flag, name, text in (
        ("--replay-cache-per-link", "replay_cache_per_link", "frame ids remembered per link"),
        (
            "--replay-signers-per-link",
            "replay_signers_per_link",
            "signers whose replay floor a link's window remembers",
        ),
    ):
        _positive_int_flag(parser, flag, getattr(policy, name), text)
    limits = DhtLimits()
    for flag, name, text in _DHT_CAPS:
        _positive_int_flag(parser, flag, getattr(limits, name), text, dest=f"dht_{name}")


def _history_flags(parser: argparse.ArgumentParser, house: HouseConfig) -> None:
    """The room history's switch and bounds (relay.house.history.HistoryBounds)."""
    bounds = house.history_bounds
    parser.add_argument(
        "--no-history", action="store_true", help="do not keep room history for catch-up"
    )
    for flag, default, text in (
        ("--history-max-per-room", bounds.max_per_room, "room history: events kept per room"),
        ("--history-max-events", bounds.max_events, "room history: events kept in all"),
        (
            "--history-max-age-s",
            bounds.max_age_ms // 1000,
            "room history: seconds an event is kept",
        ),
        (
            "--history-max-expired",
            bounds.max_expired,
            "room history: marks of expired events kept (they report gaps)",
        ),
    ):
        _positive_int_flag(parser, flag, default, text)


def _positive_int_flag(
    parser: argparse.ArgumentParser, flag: str, default: int, text: str, dest: str | None = None
) -> None:
    """``flag N``: a positive integer, ``default`` named at the end of its help ``text``."""
    parser.add_argument(
        flag, dest=dest, type=_positive(int), default=default, help=f"{text} (default {default})"
    )


def config_from_args(args: argparse.Namespace) -> StationConfig:
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
    policy = StationPolicy(
        puzzle_mode=PuzzleMode(args.puzzle),
        puzzle_difficulty=args.puzzle_difficulty,
        max_clock_skew_ms=args.max_clock_skew_ms,
        quotas=quotas,
        quic_retry=not args.no_quic_retry,
        max_inbound_links=args.max_inbound_links,
        replay_cache_per_link=args.replay_cache_per_link,
        replay_signers_per_link=args.replay_signers_per_link,
        realm_sweep_ms=args.realm_sweep_ms,
        **{name: getattr(args, name) for _, name, _ in _BOUNDS},
    )
    if args.known_peers_max < 0:
        raise SystemExit("macula-relay: --known-peers-max must be >= 0")
    dht_limits = DhtLimits(**{name: getattr(args, f"dht_{name}") for _, name, _ in _DHT_CAPS})
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
    if args.content_keep_ms < 0:
        raise SystemExit("macula-relay: --content-keep-ms must be >= 0")
    store_limits = StoreLimits(
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
    if args.lat is not None and not -90 <= args.lat <= 90:
        raise SystemExit("macula-relay: --lat must be -90..90")
    if args.lng is not None and not -180 <= args.lng <= 180:
        raise SystemExit("macula-relay: --lng must be -180..180")
    if not 0 <= args.directory_puzzle_difficulty <= 64:
        raise SystemExit("macula-relay: --directory-puzzle-difficulty must be 0..64")
    house = HouseConfig(
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
        history=not args.no_history,
        history_bounds=HistoryBounds(
            max_per_room=args.history_max_per_room,
            max_events=args.history_max_events,
            max_age_ms=args.history_max_age_s * 1000,
            max_expired=args.history_max_expired,
        ),
    )
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


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, 0600, whole: a reader sees the old file or the new one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


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
                    _write_private(path, text)
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


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, loaded = _options(argv)
    if args.print_config:
        print(config_file.render(build_parser(), args), end="")
        return
    service.check(args)
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if args.log_file is not None:
        try:
            handler = logging.handlers.RotatingFileHandler(
                args.log_file, maxBytes=args.log_max_bytes, backupCount=args.log_backups
            )
        except OSError as exc:
            raise SystemExit(f"macula-relay: --log-file {args.log_file}: {exc}") from None
    handler.setFormatter(JsonFormatter() if args.log_format == "json" else KeyValueFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    logging.getLogger("quic").setLevel(logging.WARNING)
    for chatty in ("kademlia", "rpcudp"):  # the DHT package logs every lookup at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        config = config_from_args(args)
    except SystemExit as exc:  # a check naming a --flag: also where the file set it
        raise SystemExit(loaded.blame(str(exc.code))) from None
    options = service.ServiceOptions(args, reparse=lambda: _options(argv)[0])
    lifetime = LifetimeRule(args.exit_when_gone, args.idle_exit_s)
    try:
        run_loop(
            serve(
                config, args.endpoint_file, args.pid_file, lifetime, args.lifetime_check_s, options
            )
        )
    except (ConfigError, StationEndorsementError) as exc:  # e.g. MACULA_LOOP names no loop
        raise SystemExit(f"macula-relay: {exc}") from None
    except OSError as exc:
        raise SystemExit(
            f"macula-relay: cannot listen on {config.host}:{config.port}: {exc}"
        ) from None


if __name__ == "__main__":
    main()
