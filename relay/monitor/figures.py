"""What the monitoring port shows, read from a running station at request time.

Invariants: nothing here is called per frame: every figure is read from the station's own
tables (the core's counters and maps, the stores' totals) when a monitor request asks; reading
changes nothing. Payloads carry no booleans (0/1 integers). Per-connection byte counts are the
QUIC connection's own flow-control totals (stream bytes received and sent), read when asked.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from macula.agent.petnames import petname
from macula.clock import now_ms
from relay.core.peers import Peer, PeerState
from relay.station.station import Station

MAX_PAGE = 500  # connections in one /connections page


def package_version() -> str:
    try:
        return metadata.version("macula-mesh")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class Lifecycle:
    """Where the station is in its life, as /healthz reports it."""

    started_monotonic: float = field(default_factory=time.monotonic)
    ready: int = 0  # listening and serving
    draining: int = 0  # a stop was asked for: not taking new work

    @property
    def serving(self) -> bool:
        return bool(self.ready) and not self.draining

    def uptime_s(self) -> float:
        return round(time.monotonic() - self.started_monotonic, 3)


def _state(peer: Peer) -> str:
    return peer.state.name.lower()


def _bytes(station: Station, conn: int) -> tuple[int, int]:
    """(stream bytes received, stream bytes sent) on ``conn``'s QUIC connection."""
    connection = station.connection(conn)
    return (0, 0) if connection is None else connection.stream_bytes()


def connection_row(station: Station, peer: Peer, now: int) -> dict[str, Any]:
    core = station.core
    received, sent = _bytes(station, peer.conn)
    return {
        "conn": peer.conn,
        "node_id": peer.node_id.hex(),
        "address": peer.address or peer.link_host,
        "state": _state(peer),
        "station": int(peer.is_station),
        "since_ms": peer.opened_ms,
        "age_s": max(0, now - peer.opened_ms) // 1000,
        "bytes_in": received,
        "bytes_out": sent,
        "subscriptions": core.subscriptions.count_for(peer.node_id) if peer.node_id else 0,
        "advertisements": core.adverts.count_for(peer.conn),
        "paused": int(core.pacer.paused(peer.conn)),
        "refusals": dict(sorted(peer.refusals.counts.items())),
    }


def client_row(station: Station, peer: Peer, now: int) -> dict[str, Any]:
    """A connection row with the petname of the node id the client announced (None while it
    has announced none: still handshaking)."""
    row = connection_row(station, peer, now)
    row["petname"] = petname(peer.node_id) if peer.node_id else None
    return row


def connections_page(station: Station, offset: int, limit: int) -> dict[str, Any]:
    """Client connections (not links) by connection number, ``limit`` from ``offset``."""
    limit = max(1, min(limit, MAX_PAGE))
    offset = max(0, offset)
    peers = sorted(
        (p for p in station.core.peers.values() if not p.is_station), key=lambda p: p.conn
    )
    now = now_ms()
    rows = [client_row(station, p, now) for p in peers[offset : offset + limit]]
    following = offset + limit if offset + limit < len(peers) else None
    return {
        "total": len(peers),
        "offset": offset,
        "limit": limit,
        "next_offset": following,
        "connections": rows,
    }


async def with_directory_names(station: Station, page: dict[str, Any]) -> dict[str, Any]:
    """``page`` (``connections_page``) with each client's ``operator_name`` as it announced it
    in this station's agent directory (None when not listed; one indexed query per page)."""
    house = station.house
    store = None if house is None else house.agent_store
    nodes = [bytes.fromhex(row["node_id"]) for row in page["connections"] if row["node_id"]]
    listed = {}
    if store is not None and nodes:
        with contextlib.suppress(Exception):  # a store closing under a request: no names
            listed = await store.listed(nodes, now_ms())
    for row in page["connections"]:
        found = listed.get(bytes.fromhex(row["node_id"])) if row["node_id"] else None
        row["operator_name"] = None if found is None else found.entry.operator_name
    return page


