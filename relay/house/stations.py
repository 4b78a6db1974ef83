"""The station directory: which stations the mesh has (``macula.stations.list_stations_v1``).

Invariants:
- ``handle`` never raises (cancellation aside): every call ends in an ``Outcome``, through
  ``relay.builtins.outcome.answer``. Refusals are 0x0F ``<reason>: <text>`` with reason
  ``bad_request`` or
  ``unknown_procedure``; anything else is a bug, logged with its traceback and answered 0x02.
- Arguments are validated completely (``relay.builtins.arguments``) before anything is listed. A
null
  argument, and a null optional key, count as absent; extra keys are ignored. Results carry no
  booleans.
- This station is always listed first; at most ``MAX_KNOWN_STATIONS`` others are learned
  (a new one beyond that is refused and counted, ``stats["stations_over_limit"]``).
- Others are learned from two sources: a link (``linked``: what the linked station said of
  itself over the link; it wins over discovery, and goes with the link unless discovery still
  names the station) and discovery (``discovered``: the DHT's live stations, each round
  replacing the last, so a station gone from the DHT and not linked drops out).
- Filters are case-insensitive exact matches; ``near`` keeps stations with a known position,
  nearest first (haversine), ties by node id.
No clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from macula.services.house import LIST_STATIONS
from macula.services.limits import MAX_PLACE_CHARS
from macula.store.base import check_node_id
from relay.builtins.arguments import (
    handler_for,
    integer,
    is_text,
    number,
    optional_map,
    optional_text,
)
from relay.builtins.outcome import Handler, Outcome, answer

__all__ = [
    "MAX_KNOWN_STATIONS",
    "StationDirectory",
    "StationEntry",
    "StationInfo",
    "haversine_km",
]

logger = logging.getLogger("macula.relay.house")


MAX_HOST_CHARS: Final = 253
MAX_KNOWN_STATIONS: Final = 1000
DEFAULT_NEAR_LIMIT: Final = 10
MAX_NEAR_LIMIT: Final = 100
EARTH_RADIUS_KM: Final = 6371.0088  # the IUGG mean radius
STATION_KIND: Final = "station"
STATION_CAPABILITIES: Final = 1


@dataclass(frozen=True, slots=True)
class StationInfo:
    """Where a station listens and, if it says so, where on Earth it is."""

    host: str
    port: int
    city: str | None = None
    country: str | None = None
    continent: str | None = None
    lat: float | None = None
    lng: float | None = None

    def __post_init__(self) -> None:
        if not is_text(self.host, 1, MAX_HOST_CHARS):
            raise ValueError(f"host must be 1..{MAX_HOST_CHARS} characters of text")
        if type(self.port) is not int or not 1 <= self.port <= 0xFFFF:
            raise ValueError("port must be an int 1..65535")
        for name in ("city", "country", "continent"):
            value = getattr(self, name)
            if value is not None and not is_text(value, 1, MAX_PLACE_CHARS):
                raise ValueError(f"{name} must be None or 1..{MAX_PLACE_CHARS} characters of text")
        if (self.lat is None) != (self.lng is None):
            raise ValueError("give both lat and lng, or neither")
        for name, bound in (("lat", 90.0), ("lng", 180.0)):
            value = getattr(self, name)
            if value is None:
                continue
            if type(value) not in (int, float) or not -bound <= value <= bound:
                raise ValueError(f"{name} must be a number -{bound:g}..{bound:g}")
            object.__setattr__(self, name, float(value))

    @property
    def position(self) -> tuple[float, float] | None:
        return None if self.lat is None or self.lng is None else (self.lat, self.lng)


@dataclass(frozen=True, slots=True)
class StationEntry:
    """One station the directory lists: its node id (32 bytes) and what it says about itself."""

    node_id: bytes
    info: StationInfo

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        if not isinstance(self.info, StationInfo):
            raise ValueError("info must be a StationInfo")


@dataclass(frozen=True, slots=True)
class _Near:
    lat: float
    lng: float
    limit: int


@dataclass(frozen=True, slots=True)
class _StationQuery:
    near: _Near | None
    places: tuple[tuple[str, str], ...]  # (field, casefolded wanted value)

    def matches(self, info: StationInfo) -> bool:
        for name, wanted in self.places:
            value = getattr(info, name)
            if value is None or value.casefold() != wanted:
                return False
        return True


def _station_query(payload: object) -> _StationQuery:
    args = optional_map(payload)
    near = None
    if args.get("near") is not None:
        near_args = optional_map(args["near"], "'near'")
        near = _Near(
            lat=number(near_args, "lat", -90.0, 90.0, label="near.lat"),
            lng=number(near_args, "lng", -180.0, 180.0, label="near.lng"),
            limit=integer(
                near_args,
                "limit",
                1,
                MAX_NEAR_LIMIT,
                default=DEFAULT_NEAR_LIMIT,
                label="near.limit",
            ),
        )
    places = []
    for name in ("continent", "country", "city"):
        value = optional_text(args, name, low=1, high=MAX_PLACE_CHARS, nul_ok=True)
        if value is not None:
            places.append((name, value.casefold()))
    return _StationQuery(near, tuple(places))


def haversine_km(lat1: float, lng1: float, lat2: float, lng2: float) -> float:
    """The great-circle distance in km between two points given in degrees."""
    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    half = (
        math.sin((phi2 - phi1) / 2) ** 2
        + math.cos(phi1) * math.cos(phi2) * math.sin(math.radians(lng2 - lng1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(half)))


def _station_view(entry: StationEntry, distance_km: float | None = None) -> dict[str, object]:
    info = entry.info
    view: dict[str, object] = {
        "node_id": entry.node_id.hex(),
        "host": info.host,
        "port": info.port,
        "city": info.city,
        "country": info.country,
        "continent": info.continent,
        "lat": info.lat,
        "lng": info.lng,
    }
    if distance_km is not None:
        view["distance_km"] = round(distance_km, 3)
    return view


def _coordinate_text(value: float) -> str:
    """A coordinate as §10.6 wants it: text, at most 6 decimals (about 0.1 m), no ``-0``."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


