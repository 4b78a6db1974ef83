"""House directories: which stations the mesh has, and which agents chose to be listed.

Invariants:
- ``handle`` never raises (cancellation aside): every call ends in an ``Outcome``. Refusals are
  raised inside as ``Refused`` and converted in ``_answer`` only, as 0x0F ``<reason>: <text>``
  with reason ``bad_request``, ``unauthorized``, ``directory_full`` or ``unknown_procedure``;
  anything else is a bug or a disk error, logged with its traceback and answered 0x02.
- Arguments are validated completely before any state is touched. A null argument, and a null
  optional key, count as absent; extra keys are ignored. Results carry no booleans.
- Only the key holder writes an agent entry: ``entry.node_id`` must be the authenticated caller,
  and the payload must carry that key's proof bound to ``<procedure>#<node hex>`` within
  ``PROOF_SKEW_MS`` of ``now_ms``. A replay is only useful to the key holder itself.
- Expired agent entries are never listed; ``list`` and ``register`` delete them lazily and
  ``prune`` on demand. A new node beyond ``max_agents`` live entries is refused
  ``directory_full``; a renewal always passes.
- Station filters are case-insensitive exact matches; ``near`` keeps stations with a known
  position, nearest first (haversine), ties by node id.
No clock: ``now_ms`` is an argument.
"""

from __future__ import annotations

import builtins
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from macula.agent.envelope import is_node_hex
from macula.agent.petnames import petname
from macula.agent.proof import verify_proof
from macula.store.base import (
    Migration,
    Row,
    SqliteStore,
    check_limit,
    check_node_id,
    execute,
    fetchall,
    opt_text,
)
from macula.wire.codes import ErrorCode
from relay.outcome import Outcome, Refused

__all__ = [
    "MAX_AGENTS",
    "MAX_KNOWN_STATIONS",
    "PROCEDURE_LIST",
    "PROCEDURE_LIST_STATIONS",
    "PROCEDURE_REGISTER",
    "PROCEDURE_REMOVE",
    "AgentDirectory",
    "AgentDirectoryStore",
    "AgentEntry",
    "AgentRegistration",
    "StationDirectory",
    "StationEntry",
    "StationInfo",
    "haversine_km",
    "key_holder_procedure",
]

logger = logging.getLogger("macula.relay.house")

PROCEDURE_LIST_STATIONS: Final = "macula.stations.list_stations_v1"
PROCEDURE_REGISTER: Final = "macula.agents.register_v1"
PROCEDURE_REMOVE: Final = "macula.agents.remove_v1"
PROCEDURE_LIST: Final = "macula.agents.list_v1"

PROOF_SKEW_MS: Final = 60_000
MAX_TEXT_CHARS: Final = 280
MAX_PLACE_CHARS: Final = 100
MAX_HOST_CHARS: Final = 253
MAX_OFFERS: Final = 32
MAX_KNOWN_STATIONS: Final = 1000
MAX_AGENTS: Final = 10_000
DEFAULT_NEAR_LIMIT: Final = 10
MAX_NEAR_LIMIT: Final = 100
DEFAULT_LIST_LIMIT: Final = 200
MAX_LIST_LIMIT: Final = 500
MIN_TTL_S: Final = 60
DEFAULT_TTL_S: Final = 1200
MAX_TTL_S: Final = 3600
EARTH_RADIUS_KM: Final = 6371.0088  # the IUGG mean radius
STATION_KIND: Final = "station"
STATION_CAPABILITIES: Final = 1

_Args = Mapping[object, object]
_Handler = Callable[[object, bytes, int], Awaitable[object]]


# --- refusals and argument checks -------------------------------------------------------------


def _refusal(reason: str, text: str) -> Refused:
    return Refused(ErrorCode.UNKNOWN_ERROR, reason, text)


def _bad_request(text: str) -> Refused:
    return _refusal("bad_request", text)


def _kind(value: object) -> str:
    """A short description of a peer value for error details (never more than a number)."""
    if type(value) is bool:
        return "bool"
    if value is None:
        return "null"
    if type(value) is int:
        return f"int {value}" if abs(value) < 10**20 else "a huge int"
    if type(value) is float:
        return f"float {value!r}"
    if isinstance(value, str):
        return f"text({len(value)} chars)"
    if isinstance(value, bytes):
        return f"bytes({len(value)})"
    if isinstance(value, list | tuple):
        return "array"
    return "map" if isinstance(value, Mapping) else type(value).__name__


