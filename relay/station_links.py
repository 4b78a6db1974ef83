"""The station's side of its links to peer stations: dialling, discovery, and what a link's
coming and going tells the rest of the station.

``StationLinks`` is what ``relay.federation.links.LinkManager`` is given: ``run`` dials a target
(a QUIC client connection pinned to the peer's node id), hands the connection to the router
core under the station's connection numbering and returns once it is lost; ``has_link`` and
``discover`` (the DHT's stations, remembered in ``known_peers.json`` for a restart; each
round's stations also told to the station directory). ``changed`` carries a ``LinkUp`` or
``LinkDown`` action out: the station directory hears of it, a reached station is remembered,
the DHT learns (and joins through) a new link, the station's ``link_up_hook`` is called.
Invariant: a link's bookkeeping (its lost event, label, target) is gone once ``run`` returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from macula.clock import now_ms
from macula.transport import FrameProtocol, StreamLimits, client_configuration, dial
from relay.actions import Action, LinkDown, LinkUp
from relay.core import RouterCore
from relay.federation.dht import StationDht
from relay.federation.known_peers import KnownPeers
from relay.federation.links import LinkFailed, LinkTarget, StationLike
from relay.house.services import HouseServices
from relay.sibling_links import until_lost
from relay.station_config import StationConfig

log = logging.getLogger("macula.relay")

Discover = Callable[[], Awaitable[Sequence[StationLike]]]


class LinkShell(Protocol):
    """What the links need of the station (``relay.station.Station`` is one)."""

    config: StationConfig
    known_peers: KnownPeers | None
    link_up_hook: Callable[[bytes, str, int], None] | None

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


class StationLinks:
    def __init__(self, shell: LinkShell) -> None:
        self.shell = shell
        self._lost: dict[int, asyncio.Event] = {}
        self._labels: dict[int, str] = {}  # conn -> "host:port" of a dialled link
        self._targets: dict[int, LinkTarget] = {}  # conn -> the station it dialled

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
