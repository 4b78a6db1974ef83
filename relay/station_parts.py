"""What a started station is made of, and the read accessors every other module uses.

``StationParts`` is the base of ``relay.station.Station``: the parts its start opens
(``relay.station_build`` makes them) and the connections it numbered, each read through a
property that says "station not started" instead of handing out None. It holds no behaviour:
opening and closing the parts, the task group and the action executor are the station's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from macula.transport import FrameProtocol
from macula.wire.identity import Identity
from relay.builtins import Builtins
from relay.core import RouterCore
from relay.federation.dht import StationDht
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkManager
from relay.house.services import HouseServices
from relay.realm_files import Allowlist
from relay.station_config import StationConfig
from relay.store import ContentStore, RecordStore

__all__ = ["StationParts"]


class StationParts:
    def __init__(self, config: StationConfig) -> None:
        self.config = config
        self.identity: Identity | None = None
        self.port = 0
        self._core: RouterCore | None = None
        self._connections: dict[int, FrameProtocol] = {}
        self._records: RecordStore | None = None
        self._content: ContentStore | None = None
        self._builtins: Builtins | None = None
        self._house: HouseServices | None = None
        self._dht: StationDht | None = None
        self._closing = False  # stopping: a Close is carried out at once, nothing new spawns
        self.links: LinkManager | None = None
        self.known_peers: KnownPeers | None = None
        # called as (node_id, host, dht_port) when a link comes up (e.g. a DHT bootstrap)
        self.link_up_hook: Callable[[bytes, str, int], None] | None = None
        self.allowlist: Allowlist | None = None

    @property
    def core(self) -> RouterCore:
        assert self._core is not None, "station not started"
        return self._core

    @property
    def dht(self) -> StationDht:
        assert self._dht is not None, "station not started"
        return self._dht

    @property
    def dht_or_none(self) -> StationDht | None:
        return self._dht

    @property
    def records(self) -> RecordStore | None:
        return self._records

    @property
    def content(self) -> ContentStore | None:
        return self._content

    @property
    def builtins(self) -> Builtins | None:
        return self._builtins

    @property
    def house(self) -> HouseServices | None:
        return self._house

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def node_id(self) -> bytes:
        assert self.identity is not None, "station not started"
        return self.identity.node_id

    @property
    def retry(self) -> bool:
        """QUIC address validation (Retry): on unless turned off or bound to loopback."""
        return self.config.policy.quic_retry and not _is_loopback(self.config.host)

    @property
    def endpoint(self) -> str:
        """``node_id@host:port``: what a client needs to dial and pin this station."""
        return f"{self.node_id.hex()}@{self.config.host}:{self.port}"

    def connection_count(self) -> int:
        """Connections open now (clients and links)."""
        return len(self._connections)

    def connection(self, conn: int) -> FrameProtocol | None:
        return self._connections.get(conn)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
