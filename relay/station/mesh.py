"""The mesh's stations, told over links (issue 37, ``relay.federation.mesh_roster``).

A link that comes up is introduced to: this station CALLs ``_mesh.stations`` on it with its
own signed station_endpoint record and dials the stations the answer names. ``answer`` takes
such a CALL from a link, answers it with this station's other linked stations (each by its
own record: kept from its introduction, else the DHT's) and, when a newcomer introduces
itself on its first link, passes its record on to the other links, which dial it. So a
station joining through one ``--peer`` meshes within round trips, not at the next discovery
round. ``relay.station.links.StationLinks`` makes one and tells it of each link's coming
and going.
Invariant: a link's kept record is gone once the link is lost (``unlinked``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from macula.clock import now_ms
from macula.task_scope import Spawner
from macula.wire.codes import ErrorCode
from macula.wire.record_keys import station_endpoint_key
from macula.wire.records import Record, RecordType
from relay.builtins.outcome import Outcome
from relay.core.actions import Action, RunBuiltin, StationReplied
from relay.core.router import RouterCore
from relay.federation.dht.station import StationDht
from relay.federation.dht.storage import dht_id, newest_per_signer
from relay.federation.links import StationLike
from relay.federation.mesh_roster import (
    MESH_PROCEDURE,
    MeshNews,
    MeshRoster,
    flag,
    mesh_payload,
)

__all__ = ["MESH_CALL_TIMEOUT_S", "PASSED_ON_DIAL_AFTER_S", "CallStation", "MeshIntroductions"]

log = logging.getLogger("macula.relay")

MESH_CALL_TIMEOUT_S = 2.0  # an introduction or a pass-on on a link
# a station told of a newcomer dials it only if the newcomer's own dial has not linked them by
# then (it learned this station from the same answer): one dial per pair, not two at once
PASSED_ON_DIAL_AFTER_S = 2.0

# ``Station.call_station``: (node id, procedure, payload, timeout_s) -> how it settled
CallStation = Callable[[bytes, str, Any, float], Coroutine[Any, Any, StationReplied]]


class MeshIntroductions:
    def __init__(
        self,
        core: RouterCore,
        run: Callable[[list[Action]], None],
        spawn: Spawner,
        call_station: CallStation,
        dht: StationDht,
        learn: Callable[[Sequence[StationLike], float], int],
    ) -> None:
        """``learn``: dial these stations after this many seconds; how many were new."""
        self._core = core
        self._run = run
        self._spawn = spawn
        self._call_station = call_station
        self._dht = dht
        self._learn = learn
        self.roster = MeshRoster()  # linked stations' own records

    def linked(self, node_id: bytes) -> None:
        """A link came up: introduce this station to it (not to another worker of this one)."""
        if node_id != self._core.identity.node_id:
            self._spawn(self._introduce(node_id))

    def unlinked(self, node_id: bytes) -> None:
        self.roster.unlinked(node_id)

    async def _introduce(self, node_id: bytes) -> None:
        """Give the new link this station's own record; dial the stations it answers with."""
        own = self._own_record()
        if own is None:
            return
        others = set(self._core.linked_stations()) - {node_id, own.key}
        payload = mesh_payload([own], more=1, first=int(not others))
        reply = await self._call_station(node_id, MESH_PROCEDURE, payload, MESH_CALL_TIMEOUT_S)
        if not reply.ok:
            self.roster.stats["mesh_calls_failed"] += 1
            log.info("link %s: no station list (%s)", node_id.hex()[:16], reply.payload)
            return
        self._heard(node_id, reply.payload)

    def answer(self, action: RunBuiltin) -> None:
        """A link's ``_mesh.stations`` CALL (the core made sure the link signed it): take
        what it says, answer with the other linked stations if it asks (``more`` 1)."""
        core = self._core
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
        self._run(core.builtin_done(action.conn, action.stream, action.call, outcome, now))

    def _heard(
        self, sender: bytes, payload: object, *, pass_on: bool = False, after_s: float = 0.0
    ) -> None:
        news = self.roster.take(sender, payload, now_ms())
        core = self._core
        conn = core.node_conn.get(sender)
        link = core.peers.get(conn) if conn is not None else None
        if link is not None:  # counted on the link too: its summary, the monitor's refusals
            for counter in news.refused:
                core.drop(link, counter, "a station list it sent was refused")
        self._dial(news, after_s)
        if news.own is not None and pass_on:
            self._pass_on(sender, news.own)

    def _dial(self, news: MeshNews, after_s: float) -> None:
        own_id = self._core.identity.node_id
        stations = [s for s in news.stations if s.node_id != own_id]
        if not stations:
            return
        added = self._learn(stations, after_s)
        self.roster.stats["mesh_stations_dialled"] += added
        if added:
            log.info("dialling %d station(s) a link named", added)

    def _pass_on(self, sender: bytes, record: Record) -> None:
        """Tell the other links of the newly linked station ``sender`` (its own record)."""
        payload = mesh_payload([record], more=0)
        own_id = self._core.identity.node_id
        for node_id in self._core.linked_stations():
            if node_id in (sender, own_id):
                continue
            self.roster.stats["mesh_passed_on"] += 1
            self._spawn(self._tell(node_id, payload))

    async def _tell(self, node_id: bytes, payload: dict[str, Any]) -> None:
        reply = await self._call_station(node_id, MESH_PROCEDURE, payload, MESH_CALL_TIMEOUT_S)
        if not reply.ok and reply.code != ErrorCode.UNKNOWN_NEXT_PEER:  # a link just gone
            self.roster.stats["mesh_calls_failed"] += 1

    def _own_record(self) -> Record | None:
        records = self._dht.own_records(now_ms())
        return next((r for r in records if r.type == RecordType.STATION_ENDPOINT), None)

    def _linked_records(self, excluding: bytes, now: int) -> list[Record]:
        """The own records of the linked stations but ``excluding`` (kept from their
        introduction, else the newest the DHT holds here), at most a list's worth."""
        own_id = self._core.identity.node_id
        others = [n for n in self._core.linked_stations() if n not in (excluding, own_id)]
        return self.roster.listing(self._record_of(n, now) for n in others)

    def _record_of(self, node_id: bytes, now: int) -> Record | None:
        kept = self.roster.record_of(node_id, now)
        if kept is not None:
            return kept
        held = self._dht.storage.records(dht_id(station_endpoint_key(node_id)), now)
        own = [r for r in held if r.key == node_id and r.type == RecordType.STATION_ENDPOINT]
        return next(iter(newest_per_signer(own)), None)