def _map(value: object, label: str) -> _Args:
    """``value`` as a map; null counts as an empty one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad_request(f"{label} must be a map, got {_kind(value)}")
    return value


def _required(args: _Args, key: str, label: str) -> object:
    value = args.get(key)
    if value is None:
        raise _bad_request(f"missing {label!r}")
    return value


def _is_text(value: object, low: int, high: int) -> bool:
    if type(value) is not str or not low <= len(value) <= high:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not text SQLite or CBOR can carry
        return False
    return True


def _text(args: _Args, key: str, label: str, high: int, low: int = 0) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not _is_text(value, low, high):
        raise _bad_request(
            f"{label!r} must be {low}..{high} characters of text, got {_kind(value)}"
        )
    assert isinstance(value, str)
    return value


def _int(args: _Args, key: str, label: str, low: int, high: int, default: int) -> int:
    value = args.get(key)
    if value is None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise _bad_request(f"{label!r} must be an int {low}..{high}, got {_kind(value)}")
    return value


def _number(args: _Args, key: str, label: str, bound: float) -> float:
    value = _required(args, key, label)
    if not (type(value) is int or type(value) is float) or not -bound <= value <= bound:
        raise _bad_request(f"{label!r} must be a number -{bound:g}..{bound:g}, got {_kind(value)}")
    return float(value)


def _node_hex(args: _Args, key: str, label: str) -> str:
    value = _required(args, key, label)
    if not is_node_hex(value):
        raise _bad_request(f"{label!r} must be a node id in 64 lowercase hex, got {_kind(value)}")
    assert isinstance(value, str)
    return value


async def _answer(
    handlers: Mapping[str, _Handler], procedure: str, payload: object, caller: bytes, now_ms: int
) -> Outcome:
    """Run the handler of ``procedure``; the one place refusals and bugs become outcomes."""
    handler = handlers.get(procedure) if type(procedure) is str else None
    try:
        if handler is None:
            raise _refusal("unknown_procedure", f"this service answers {', '.join(handlers)}")
        return Outcome.result(await handler(payload, caller, now_ms))
    except Refused as refused:
        return Outcome.error(refused.code, refused.detail)
    except Exception:
        logger.exception("house service %.100r failed", procedure)
        return Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)


# --- the station directory --------------------------------------------------------------------


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
        if not _is_text(self.host, 1, MAX_HOST_CHARS):
            raise ValueError(f"host must be 1..{MAX_HOST_CHARS} characters of text")
        if type(self.port) is not int or not 1 <= self.port <= 0xFFFF:
            raise ValueError("port must be an int 1..65535")
        for name in ("city", "country", "continent"):
            value = getattr(self, name)
            if value is not None and not _is_text(value, 1, MAX_PLACE_CHARS):
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
    args = _map(payload, "the argument")
    near = None
    if args.get("near") is not None:
        near_args = _map(args["near"], "'near'")
        near = _Near(
            lat=_number(near_args, "lat", "near.lat", 90.0),
            lng=_number(near_args, "lng", "near.lng", 180.0),
            limit=_int(near_args, "limit", "near.limit", 1, MAX_NEAR_LIMIT, DEFAULT_NEAR_LIMIT),
        )
    places = []
    for name in ("continent", "country", "city"):
        value = _text(args, name, name, MAX_PLACE_CHARS, low=1)
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
        self._handlers: dict[str, _Handler] = {PROCEDURE_LIST_STATIONS: self._list_stations}

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

    def forget(self, node_id: bytes) -> bool:
        """Drop a learned station; True if it was known."""
        return self._known.pop(node_id, None) is not None

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
        return await _answer(self._handlers, procedure, payload, caller, now_ms)

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


# --- the agent directory: store ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentEntry:
    """What an agent asked to be listed with; the handler has checked every field."""

    node_id: bytes
    petname: str
    operator_name: str | None = None
    session_name: str | None = None
    model: str | None = None
    connected_via: str | None = None
    offers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentRegistration:
    entry: AgentEntry
    registered_ms: int
    expires_ms: int


_AGENTS_V1: Final[Migration] = (
    """
    CREATE TABLE agents (
        node_id       BLOB PRIMARY KEY CHECK (length(node_id) = 32),
        petname       TEXT NOT NULL,
        operator_name TEXT,
        session_name  TEXT,
        model         TEXT,
        connected_via TEXT,
        offers        TEXT NOT NULL,   -- a JSON array of text
        registered_ms INTEGER NOT NULL,
        expires_ms    INTEGER NOT NULL
    ) WITHOUT ROWID
    """,
    "CREATE INDEX agents_by_expiry ON agents (expires_ms)",
    "CREATE INDEX agents_by_registered ON agents (registered_ms)",
)

_COLUMNS: Final = (
    "node_id, petname, operator_name, session_name, model, connected_via, offers,"
    " registered_ms, expires_ms"
)

_UPSERT: Final = f"""
INSERT OR REPLACE INTO agents ({_COLUMNS})
VALUES (:node_id, :petname, :operator_name, :session_name, :model, :connected_via, :offers,
        :registered_ms, :expires_ms)
