"""Client of the station's house services: shared memory, station and agent directories, path
reservations.

The realm of each service is resolved from the DHT, only from procedure_advertisement records
signed by the station the node is connected to (``DhtClient.resolve_realm`` skips and counts
any other signer in ``stats["house_foreign_signer"]``), and cached per station: the cache is
forgotten when the node's station key changes. Then the service is called like any procedure.
Recall re-hashes every hit (``content_verified`` 1 only when SHA-256 of its text equals the
``content_hash`` the station reported). Directory entries are proven by our own key, and
signed for the station that lists them (``macula.services.directory_listing``) so that it may relay
them to linked stations.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from macula.agent.proof import make_proof
from macula.clock import now_ms
from macula.services.dht import Caller, DhtClient
from macula.services.directory_listing import listing_procedure
from macula.services.house import (
    AGENTS_LIST,
    AGENTS_REGISTER,
    AGENTS_REMOVE,
    LIST_RESERVATIONS,
    LIST_STATIONS,
    MEMORY_ADD,
    MEMORY_QUERY,
    RELEASE_PATHS,
    RESERVE_PATHS,
)
from macula.services.limits import (
    DEFAULT_AGENTS_LIST,
    DEFAULT_RESERVATION_TTL_S,
    DEFAULT_RESERVATIONS_PAGE,
    DEFAULT_TOP_K,
)
from macula.wire.identity import Identity

DIRECTORY_TTL_S = 20 * 60
DIRECTORY_RENEW_S = 5 * 60


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class StationLink(Protocol):
    """The connection to a station, as far as the house client cares: whose key it is."""

    @property
    def station_key(self) -> bytes: ...


class HouseCaller(Caller, Protocol):
    """A node: it calls procedures and knows the station it is connected to."""

    async def session(self, timeout: float | None = None) -> StationLink: ...


class HouseClient:
    """The house services through ``caller``, realms resolved by ``dht`` from records the
    caller's station signed; directory entries are proven by ``identity``."""

    def __init__(
        self, caller: HouseCaller, dht: DhtClient, identity: Identity, *, timeout: float = 10.0
    ) -> None:
        self._caller = caller
        self._dht = dht
        self._identity = identity
        self.timeout = timeout
        self._station = b""  # the key the cached realms were resolved against
        self._realms: dict[str, bytes] = {}

    @property
    def foreign_records(self) -> int:
        """House advertisements ignored because the station did not sign them."""
        return self._dht.stats["house_foreign_signer"]

    async def realm_of(self, procedure: str) -> bytes:
        station = (await self._caller.session(self.timeout)).station_key
        if station != self._station:
            self._realms.clear()
            self._station = station
        realm = self._realms.get(procedure)
        if realm is None:
            realm = await self._dht.resolve_realm(procedure, station=station)
            if self._station == station:
                self._realms[procedure] = realm
        return realm

    async def call(self, procedure: str, payload: Any) -> Any:
        realm = await self.realm_of(procedure)
        return await self._caller.call(realm, procedure, payload, timeout=self.timeout)

    # -- shared memory ----------------------------------------------------------------------

    async def remember(
        self,
        content: str,
        *,
        source_label: str | None = None,
        topics: list[str] | None = None,
        document_id: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"content": content}
        for key, value in (
            ("source_label", source_label),
            ("topics", topics),
            ("document_id", document_id),
        ):
            if value is not None:
                payload[key] = value
        result = await self.call(MEMORY_ADD, payload)
        return dict(result) | {"realm": (await self.realm_of(MEMORY_ADD)).hex()}

    async def recall(self, query_text: str, top_k: int = DEFAULT_TOP_K) -> dict[str, Any]:
        result = await self.call(MEMORY_QUERY, {"query_text": query_text, "top_k": top_k})
        hits = []
        for hit in result.get("hits", []) if isinstance(result, dict) else []:
            text = hit.get("text") if isinstance(hit, dict) else None
            verified = isinstance(text, str) and content_hash(text) == hit.get("content_hash")
            hits.append(dict(hit) | {"content_verified": int(verified)})
        return {"realm": (await self.realm_of(MEMORY_QUERY)).hex(), "hits": hits}

    # -- directories --------------------------------------------------------------------------

    async def list_stations(self, filters: dict[str, Any]) -> dict[str, Any]:
        result = await self.call(LIST_STATIONS, filters)
        return dict(result) | {"realm": (await self.realm_of(LIST_STATIONS)).hex()}

    async def register_agent(
        self, entry: dict[str, Any], *, ttl_seconds: int = DIRECTORY_TTL_S
    ) -> Any:
        me = self._identity.node_id.hex()
        full = {**entry, "node_id": me}
        now = now_ms()
        proof = make_proof(self._identity, f"{AGENTS_REGISTER}#{me}", now)
        # what lets the station relay this row to its linked stations, unchanged
        station = (await self._caller.session(self.timeout)).station_key
        listed = make_proof(self._identity, listing_procedure(station, ttl_seconds, full), now)
        payload = {
            "entry": full,
            "proof": dict(proof),
            "listing_proof": dict(listed),
            "ttl_seconds": ttl_seconds,
        }
        return await self.call(AGENTS_REGISTER, payload)

    async def remove_agent(self) -> Any:
        me = self._identity.node_id.hex()
        proof = make_proof(self._identity, f"{AGENTS_REMOVE}#{me}", now_ms())
        return await self.call(AGENTS_REMOVE, {"node_id": me, "proof": dict(proof)})

    async def list_agents(self, limit: int = DEFAULT_AGENTS_LIST) -> list[dict[str, Any]]:
        result = await self.call(AGENTS_LIST, {"limit": limit})
        agents = result.get("agents", []) if isinstance(result, dict) else []
        # a listing proof is for stations checking rows they relay, not for readers
        return [
            {k: v for k, v in a.items() if k != "listing_proof"}
            for a in agents
            if isinstance(a, dict)
        ]

    # -- path reservations (a project is a normalised origin URL or a name) -------------------

    async def reserve_paths(
        self,
        project: str,
        paths: list[str],
        *,
        realm: str | None = None,
        exclusive: int = 1,
        ttl_seconds: int = DEFAULT_RESERVATION_TTL_S,
        reason: str = "",
        holder_name: str = "",
    ) -> dict[str, Any]:
        """Reserve (or renew) ``paths``: ``granted`` 1, or 0 with the ``conflicts``."""
        payload = _scoped(project, realm) | {
            "paths": list(paths),
            "exclusive": exclusive,
            "ttl_seconds": ttl_seconds,
            "reason": reason,
            "holder_name": holder_name,
        }
        return dict(await self.call(RESERVE_PATHS, payload))

    async def release_paths(
        self, project: str, paths: list[str] | None = None, *, realm: str | None = None
    ) -> dict[str, Any]:
        """Release this node's reservations of ``paths`` (None: all of them) in ``project``."""
        payload = _scoped(project, realm) | ({} if paths is None else {"paths": list(paths)})
        return dict(await self.call(RELEASE_PATHS, payload))

    async def list_reservations(
        self,
        project: str,
        *,
        realm: str | None = None,
        after_id: int = 0,
        limit: int = DEFAULT_RESERVATIONS_PAGE,
        touching: str | None = None,
    ) -> dict[str, Any]:
        """One page of the project's live reservations (``remaining``: how many more)."""
        payload = _scoped(project, realm) | {"after_id": after_id, "limit": limit}
        if touching is not None:
            payload["touching"] = touching
        return dict(await self.call(LIST_RESERVATIONS, payload))


def _scoped(project: str, realm: str | None) -> dict[str, Any]:
    return {"project": project} | ({} if realm is None else {"realm": realm})
