"""What a station is told at start (``relay.station.station.Station``): its address, data dir,
policy,
links to peer stations, protected realms and admission."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from macula.wire.records import Record
from relay.core.policy import StationPolicy
from relay.federation.dht.station import DhtConfig
from relay.federation.links import LinkTarget, StationLike
from relay.house.services import HouseConfig
from relay.realms.admission import AdmissionMode
from relay.realms.gate import ProtectedRealm
from relay.stores.records import StoreLimits


@dataclass
class StationConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 4433
    # the DHT among stations (UDP): None = port + 1, or any free port when port is 0
    dht_port: int | None = None
    dht: DhtConfig = field(default_factory=DhtConfig)
    # names and addresses clients may dial (certificate SANs, station_endpoint record)
    advertised_hosts: list[str] = field(default_factory=list)
    policy: StationPolicy = field(default_factory=StationPolicy)
    tick_interval_s: float = 0.2
    endpoint_refresh_s: float = 60.0
    house: HouseConfig = field(default_factory=HouseConfig)
    store_limits: StoreLimits = field(default_factory=StoreLimits)
    # --- links to peer stations (docs/federation.md) ---
    peers: list[LinkTarget] = field(default_factory=list)  # ``--peer NODE_ID@HOST:PORT``
    max_links: int = 64  # stations this one dials at most
    # more stations to link with (the DHT's ``stations()``); None: only ``peers``
    discover: Callable[[], Awaitable[Sequence[StationLike]]] | None = None
    discover_interval_s: float = 30.0
    link_backoff_s: float = 0.5  # first redial delay, doubling up to ``link_backoff_max_s``
    link_backoff_max_s: float = 30.0
    link_timeout_s: float = 10.0  # QUIC handshake with a peer station
    # stations linked with or discovered, remembered in the data dir and dialled again after
    # a restart (besides ``peers``); at most this many, 0: none remembered
    known_peers_max: int = 256
    # --- protected realms and admission (relay.realms.gate, relay.realms.admission; issue 13) ---
    realms: list[ProtectedRealm] = field(default_factory=list)  # ``--realm NAME=KEY``
    # this station's station endorsements (``--realm-endorsement FILE``), shown on its links
    station_endorsements: list[Record] = field(default_factory=list)
    admission: AdmissionMode = AdmissionMode.OPEN
    allowlist: Path | None = None  # node ids, one a line; re-read when it changes
    # --- one worker of ``macula-relay --workers N`` (relay.workers.balancer) ---
    reuse_port: bool = False  # bind ``port`` with SO_REUSEPORT, shared with the other workers
    # a second QUIC listener on 127.0.0.1 for the other workers' links (None: none)
    link_port: int | None = None
    # the other workers to dial: they hold this station's own key (``relay.workers.balancer``)
    siblings: list[LinkTarget] = field(default_factory=list)
