"""The station's side of its links to peer stations: dialling, discovery, and what a link's
coming and going tells the rest of the station.

``StationLinks`` keeps the station's ``relay.federation.links.LinkManager`` (``manager``) and
gives it what it needs: ``run`` dials a target (a QUIC client connection pinned to the peer's
node id), hands the connection to the station's connection table (``adopt``: the router core
hears it under the station's numbering) and returns once it is lost; ``has_link`` and
``discover`` (the DHT's stations, remembered in ``known_peers.json`` for a restart; each
round's stations also told to the station directory). ``changed`` carries a ``LinkUp`` or
``LinkDown`` action out: the station directory hears of it, a reached station is remembered,
the DHT learns (and joins through) a new link, ``on_up`` is called, and the link is introduced
to (``relay.station.mesh.MeshIntroductions``, which also ``answer``s a link's introduction).
The station makes it once its parts are open, before it reads its first datagram, and gives
it exactly the parts and calls it uses.
Invariant: a link's bookkeeping (its lost event, label, target, kept record) is gone once it
is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from macula.clock import now_ms
from macula.quic.transport import FrameProtocol, StreamLimits, client_configuration, dial
from macula.task_scope import Spawner
from relay.core.actions import Action, LinkDown, LinkUp, RunBuiltin
from relay.core.router import RouterCore
from relay.federation.dht.station import StationDht
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkFailed, LinkManager, LinkTarget, StationLike
from relay.federation.mesh_roster import MeshRoster
from relay.house.services import HouseServices
from relay.station.config import StationConfig
from relay.station.mesh import CallStation, MeshIntroductions
from relay.station.sibling_links import until_lost

__all__ = ["ConnectionTable", "StationLinks"]

log = logging.getLogger("macula.relay")

Discover = Callable[[], Awaitable[Sequence[StationLike]]]


@dataclass(frozen=True)
class ConnectionTable:
    """The station's numbered connections, as a link uses them."""

    adopt: Callable[[FrameProtocol], int]  # number it; its reports reach the core
    forget: Callable[[int, str], None]  # it is lost: the core hears of it
    get: Callable[[int], FrameProtocol | None]