class StationDirectory:
    """``macula.stations.list_stations_v1`` over this station and the stations learned since."""

    def __init__(self, station_id: bytes, info: StationInfo) -> None:
        self.own = StationEntry(station_id, info)
        self._known: dict[bytes, StationInfo] = {}
        self._linked: set[bytes] = set()  # learned from a link (what it said of itself)
        self._discovered: set[bytes] = set()  # named by the last discovery round
        self.stats: Counter[str] = Counter()
        self._handlers: dict[str, Handler] = {LIST_STATIONS: self._list_stations}

    @property
    def station_id(self) -> bytes:
        return self.own.node_id

    def add_known(self, entry: StationEntry) -> bool:
        """Learn (or update) another station; False if the directory is full and it is new."""
        if not isinstance(entry, StationEntry):
            raise ValueError("add_known takes a StationEntry")
        if entry.node_id == self.station_id:
            raise ValueError("this station's own entry is fixed at construction")
        if entry.node_id not in self._known and len(self._known) >= MAX_KNOWN_STATIONS:
            return False
        self._known[entry.node_id] = entry.info
        return True

    def knows(self, node_id: bytes) -> bool:
        """``node_id`` is this station or a learned one."""
        return node_id == self.station_id or node_id in self._known

    def forget(self, node_id: bytes) -> bool:
        """Drop a learned station; True if it was known."""
        self._linked.discard(node_id)
        self._discovered.discard(node_id)
        return self._known.pop(node_id, None) is not None

    def linked(self, entry: StationEntry) -> bool:
        """A link to ``entry``'s station is up and it described itself; False if full."""
        if entry.node_id == self.station_id:
            return False
        if not self._learn(entry):
            return False
        self._linked.add(entry.node_id)
        return True

    def unlinked(self, node_id: bytes) -> None:
        """The link to ``node_id`` is gone: it stays listed only while discovery names it."""
        self._linked.discard(node_id)
        if node_id not in self._discovered:
            self._known.pop(node_id, None)

    def discovered(self, entries: Iterable[StationEntry]) -> int:
        """One discovery round's live stations replace the last round's; how many are new.
        A linked station keeps what it said of itself."""
        seen: set[bytes] = set()
        new = 0
        for entry in entries:
            if entry.node_id == self.station_id or entry.node_id in seen:
                continue
            if entry.node_id not in self._linked:
                known = entry.node_id in self._known
                if not self._learn(entry):
                    continue
                new += not known
            seen.add(entry.node_id)
        for gone in self._discovered - seen - self._linked:
            self._known.pop(gone, None)
        self._discovered = seen
        return new

    def _learn(self, entry: StationEntry) -> bool:
        if entry.node_id not in self._known and len(self._known) >= MAX_KNOWN_STATIONS:
            self.stats["stations_over_limit"] += 1
            return False
        self._known[entry.node_id] = entry.info
        return True

    def entries(self) -> list[StationEntry]:
        """This station first, then the learned ones by node id."""
        known = [StationEntry(node_id, self._known[node_id]) for node_id in sorted(self._known)]
        return [self.own, *known]

    def own_record_payload(self) -> dict[str, object]:
        """The payload of a node_record (0x01, §10.6) for this station; absent fields omitted."""
        info = self.own.info
        payload: dict[str, object] = {
            "node_id": self.station_id,
            "station_id": self.station_id,
            "realms": [],
            "capabilities": STATION_CAPABILITIES,
            "hostname": info.host,
            "endpoint": f"quic://{info.host}:{info.port}",
            "kind": STATION_KIND,
        }
        for name in ("city", "country"):
            value = getattr(info, name)
            if value is not None:
                payload[name] = value
        if info.position is not None:
            lat, lng = info.position
            payload["lat"] = _coordinate_text(lat)
            payload["lng"] = _coordinate_text(lng)
        return payload

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure``. Never raises."""
        return await answer(
            procedure,
            lambda: handler_for(self._handlers, procedure)(payload, caller, now_ms),
            logger,
        )

    async def _list_stations(self, payload: object, caller: bytes, now_ms: int) -> object:
        query = _station_query(payload)
        matches = [entry for entry in self.entries() if query.matches(entry.info)]
        if query.near is None:
            views = [_station_view(entry) for entry in matches]
        else:
            near = query.near
            placed = [
                (haversine_km(near.lat, near.lng, *entry.info.position), entry.node_id, entry)
                for entry in matches
                if entry.info.position is not None
            ]
            placed.sort(key=lambda item: (item[0], item[1]))
            views = [_station_view(entry, km) for km, _, entry in placed[: near.limit]]
        return {"count": len(views), "stations": views}
