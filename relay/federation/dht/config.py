"""The station DHT's settings (``relay.federation.dht.station``): sizes, periods and limits, each
checked on construction (a bad one raises ``ValueError`` naming it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from macula.wire.records import STATION_ENDPOINT_TTL_MS
from relay.federation.dht.guard import GuardLimits
from relay.federation.dht.storage import DhtLimits


@dataclass(frozen=True, slots=True)
class DhtConfig:
    ksize: int = 20
    alpha: int = 3
    rpc_timeout_s: float = 2.0
    own_period_s: float = 60.0
    own_ttl_ms: int = STATION_ENDPOINT_TTL_MS
    replicate_period_s: float = 600.0
    refresh_period_s: float = 3600.0
    # lookups stations() runs at once (more loses datagrams when many stations share a host)
    stations_concurrency: int = 4
    # stations() looks a known station's endpoint up again once this share (percent) of its
    # record's lifetime has passed (or it expired); until then the address learned is used
    endpoint_refresh_percent: int = 50
    # consecutive unanswered requests before a station leaves the routing table
    evict_after_timeouts: int = 3
    # STOREs pushed to a station seen for the first time (values it should hold); 0 = none
    welcome_max_values: int = 32
    # station ids remembered as already welcomed; record bytes remembered as checked
    welcome_memory: int = 4_096
    verified_cache: int = 8_192
    # pages of records read from one station's answer to a find (each one UDP datagram)
    find_pages: int = 8
    # a return-address token got from a station is used this long before asking anew
    token_reuse_s: float = 60.0
    # own records are put again this long after a join through a new link (one put for a
    # burst of links coming up, not one per link: issue 37's meshing links many at once)
    rejoin_publish_delay_s: float = 1.0
    limits: DhtLimits = field(default_factory=DhtLimits)
    guard: GuardLimits = field(default_factory=GuardLimits)

    def __post_init__(self) -> None:
        for name in (
            "ksize",
            "alpha",
            "own_ttl_ms",
            "stations_concurrency",
            "evict_after_timeouts",
            "welcome_memory",
            "find_pages",
        ):
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise ValueError(f"DhtConfig.{name} must be a positive int")
        for name in ("welcome_max_values", "verified_cache"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise ValueError(f"DhtConfig.{name} must be an int >= 0")
        percent = self.endpoint_refresh_percent
        if type(percent) is not int or not 1 <= percent <= 100:
            raise ValueError("DhtConfig.endpoint_refresh_percent must be an int in 1..100")
        for name in (
            "rpc_timeout_s",
            "own_period_s",
            "replicate_period_s",
            "refresh_period_s",
            "token_reuse_s",
            "rejoin_publish_delay_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"DhtConfig.{name} must be positive")