class StationLinks:
    def __init__(
        self,
        config: StationConfig,
        core: RouterCore,
        connections: ConnectionTable,
        *,
        run: Callable[[list[Action]], None],
        spawn: Spawner,
        call_station: CallStation,
        parts: tuple[StationDht, HouseServices, KnownPeers],
        remembered: Sequence[LinkTarget],
        on_up: Callable[[bytes, str, int], None],
    ) -> None:
        """``parts``: the DHT, the house services, the stations remembered in the data dir;
        ``remembered``: those of them ``config.peers`` does not name; ``on_up``: called as
        (node_id, host, dht_port) when a link comes up."""
        self._config = config
        self._core = core
        self._connections = connections
        self._run = run
        self._spawn = spawn
        self._dht, self._house, self._known_peers = parts
        self._on_up = on_up
        self._lost: dict[int, asyncio.Event] = {}
        self._labels: dict[int, str] = {}  # conn -> "host:port" of a dialled link
        self._targets: dict[int, LinkTarget] = {}  # conn -> the station it dialled
        self.manager = LinkManager(
            core.identity.node_id,
            run_link=self.run,
            has_link=self.has_link,
            peers=config.peers,
            siblings=config.siblings,
            remembered=remembered,
            discover=self.noting(config.discover if config.discover is not None else self.discover),
            max_links=config.max_links,
            discover_interval_s=config.discover_interval_s,
            backoff_base_s=config.link_backoff_s,
            backoff_max_s=config.link_backoff_max_s,
            spawn=spawn,
        )
        self.mesh = MeshIntroductions(
            core,
            run,
            spawn,
            call_station,
            self._dht,
            lambda found, after_s: self.manager.learn(found, after_s=after_s),
        )

    @property
    def roster(self) -> MeshRoster:
        """Linked stations' own records (``relay.federation.mesh_roster``)."""
        return self.mesh.roster

    async def run(self, target: LinkTarget) -> None:
        """Dial ``target`` (pinned to its node id), hand the connection to the core, and
        return once it is lost; a connection that cannot be made raises."""
        config, core = self._config, self._core
        configuration = client_configuration(server_name=target.host)
        address = f"{target.host}:{target.quic_port}"
        async with dial(
            target.host, target.quic_port, configuration, timeout=config.link_timeout_s
        ) as connection:
            key = connection.peer_certificate_key()
            if key != target.node_id:
                shown = key.hex()[:16] if key else "none"
                raise LinkFailed(f"{address} presented key {shown}, not the station dialled")
            if core.stopping:  # the station stops (its drain shut the core down)
                return
            policy = config.policy
            connection.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
            connection.control_limits = StreamLimits(
                policy.max_control_frame_size, policy.max_control_frame_items
            )
            conn = self._connections.adopt(connection)
            lost = self._lost[conn] = asyncio.Event()
            self._labels[conn] = address
            self._targets[conn] = target
            try:
                self._run(core.dial(conn, target.node_id, now_ms(), host=target.host))
                if target in config.siblings:  # another worker: probed (relay.workers.balancer)
                    await until_lost(connection, lost)
                else:
                    await lost.wait()
            finally:
                if self._connections.get(conn) is not None:  # cancelled (stopping): forget it
                    self._connections.forget(conn, "link closed")
                self._lost.pop(conn, None)
                self._labels.pop(conn, None)
                self._targets.pop(conn, None)

    def lost(self, conn: int) -> None:
        """Connection ``conn`` is gone: a link's ``run`` returns."""
        waiter = self._lost.get(conn)
        if waiter is not None:
            waiter.set()

    def has_link(self, node_id: bytes) -> bool:
        core = self._core
        conn = core.node_conn.get(node_id)
        peer = core.peers.get(conn) if conn is not None else None
        return peer is not None and peer.linked

    async def discover(self) -> Sequence[StationLike]:
        """The stations the DHT knows (FEDERATION.md): what the link manager dials; they
        are remembered for a restart."""
        found = await self._dht.stations()
        self._known_peers.saw(found)
        return found

    def noting(self, discover: Discover) -> Discover:
        """``discover``, each round's stations also told to the station directory."""

        async def noted() -> Sequence[StationLike]:
            found = await discover()
            self._house.stations_discovered(found)
            return found

        return noted

    def answer(self, action: RunBuiltin) -> None:
        """A link's ``_mesh.stations`` CALL: ``MeshIntroductions.answer``."""
        self.mesh.answer(action)

    def _house_learns(self, action: LinkUp | LinkDown, label: str | None) -> None:
        """The station directory hears of the link: a dialled one's address, or its loss."""
        if isinstance(action, LinkDown):
            self._house.station_unlinked(action.node_id)
            return
        host, _, port = (label or "").rpartition(":")
        dialled = (host, int(port)) if host and port.isdecimal() else None
        self._house.station_linked(action.node_id, dialled)

    def changed(self, action: LinkUp | LinkDown) -> None:
        label = self._labels.get(action.conn)
        self._house_learns(action, label)
        if isinstance(action, LinkUp):
            self._up(action, label)
            return
        self.mesh.unlinked(action.node_id)
        self._dht.link_down(action.node_id)
        connection = self._connections.get(action.conn)
        where = label or (connection.peer_host if connection is not None else None) or "?"
        log.info("link down: %s %s", action.node_id.hex()[:16], where)

    def _up(self, action: LinkUp, label: str | None) -> None:
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
        if target is not None:
            self._known_peers.saw([target])  # a station we reached: remembered
        self._on_up(action.node_id, action.host, action.dht_port)
        dht = self._dht  # a linked station may STORE at this one's DHT
        dht.link_up(action.node_id, action.host, action.dht_port)
        self._spawn(dht.join_link(action.node_id, action.host, action.dht_port))
        self.mesh.linked(action.node_id)
