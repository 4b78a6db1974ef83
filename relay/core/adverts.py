"""Which node serves which procedure (PROTOCOL.md §6.1), and the tombstones of released ones.

Pure state, no I/O, no policy: the router decides who may advertise; this table records it.
Invariants: a procedure key ``(realm, procedure)`` has at most one advertisement; the per
connection index holds ``key`` under ``conn`` exactly when ``get(key).conn == conn``; removing
an advertisement always leaves a tombstone naming its former owner until the given time, and
``expire`` deletes tombstones whose time has come.
"""

from __future__ import annotations

from collections.abc import Mapping, ValuesView
from dataclasses import dataclass

ProcedureKey = tuple[bytes, str]  # (realm, procedure)


@dataclass(slots=True)
class Advertisement:
    node_id: bytes
    conn: int


class AdvertTable:
    def __init__(self) -> None:
        self._ads: dict[ProcedureKey, Advertisement] = {}
        self._by_conn: dict[int, set[ProcedureKey]] = {}
        self._tombstones: dict[ProcedureKey, tuple[bytes, int]] = {}  # -> (old owner, until_ms)

    def get(self, key: ProcedureKey) -> Advertisement | None:
        return self._ads.get(key)

    def put(self, key: ProcedureKey, node_id: bytes, conn: int) -> None:
        """``node_id`` on ``conn`` now serves ``key`` (replacing any earlier advertiser)."""
        current = self._ads.get(key)
        if current is not None:
            self._unindex(key, current.conn)
        self._ads[key] = Advertisement(node_id, conn)
        self._by_conn.setdefault(conn, set()).add(key)

    def remove(self, key: ProcedureKey, tombstone_until_ms: int) -> Advertisement | None:
        """Forget ``key``'s advertisement, leaving a tombstone for its owner until the time."""
        ad = self._ads.pop(key, None)
        if ad is None:
            return None
        self._unindex(key, ad.conn)
        self._tombstones[key] = (ad.node_id, tombstone_until_ms)
        return ad

    def keys_for(self, conn: int) -> list[ProcedureKey]:
        return list(self._by_conn.get(conn, ()))

    def count_for(self, conn: int) -> int:
        return len(self._by_conn.get(conn, ()))

    def held_by(self, conn: int, key: ProcedureKey) -> bool:
        return key in self._by_conn.get(conn, ())

    def released_by(self, key: ProcedureKey, now_ms: int) -> bytes | None:
        """The node that released ``key``, while its tombstone is still standing at ``now_ms``."""
        tomb = self._tombstones.get(key)
        if tomb is None or tomb[1] <= now_ms:
            return None
        return tomb[0]

    def expire(self, now_ms: int) -> None:
        """Delete the tombstones whose time has come."""
        for key, (_, until) in list(self._tombstones.items()):
            if until <= now_ms:
                del self._tombstones[key]

    @property
    def tombstones(self) -> Mapping[ProcedureKey, tuple[bytes, int]]:
        return self._tombstones

    def values(self) -> ValuesView[Advertisement]:
        return self._ads.values()

    def __len__(self) -> int:
        return len(self._ads)

    def _unindex(self, key: ProcedureKey, conn: int) -> None:
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_conn[conn]