"""

_COUNT_AND_PRESENT: Final = (
    "SELECT (SELECT count(*) FROM agents), EXISTS (SELECT 1 FROM agents WHERE node_id = ?)"
)


class AgentDirectoryStore(SqliteStore):
    """Agent entries keyed by node id, each with an expiry; most recently registered first."""

    MIGRATIONS = (_AGENTS_V1,)

    async def register(
        self, entry: AgentEntry, now_ms: int, expires_ms: int, max_entries: int = MAX_AGENTS
    ) -> bool:
        """Store or renew ``entry`` until ``expires_ms``; False (nothing stored) if the node is
        new and ``max_entries`` live entries are already held. Expired entries go first."""
        check_node_id(entry.node_id)
        params = {
            "node_id": entry.node_id,
            "petname": entry.petname,
            "operator_name": entry.operator_name,
            "session_name": entry.session_name,
            "model": entry.model,
            "connected_via": entry.connected_via,
            "offers": json.dumps(list(entry.offers), ensure_ascii=False),
            "registered_ms": now_ms,
            "expires_ms": expires_ms,
        }
        async with self._transaction() as db:
            await execute(db, "DELETE FROM agents WHERE expires_ms <= ?", (now_ms,))
            held, present = (await fetchall(db, _COUNT_AND_PRESENT, (entry.node_id,)))[0]
            if not present and int(held) >= max_entries:
                return False
            await execute(db, _UPSERT, params)
            return True

    async def remove(self, node_id: bytes) -> bool:
        """Forget ``node_id``; True if it was held (expired or not)."""
        check_node_id(node_id)
        return await self._execute("DELETE FROM agents WHERE node_id = ?", (node_id,)) > 0

    async def list(
        self, now_ms: int, limit: int = DEFAULT_LIST_LIMIT
    ) -> builtins.list[AgentRegistration]:
        """Unexpired entries, most recently registered first (ties by node id)."""
        check_limit(limit)
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM agents WHERE expires_ms > ?"
            " ORDER BY registered_ms DESC, node_id LIMIT ?",
            (now_ms, limit),
        )
        return [_registration(row) for row in rows]

    async def prune(self, now_ms: int) -> int:
        """Delete the entries expired at ``now_ms``; return how many."""
        return await self._execute("DELETE FROM agents WHERE expires_ms <= ?", (now_ms,))

    async def count(self) -> int:
        """Rows held, including expired ones not yet pruned."""
        row = await self._fetchone("SELECT count(*) FROM agents")
        return int(row[0]) if row is not None else 0


def _registration(row: Row) -> AgentRegistration:
    offers = json.loads(row[6])
    entry = AgentEntry(
        node_id=bytes(row[0]),
        petname=str(row[1]),
        operator_name=opt_text(row[2]),
        session_name=opt_text(row[3]),
        model=opt_text(row[4]),
        connected_via=opt_text(row[5]),
        offers=tuple(str(offer) for offer in offers) if isinstance(offers, list) else (),
    )
    return AgentRegistration(entry, registered_ms=int(row[7]), expires_ms=int(row[8]))


# --- the agent directory: procedures ----------------------------------------------------------


def key_holder_procedure(procedure: str, node_id: bytes) -> str:
    """What a register/remove proof is bound to: ``<procedure>#<64 hex node id>``."""
    return f"{procedure}#{node_id.hex()}"


def _caller_id(caller: object) -> bytes:
    if type(caller) is not bytes or len(caller) != 32:
        raise _refusal("unauthorized", "the caller has no authenticated node id")
    return caller


def _check_key_holder(
    args: _Args, procedure: str, node_hex: str, caller: bytes, now_ms: int
) -> None:
    """The caller is ``node_hex`` and proved it for ``procedure``, else ``unauthorized``."""
    if node_hex != caller.hex():
        raise _refusal("unauthorized", "only the holder of a node id's key may write its entry")
    bound = key_holder_procedure(procedure, caller)
    problem = verify_proof(args["proof"], caller, bound, now_ms, PROOF_SKEW_MS)
    if problem is not None:
        raise _refusal(
            "unauthorized",
            f"proof {problem}: sign {bound!r} with the caller's key within 60 s of now",
        )


