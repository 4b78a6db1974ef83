"""The station's side of its links to peer stations: dialling, discovery, and what a link's
coming and going tells the rest of the station.

``StationLinks`` is what ``relay.federation.links.LinkManager`` is given: ``run`` dials a target
(a QUIC client connection pinned to the peer's node id), hands the connection to the router
core under the station's connection numbering and returns once it is lost; ``has_link`` and
``discover`` (the DHT's stations, remembered in ``known_peers.json`` for a restart; each
round's stations also told to the station directory). ``changed`` carries a ``LinkUp`` or
``LinkDown`` action out: the station directory hears of it, a reached station is remembered,
the DHT learns (and joins through) a new link, the station's ``link_up_hook`` is called.
A link that comes up is also introduced to (issue 37, ``relay.federation.mesh_roster``): this
station CALLs ``_mesh.stations`` on it with its own signed station_endpoint record and dials
the stations the answer names; ``answer`` takes such a CALL from a link, answers it with this
station's other linked stations (each by its own record: kept from its introduction, else the
DHT's) and, when a newcomer introduces itself on its first link, passes its record on to the
other links, which dial it. So a station joining through one ``--peer`` meshes within round
trips, not at the next discovery round.
Invariant: a link's bookkeeping (its lost event, label, target, kept record) is gone once it
is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from macula.clock import now_ms
from macula.transport import FrameProtocol, StreamLimits, client_configuration, dial
from macula.wire.codes import ErrorCode
from macula.wire.record_keys import station_endpoint_key
from macula.wire.records import Record, RecordType
from relay.actions import Action, LinkDown, LinkUp, RunBuiltin, StationReplied
from relay.core import RouterCore
from relay.federation.dht import StationDht
from relay.federation.dht_storage import dht_id, newest_per_signer
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkFailed, LinkManager, LinkTarget, StationLike
from relay.federation.mesh_roster import (
    MESH_PROCEDURE,
    MeshNews,
    MeshRoster,
    flag,
    mesh_payload,
)
from relay.house.services import HouseServices
from relay.outcome import Outcome
from relay.sibling_links import until_lost
from relay.station_config import StationConfig

log = logging.getLogger("macula.relay")

Discover = Callable[[], Awaitable[Sequence[StationLike]]]

MESH_CALL_TIMEOUT_S = 2.0  # an introduction or a pass-on on a link
# a station told of a newcomer dials it only if the newcomer's own dial has not linked them by
# then (it learned this station from the same answer): one dial per pair, not two at once
PASSED_ON_DIAL_AFTER_S = 2.0


class LinkShell(Protocol):
    """What the links need of the station (``relay.station.Station`` is one)."""

    config: StationConfig
    known_peers: KnownPeers | None
    link_up_hook: Callable[[bytes, str, int], None] | None
    links: LinkManager | None

    @property
    def core(self) -> RouterCore: ...

    @property
    def closing(self) -> bool: ...

    @property
    def house(self) -> HouseServices | None: ...

    @property
    def dht_or_none(self) -> StationDht | None: ...

    def adopt(self, connection: FrameProtocol) -> int: ...

    def forget(self, conn: int, reason: str) -> None: ...

    def connection(self, conn: int) -> FrameProtocol | None: ...

    def run(self, actions: list[Action]) -> None: ...

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None: ...

    async def call_station(
        self, node_id: bytes, procedure: str, payload: Any, timeout_s: float
    ) -> StationReplied: ...


class StationLinks:
    def __init__(self, shell: LinkShell) -> None:
        self.shell = shell
        self._lost: dict[int, asyncio.Event] = {}
        self._labels: dict[int, str] = {}  # conn -> "host:port" of a dialled link
        self._targets: dict[int, LinkTarget] = {}  # conn -> the station it dialled
        self.roster = MeshRoster()  # linked stations' own records (issue 37)

    async def run(self, target: LinkTarget) -> None:
        """Dial ``target`` (pinned to its node id), hand the connection to the core, and
        return once it is lost; a connection that cannot be made raises."""
        shell = self.shell
        configuration = client_configuration(server_name=target.host)
        address = f"{target.host}:{target.quic_port}"
        async with dial(
            target.host, target.quic_port, configuration, timeout=shell.config.link_timeout_s
        ) as connection:
            key = connection.peer_certificate_key()
            if key != target.node_id:
                shown = key.hex()[:16] if key else "none"
                raise LinkFailed(f"{address} presented key {shown}, not the station dialled")
            if shell.closing or shell.core.stopping:
                return
            policy = shell.config.policy
            connection.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
            connection.control_limits = StreamLimits(
                policy.max_control_frame_size, policy.max_control_frame_items
            )
            conn = shell.adopt(connection)
            lost = self._lost[conn] = asyncio.Event()
            self._labels[conn] = address
            self._targets[conn] = target
            try:
                shell.run(shell.core.dial(conn, target.node_id, now_ms(), host=target.host))
                if target in shell.config.siblings:  # another worker: probed (relay.workers)
                    await until_lost(connection, lost)
                else:
                    await lost.wait()
            finally:
                if shell.connection(conn) is not None:  # cancelled (stopping): forget it now
                    shell.forget(conn, "link closed")
                self._lost.pop(conn, None)
                self._labels.pop(conn, None)
                self._targets.pop(conn, None)

    def lost(self, conn: int) -> None:
        """Connection ``conn`` is gone: a link's ``run`` returns."""
        waiter = self._lost.get(conn)
        if waiter is not None:
            waiter.set()

    def has_link(self, node_id: bytes) -> bool:
        core = self.shell.core
        conn = core.node_conn.get(node_id)
        peer = core.peers.get(conn) if conn is not None else None
        return peer is not None and peer.linked

    async def discover(self) -> Sequence[StationLike]:
        """The stations the DHT knows (FEDERATION.md): what the link manager dials; they
        are remembered for a restart."""
        dht = self.shell.dht_or_none
        found = [] if dht is None else await dht.stations()
        if self.shell.known_peers is not None:
            self.shell.known_peers.saw(found)
        return found

    def noting(self, discover: Discover) -> Discover:
        """``discover``, each round's stations also told to the station directory."""

        async def noted() -> Sequence[StationLike]:
            found = await discover()
            house = self.shell.house
            if house is not None:
                house.stations_discovered(found)
            return found

        return noted

    def _house_learns(self, action: LinkUp | LinkDown, label: str | None) -> None:
        """The station directory hears of the link: a dialled one's address, or its loss."""
        house = self.shell.house
        if house is None:
            return
        if isinstance(action, LinkDown):
            house.station_unlinked(action.node_id)
            return
        host, _, port = (label or "").rpartition(":")
        dialled = (host, int(port)) if host and port.isdecimal() else None
        house.station_linked(action.node_id, dialled)

    def changed(self, action: LinkUp | LinkDown) -> None:
        label = self._labels.get(action.conn)
        self._house_learns(action, label)
        if isinstance(action, LinkUp):
            self._up(action, label)
            return
        shell = self.shell
        self.roster.unlinked(action.node_id)
        dht = shell.dht_or_none
        if dht is not None:
            dht.link_down(action.node_id)
        connection = shell.connection(action.conn)
        where = label or (connection.peer_host if connection is not None else None) or "?"
        log.info("link down: %s %s", action.node_id.hex()[:16], where)

    def _up(self, action: LinkUp, label: str | None) -> None:
        shell = self.shell
        where = label or action.host
        how = "dialled" if label else "accepted"
        log.info(
            "link up: %s %s (%s, dht port %d)",
            action.node_id.hex()[:16],
            where,
            how,
            action.dht_port,
        )
        target = self._targets.get(action.conn)
        if target is not None and shell.known_peers is not None:
            shell.known_peers.saw([target])  # a station we reached: remembered
        if shell.link_up_hook is not None:
            shell.link_up_hook(action.node_id, action.host, action.dht_port)
        dht = shell.dht_or_none
        if dht is not None:  # a linked station may STORE at this one's DHT
            dht.link_up(action.node_id, action.host, action.dht_port)
            shell.spawn(dht.join_link(action.node_id, action.host, action.dht_port))
        if action.node_id != shell.core.identity.node_id:  # not another worker of this one
            shell.spawn(self._introduce(action.node_id))

    # -- the mesh's stations, told over links (issue 37) -------------------------------------

    async def _introduce(self, node_id: bytes) -> None:
        """Give the new link this station's own record; dial the stations it answers with."""
        own = self._own_record()
        if own is None:
            return
        others = set(self.shell.core.linked_stations()) - {node_id, own.key}
        payload = mesh_payload([own], more=1, first=int(not others))
        reply = await self.shell.call_station(node_id, MESH_PROCEDURE, payload, MESH_CALL_TIMEOUT_S)
        if not reply.ok:
            self.roster.stats["mesh_calls_failed"] += 1
            log.info("link %s: no station list (%s)", node_id.hex()[:16], reply.payload)
            return
        self._heard(node_id, reply.payload)

    def answer(self, action: RunBuiltin) -> None:
        """A link's ``_mesh.stations`` CALL (the core made sure the link signed it): take
        what it says, answer with the other linked stations if it asks (``more`` 1)."""
        core = self.shell.core
        peer = core.peers.get(action.conn)
        now = now_ms()
        records: list[Record] = []
        payload = action.call.payload
        if peer is not None and peer.linked:
            told = not flag(payload, "more")  # a newcomer passed on, not an introduction
            after = PASSED_ON_DIAL_AFTER_S if told else 0.0
            self._heard(peer.node_id, payload, pass_on=flag(payload, "first"), after_s=after)
            if flag(payload, "more"):
                records = self._linked_records(peer.node_id, now)
        outcome = Outcome.result(mesh_payload(records, more=0))
        self.shell.run(core.builtin_done(action.conn, action.stream, action.call, outcome, now))

    def _heard(
        self, sender: bytes, payload: object, *, pass_on: bool = False, after_s: float = 0.0
    ) -> None:
        news = self.roster.take(sender, payload, now_ms())
        core = self.shell.core
        conn = core.node_conn.get(sender)
        link = core.peers.get(conn) if conn is not None else None
        if link is not None:  # counted on the link too: its summary, the monitor's refusals
            for counter in news.refused:
                core.drop(link, counter, "a station list it sent was refused")
        self._dial(news, after_s)
        if news.own is not None and pass_on:
            self._pass_on(sender, news.own)

    def _dial(self, news: MeshNews, after_s: float) -> None:
        links = self.shell.links
        own_id = self.shell.core.identity.node_id
        stations = [s for s in news.stations if s.node_id != own_id]
        if links is None or not stations:
            return
        added = links.learn(stations, after_s=after_s)
        self.roster.stats["mesh_stations_dialled"] += added
        if added:
            log.info("dialling %d station(s) a link named", added)

    def _pass_on(self, sender: bytes, record: Record) -> None:
        """Tell the other links of the newly linked station ``sender`` (its own record)."""
        payload = mesh_payload([record], more=0)
        own_id = self.shell.core.identity.node_id
        for node_id in self.shell.core.linked_stations():
            if node_id in (sender, own_id):
                continue
            self.roster.stats["mesh_passed_on"] += 1
            self.shell.spawn(self._tell(node_id, payload))

    async def _tell(self, node_id: bytes, payload: dict[str, Any]) -> None:
        reply = await self.shell.call_station(node_id, MESH_PROCEDURE, payload, MESH_CALL_TIMEOUT_S)
        if not reply.ok and reply.code != ErrorCode.UNKNOWN_NEXT_PEER:  # a link just gone
            self.roster.stats["mesh_calls_failed"] += 1

    def _own_record(self) -> Record | None:
        dht = self.shell.dht_or_none
        if dht is None:
            return None
        records = dht.own_records(now_ms())
        return next((r for r in records if r.type == RecordType.STATION_ENDPOINT), None)

    def _linked_records(self, excluding: bytes, now: int) -> list[Record]:
        """The own records of the linked stations but ``excluding`` (kept from their
        introduction, else the newest the DHT holds here), at most a list's worth."""
        own_id = self.shell.core.identity.node_id
        others = [n for n in self.shell.core.linked_stations() if n not in (excluding, own_id)]
        return self.roster.listing(self._record_of(n, now) for n in others)

    def _record_of(self, node_id: bytes, now: int) -> Record | None:
        kept = self.roster.record_of(node_id, now)
        if kept is not None:
            return kept
        dht = self.shell.dht_or_none
        if dht is None:
            return None
        held = dht.storage.records(dht_id(station_endpoint_key(node_id)), now)
        own = [r for r in held if r.key == node_id and r.type == RecordType.STATION_ENDPOINT]
        return next(iter(newest_per_signer(own)), None)
