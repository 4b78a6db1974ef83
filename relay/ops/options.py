"""``macula-relay``'s options: the argparse definitions, one function per section.

``build_parser`` adds them in the order ``--help`` lists them; ``relay.ops.config_file`` derives
the config file's keys from these same definitions. ``BOUNDS`` and ``DHT_CAPS`` are the
tables of positive-integer bounds whose flags map one to one onto ``StationPolicy`` and
``DhtLimits`` fields (``relay.ops.cli.config_from_args`` reads them back).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from macula.config import HOME_ENV, STATIONS_ENV
from macula.help_format import HelpFormatter
from relay.core.policy import PuzzleMode, Quotas, StationPolicy
from relay.federation.dht.storage import DhtLimits
from relay.federation.links import LinkTarget, parse_peer
from relay.house.services import HouseConfig
from relay.ops import service
from relay.realms.admission import AdmissionMode
from relay.realms.gate import ProtectedRealm, parse_realm_flag
from relay.station.config import StationConfig
from relay.stores.records import StoreLimits
from relay.workers.balancer import MAX_WORKERS, parse_role


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


BOUNDS = (  # (flag, StationPolicy field, help): positive integers (issue 11)
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


Flags = argparse._ActionsContainer  # a parser or one of its argument groups

DESCRIPTION = f"""Run a Macula station: the meeting point agents connect to over QUIC (UDP).
It prints one line once it listens, node_id@host:port: that is what clients pin
({STATIONS_ENV}). Every flag can also be a key of a --config file."""

EPILOG = """
examples:
  macula-relay                                  # loopback, port 4433, data in ~/.macula/station
  macula-relay --host 0.0.0.0 --advertise-host vps.example.org   # a station others dial
  macula-relay --config station.toml --print-config               # the effective settings