def _offers(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or len(value) > MAX_OFFERS:
        raise _bad_request(f"'entry.offers' must be an array of at most {MAX_OFFERS} texts")
    for index, offer in enumerate(value):
        if not _is_text(offer, 1, MAX_TEXT_CHARS):
            raise _bad_request(
                f"'entry.offers[{index}]' must be 1..{MAX_TEXT_CHARS} characters of text,"
                f" got {_kind(offer)}"
            )
    return tuple(value)


def _agent_entry(value: object) -> AgentEntry:
    args = _map(value, "'entry'")
    node_hex = _node_hex(args, "node_id", "entry.node_id")
    node_id = bytes.fromhex(node_hex)
    expected = petname(node_id)
    if args.get("petname") != expected:
        got = _kind(args.get("petname"))
        raise _bad_request(
            f"'entry.petname' must be {expected!r}, the node id's petname; got {got}"
        )
    return AgentEntry(
        node_id=node_id,
        petname=expected,
        operator_name=_text(args, "operator_name", "entry.operator_name", MAX_TEXT_CHARS),
        session_name=_text(args, "session_name", "entry.session_name", MAX_TEXT_CHARS),
        model=_text(args, "model", "entry.model", MAX_TEXT_CHARS),
        connected_via=_text(args, "connected_via", "entry.connected_via", MAX_TEXT_CHARS),
        offers=_offers(args.get("offers")),
    )


def _agent_view(registration: AgentRegistration) -> dict[str, object]:
    entry = registration.entry
    return {
        "node_id": entry.node_id.hex(),
        "petname": entry.petname,
        "operator_name": entry.operator_name,
        "session_name": entry.session_name,
        "model": entry.model,
        "connected_via": entry.connected_via,
        "offers": list(entry.offers),
        "registered_ms": registration.registered_ms,
        "expires_ms": registration.expires_ms,
    }


class AgentDirectory:
    """``macula.agents.register_v1``, ``remove_v1`` and ``list_v1`` over a store."""

    def __init__(self, store: AgentDirectoryStore, *, max_agents: int = MAX_AGENTS) -> None:
        if type(max_agents) is not int or max_agents < 1:
            raise ValueError("max_agents must be a positive int")
        self.store = store
        self.max_agents = max_agents
        self._handlers: dict[str, _Handler] = {
            PROCEDURE_REGISTER: self._register,
            PROCEDURE_REMOVE: self._remove,
            PROCEDURE_LIST: self._list,
        }

    async def handle(self, procedure: str, payload: object, caller: bytes, now_ms: int) -> Outcome:
        """Answer one call of ``procedure`` from ``caller`` (its node id). Never raises."""
        return await _answer(self._handlers, procedure, payload, caller, now_ms)

    async def prune(self, now_ms: int) -> int:
        """Delete the entries expired at ``now_ms``; return how many."""
        return await self.store.prune(now_ms)

    async def _register(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = _map(payload, "the argument")
        entry = _agent_entry(_required(args, "entry", "entry"))
        ttl_s = _int(args, "ttl_seconds", "ttl_seconds", MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S)
        _required(args, "proof", "proof")
        caller = _caller_id(caller)
        _check_key_holder(args, PROCEDURE_REGISTER, entry.node_id.hex(), caller, now_ms)
        expires_ms = now_ms + ttl_s * 1000
        if not await self.store.register(entry, now_ms, expires_ms, self.max_agents):
            raise _refusal(
                "directory_full",
                f"the directory holds {self.max_agents} agents; try again later",
            )
        return {"registered": 1, "expires_ms": expires_ms}

    async def _remove(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = _map(payload, "the argument")
        node_hex = _node_hex(args, "node_id", "node_id")
        _required(args, "proof", "proof")
        caller = _caller_id(caller)
        _check_key_holder(args, PROCEDURE_REMOVE, node_hex, caller, now_ms)
        return {"removed": int(await self.store.remove(caller))}

    async def _list(self, payload: object, caller: bytes, now_ms: int) -> object:
        args = _map(payload, "the argument")
        limit = _int(args, "limit", "limit", 1, MAX_LIST_LIMIT, DEFAULT_LIST_LIMIT)
        await self.store.prune(now_ms)
        agents = [
            _agent_view(registration) for registration in await self.store.list(now_ms, limit)
        ]
        return {"count": len(agents), "agents": agents}
