"""The DHT among stations (issue 12): the ``kademlia`` package, adapted, over UDP.

``StationDht`` puts, finds and republishes the records of PROTOCOL.md §10 at the stations
closest to their key, and lists the live stations from their own records.

How the package is adapted (no fork; its pickle ``save_state``/``load_state`` are never used):
- ``DhtProtocol`` (``relay.federation.dht.protocol``) replaces the package's protocol: every
  datagram is checked before anything reads it, a source that has not proven its address
  (``relay.federation.dht.guard``'s return-address tokens) gets at most 3x the bytes it sent,
  STORE and pushes of held records are for linked stations only (``link_up``/``link_down``, told
  by the QUIC link layer), replies are pages of at most ``max_reply_bytes``. STORE takes a
  CBOR array of wire-form records (``RecordShelf.accept_value`` validates each); FIND_VALUE
  answers the records it holds *and* the closest nodes it knows, so a find crawls to the k
  closest stations and merges them all (newest per signer) instead of stopping at the first,
  reading further pages of an answer with ``find_more`` (at most ``find_pages``).
- ``RecordShelf`` (``relay.federation.dht.storage``) replaces the one-value-per-key storage.
- ``_Server(Server)``: our protocol, our id (``dht_id`` of the station's node id), a checked
  bootstrap ping, and no hourly table refresh of its own: ``StationDht`` runs the loops.
Invariants:
- Records are stored at (``put``, ``replicate``) and pushed to linked stations only; a linked
  station's DHT address is the one its link named (host names resolved) or the one its own
  signed station_endpoint record names.
- A record is held here or sent to a peer only after ``check_record``; every record a find
  returns was checked again here (the reader), whoever sent it.
- ``StationDht`` owns its loops (own records every ``own_period_s``, re-storing everything it
  holds to the current k closest plus reaping every ``replicate_period_s``, the routing table
  refresh every ``refresh_period_s``), run through the injected ``spawn`` (the station's task
  group) in a ``macula.task_scope.TaskScope``; ``stop`` cancels and awaits them, then closes
  the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from kademlia.crawling import NodeSpiderCrawl, SpiderCrawl
from kademlia.network import Server
from kademlia.node import Node

from macula.clock import now_ms
from macula.quic.transport import ALPN, enlarge_receive_buffer
from macula.task_scope import Spawner, TaskScope
from macula.wire.errors import RecordInvalid
from macula.wire.identity import ZERO_REALM, Identity
from macula.wire.record_keys import realm_stations_key, station_endpoint_key
from macula.wire.records import (
    Record,
    RecordType,
    new_record,
    record_version,
)
from relay.federation.addresses import StationAddress, endpoint_address
from relay.federation.dht.checks import is_id
from relay.federation.dht.config import DhtConfig
from relay.federation.dht.guard import (
    Address,
    DhtGuard,
    endpoint_addresses,
    is_ip,
)
from relay.federation.dht.protocol import DhtProtocol
from relay.federation.dht.storage import (
    DhtRefused,
    RecordShelf,
    VerifiedRecords,
    check_record,
    decode_value,
    dht_id,
    dht_storage_key,
    encode_value,
    newest_per_signer,
)

__all__ = ["DhtConfig", "DhtRefused", "StationAddress", "StationDht"]

log = logging.getLogger("macula.relay.dht")


class _RecordCrawl(SpiderCrawl):  # type: ignore[misc]
    """Crawls to the k closest stations, keeping every value they answer (not the first)."""

    def __init__(
        self, protocol: DhtProtocol, node: Node, peers: list[Node], ksize: int, alpha: int
    ) -> None:
        super().__init__(protocol, node, peers, ksize, alpha)
        self.values: list[bytes] = []

    async def find(self) -> list[bytes]:
        result: list[bytes] = await self._find(self.protocol.call_find_value)
        return result

    async def _nodes_found(self, responses: dict[bytes, Any]) -> list[bytes]:
        gone, more = [], []
        for peer_id, (answered, data) in responses.items():
            if not answered:
                gone.append(peer_id)
                continue
            self.values.append(data["value"])
            peer = self.nearest.get_node(peer_id)
            if data.get("next", 0) and peer is not None:
                more.append(self._more(peer, data["next"]))
            self.nearest.push([Node(*triple) for triple in data["nodes"]])
        await asyncio.gather(*more)
        self.nearest.remove(gone)
        if self.nearest.have_contacted_all():
            return self.values
        return await self.find()

    async def _more(self, peer: Node, following: int) -> None:
        """The further pages ``peer`` holds, at most ``find_pages`` in all."""
        protocol: DhtProtocol = self.protocol
        for _ in range(protocol.config.find_pages - 1):
            answered, data = await protocol.call_find_more(peer, self.node.id, following)
            if not answered:
                return
            self.values.append(data["value"])
            following = data.get("next", 0)
            if not following:
                return
        protocol.stats["find_pages_capped"] += 1


class _Server(Server):  # type: ignore[misc]
    protocol: DhtProtocol

    def __init__(
        self,
        config: DhtConfig,
        node_id: bytes,
        storage: RecordShelf,
        guard: DhtGuard,
        spawn: Spawner | None = None,
    ) -> None:
        super().__init__(config.ksize, config.alpha, node_id, storage)
        self.config = config
        self.guard = guard
        self.spawn = spawn

    def _create_protocol(self) -> DhtProtocol:
        return DhtProtocol(self.node, self.storage, self.config, self.guard, self.spawn)

    def refresh_table(self, interval: int = 3600) -> None:
        pass  # StationDht runs the refresh on its own period (and cancels it on stop)

    async def bootstrap_node(self, addr: tuple[str, int]) -> Node | None:
        result = await self.protocol.ping_address(addr)
        if result[0] and is_id(result[1]):
            return Node(result[1], addr[0], addr[1])
        return None


# --- the station's DHT ----------------------------------------------------------------------


class StationDht:
    """One station's node in the DHT among stations (FEDERATION.md's interface)."""

    def __init__(
        self,
        identity: Identity,
        *,
        quic_port: int,
        hosts: Sequence[str],
        config: DhtConfig | None = None,
        clock: Callable[[], int] = now_ms,
        spawn: Spawner | None = None,
    ) -> None:
        self.identity = identity
        self.quic_port = quic_port
        self.hosts = list(dict.fromkeys(hosts))
        self.config = DhtConfig() if config is None else config
        self.clock = clock
        self.storage = RecordShelf(
            self.config.limits, clock, VerifiedRecords(self.config.verified_cache)
        )
        self.guard = DhtGuard(os.urandom(32), self.config.guard, endpoints=self._endpoint_addresses)
        self._scope = TaskScope(spawn)
        self._server = _Server(
            self.config, dht_id(identity.node_id), self.storage, self.guard, self._scope.spawn
        )
        self.port = 0
        # stations() learned: node id -> (address, when to look it up again, expires_at)
        self._addresses: dict[bytes, tuple[StationAddress, int, int]] = {}
        self._joined = False  # a bootstrap crawl has run
        self._publish_due = False  # a put of own records after a rejoin is scheduled

    @property
    def stats(self) -> Counter[str]:
        """Refusals and protocol counters (``refused_<reason>``, ``malformed_*``, ...)."""
        return self.storage.stats

    @property
    def contacts(self) -> int:
        """Stations in the routing table."""
        protocol = self._server.protocol
        return 0 if protocol is None else sum(len(b) for b in protocol.router.buckets)

    async def start(self, host: str, port: int) -> int:
        """Listen on UDP ``host:port`` (0 = any free port); the bound port."""
        await self._server.listen(port, host)
        transport = self._server.transport
        enlarge_receive_buffer(transport.get_extra_info("socket"))  # lookups answer in bursts
        self.port = int(transport.get_extra_info("sockname")[1])
        config = self.config
        self._every(config.own_period_s, self.publish_own, first=True)
        self._every(config.replicate_period_s, self.replicate)
        self._every(config.refresh_period_s, self._server._refresh_table)
        return self.port

    async def stop(self) -> None:
        await self._scope.aclose()
        self._server.stop()
        protocol = self._server.protocol
        if protocol is not None:  # pending calls end as "no reply" now, not at their timeout
            for msg_id in list(protocol._outstanding):
                protocol._outstanding[msg_id][1].cancel()
                protocol._timeout(msg_id)

    def _every(
        self, period_s: float, work: Callable[[], Coroutine[Any, Any, Any]], first: bool = False
    ) -> None:
        async def loop() -> None:
            if not first:
                await asyncio.sleep(period_s)
            while True:
                try:
                    await work()
                except Exception:
                    log.exception("DHT %s failed", getattr(work, "__name__", "work"))
                await asyncio.sleep(period_s)

        self._scope.spawn(loop())

    # -- linked stations (told by the QUIC link layer) ------------------------------------------

    def link_up(self, node_id: bytes, host: str, dht_port: int) -> None:
        """Station ``node_id`` is linked (authenticated over QUIC), its DHT at
        ``host:dht_port`` (0: not told; then its signed station_endpoint record names it):
        it may STORE here and be sent records, from now on (then run ``join_link``)."""
        self.guard.link_up(node_id, host, dht_port if is_ip(host) else 0)

    async def join_link(self, node_id: bytes, host: str, dht_port: int) -> None:
        """Join the DHT through a linked station (its host name resolved and bound first)."""
        if not dht_port:
            return
        if not is_ip(host):
            with contextlib.suppress(OSError):
                infos = await asyncio.get_running_loop().getaddrinfo(host, dht_port, type=2)
                for info in infos[:4]:
                    self.guard.add_address(node_id, (str(info[4][0]), dht_port))
        await self.bootstrap([(host, dht_port)])

    def link_down(self, node_id: bytes) -> None:
        self.guard.link_down(node_id)

    def _endpoint_addresses(self, node_id: bytes) -> list[Address]:
        """The DHT addresses station ``node_id``'s own station_endpoint records name: those
        held here, and the one stations() learned (each checked: signed by it)."""
        dkey = dht_id(station_endpoint_key(node_id))
        found = [
            address
            for record in self.storage.records(dkey, self.clock())
            if record.key == node_id
            for address in endpoint_addresses(record)
        ]
        learned = self._addresses.get(node_id)  # by stations(), from its checked record
        if learned is not None and is_ip(learned[0].host) and learned[0].dht_port:
            found.append((learned[0].host, learned[0].dht_port))
        return found

    def _pushable(self, nodes: list[Node]) -> list[Node]:
        """The stations records may be stored at: linked ones, at their bound address."""
        protocol = self._server.protocol
        kept = [n for n in nodes if protocol.pushable(n)]
        self.stats["store_not_linked"] += len(nodes) - len(kept)
        return kept

    async def bootstrap(self, addrs: list[tuple[str, int]]) -> None:
        """Join through stations' DHT addresses (host names resolved), then put own records:
        at once the first time, ``rejoin_publish_delay_s`` after a later join (a new link),
        one put shared by the joins meanwhile."""
        loop = asyncio.get_running_loop()
        resolved: list[tuple[str, int]] = []
        for host, port in addrs:
            with contextlib.suppress(OSError):
                infos = await loop.getaddrinfo(host, port, type=2)  # SOCK_DGRAM
                resolved.extend((str(info[4][0]), port) for info in infos[:1])
        protocol = self._server.protocol
        known = {(n.ip, n.port) for b in protocol.router.buckets for n in b.get_nodes()}
        if self._joined and resolved and all(a in known for a in resolved):
            self.stats["bootstrap_skipped"] += 1  # e.g. a link to a station the DHT knows
            return
        await self._server.bootstrap(resolved)
        if not self._joined:
            self._joined = True
            await self.publish_own()
            return
        self.stats["rejoined"] += 1
        self._publish_soon()  # links coming up together: their joins share one put

    def _publish_soon(self) -> None:
        """Put own records once, ``rejoin_publish_delay_s`` from now (unless one is due)."""
        if self._publish_due:
            return
        self._publish_due = True

        async def later() -> None:
            await asyncio.sleep(self.config.rejoin_publish_delay_s)
            self._publish_due = False  # a join from now on schedules another put
            await self.publish_own()

        if self._scope.spawn(later()) is None:
            self._publish_due = False

    # -- records ---------------------------------------------------------------------------

    def own_records(self, now: int) -> list[Record]:
        """This station's station_endpoint (with its DHT port) and zero-realm realm_stations."""
        identity, ttl = self.identity, self.config.own_ttl_ms
        endpoint = {
            "quic_port": self.quic_port,
            "host_advertised": [h.encode() for h in self.hosts],
            "alpn": ALPN,
            "dht_port": self.port,
        }
        return [
            new_record(
                identity,
                record_type,
                payload,
                now_ms=now,
                version=record_version(now, os.urandom(10)),
                ttl_ms=ttl,
            )
            for record_type, payload in (
                (RecordType.STATION_ENDPOINT, endpoint),
                (RecordType.REALM_STATIONS, {"realm": ZERO_REALM}),
            )
        ]

    async def publish_own(self) -> None:
        for record in self.own_records(self.clock()):
            await self.put(record)

    async def put(self, record: Record) -> int:
        """Check ``record`` (``DhtRefused`` if it may not be held) and store it at the k
        closest stations; how many took it (this one included)."""
        now = self.clock()
        dkey = dht_id(_key_of(record))
        check_record(record, dkey, now, self.config.limits, verified=self.storage.verified)
        target = Node(dkey)
        nodes = await self._closest(target)
        stored = 0
        closest, nodes = nodes, self._pushable(nodes)
        if len(closest) < self.config.ksize or self._server.node.distance_to(target) < max(
            n.distance_to(target) for n in closest
        ):
            stored += self.storage.accept(dkey, record, now)
        value = encode_value([record])
        replies = await asyncio.gather(
            *(self._server.protocol.call_store(n, dkey, value) for n in nodes)
        )
        return stored + sum(1 for ok, taken in replies if ok and taken)

    async def _closest(self, target: Node) -> list[Node]:
        protocol = self._server.protocol
        nearest = protocol.router.find_neighbors(target)
        if not nearest:
            return []
        config = self.config
        found: list[Node] = await NodeSpiderCrawl(
            protocol, target, nearest, config.ksize, config.alpha
        ).find()
        return found

    async def find(self, storage_key: bytes) -> list[Record]:
        """The records under ``storage_key`` here and at the k closest stations, newest per
        signer; each checked here, whoever held it."""
        dkey = dht_id(storage_key)
        now = self.clock()
        found = self.storage.records(dkey, now)
        protocol = self._server.protocol
        nearest = protocol.router.find_neighbors(Node(dkey))
        if nearest:
            config = self.config
            crawl = _RecordCrawl(protocol, Node(dkey), nearest, config.ksize, config.alpha)
            found.extend(self._checked(await crawl.find(), dkey, self.clock()))
        return newest_per_signer(found)

    def _checked(self, values: list[bytes], dkey: bytes, now: int) -> list[Record]:
        """The records of the stations' answers, each distinct one checked once (the k
        closest mostly answer the same bytes: verifying every copy would cost k times more)."""
        distinct: set[Record] = set()
        for value in set(values):
            distinct.update(decode_value(value, self.config.limits, self.stats))
        kept = []
        for record in distinct:
            try:
                check_record(record, dkey, now, self.config.limits, verified=self.storage.verified)
            except DhtRefused as exc:
                self.stats[f"found_refused_{exc.reason}"] += 1
                continue
            kept.append(record)
        return kept

    async def replicate(self) -> int:
        """Reap, then re-store every record held to the current k closest stations."""
        now = self.clock()
        self.storage.reap(now)
        sent = 0
        for dkey in self.storage.digests():
            batches = self.storage.store_batches(self.storage.records(dkey, now))
            nodes = self._pushable(await self._closest(Node(dkey)))
            calls = [self._server.protocol.call_store(n, dkey, b) for n in nodes for b in batches]
            sent += len(await asyncio.gather(*calls))
        self.stats["replicated"] += sent
        return sent

    async def stations(self) -> list[StationAddress]:
        """Every live station: a realm_stations record under the zero realm's station_set key
        and an unexpired station_endpoint record, both signed by that station.

        One lookup of the station set per call; a station's endpoint is looked up only when
        it is new here or its record learned before is past ``endpoint_refresh_percent`` of
        its lifetime (a station republishes it every ``own_period_s``)."""
        members = await self.find(realm_stations_key(ZERO_REALM))
        signers = sorted({r.key for r in members if r.type == RecordType.REALM_STATIONS})
        gate = asyncio.Semaphore(self.config.stations_concurrency)
        now = self.clock()
        learned = self._addresses

        async def address(node_id: bytes) -> StationAddress | None:
            held = learned.get(node_id)
            if held is not None and now < held[1]:
                self.stats["endpoint_known"] += 1
                return held[0]
            async with gate:
                records = await self.find(station_endpoint_key(node_id))
            self.stats["endpoint_lookup"] += 1
            for record in records:
                found = endpoint_address(record)
                if found is not None:
                    lifetime = record.expires_at - record.created_at
                    again = (
                        record.created_at + lifetime * self.config.endpoint_refresh_percent // 100
                    )
                    learned[node_id] = (found, min(again, record.expires_at), record.expires_at)
                    return found
            if held is not None and now < held[2]:  # not found now, but learned unexpired
                return held[0]
            learned.pop(node_id, None)
            return None

        found = await asyncio.gather(*(address(s) for s in signers))
        for node_id in set(learned) - set(signers):
            del learned[node_id]  # no longer a member
        return [a for a in found if a is not None]


def _key_of(record: Record) -> bytes:
    try:
        return dht_storage_key(record)
    except RecordInvalid as exc:
        raise DhtRefused(exc.reason, exc.detail) from None