def links(station: Station) -> list[dict[str, Any]]:
    """Every station connection (dialled or accepted) with its state."""
    now = now_ms()
    rows = []
    for peer in sorted(station.core.peers.values(), key=lambda p: p.conn):
        if not (peer.is_station or peer.dialled):
            continue
        row = connection_row(station, peer, now)
        row["linked"] = int(peer.linked)
        row["dialled"] = int(peer.dialled)
        row["node_id"] = (peer.node_id or peer.expected_node_id).hex()
        rows.append(row)
    return rows


def refusals(station: Station) -> dict[str, int]:
    """Every refusal counter the station keeps: the frames the core dropped (``core.refusals``),
    its ``*_refused`` counters (handshakes, calls, links), and the connection caps'. Only those
    that happened are listed (docs/operations.md names them)."""
    core = station.core
    counted: dict[str, int] = {name: int(n) for name, n in core.refusals.items()}
    for name, value in core.stats.items():
        if (name.endswith("_refused") or name == "framing_errors") and name not in counted:
            counted[name] = int(value)
    for name, value in core.caps.refused.counts.items():
        counted[name] = counted.get(name, 0) + int(value)
    return dict(sorted(counted.items()))


async def _store_figures(station: Station) -> dict[str, int]:
    figures = {"record_store_rows": 0, "content_bytes": 0, "content_blocks": 0, "history_rows": 0}
    with contextlib.suppress(Exception):  # a store closing under a request: zeros
        records, content, house = station.records, station.content, station.house
        if records is not None:
            figures["record_store_rows"] = await records.count()
        if content is not None:
            stats = await content.stats()
            figures["content_bytes"] = await content.held()
            figures["content_blocks"] = stats.blocks
        if house is not None and house.history is not None:
            figures["history_rows"] = await house.history.store.count()
    return figures


async def status(station: Station, lifecycle: Lifecycle) -> dict[str, Any]:
    """The /status document: the station at a glance, every figure an integer or text."""
    core = station.core
    peers = list(core.peers.values())
    clients = [p for p in peers if not p.is_station and not p.dialled]
    connected = [p for p in clients if p.state is PeerState.CONNECTED]
    dht = station.dht_or_none
    shelf = dht.storage if dht is not None else None
    stats = core.stats
    return {
        "version": package_version(),
        "node_id": station.node_id.hex(),
        "endpoint": station.endpoint,
        "uptime_s": lifecycle.uptime_s(),
        "ready": lifecycle.ready,
        "draining": int(bool(lifecycle.draining or core.stopping)),
        "connections": {
            "clients": len(connected),
            "handshaking": sum(p.state is PeerState.HANDSHAKING for p in clients),
            "total": len(peers),
            "max": core.caps.max_connections,
        },
        "subscriptions": len(core.subscriptions),
        "subscribers": len(core.subscriptions.nodes()),
        "advertisements": len(core.adverts),
        "pending_calls": len(core.pending),
        "paused_publishers": len(core.pacer.backlog),
        "publishers_paused_total": int(stats["publishers_paused"]),
        "slow_consumers_closed": int(stats["slow_consumers"]),
        "links": {
            "up": sum(p.linked for p in peers),
            "connections": sum(1 for p in peers if p.is_station or p.dialled),
            "paused_total": int(stats["links_paused"]),
            "stations": [
                {key: row[key] for key in ("node_id", "address", "state", "linked", "dialled")}
                for row in links(station)
            ],
        },
        "dht": {
            "records": shelf.rows if shelf is not None else 0,
            "bytes": shelf.bytes if shelf is not None else 0,
            "contacts": dht.contacts if dht is not None else 0,
            "port": dht.port if dht is not None else 0,
        },
        "stores": await _store_figures(station),
        "refusals": refusals(station),
        "counters": {name: int(value) for name, value in sorted(stats.items())},
    }
