"""Advertisements across station links (docs/federation.md, "RPC"), sans-I/O.

A station tells its linked stations the procedures its *own clients* serve: ADVERTISE (the
advertiser is this station, signed by it) when a client's advertisement appears, UNADVERTISE
when it is released, and every one of them again to a link that comes up. What linked
stations gossip to it is kept here, apart from the clients' ``AdvertTable``, in
``StationAdverts``. Invariants:
- gossip goes only to CONNECTED station peers, never to clients (§13 #16), and only about
  local clients' advertisements: nothing a station peer told us is passed on (one hop);
- a local client's advertisement wins over any station's (``serving`` looks there first);
  among stations the first one still linked wins (arrival order per procedure);
- a station peer holds at most ``max_station_advertisements`` procedures; its UNADVERTISE
  removes only its own entry; its link going removes all of its entries;
- a CALL that came from a station peer is served only by a local client (``local_only``).
"""

from __future__ import annotations

from collections.abc import Callable

from macula.services.refusals import STATION_ADVERTISE_QUOTA
from macula.wire.frames import Advertise, Unadvertise
from relay.core.actions import Action, Send
from relay.core.adverts import AdvertTable, ProcedureKey
from relay.core.frames import StationFrames
from relay.core.peers import Peer, PeerState


class StationAdverts:
    """Procedures linked stations serve: per procedure, the links in arrival order."""

    def __init__(self) -> None:
        self._by_key: dict[ProcedureKey, dict[int, bytes]] = {}  # -> {conn: station id}
        self._by_conn: dict[int, set[ProcedureKey]] = {}

    def put(self, key: ProcedureKey, conn: int, node_id: bytes) -> None:
        self._by_key.setdefault(key, {})[conn] = node_id
        self._by_conn.setdefault(conn, set()).add(key)

    def remove(self, key: ProcedureKey, conn: int) -> bool:
        """Forget ``conn``'s entry for ``key``; False if it had none."""
        links = self._by_key.get(key)
        if links is None or conn not in links:
            return False
        del links[conn]
        if not links:
            del self._by_key[key]
        keys = self._by_conn[conn]
        keys.discard(key)
        if not keys:
            del self._by_conn[conn]
        return True

    def forget_conn(self, conn: int) -> int:
        """The link ``conn`` is gone: all of its entries go; how many there were."""
        keys = self._by_conn.pop(conn, set())
        for key in keys:
            links = self._by_key[key]
            del links[conn]
            if not links:
                del self._by_key[key]
        return len(keys)

    def links_for(self, key: ProcedureKey) -> list[int]:
        return list(self._by_key.get(key, ()))

    def held_by(self, conn: int, key: ProcedureKey) -> bool:
        return key in self._by_conn.get(conn, ())

    def keys_of(self, conn: int) -> list[ProcedureKey]:
        return sorted(self._by_conn.get(conn, ()))

    def count_for(self, conn: int) -> int:
        return len(self._by_conn.get(conn, ()))

    def __len__(self) -> int:
        return sum(len(links) for links in self._by_key.values())


class AdvertGossip:
    def __init__(
        self,
        peers: dict[int, Peer],
        adverts: AdvertTable,
        frames: StationFrames,
        *,
        max_station_advertisements: int,
    ) -> None:
        self._peers = peers
        self._adverts = adverts
        self._frames = frames
        self._max_station_advertisements = max_station_advertisements
        self.remote = StationAdverts()

    # --- what this station tells its links -------------------------------------------------

    def local_added(self, key: ProcedureKey, now_ms: int) -> list[Action]:
        """A local client now serves ``key``: ADVERTISE it on every link."""
        return [
            Send(link.conn, link.control or 0, self._advertise(key, now_ms))
            for link in self._links()
        ]

    def local_removed(self, key: ProcedureKey, now_ms: int) -> list[Action]:
        """No local client serves ``key`` any more: UNADVERTISE it on every link."""
        frame = Unadvertise(
            **self._frames.stamp(now_ms),
            realm=key[0],
            procedure=key[1],
            advertiser=self._frames.identity.node_id,
        )
        data = self._frames.sign(frame)
        return [Send(link.conn, link.control or 0, data) for link in self._links()]

    def station_linked(
        self, peer: Peer, now_ms: int, realm_ok: Callable[[bytes], bool] | None = None
    ) -> list[Action]:
        """A link came up: tell it every procedure a local client serves (one Send), in the
        realms ``realm_ok`` allows."""
        keys = [k for k in self._local_keys() if realm_ok is None or realm_ok(k[0])]
        if not keys or peer.control is None:
            return []
        data = b"".join(self._advertise(key, now_ms) for key in keys)
        return [Send(peer.conn, peer.control, data)]

    # --- what links tell this station ------------------------------------------------------

    def station_advertised(self, peer: Peer, key: ProcedureKey) -> str | None:
        """Record ``peer``'s ADVERTISE of ``key``; the counter of a refusal, else None."""
        if self.remote.held_by(peer.conn, key):
            return None
        if self.remote.count_for(peer.conn) >= self._max_station_advertisements:
            return STATION_ADVERTISE_QUOTA
        self.remote.put(key, peer.conn, peer.node_id)
        return None

    def station_unadvertised(self, peer: Peer, key: ProcedureKey) -> bool:
        """``peer`` no longer serves ``key`` (only its own entry goes); False if it had none."""
        return self.remote.remove(key, peer.conn)

    def link_lost(self, conn: int) -> int:
        return self.remote.forget_conn(conn)

    # --- who serves a procedure ------------------------------------------------------------

    def serving(self, key: ProcedureKey, *, local_only: bool) -> Peer | None:
        """The CONNECTED peer a CALL for ``key`` goes to: a local client advertiser first,
        else (unless ``local_only``) the first linked station that gossiped it."""
        ad = self._adverts.get(key)
        peer = self._peers.get(ad.conn) if ad is not None else None
        if peer is not None and peer.state is PeerState.CONNECTED and not peer.is_station:
            return peer
        if local_only:
            return None
        for conn in self.remote.links_for(key):
            link = self._peers.get(conn)
            if link is not None and link.state is PeerState.CONNECTED and link.control is not None:
                return link
        return None

    # --- helpers ---------------------------------------------------------------------------

    def _links(self) -> list[Peer]:
        return [
            p
            for p in self._peers.values()
            if p.is_station and p.state is PeerState.CONNECTED and p.control is not None
        ]

    def _local_keys(self) -> list[ProcedureKey]:
        """Every procedure a CONNECTED local client advertises, sorted."""
        keys: list[ProcedureKey] = []
        for conn in {ad.conn for ad in self._adverts.values()}:
            peer = self._peers.get(conn)
            if peer is not None and peer.state is PeerState.CONNECTED and not peer.is_station:
                keys += self._adverts.keys_for(conn)
        return sorted(keys)

    def _advertise(self, key: ProcedureKey, now_ms: int) -> bytes:
        frame = Advertise(
            **self._frames.stamp(now_ms),
            realm=key[0],
            procedure=key[1],
            advertiser=self._frames.identity.node_id,
        )
        return self._frames.sign(frame)