docs/operations.md says how to run one as a service, docs/federation.md how stations link,
docs/two-machines.md how two laptops meet through one."""


def build_parser() -> argparse.ArgumentParser:
    """Every ``macula-relay`` option, in the order ``--help`` lists them, in groups."""
    defaults = Quotas()
    policy = StationPolicy()
    house = HouseConfig()  # house-service limits (relay.house.services.HouseConfig)
    parser = argparse.ArgumentParser(
        prog="macula-relay",
        usage="macula-relay [--host HOST] [--port PORT] [--advertise-host NAME] [FLAG ...]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )

    def group(title: str, description: str) -> Flags:
        return parser.add_argument_group(title, description)

    _listen_flags(group("listening", "where the station listens and what clients dial"))
    logs = group("logging and process", "logs, the files macula-mcp reads, when it exits")
    _process_flags(logs)
    _client_flags(group("client limits", "what a client must do and may do"), defaults)
    _store_flags(
        group("store and frame limits", "what the station holds and accepts per frame"),
        defaults,
        policy,
    )
    _house_flags(group("house services", "shared memory and the directories it serves"), house)
    _history_flags(group("house services: room history", "kept for catch-up"), house)
    federation = group("federation", "links with other stations and the DHT among them")
    _link_flags(federation)
    _federation_flags(federation, policy)
    _realm_flags(group("realms", "protected realms and who may connect"), policy)
    service.add_flags(
        group("configuration file", "every flag as a key of a TOML file"),
        monitor=group("monitor", "an HTTP status page and metrics (off by default)"),
        logs=logs,
    )
    return parser


def _listen_flags(parser: Flags) -> None:
    """Where the station listens and what it advertises."""
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
        help=f"key, certificate and stores (default ${HOME_ENV}/station)",
    )
    parser.add_argument(
        "--advertise-host",
        action="append",
        default=[],
        metavar="NAME",
        help="host name or IP clients dial (certificate SAN, station_endpoint record); repeatable",
    )
    parser.add_argument(
        "--no-quic-retry",
        action="store_true",
        help="no QUIC address validation (Retry; on by default unless bound to loopback)",
    )


def _process_flags(parser: Flags) -> None:
    """Logs, the files ``macula-mcp`` reads, and when the station exits by itself."""
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines written",
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
        help="exit by itself once PATH no longer exists (default: never)",
    )
    parser.add_argument(
        "--idle-exit-s",
        type=_positive(float),
        metavar="SECONDS",
        help="exit by itself after this long with no connection open (default: never)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help=f"station processes sharing the UDP port, 1..{MAX_WORKERS} (default 1;"
        " docs/operations.md)",
    )
    parser.add_argument(  # set by the parent of --workers N on each worker it starts
        "--worker-role", type=parse_role, default=None, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--lifetime-check-s",
        type=_positive(float),
        default=2.0,
        metavar="SECONDS",
        help="how often --exit-when-gone and --idle-exit-s are checked",
    )


def _client_flags(parser: Flags, defaults: Quotas) -> None:
    """What a client must do (puzzle, clock) and may do (quotas, rates)."""
    parser.add_argument(
        "--puzzle",
        default="off",
        choices=[m.value for m in PuzzleMode],
        help="S/Kademlia puzzle policy for clients (default off)",
    )
    parser.add_argument(
        "--puzzle-difficulty",
        type=int,
        default=8,
        help="identity puzzle bits a client's node id must meet when --puzzle asks, 0..64",
    )
    parser.add_argument(
        "--max-clock-skew-ms",
        type=int,
        default=300_000,
        help="refuse frames whose sent_at_ms is further off; 0 disables replay checks"
        " (default 300000)",
    )
    parser.add_argument(
        "--max-subscriptions",
        type=_positive(int),
        default=defaults.max_subscriptions,
        help="subscriptions one connection may hold",
    )
    parser.add_argument(
        "--max-advertisements",
        type=_positive(int),
        default=defaults.max_advertisements,
        help="procedures one connection may advertise",
    )
    parser.add_argument(
        "--max-pending-calls",
        type=_positive(int),
        default=defaults.max_pending_calls,
        help="calls one connection may have waiting for an answer",
    )
    parser.add_argument(
        "--max-streams",
        type=_positive(int),
        default=defaults.max_streams,
        help="streams (content, stream calls) one connection may have open",
    )
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


def _store_flags(parser: Flags, defaults: Quotas, policy: StationPolicy) -> None:
    """Store limits (relay.stores.limits), the outbound queue, the frame and connection bounds."""
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
    for flag, name, text in BOUNDS:
        _positive_int_flag(parser, flag, getattr(policy, name), text)


def _house_flags(parser: Flags, house: HouseConfig) -> None:
    """The house services' switches, place and limits."""
    parser.add_argument("--no-memory", action="store_true", help="do not serve shared memory")
    parser.add_argument(
        "--no-station-directory", action="store_true", help="do not serve the station directory"
    )
    parser.add_argument(
        "--no-agent-directory", action="store_true", help="do not serve the agent directory"
    )
    parser.add_argument(
        "--no-reservations", action="store_true", help="do not serve path reservations"
    )
    parser.add_argument(
        "--reservations-max-total",
        type=_positive(int),
        default=house.reservations_max_total,
        help="live path reservations on this station, every project together",
    )
    for name in ("city", "country", "continent"):
        parser.add_argument(f"--{name}", help=f"this station's {name} (station directory)")
    parser.add_argument("--lat", type=float, help="latitude, -90..90 (station directory)")
    parser.add_argument("--lng", type=float, help="longitude, -180..180 (station directory)")
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


def _link_flags(parser: Flags) -> None:
    """The stations to link with."""
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


def _realm_flags(parser: Flags, policy: StationPolicy) -> None:
    """Protected realms and admission (relay.realms.gate, relay.realms.admission)."""
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


DHT_CAPS = (  # (flag, DhtLimits field, help): what this station holds for the mesh's DHT
    ("--dht-max-records", "records_total", "DHT records held for the mesh"),
    ("--dht-max-bytes", "bytes_total", "bytes of those"),
    ("--dht-max-records-per-signer", "records_per_signer", "of those, by one signer"),
    ("--dht-max-bytes-per-signer", "bytes_per_signer", "bytes of one signer's"),
)


def _federation_flags(parser: Flags, policy: StationPolicy) -> None:
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
    for flag, name, text in DHT_CAPS:
        _positive_int_flag(parser, flag, getattr(limits, name), text, dest=f"dht_{name}")


def _history_flags(parser: Flags, house: HouseConfig) -> None:
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
    parser: Flags, flag: str, default: int, text: str, dest: str | None = None
) -> None:
    """``flag N``: a positive integer, ``default`` named at the end of its help ``text``."""
    parser.add_argument(
        flag, dest=dest, type=_positive(int), default=default, help=f"{text} (default {default})"
    )
